"""Blur IG, Guided IG and XRAI against PAIR's ``saliency`` 0.2.1 on the same Keras model and inputs.

PAIR's core is framework-agnostic: it is called with a function returning the model's gradients,
computed here with ``tf.GradientTape`` (no kerascope code). PAIR's Guided IG calls
``np.quantile(..., interpolation=)``, which numpy 2 renamed ``method=``: a shim in this test maps it.
PAIR gets float64 inputs (its blur finite differences then keep their precision; kerascope blurs in
float64 too). Run on TensorFlow only (tests/test_guided_paths.py covers every backend).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

pair = pytest.importorskip("saliency.core")

import kerascope as ks  # noqa: E402

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the PAIR reference runs once, on TensorFlow"
)


class _NumpyTwo:
    """numpy, with ``quantile(interpolation=)`` mapped to numpy 2's ``method=`` (PAIR 0.2.1 predates it)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def quantile(a, q, interpolation="linear", **kwargs):
        return np.quantile(a, q, method=interpolation, **kwargs)


@pytest.fixture(autouse=True)
def numpy_two(monkeypatch):
    import saliency.core.guided_ig as guided_ig

    monkeypatch.setattr(guided_ig, "np", _NumpyTwo())


def cnn(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(4, 3, activation="relu", name="c1"),
        keras.layers.Conv2D(5, 3, activation="tanh", name="c2"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, name="out"),
    ])


@pytest.fixture(scope="module")
def model():
    return cnn()


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).uniform(0, 1, (3, 12, 12, 3)).astype(np.float32)


def call_model(model):
    import tensorflow as tf

    def fn(batch, call_model_args=None, expected_keys=None):
        v = tf.constant(np.asarray(batch, np.float32))
        with tf.GradientTape() as tape:
            tape.watch(v)
            score = model(v, training=False)[:, call_model_args["class"]]
        return {pair.INPUT_OUTPUT_GRADIENTS: tape.gradient(score, v).numpy()}

    return fn


def close(ours, theirs, rel=1e-4):
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=rel * float(np.abs(theirs).max()))


@pytest.mark.parametrize("kwargs", [dict(max_sigma=6.0, steps=12), dict(max_sigma=4.0, steps=7, sqrt=True)])
def test_blur_ig(model, x, kwargs):
    targets = [0, 2, 1]
    ours = ks.BlurIG(model, batch_size=10, **kwargs).explain(x, targets).attributions
    fn = call_model(model)
    for i, t in enumerate(targets):  # (PAIR's sqrt spacing is only right with batch_size=1)
        theirs = pair.BlurIG().GetMask(x[i].astype(np.float64), fn, {"class": t}, batch_size=1, **kwargs)
        close(ours[i], theirs)


NOISE = np.random.default_rng(5).uniform(0, 0.3, (12, 12, 3)).astype(np.float32)


# A constant baseline on a conv net gives equal gradients at every interior pixel, so which of them the first
# step moves is decided by float rounding (batched passes round differently): the second case starts from a
# non-constant baseline, where the selection is well defined.
@pytest.mark.parametrize("steps,kwargs,baseline", [
    (20, {}, None),
    (15, dict(fraction=0.4, max_dist=0.3), NOISE),
])
def test_guided_ig(model, x, steps, kwargs, baseline):
    targets = [1, 0, 2]
    ours = ks.GuidedIG(model, steps=steps, baseline=baseline, batch_size=2, **kwargs).explain(x, targets)
    fn = call_model(model)
    for i, t in enumerate(targets):
        start = np.zeros_like(x[i]) if baseline is None else baseline
        theirs = pair.GuidedIG().GetMask(x[i], fn, {"class": t}, x_baseline=start, x_steps=steps, **kwargs)
        close(ours.attributions[i], theirs)


def random_masks(rng, count, shape=(12, 12)):
    """Overlapping rectangles and blobs, plus one exact duplicate (a tie PAIR breaks by order)."""
    masks = []
    for _ in range(count):
        m = np.zeros(shape, bool)
        r, c = rng.integers(0, shape[0] - 3, 2)
        m[r: r + rng.integers(3, 8), c: c + rng.integers(3, 8)] = True
        masks.append(m)
    masks.append(masks[2].copy())
    return masks


@pytest.mark.parametrize("area_threshold,min_pixel_diff", [(1.0, 5), (0.6, 1), (1.0, 30)])
def test_xrai_given_segments(model, x, area_threshold, min_pixel_diff):
    """Given masks and a base attribution, XRAI equals PAIR's (the map and the region ranks)."""
    rng = np.random.default_rng(7)
    segments = [random_masks(rng, 12 + 3 * i) for i in range(3)]
    base = rng.normal(size=x.shape)
    ours = ks.XRAI(model, segments=segments, base_attribution=base, area_threshold=area_threshold,
                   min_pixel_diff=min_pixel_diff, batch_size=2).explain(x, 0)
    params = pair.XRAIParameters(area_threshold=area_threshold, return_xrai_segments=True)
    params.experimental_params["min_pixel_diff"] = min_pixel_diff
    for i in range(3):
        theirs = pair.XRAI().GetMaskWithDetails(x[i], call_model(model), {"class": 0}, segments=segments[i],
                                                base_attribution=base[i], extra_parameters=params)
        np.testing.assert_allclose(ours.attributions[i], theirs.attribution_mask, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(ours.extras["ranks"][i], theirs.segments)


def test_xrai_default_segments(model):
    """segments=None: PAIR's Felzenszwalb segments (six scales, dilated), so the same map as PAIR's."""
    rng = np.random.default_rng(8)
    images = rng.uniform(0, 1, (2, 12, 12, 3)).astype(np.float32)
    images[:, 3:9, 3:9, 0] += 1.5  # some structure for the segmentation
    base = rng.normal(size=images.shape)
    ours = ks.XRAI(model, base_attribution=base).explain(images, 1)
    for i in range(2):
        theirs = pair.XRAI().GetMask(images[i], call_model(model), {"class": 1}, base_attribution=base[i])
        np.testing.assert_allclose(ours.attributions[i], theirs, rtol=1e-6, atol=1e-7)


def test_xrai_default_masks_equal_pair():
    """The dilated Felzenszwalb masks themselves, at an image size where they differ from the labels."""
    from saliency.core import xrai as pair_xrai

    from kerascope.methods.xrai import felzenszwalb_labels, label_pairs

    image = np.random.default_rng(9).uniform(0, 1, (40, 30, 3))
    theirs = np.stack(pair_xrai._get_segments_felzenszwalb(image)).reshape(-1, 40 * 30)
    pixels, segments, count = label_pairs(felzenszwalb_labels(image))
    ours = np.zeros((count, 40 * 30), bool)
    ours[segments, pixels] = True
    np.testing.assert_array_equal(ours, theirs)
