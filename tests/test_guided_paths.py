"""Blur IG and Guided IG: closed forms, completeness, batch invariance, errors (every backend).

PAIR's own closed-form checks: on a linear model Guided IG is exactly ``w (x - b)`` and on
``f = sum(x^2)`` any path gives ``x^2 - b^2`` per feature when features move one by one; Blur IG on a
linear model is ``w * (x - blur(x, max_sigma))`` up to the path's finite differences.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.numeric.blur import gaussian_blur_rows  # noqa: E402
from tests.conftest import assert_unchanged, snapshot  # noqa: E402


def linear(shape, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(2, name="out")])


def cnn(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((10, 10, 2)),
        keras.layers.Conv2D(3, 3, activation="tanh"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2),
    ])


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).uniform(-1, 1, (3, 10, 10, 2)).astype(np.float32)


def test_guided_ig_linear_closed_form():
    m = linear((5,))
    x = np.random.default_rng(1).normal(size=(4, 5)).astype(np.float32)
    w = m.get_layer("out").get_weights()[0][:, 1]
    got = ks.GuidedIG(m, steps=16, baseline=0.5, max_dist=0.1, batch_size=3).explain(x, 1).attributions
    np.testing.assert_allclose(got, w * (x - 0.5), rtol=1e-5, atol=1e-6)


def test_guided_ig_quadratic_closed_form():
    """f = sum(x^2): whatever the path's shape, a feature moved alone contributes x^2 - b^2 (PAIR's test)."""
    inp = keras.Input((6,))
    m = keras.Model(inp, keras.ops.sum(inp * inp, axis=1, keepdims=True))
    x = np.random.default_rng(2).uniform(0.5, 2.0, (2, 6)).astype(np.float32)
    got = ks.GuidedIG(m, steps=400, fraction=0.25, max_dist=1.0).explain(x, 0).attributions
    np.testing.assert_allclose(got.sum(axis=1), (x**2).sum(axis=1), rtol=1e-2)


def test_guided_ig_completeness_and_batch_invariance(images):
    # (a non-constant baseline: from a constant one, a conv net's equal interior gradients leave the first
    # step's choice to float rounding, which batching changes)
    m = cnn()
    start = np.random.default_rng(4).uniform(-0.2, 0.2, images.shape[1:]).astype(np.float32)
    e = ks.GuidedIG(m, steps=60, baseline=start, batch_size=2).explain(images, [0, 1, 0])
    base = keras.ops.convert_to_numpy(m(start[None]))[0, [0, 1, 0]]
    np.testing.assert_allclose(e.attributions.reshape(3, -1).sum(axis=1), e.scores - base, rtol=0.05, atol=0.02)
    one = ks.GuidedIG(m, steps=60, baseline=start).explain(images[1:2], 1).attributions
    np.testing.assert_allclose(e.attributions[1:2], one, rtol=1e-4, atol=1e-6)


def test_blur_ig_linear_closed_form(images):
    m = linear((10, 10, 2))
    w = m.get_layer("out").get_weights()[0][:, 0].reshape(10, 10, 2)
    got = ks.BlurIG(m, max_sigma=3.0, steps=300, grad_step=1e-3, batch_size=64).explain(images, 0).attributions
    expected = w * (images - gaussian_blur_rows(images, np.full(3, 3.0)))
    np.testing.assert_allclose(got, expected, atol=2e-2 * np.abs(expected).max())


def test_blur_ig_batch_invariance(images):
    m = cnn()
    a = ks.BlurIG(m, max_sigma=4.0, steps=9, batch_size=4).explain(images, 1).attributions
    b = ks.BlurIG(m, max_sigma=4.0, steps=9, batch_size=64).explain(images[::-1], 1).attributions[::-1]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_errors_and_model_unchanged(images):
    m = cnn()
    before = snapshot(m)
    with pytest.raises(ValueError, match="max_sigma"):
        ks.BlurIG(m, max_sigma=0)
    with pytest.raises(ValueError, match="fraction"):
        ks.GuidedIG(m, fraction=1.5)
    with pytest.raises(ValueError, match="max_dist"):
        ks.GuidedIG(m, max_dist=-0.1)
    with pytest.raises(ValueError, match="tabular"):
        ks.BlurIG(linear((4,))).explain(np.ones((1, 4)), 0)
    ks.explain(m, images, method="guided_ig", steps=3)
    ks.explain(m, images, method="blur_ig", steps=3, max_sigma=2)
    assert_unchanged(m, before)


@pytest.mark.parametrize("shape", [(3, 17, 2), (3, 9, 11, 3), (2, 5, 6, 7, 2)])
def test_blur_and_slope_rows_equal_scipy_on_sequences_images_and_volumes(shape):
    """The path points and their finite-difference slopes, per row, against ``scipy.ndimage`` in float64."""
    from scipy import ndimage

    from kerascope.numeric.blur import blur_and_slope_rows

    x = np.random.default_rng(1).normal(size=shape)
    sigmas, step = np.array([0.0, 1.5, 4.0])[: shape[0]], 0.01
    point, slope = blur_and_slope_rows(x.astype(np.float32), sigmas, step)
    spatial = len(shape) - 2

    def blur(row, s):
        return ndimage.gaussian_filter(row, [s] * spatial + [0.0], mode="constant", truncate=4.0)

    for r, s in enumerate(sigmas):
        np.testing.assert_allclose(point[r], blur(x[r], s), atol=1e-5)
        np.testing.assert_allclose(slope[r], (blur(x[r], s + step) - blur(x[r], s)) / step, atol=1e-3)
    assert point.flags.c_contiguous and slope.flags.c_contiguous and point.dtype == np.float32
