"""Properties and closed forms of the Quantus metric families (any backend; tests/test_quantus_crosscheck.py
compares them with Quantus itself)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kerascope import metrics  # noqa: E402


def test_complexity_closed_forms():
    d = 16
    uniform, onehot = np.ones((1, 4, 4)), np.zeros((1, 4, 4))
    onehot[0, 1, 2] = 5.0
    assert metrics.sparseness(uniform).scores[0] == pytest.approx(0.0, abs=1e-9)
    assert metrics.sparseness(onehot).scores[0] == pytest.approx((d - 1) / d, abs=1e-6)
    assert metrics.complexity(uniform).scores[0] == pytest.approx(np.log(d), abs=1e-9)
    assert metrics.complexity(onehot).scores[0] == pytest.approx(0.0, abs=1e-9)
    assert metrics.effective_complexity(onehot, eps=1.0).scores.tolist() == [1.0]
    assert metrics.sparseness(uniform).higher_is_better and not metrics.complexity(uniform).higher_is_better


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 2**31 - 1))
def test_complexity_is_scale_and_permutation_invariant(n, side, seed):
    a = np.random.default_rng(seed).normal(size=(n, side, side))
    perm = np.random.default_rng(seed + 1).permutation(side * side)
    shuffled = a.reshape(n, -1)[:, perm].reshape(a.shape)
    for metric in (metrics.sparseness, metrics.complexity):
        np.testing.assert_allclose(metric(3.0 * a).scores, metric(a).scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(metric(shuffled).scores, metric(a).scores, rtol=1e-9)


def test_localisation_perfect_and_inverted_maps():
    masks = np.zeros((2, 6, 6), bool)
    masks[:, 1:4, 2:5] = True
    perfect = masks.astype(float) + 0.01 * np.random.default_rng(0).random((2, 6, 6))
    inverted = 1.0 - perfect
    assert metrics.auc(perfect, masks).scores.tolist() == [1.0, 1.0]
    assert metrics.auc(inverted, masks).scores.tolist() == [0.0, 0.0]
    assert metrics.relevance_rank_accuracy(perfect, masks).scores.tolist() == [1.0, 1.0]
    assert metrics.top_k_intersection(perfect, masks, k=9).scores.tolist() == [1.0, 1.0]
    np.testing.assert_allclose(metrics.relevance_mass_accuracy(masks.astype(float), masks).scores, 1.0)
    empty = np.zeros_like(masks)
    assert np.isnan(metrics.auc(perfect, empty).scores).all()
    assert np.isnan(metrics.relevance_mass_accuracy(perfect, empty).scores).all()


def test_auc_equals_pairwise_probability_with_ties():
    rng = np.random.default_rng(1)
    a = np.round(rng.normal(size=(3, 5, 5)))
    s = rng.random((3, 5, 5)) < 0.3
    expected = []
    for ai, si in zip(a.reshape(3, -1), s.reshape(3, -1), strict=True):
        pos, neg = ai[si], ai[~si]
        diff = pos[:, None] - neg[None, :]
        expected.append(((diff > 0) + 0.5 * (diff == 0)).mean())
    np.testing.assert_allclose(metrics.auc(a, s).scores, expected, rtol=1e-12)


def test_pixel_masks_apply_to_every_channel():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(2, 4, 4, 3))
    m = rng.random((2, 4, 4)) < 0.5
    per_channel = np.repeat(m[..., None], 3, axis=-1)
    for metric in (metrics.relevance_mass_accuracy, metrics.auc, metrics.attribution_localisation):
        np.testing.assert_allclose(metric(a, m).scores, metric(a, per_channel).scores)
    with pytest.raises(ValueError, match="Expected masks of the attributions' shape"):
        metrics.auc(a, m[:, :3])
    with pytest.raises(ValueError, match="Received: k=0"):
        metrics.top_k_intersection(a, m, k=0)


def test_focus_quadrant_flags_equal_the_equivalent_mask():
    a = np.random.default_rng(3).normal(size=(2, 6, 6))
    flags = np.array([[1, 0, 0, 1], [0, 1, 0, 0]])
    mask = np.zeros((2, 6, 6), bool)
    mask[0, :3, :3] = mask[0, 3:, 3:] = mask[1, :3, 3:] = True
    np.testing.assert_allclose(metrics.focus(a, flags).scores, metrics.focus(a, mask).scores)
    assert metrics.focus(a, np.ones((2, 4))).scores == pytest.approx(1.0)
