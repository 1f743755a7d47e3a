"""Cross-checks of the Quantus metric families against Quantus 0.6.0 on identical inputs.

Quantus runs on a PyTorch twin of a tiny Keras CNN with identical weights (tests/_quantus.py); both sides get
the same inputs, attributions, masks and targets, with Quantus's ``normalise=False`` and the same ``abs``.
Agreement: 1e-4 (float32 models on both sides). Runs on the TensorFlow backend only (the reference is torch).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _quantus import build_pair, images, import_quantus, nchw, torch_saliency  # noqa: E402 - tests/ is on sys.path

from kerascope import metrics  # noqa: E402

pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                       reason="Quantus reference cross-checks run once, on the TensorFlow backend"),
]

N = 4


@pytest.fixture(scope="module")
def quantus():
    return import_quantus()


@pytest.fixture(scope="module")
def pair():
    return build_pair()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x = images(N)
    maps = rng.normal(size=(N, 8, 8)).astype(np.float32)
    masks = np.zeros((N, 8, 8), bool)
    masks[0, :4, :4] = masks[1, 2:7, 1:5] = masks[2, 4:, :] = masks[3, 1:3, 5:8] = True
    return x, np.array([0, 1, 2, 1]), maps, masks


def run(quantus, cls, net, x, y, a, s=None, call=None, **params):
    metric = getattr(quantus, cls)(normalise=False, disable_warnings=True, **params)
    kwargs = dict(model=net, x_batch=nchw(x), y_batch=y, a_batch=a[:, None].copy(), channel_first=True,
                  **(call or {}))
    if s is not None:
        kwargs["s_batch"] = s[:, None].astype(np.float32)
    return np.asarray(metric(**kwargs), np.float64)


@pytest.mark.parametrize("name, cls, params", [
    ("sparseness", "Sparseness", {}),
    ("complexity", "Complexity", {}),
    ("effective_complexity", "EffectiveComplexity", {"eps": 0.5}),
    ("sparseness", "Sparseness", {"abs": False}),
])
def test_complexity_equals_quantus(quantus, pair, data, name, cls, params):
    x, y, maps, _ = data
    positive = np.abs(maps) if params.get("abs") is False else maps  # signed Gini/entropy are Quantus's own ill-defined cases
    expected = run(quantus, cls, pair[1], x, y, positive, **({"abs": True} | params))
    ours = getattr(metrics, name)(positive, **params).scores
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name, cls, params", [
    ("relevance_mass_accuracy", "RelevanceMassAccuracy", {}),
    ("relevance_mass_accuracy", "RelevanceMassAccuracy", {"abs": True}),
    ("relevance_rank_accuracy", "RelevanceRankAccuracy", {}),
    ("attribution_localisation", "AttributionLocalisation", {}),
    ("attribution_localisation", "AttributionLocalisation", {"abs": False, "positive_attributions": True}),
    ("top_k_intersection", "TopKIntersection", {"k": 10}),
    ("top_k_intersection", "TopKIntersection", {"k": 10, "concept_influence": True}),
    ("auc", "AUC", {}),
])
def test_localisation_equals_quantus(quantus, pair, data, name, cls, params):
    x, y, maps, masks = data
    expected = run(quantus, cls, pair[1], x, y, maps, masks, **params)
    ours = getattr(metrics, name)(maps, masks, **params).scores
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-6)


def test_auc_with_ties_equals_quantus(quantus, pair, data):
    x, y, maps, masks = data
    tied = np.round(maps).astype(np.float32)  # few distinct values: ROC steps through tied groups
    np.testing.assert_allclose(metrics.auc(tied, masks).scores, run(quantus, "AUC", pair[1], x, y, tied, masks),
                               rtol=1e-6)


def test_focus_equals_quantus_on_mosaic_flags(quantus, pair, data):
    x, y, maps, _ = data
    flags = np.array([[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]])
    expected = run(quantus, "Focus", pair[1], x, y, maps, call={"custom_batch": flags})
    np.testing.assert_allclose(metrics.focus(maps, flags).scores, expected, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- faithfulness
def element_attributions(seed: int = 11) -> np.ndarray:
    """Per-element attributions ``(N, H, W, C)`` with distinct values (no ties to break)."""
    return np.random.default_rng(seed).permutation(N * 8 * 8 * 3).reshape(N, 8, 8, 3).astype(np.float32)


def quantus_model_call(quantus, cls, net, x, y, a_nchw, call=None, **params):
    metric = getattr(quantus, cls)(normalise=False, disable_warnings=True, **params)
    return metric(model=net, x_batch=nchw(x), y_batch=y, a_batch=a_nchw.copy(), channel_first=True,
                  **(call or {}))


def test_pixel_flipping_equals_quantus(quantus, pair, data):
    model, net = pair
    x, y, _, _ = data
    a = element_attributions()
    ours = metrics.pixel_flipping(model, x, a, y, features_in_step=4)
    a_q, step = nchw(a), 4
    curves = np.asarray(quantus_model_call(quantus, "PixelFlipping", net, x, y, a_q, features_in_step=step,
                                           abs=False, call={"softmax": True}), np.float64)
    np.testing.assert_allclose(ours.curves, curves, atol=1e-4)
    # Quantus's return_auc_per_sample calls np.trapz, gone in NumPy 2: its rule, written out
    np.testing.assert_allclose(ours.scores, (curves[:, 1:] + curves[:, :-1]).sum(1) / 2, rtol=1e-4)


@pytest.mark.parametrize("patch_size, order, regions", [(2, "morf", 10), (3, "lerf", 100), (3, "morf", 5)])
def test_region_perturbation_equals_quantus(quantus, pair, data, patch_size, order, regions):
    model, net = pair
    x, y, maps, _ = data
    ours = metrics.region_perturbation(model, x, maps, y, patch_size=patch_size, order=order, regions=regions)
    curves = quantus_model_call(quantus, "RegionPerturbation", net, x, y, maps[:, None], patch_size=patch_size,
                                order=order, regions_evaluation=regions, abs=False, call={"softmax": True})
    np.testing.assert_allclose(ours.curves, np.asarray(curves, np.float64), atol=1e-4)


@pytest.mark.parametrize("patch_size", [3, 4])
def test_selectivity_equals_quantus(quantus, pair, data, patch_size):
    model, net = pair
    x, y, _, _ = data
    a = element_attributions(2)
    ours = metrics.selectivity(model, x, a, y, patch_size=patch_size)
    curves = quantus_model_call(quantus, "Selectivity", net, x, y, nchw(a), patch_size=patch_size, abs=False,
                                call={"softmax": True})
    np.testing.assert_allclose(ours.curves, np.asarray(curves, np.float64), atol=1e-4)


def test_faithfulness_estimate_equals_quantus(quantus, pair, data):
    model, net = pair
    x, y, _, _ = data
    a = element_attributions(4)
    ours = metrics.faithfulness_estimate(model, x, a, y, features_in_step=8)
    expected = quantus_model_call(quantus, "FaithfulnessEstimate", net, x, y, nchw(a), features_in_step=8,
                                  abs=False, call={"softmax": False})
    np.testing.assert_allclose(ours.scores, np.asarray(expected, np.float64), atol=1e-4)


def test_faithfulness_correlation_equals_quantus_on_the_same_draws(quantus, pair, data):
    model, net = pair
    x, y, _, _ = data
    a = element_attributions(6)
    runs, size, d = 12, 20, 8 * 8 * 3
    np.random.seed(123)
    drawn = []
    for _ in range(runs):  # Quantus's draw order: runs outer, samples inner (NCHW element indices) ...
        drawn.append(np.stack([np.random.choice(d, size, replace=False) for _ in range(N)]))
        np.random.uniform(size=N)  # ... and its baseline table draws a "uniform" entry at every perturbation
    drawn = np.stack(drawn, axis=1)
    c, p = drawn // 64, drawn % 64
    ours = metrics.faithfulness_correlation(model, x, a, y, subsets=p * 3 + c)
    np.random.seed(123)
    expected = quantus_model_call(quantus, "FaithfulnessCorrelation", net, x, y, nchw(a), nr_runs=runs,
                                  subset_size=size, abs=False, return_aggregate=False,
                                  call={"softmax": False})
    np.testing.assert_allclose(ours.scores, np.asarray(expected, np.float64), atol=1e-4)


@pytest.mark.parametrize("perturbation", ["mean", "black"])
def test_irof_equals_quantus_on_grey_images(quantus, monkeypatch, perturbation):
    """Quantus's IROF masks with a one-channel mask (grey images only) and takes its baseline over the whole
    batch: one image per call makes that the image's own, as kerascope's. Its AOC calls np.trapz (removed in
    NumPy 2): NumPy's own renamed function is put back under the old name for it."""
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)
    model, net = build_pair(seed=1, size=16, channels=1)
    x = np.random.default_rng(8).random((2, 16, 16, 1)).astype(np.float32)
    a = np.random.default_rng(9).normal(size=(2, 16, 16)).astype(np.float32)
    y = np.array([0, 2])
    ours = metrics.irof(model, x, a, y, perturbation=perturbation)
    for i in range(2):
        metric = quantus.IROF(normalise=False, disable_warnings=True, abs=False, perturb_baseline=perturbation,
                              return_aggregate=False)
        expected = metric(model=net, x_batch=nchw(x[i:i + 1]), y_batch=y[i:i + 1], a_batch=a[i:i + 1, None].copy(),
                          channel_first=True, softmax=True)
        assert ours.scores[i] == pytest.approx(expected[0], rel=1e-4)


# ----------------------------------------------------------------------------- robustness
@pytest.mark.parametrize("name, cls, params, draw", [
    ("max_sensitivity", "MaxSensitivity", {"lower_bound": 0.3}, lambda shape: np.random.uniform(-0.3, 0.3, shape)),
    ("avg_sensitivity", "AvgSensitivity", {"lower_bound": 0.3}, lambda shape: np.random.uniform(-0.3, 0.3, shape)),
    ("local_lipschitz_estimate", "LocalLipschitzEstimate", {"perturb_std": 0.2},
     lambda shape: np.random.normal(0.0, 0.2, shape)),
    ("relative_input_stability", "RelativeInputStability", {"return_nan_when_prediction_changes": False},
     lambda shape: np.random.uniform(0.02, 0.2, shape)),
    ("relative_output_stability", "RelativeOutputStability", {"return_nan_when_prediction_changes": False},
     lambda shape: np.random.uniform(0.02, 0.2, shape)),
])
def test_robustness_equals_quantus_on_the_same_draws(quantus, pair, data, name, cls, params, draw):
    model, net = pair
    x, y, _, _ = data
    samples = 6
    np.random.seed(321)
    noise = np.stack([draw((N, 3 * 8 * 8)) for _ in range(samples)], axis=1)  # Quantus: one (N, D) draw per step
    ours_noise = noise.reshape(N, samples, 3, 8, 8).transpose(0, 1, 3, 4, 2)
    extra = {"return_nan_when_prediction_changes": False} if name.startswith("relative") else {}
    ours = getattr(metrics, name)(model, x, "saliency", y, samples=samples, perturbations=ours_noise, **extra)
    np.random.seed(321)
    metric = getattr(quantus, cls)(normalise=False, disable_warnings=True, nr_samples=samples, abs=False,
                                   return_aggregate=False, **params)
    a = torch_saliency(net, nchw(x), y)
    expected = metric(model=net, x_batch=nchw(x), y_batch=y, a_batch=a, channel_first=True,
                      explain_func=torch_saliency)
    np.testing.assert_allclose(ours.scores, np.asarray(expected, np.float64), rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- axiomatic
def test_non_sensitivity_equals_quantus(quantus, pair, data):
    model, net = pair
    x, y, _, _ = data
    a = element_attributions(12).astype(np.float32)
    a[a % 3 == 0] = 0.0  # a third of the elements unattributed
    ours = metrics.non_sensitivity(model, x, a, y, eps=1e-5)
    metric = quantus.NonSensitivity(normalise=False, disable_warnings=True, eps=1e-5, features_in_step=1, abs=True)
    expected = metric(model=net, x_batch=nchw(x), y_batch=y, a_batch=nchw(a), channel_first=True, softmax=True)
    np.testing.assert_array_equal(ours.scores, np.asarray(expected, np.float64))


# ----------------------------------------------------------------------------- randomisation
def test_random_logit_equals_quantus(quantus, pair, data):
    model, net = pair
    x, y, _, _ = data

    def torch_saliency_map(model, inputs, targets, **kwargs):  # per-pixel maps: the same flattening on both sides
        return torch_saliency(model, inputs, targets).sum(1, keepdims=True)

    def ours_map(m, inputs, targets):
        import kerascope as ks

        return ks.Saliency(m).explain(inputs, targets).attributions.sum(-1)

    ours = metrics.random_logit(model, x, ours_map, y, num_classes=3, seed=42)
    metric = quantus.RandomLogit(normalise=False, disable_warnings=True, num_classes=3, seed=42, abs=False,
                                 return_aggregate=False)
    expected = metric(model=net, x_batch=nchw(x), y_batch=y, a_batch=torch_saliency_map(net, nchw(x), y),
                      channel_first=True, explain_func=torch_saliency_map)
    np.testing.assert_allclose(ours.scores, np.asarray(expected, np.float64), rtol=1e-4, atol=1e-5)


def test_ssim_1d_equals_skimage():
    from skimage.metrics import structural_similarity

    rng = np.random.default_rng(13)
    a, b = rng.normal(size=(3, 50)), rng.normal(size=(3, 50))
    expected = [structural_similarity(p, q, data_range=float(np.ptp(np.concatenate([p, q])))) for p, q in zip(a, b)]
    np.testing.assert_allclose(metrics.ssim_1d(a, b), expected, rtol=1e-10)


def test_consistency_equals_quantus(quantus, pair):
    model, net = pair
    x = images(8, seed=17) * np.array([-6, -6, 6, 6, -3, 3, -3, -3], np.float32)[:, None, None, None]
    y = np.zeros(8, np.int64)
    maps = np.random.default_rng(18).normal(size=(8, 8, 8)).astype(np.float32)
    maps[:, 0, :5] = np.sign(maps[[0, 0, 0, 3, 3, 5, 5, 5], 0, :5])  # groups share their first 5 signs
    ours = metrics.consistency(model, x, attributions=maps, abs=False)
    metric = quantus.Consistency(normalise=False, disable_warnings=True, abs=False, return_aggregate=False)
    expected = metric(model=net, x_batch=nchw(x), y_batch=y, a_batch=maps[:, None].copy(), channel_first=True)
    np.testing.assert_allclose(ours.scores, np.asarray(expected, np.float64), atol=1e-9)
    assert len(set(np.round(ours.scores, 6))) > 1  # predictions and labels both vary here
