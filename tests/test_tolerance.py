"""``tolerance=``: IG doubles its path points on nested grids, noise wrappers / Expected Gradients add
antithetic pairs, until the estimated error is below the tolerance.

Checks against independent numbers: completeness with f(x) - f(baseline) from the model itself, the
non-adaptive quadrature with the same number of points, 1024-step / 1024-sample references, closed
forms on linear models; reproducibility with a seed and batch invariance.
"""

import warnings

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kerascope as ks
from kerascope.methods._convergence import correlation_error, next_pairs

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    m = keras.Sequential([
        keras.Input((10, 10, 1)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Conv2D(4, 3, activation="tanh", name="conv2"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, name="head"),
    ])
    weights = [w * 2.0 for w in m.get_weights()]
    m.set_weights(weights)
    return m


@pytest.fixture(scope="module")
def images():
    return RNG.uniform(0, 1, (3, 10, 10, 1)).astype(np.float32)


def logits(model, x):
    return np.asarray(keras.ops.convert_to_numpy(model(x)), np.float64)


def relative_l2(a, b):
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("rule", ["open_trapezoid", "riemann_trapezoid"])
def test_ig_tolerance_completeness_reference_and_same_as_fixed_rule(model, images, rule):
    targets = np.array([0, 1, 2])
    e = ks.IntegratedGradients(model, tolerance=0.01, method=rule, batch_size=16).explain(images, targets)
    # completeness against the model's own scores (zeros baseline)
    delta = logits(model, images)[np.arange(3), targets] - logits(model, np.zeros_like(images))[np.arange(3), targets]
    total = e.attributions.reshape(3, -1).astype(np.float64).sum(axis=1)
    assert np.all(np.abs(total - delta) / np.abs(delta) <= 0.01)
    if rule == "open_trapezoid":  # the map within the tolerance of a 1024-interval trapezoid reference
        ref = ks.IntegratedGradients(model, steps=1025, method="riemann_trapezoid", batch_size=1025).explain(
            images, targets)
        assert np.all(relative_l2(e.attributions, ref.attributions) <= 0.01)
    # steps recorded per sample, on the nested grid; a sample equals the fixed rule with its steps
    steps = e.extras["steps"]
    grids = {2**k + (1 if rule == "riemann_trapezoid" else -1) for k in range(3, 11)}
    assert set(steps.tolist()) <= grids and steps.max() < 1023
    i = int(np.argmax(steps))
    fixed = ks.IntegratedGradients(model, steps=int(steps[i]), method=rule).explain(images[i:i + 1], targets[i:i + 1])
    np.testing.assert_allclose(e.attributions[i:i + 1], fixed.attributions, rtol=1e-4, atol=1e-6)
    assert np.all(e.extras["estimated_error"] <= 0.01)
    assert e.params["tolerance"] == 0.01 and e.params["method"] == rule


def test_ig_tolerance_linear_model_stops_at_first_grid():
    lin = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    x = RNG.normal(size=(2, 4)).astype(np.float32)
    e = ks.IntegratedGradients(lin, tolerance=0.001).explain(x, 1)
    w = lin.layers[0].get_weights()[0][:, 1]
    np.testing.assert_allclose(e.attributions, x * w, rtol=1e-5, atol=1e-6)
    assert e.extras["steps"].tolist() == [7, 7]


def test_ig_tolerance_at_a_layer_reaches_completeness(model, images):
    e = ks.IntegratedGradients(model, layer="conv", tolerance=0.01).explain(images, 0)
    delta = e.scores.astype(np.float64) - e.extras["baseline_scores"]
    assert np.all(np.abs(e.extras["completeness_error"]) / np.abs(delta) <= 0.01)
    s = int(e.extras["steps"][0])
    fixed = ks.IntegratedGradients(model, layer="conv", steps=s, method="open_trapezoid").explain(images[:1], 0)
    np.testing.assert_allclose(e.attributions[:1], fixed.attributions, rtol=1e-4, atol=1e-6)


def test_ig_tolerance_cap_warns_and_refuses_non_nested_rules(model, images):
    with pytest.warns(RuntimeWarning, match=r"did not reach tolerance=1e-06 within max_steps=15"):
        e = ks.IntegratedGradients(model, tolerance=1e-6, max_steps=15).explain(images, 0)
    assert e.extras["steps"].tolist() == [15, 15, 15]
    with pytest.raises(ValueError, match="nested grids.*method='gausslegendre'"):
        ks.IntegratedGradients(model, tolerance=0.01, method="gausslegendre")
    with pytest.raises(ValueError, match=r"`tolerance` must be None or a number in \(0, 1\)"):
        ks.IntegratedGradients(model, tolerance=0)
    with pytest.raises(ValueError, match="first grid of 7 path points"):
        ks.IntegratedGradients(model, tolerance=0.1, max_steps=5)


def one_minus_rho(est, ref):
    """1 - rho per sample (rho: Pearson correlation of the flattened maps)."""
    return np.array([1 - np.corrcoef(a.ravel(), b.ravel())[0, 1] for a, b in zip(est, ref, strict=True)])


def test_smoothgrad_tolerance_reference_seed_and_batch_invariance(model, images):
    kw = {"noise": 0.3, "tolerance": 0.05}
    e = ks.SmoothGrad(model, **kw, batch_size=32).explain(images, 0)
    ref = ks.SmoothGrad(model, noise=0.3, samples=1024, seed=11, batch_size=1024).explain(images, 0)
    assert np.all(e.extras["estimated_error"] <= 0.05)
    # the estimate is honest: it estimates the *expected* 1 - rho; one realisation scatters
    # around it (see the test over seeds below), the reference adds a little of its own
    assert np.all(one_minus_rho(e.attributions, ref.attributions) <= 0.10)
    assert np.all(e.extras["samples"] % 2 == 0) and np.all(e.extras["samples"] >= 32)
    again = ks.SmoothGrad(model, **kw, batch_size=32).explain(images, 0)
    np.testing.assert_array_equal(again.attributions, e.attributions)
    alone = ks.SmoothGrad(model, **kw, batch_size=5).explain(images[2:], 0)
    np.testing.assert_allclose(alone.attributions, e.attributions[2:], rtol=1e-6, atol=1e-9)
    assert alone.extras["samples"].tolist() == e.extras["samples"][2:].tolist()
    other = ks.SmoothGrad(model, **kw, seed=1).explain(images, 0)
    assert not np.array_equal(other.attributions, e.attributions)


def test_noise_wrappers_tolerance_on_linear_model_closed_forms():
    lin = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    lin.layers[0].set_weights([np.array([[2.0], [-3.0], [0.5]])])
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    w = np.array([2.0, -3.0, 0.5])
    for cls, expected in ((ks.SmoothGrad, w), (ks.SmoothGradSquared, w**2), (ks.VarGrad, 0 * w)):
        e = cls(lin, tolerance=0.01, noise=0.5).explain(x, 0)
        np.testing.assert_allclose(e.attributions, np.tile(expected, (2, 1)), rtol=1e-5, atol=1e-5)
        assert e.extras["samples"].tolist() == [32, 32]  # constant gradients: no sampling noise


@pytest.mark.parametrize("cls", [ks.SmoothGradSquared, ks.VarGrad])
def test_squared_wrappers_tolerance_against_reference(model, images, cls):
    e = cls(model, noise=0.3, tolerance=0.05, batch_size=64).explain(images, 0)
    ref = cls(model, noise=0.3, samples=1024, seed=5, batch_size=1024).explain(images, 0)
    assert np.all(e.extras["estimated_error"] <= 0.05)
    assert np.all(one_minus_rho(e.attributions, ref.attributions) <= 0.10)


def test_expected_gradients_tolerance_against_reference(model, images):
    bg = RNG.uniform(0, 1, (6, 10, 10, 1)).astype(np.float32)
    e = ks.ExpectedGradients(model, baseline=bg, tolerance=0.05, batch_size=64).explain(images, 0)
    ref = ks.ExpectedGradients(model, baseline=bg, samples=2048, seed=9, batch_size=2048).explain(images, 0)
    assert np.all(e.extras["estimated_error"] <= 0.05)
    assert np.all(one_minus_rho(e.attributions, ref.attributions) <= 0.10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = ks.ExpectedGradients(model, baseline=bg, tolerance=0.05, batch_size=7).explain(images, 0)
    np.testing.assert_allclose(again.attributions, e.attributions, rtol=1e-5, atol=1e-7)
    with pytest.warns(RuntimeWarning, match="max_samples=8"):
        ks.ExpectedGradients(model, baseline=bg, tolerance=1e-4, samples=4, max_samples=8).explain(images, 0)


def test_estimated_error_is_one_minus_rho_and_honest_over_seeds(model, images):
    """Over seeds, the estimated 1 - rho stays within a factor ~2 of 1 - rho measured against a
    16384-sample reference (whose own error is ~100x smaller), and never far above the tolerance."""
    ref = ks.SmoothGrad(model, noise=0.3, samples=16384, seed=99, batch_size=4096).explain(images, 0).attributions
    estimated, measured = [], []
    for seed in range(6):
        e = ks.SmoothGrad(model, noise=0.3, tolerance=0.005, seed=seed, batch_size=64).explain(images, 0)
        assert np.all(e.extras["estimated_error"] <= 0.005)
        estimated.append(e.extras["estimated_error"].astype(np.float64))
        measured.append(one_minus_rho(e.attributions, ref))
    estimated, measured = np.concatenate(estimated), np.concatenate(measured)
    ratio = measured / estimated
    assert 0.3 <= ratio.min() and ratio.max() <= 2.5, ratio
    assert 0.6 <= float(np.mean(ratio)) <= 1.6, ratio
    assert measured.max() <= 0.01


def test_correlation_error_closed_form():
    f = np.array([0.0, 0.19, 0.36, 1.0, 3.0, np.inf])
    np.testing.assert_allclose(correlation_error(f), [0.0, 0.1, 0.2, 1.0, 1.0, np.inf])


@settings(max_examples=60, deadline=None)
@given(
    done=st.integers(2, 200),
    tolerance=st.floats(0.001, 0.3),
    start=st.floats(0.01, 0.9),
    other=st.floats(0.01, 3.0),
)
def test_predicted_round_reaches_the_tolerance_when_noise_falls_as_one_over_n(done, tolerance, start, other):
    """With noise over signal exactly ~ 1 / pairs, the round is sized for the sample nearest to its
    goal: it reaches the goal in one round unless the 4x limit holds it back; at least 4 more pairs."""
    cap = 10**6
    goal = 1 - (1 - tolerance) ** 2
    nearest = min(start, other) if other < 1 else start  # f >= 1: no signal yet, does not size the round
    needed = done * (nearest / (1 - nearest)) / (goal / (1 - goal))
    target = next_pairs(done, cap, np.array([start, other, np.inf]), tolerance)
    assert target == min(cap, 4 * done, max(done + 4, int(np.ceil(needed * 1.1 - 1e-9))))
    r = nearest / (1 - nearest) * done / target  # noise over signal of that sample at the target
    if needed * 1.1 <= 4 * done:
        assert correlation_error(np.array([r / (1 + r)]))[0] <= tolerance
    assert next_pairs(done, 10, np.array([start]), tolerance) <= 10
    assert next_pairs(done, cap, np.array([np.inf, 1.5]), tolerance) == next_pairs(done, cap)


@pytest.mark.parametrize("make", [
    # tolerances far below what 8 samples / 15 points reach on every backend's weights
    lambda m: ks.SmoothGrad(m, noise=0.3, tolerance=1e-8, samples=4, max_samples=8),
    lambda m: ks.ExpectedGradients(m, tolerance=1e-8, samples=4, max_samples=8),
    lambda m: ks.IntegratedGradients(m, tolerance=1e-8, max_steps=15),
    lambda m: ks.IntegratedGradients(m, layer="conv", tolerance=1e-8, max_steps=15),
])
def test_not_converged_warning_points_at_the_users_call(model, images, make):
    with pytest.warns(RuntimeWarning, match="did not reach tolerance") as record:
        make(model).explain(images, 0)
    assert [w.filename for w in record if "did not reach" in str(w.message)] == [__file__]
