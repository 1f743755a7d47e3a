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
