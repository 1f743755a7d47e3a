"""ROAD's imputation and curves, and the Quantus-named MPRT variants: closed forms and properties, all backends."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kerascope import metrics  # noqa: E402


def linear_model(seed: int = 0, size: int = 6, classes: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((size, size, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(classes, name="d")])


def cnn(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3, activation="relu", name="c"),
                             keras.layers.Flatten(), keras.layers.Dense(3, name="d")])


def images(n: int = 3, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, (n, 6, 6, 1)).astype(np.float32)


# ----------------------------------------------------------------------------- ROAD
def test_imputation_reproduces_a_linear_image_in_interior_holes():
    r, c = np.meshgrid(np.arange(7.0), np.arange(8.0), indexing="ij")
    x = np.stack([2 * r - 3 * c + 1, 0.5 * r + c], -1)[None].astype(np.float32)  # each channel linear
    hole = np.zeros((1, 7, 8), bool)
    hole[0, 2:5, 2:6] = True  # interior: the symmetric stencil's mean of a linear function is its centre
    np.testing.assert_allclose(metrics.linear_imputation(x, hole), x, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.05, 0.95))
def test_imputation_keeps_known_pixels_and_stays_within_their_range(seed, share):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 5, 6, 2)).astype(np.float32)
    removed = rng.random((2, 30)) < share
    removed[:, 0] = False  # at least one known pixel per image
    out = metrics.linear_imputation(x, removed).reshape(2, 30, 2)
    flat = x.reshape(2, 30, 2)
    np.testing.assert_array_equal(out[~removed], flat[~removed])
    lo = np.where(removed[..., None], np.inf, flat).min(1)
    hi = np.where(removed[..., None], -np.inf, flat).max(1)
    for j in range(2):  # a weighted mean of neighbours with positive weights: the maximum principle
        assert np.all(out[j][removed[j]] >= lo[j] - 1e-5) and np.all(out[j][removed[j]] <= hi[j] + 1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.05, 0.98), st.integers(2, 9), st.integers(2, 9))
def test_imputed_pixels_solve_the_stencil_equations(seed, share, h, w):
    # the defining equations, whatever solver: a removed pixel is the weighted mean of its in-image
    # neighbours (1/6 direct, 1/12 diagonal), removed neighbours with their imputed values
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3, h, w, 2)).astype(np.float32)
    removed = rng.random((3, h * w)) < share
    removed[np.arange(3), rng.integers(0, h * w, 3)] = False  # at least one known pixel per image
    out = np.pad(metrics.linear_imputation(x, removed).astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    inside = np.pad(np.ones((3, h, w, 1)), ((0, 0), (1, 1), (1, 1), (0, 0)))
    total, weight = 0.0, 0.0
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr or dc:
                wgt = 1 / 12 if dr and dc else 1 / 6
                shift = (slice(None), slice(1 + dr, 1 + dr + h), slice(1 + dc, 1 + dc + w))
                total, weight = total + wgt * out[shift], weight + wgt * inside[shift]
    mean = (total / weight).reshape(3, h * w, 2)
    np.testing.assert_allclose(out[:, 1:-1, 1:-1].reshape(3, h * w, 2)[removed], mean[removed], atol=1e-4)


def test_imputation_noise_has_the_requested_spread():
    x = np.zeros((4, 16, 16, 1), np.float32)
    removed = np.ones((4, 256), bool)
    removed[:, 0] = False
    out = metrics.linear_imputation(x, removed, noise=0.3, rng=np.random.default_rng(0))
    assert abs(out.reshape(4, -1)[:, 1:].std() - 0.3) < 0.02


def test_road_curve_on_a_linear_model_and_batch_invariance():
    model = linear_model()
    x = images(4)
    maps = np.random.default_rng(3).normal(size=(4, 6, 6)).astype(np.float32)
    r = metrics.road(model, x, maps, percentages=[0, 30, 60, 90], noise=0.0, batch_size=64)
    np.testing.assert_array_equal(r.curves[:, 0], 1.0)  # nothing removed: the prediction is the target
    # by hand: impute, then a plain matrix product with the dense kernel
    kernel, bias = model.get_layer("d").get_weights()
    order = np.argsort(-maps.reshape(4, -1), axis=1, kind="stable")
    for k, p in enumerate([0, 30, 60, 90]):
        removed = np.zeros((4, 36), bool)
        np.put_along_axis(removed, order[:, :int(36 * p / 100)], True, axis=1)
        logits = metrics.linear_imputation(x, removed).reshape(4, -1) @ kernel + bias
        np.testing.assert_array_equal(r.curves[:, k], logits.argmax(1) == r.details["targets"])
        np.testing.assert_allclose(r.details["probabilities"][:, k],
                                   logits[np.arange(4), r.details["targets"]], rtol=1e-4, atol=1e-4)
    small = metrics.road(model, x, maps, percentages=[0, 30, 60, 90], noise=0.0, batch_size=3)
    np.testing.assert_array_equal(small.curves, r.curves)
    np.testing.assert_allclose(r.scores, r.curves.mean(1))


def test_road_noise_is_seeded_and_lerf_reads_higher():
    model, x = linear_model(), images(3)
    a = np.abs(x[..., 0])
    one = metrics.road(model, x, a, 0, percentages=[50, 90], noise=0.5, seed=4)
    two = metrics.road(model, x, a, 0, percentages=[50, 90], noise=0.5, seed=4)
    np.testing.assert_array_equal(one.details["probabilities"], two.details["probabilities"])
    chunked = metrics.road(model, x, a, 0, percentages=[50, 90], noise=0.5, seed=4, batch_size=1)
    np.testing.assert_allclose(chunked.details["probabilities"], one.details["probabilities"], rtol=1e-5, atol=1e-6)
    other = metrics.road(model, x, a, 0, percentages=[50, 90], noise=0.5, seed=5)
    assert not np.allclose(other.details["probabilities"], one.details["probabilities"])
    assert not metrics.road(model, x, a, 0, percentages=[50], order="morf").higher_is_better
    assert metrics.road(model, x, a, 0, percentages=[50], order="lerf").higher_is_better


@pytest.mark.parametrize("kwargs, match", [
    ({"percentages": [120]}, "percentages"), ({"percentages": [50, 100]}, "below 100"), ({"order": "random"}, "order"),
    ({"noise": -1.0}, "noise"),
])
def test_road_refuses_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        metrics.road(linear_model(), images(1), np.ones((1, 6, 6)), 0, **kwargs)


# ----------------------------------------------------------------------------- MPRT
def test_mprt_names_map_to_model_randomisation():
    model, x = cnn(), images(2)
    for order, mode in [("top_down", "cascading"), ("independent", "independent")]:
        r = metrics.mprt(model, x, "saliency", 0, layer_order=order, seed=5)
        ref = metrics.model_randomisation(model, "saliency", x, 0, mode=mode, seed=5)
        np.testing.assert_allclose(r.curves, ref.spearman.T)
        np.testing.assert_allclose(r.scores, ref.spearman[-1])
        assert r.details["layers"] == ["d", "c"] and not r.higher_is_better
    avg = metrics.mprt(model, x, "saliency", 0, seed=5, return_average_correlation=True)
    np.testing.assert_allclose(avg.scores, avg.curves.mean(1))
    with pytest.raises(ValueError, match="layer_order='bottom_up'"):
        metrics.mprt(model, x, "saliency", 0, layer_order="bottom_up")


def test_smooth_mprt_of_a_gradient_that_ignores_the_input_equals_mprt():
    model, x = linear_model(), images(2)  # the saliency of a linear model is its kernel: noise changes nothing
    smooth = metrics.smooth_mprt(model, x, "saliency", 1, nr_samples=5, noise_magnitude=0.3, seed=2)
    plain = metrics.mprt(model, x, "saliency", 1, seed=2)
    np.testing.assert_allclose(smooth.scores, plain.scores, atol=1e-6)


def test_smooth_mprt_averages_noisy_explanations():
    model, x = cnn(1), images(2)
    seen = []

    def method(m, inputs, targets):
        seen.append((np.asarray(inputs).copy(), np.asarray(targets).copy()))
        return np.asarray(inputs) ** 2  # an "explanation" whose average is easy to write down

    metrics.smooth_mprt(model, x, method, [0, 2], nr_samples=4, noise_magnitude=0.2, seed=7)
    noisy, targets = seen[0]
    assert noisy.shape == (8, 6, 6, 1) and targets.tolist() == [0, 2] * 4
    std = 0.2 * (x.max(axis=(1, 2, 3)) - x.min(axis=(1, 2, 3)))
    spread = (noisy.reshape(4, 2, -1) - x.reshape(1, 2, -1)).std(axis=(0, 2))
    np.testing.assert_allclose(spread, std, rtol=0.3)
    np.testing.assert_array_equal(seen[1][0], noisy)  # every model state sees the same draws


def test_efficient_mprt_of_a_linear_model_by_hand():
    model, x = linear_model(), images(2)
    before = [w.copy() for w in model.get_weights()]
    r = metrics.efficient_mprt(model, x, "saliency", [0, 2], n_bins=10, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    kernel = model.get_layer("d").get_weights()[0]
    copy = metrics.copy_model(model, x)
    metrics.randomise_layer(copy.get_layer("d"), 3 * 7919)
    randomised = copy.get_layer("d").get_weights()[0]

    def entropy(v):  # np.histogram + the entropy formula
        counts = np.histogram(v, bins=10)[0]
        p = counts[counts > 0] / counts.sum()
        return -(p * np.log(p)).sum()

    for i, t in enumerate([0, 2]):
        h0, h1 = entropy(kernel[:, t]), entropy(randomised[:, t])
        np.testing.assert_allclose(r.scores[i], (h1 - h0) / h0, rtol=1e-5)
    assert r.higher_is_better and r.details["layers"] == ["d"]
