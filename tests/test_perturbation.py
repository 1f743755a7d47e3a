"""Perturbation family: Occlusion and RISE against independent (looped) numpy computations."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods.perturbation import rise_masks, window_starts  # noqa: E402

RNG = np.random.default_rng(11)


def linear_image_model(shape=(7, 6, 2), seed=0) -> tuple[keras.Model, np.ndarray]:
    """f_c(x) = sum(W_c * x) + b_c: occlusion differences are sums of W * x over a window."""
    model = keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(3, name="d")])
    w = np.random.default_rng(seed).normal(size=(int(np.prod(shape)), 3)).astype(np.float32)
    model.get_layer("d").set_weights([w, np.array([0.1, -0.2, 0.3], np.float32)])
    return model, w


def looped_occlusion(x, weights_c, window, stride, baseline):
    """Independent reference: explicit loops over windows (positions as documented)."""
    n, h, w, _ = x.shape
    rows = list(range(0, h - window[0] + 1, stride[0]))
    cols = list(range(0, w - window[1] + 1, stride[1]))
    if rows[-1] + window[0] < h:
        rows.append(h - window[0])
    if cols[-1] + window[1] < w:
        cols.append(w - window[1])
    total = np.zeros((n, h, w))
    count = np.zeros((h, w))
    for r in rows:
        for c in cols:
            sl = (slice(None), slice(r, r + window[0]), slice(c, c + window[1]))
            drop = ((x[sl] - baseline) * weights_c[sl[1:]]).reshape(n, -1).sum(axis=1)
            total[sl] += drop[:, None, None]
            count[sl[1:]] += 1
    return np.repeat((total / count)[..., None], x.shape[-1], axis=-1)


@pytest.mark.parametrize("window, stride, baseline", [((2, 3), (2, 3), 0.0), ((3, 2), (2, 1), 0.5), ((4, 4), (3, 5), -1.0)])
def test_occlusion_linear_model_closed_form(window, stride, baseline, unchanged):
    model, w = linear_image_model()
    check = unchanged(model)
    x = RNG.normal(size=(3, 7, 6, 2)).astype(np.float32)
    e = ks.Occlusion(model, window=window, stride=stride, baseline=baseline, batch_size=7).explain(x, 2)
    expected = looped_occlusion(x, w[:, 2].reshape(7, 6, 2), window, stride, baseline)
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-4, atol=1e-5)
    assert e.attributions.shape == x.shape
    check()


def test_occlusion_tabular_targets_and_batching():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    x = RNG.normal(size=(4, 5)).astype(np.float32)
    e = ks.Occlusion(model, window=1).explain(x)
    logits = model.predict(x, verbose=0)
    np.testing.assert_array_equal(e.targets, logits.argmax(axis=1))
    # window 1 over features: the score drop when each feature alone is set to 0.
    for j in range(5):
        occluded = x.copy()
        occluded[:, j] = 0.0
        drop = logits[np.arange(4), e.targets] - model.predict(occluded, verbose=0)[np.arange(4), e.targets]
        np.testing.assert_allclose(e.attributions[:, j], drop, rtol=1e-4, atol=1e-5)
    small = ks.Occlusion(model, window=2, stride=1, batch_size=3).explain(x, e.targets)
    big = ks.Occlusion(model, window=2, stride=1, batch_size=64).explain(x, e.targets)
    np.testing.assert_allclose(small.attributions, big.attributions, rtol=1e-5, atol=1e-6)
    alone = ks.Occlusion(model, window=2, stride=1).explain(x[2:3], int(e.targets[2]))
    np.testing.assert_allclose(alone.attributions[0], big.attributions[2], rtol=1e-5, atol=1e-6)
    assert window_starts(5, 2, 2).tolist() == [0, 2, 3]


def test_rise_masks():
    masks = rise_masks(400, (20, 18), cell=5, p=0.3, seed=4)
    assert masks.shape == (400, 20, 18)
    assert masks.min() >= 0.0 and masks.max() <= 1.0
    assert abs(masks.mean() - 0.3) < 0.03
    # Mask m depends on (seed, m) only, not on how they are drawn.
    again = np.concatenate([rise_masks(150, (20, 18), 5, 0.3, 4), rise_masks(400, (20, 18), 5, 0.3, 4)[150:]])
    np.testing.assert_array_equal(masks, again)
    assert not np.array_equal(masks, rise_masks(400, (20, 18), 5, 0.3, seed=5))
    # Smooth: bilinear upsampling of cells of ceil(20 / 5) = 4 pixels never jumps by more than 1/4.
    assert np.abs(np.diff(masks, axis=1)).max() <= 0.25 + 1e-6


def test_rise_equals_looped_reference(unchanged):
    model, _ = linear_image_model((8, 8, 2))
    model = keras.Sequential([model, keras.layers.Softmax()])
    check = unchanged(model)
    x = RNG.uniform(0, 1, (3, 8, 8, 2)).astype(np.float32)
    e = ks.RISE(model, masks=50, cell=3, p=0.5, seed=2, batch_size=16).explain(x)
    probs = model.predict(x, verbose=0)
    np.testing.assert_array_equal(e.targets, probs.argmax(axis=1))
    masks = rise_masks(50, (8, 8), 3, 0.5, 2)
    expected = np.zeros((3, 8, 8))
    for m in range(50):  # independent reference: one image batch per mask
        out = keras.ops.convert_to_numpy(model(x * masks[m][None, :, :, None]))
        expected += out[np.arange(3), e.targets][:, None, None] * masks[m][None]
    np.testing.assert_allclose(e.attributions, expected / (50 * 0.5), rtol=1e-4, atol=1e-6)
    check()


def test_rise_seeds_batches_and_p_one():
    model, _ = linear_image_model((8, 8, 1))
    x = RNG.uniform(0, 1, (3, 8, 8, 1)).astype(np.float32)
    one = ks.RISE(model, masks=40, cell=2, seed=9, batch_size=7).explain(x, 1).attributions
    two = ks.RISE(model, masks=40, cell=2, seed=9, batch_size=64).explain(x, 1).attributions
    other = ks.RISE(model, masks=40, cell=2, seed=10).explain(x, 1).attributions
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)
    assert not np.allclose(one, other)
    alone = ks.RISE(model, masks=40, cell=2, seed=9).explain(x[1:2], 1).attributions
    np.testing.assert_allclose(alone[0], one[1], rtol=1e-5, atol=1e-6)
    # p = 1 keeps everything: every mask is 1, so the map is f(x) everywhere.
    full = ks.RISE(model, masks=5, cell=2, p=1.0, output="logits").explain(x, 1)
    np.testing.assert_allclose(full.attributions, np.broadcast_to(full.scores[:, None, None], (3, 8, 8)), rtol=1e-5)


def test_perturbation_errors():
    model, _ = linear_image_model((8, 8, 1))
    x = np.zeros((1, 8, 8, 1), np.float32)
    with pytest.raises(ValueError, match="window"):
        ks.Occlusion(model, window=(2, 2, 2)).explain(x)
    with pytest.raises(ValueError, match="p=0"):
        ks.RISE(model, p=0)
    tabular = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="images"):
        ks.RISE(tabular, masks=2).explain(np.zeros((1, 4), np.float32))
    a, b = keras.Input((2,)), keras.Input((2,))
    two = keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    with pytest.raises(ValueError, match="none of them are images.*choose the input.*`input_index=`"):
        ks.Occlusion(two, window=1).explain([np.zeros((1, 2)), np.zeros((1, 2))])
