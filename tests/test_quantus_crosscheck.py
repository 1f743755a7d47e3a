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

from kerascope import metrics  # noqa: E402
from tests._quantus import build_pair, images, import_quantus, nchw  # noqa: E402

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
