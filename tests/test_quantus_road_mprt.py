"""ROAD and the MPRT variants against Quantus 0.6.0 on identical inputs (a PyTorch twin of a tiny Keras CNN).

ROAD's imputation is deterministic at ``noise=0``; the MPRT variants draw weights that cannot be passed to
Quantus, so their deterministic parts (the complexity ratio, the entropy) are checked with Quantus's own
functions on the same explanations. Runs on the TensorFlow backend only (the reference is torch).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _quantus import build_pair, import_quantus, nchw  # noqa: E402 - tests/ is on sys.path

from kerascope import metrics  # noqa: E402

pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                       reason="Quantus reference cross-checks run once, on the TensorFlow backend"),
]


@pytest.fixture(scope="module")
def quantus():
    return import_quantus()


def test_linear_imputation_equals_quantus(quantus):
    from quantus.functions.perturb_func import noisy_linear_imputation

    rng = np.random.default_rng(0)
    x = rng.random((3, 7, 9, 3)).astype(np.float32)
    removed = rng.random((3, 7 * 9)) < np.array([[0.2], [0.6], [0.95]])
    ours = metrics.linear_imputation(x, removed)
    for j in range(3):
        expected = noisy_linear_imputation(arr=nchw(x[j:j + 1])[0], indices=np.nonzero(removed[j])[0], noise=0.0)
        np.testing.assert_allclose(ours[j], expected.transpose(1, 2, 0), atol=1e-6)


def test_road_equals_quantus_without_noise(quantus):
    # one channel: Quantus ranks the channel-broadcast map but indexes pixels, consistent only for C = 1
    model, net = build_pair(seed=2, channels=1)
    rng = np.random.default_rng(5)
    x = rng.normal(0, 3, (8, 8, 8, 1)).astype(np.float32)  # contrasty: imputation moves the predictions
    maps = rng.normal(size=(8, 8, 8)).astype(np.float32)
    y = np.asarray(model.predict(x, verbose=0)).argmax(-1)
    pct = [5, 20, 40, 60, 80, 95]
    ours = metrics.road(model, x, maps, y, percentages=pct, noise=0.0, batch_size=7)
    metric = quantus.ROAD(percentages=pct, noise=0.0, normalise=False, abs=False, disable_warnings=True)
    expected = metric(model=net, x_batch=nchw(x), y_batch=y, a_batch=maps[:, None].copy(), channel_first=True)
    np.testing.assert_allclose(ours.curves.mean(0), [expected[p] for p in pct], atol=1e-9)
    assert 0 < ours.curves.mean() < 1  # the curves move: the check compares real decisions


def test_discrete_entropy_equals_quantus(quantus):
    from quantus.functions.complexity_func import discrete_entropy

    rng = np.random.default_rng(2)
    values = np.concatenate([rng.normal(size=(3, 50)), np.round(rng.normal(size=(2, 50)), 1),
                             np.ones((1, 50))]).astype(np.float32)
    for bins in (7, 100):
        expected = [discrete_entropy(a=v, x=v, n_bins=bins) for v in values]
        np.testing.assert_allclose(metrics.discrete_entropy(values, bins), expected, rtol=1e-9, atol=1e-12)


def test_efficient_mprt_is_quantus_ratio_on_the_same_explanations(quantus):
    from quantus.functions.complexity_func import discrete_entropy

    model, _ = build_pair(seed=2)
    x = np.random.default_rng(4).uniform(0, 1, (3, 8, 8, 3)).astype(np.float32)
    seen = []

    def method(m, inputs, targets):
        a = metrics.sanity._explainer("saliency", 8, None)[1](m, inputs, targets)
        seen.append(np.asarray(a))
        return a

    before = [w.copy() for w in model.get_weights()]
    r = metrics.efficient_mprt(model, x, method, [0, 1, 2], n_bins=20, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    h0 = np.array([discrete_entropy(a=a, x=a, n_bins=20) for a in seen[0]])
    h1 = np.array([discrete_entropy(a=a, x=a, n_bins=20) for a in seen[1]])
    np.testing.assert_allclose(r.scores, (h1 - h0) / h0, rtol=1e-6)
    # its fully randomised copy is mprt's last cascading state (same seeds)
    last = metrics.model_randomisation(model, "saliency", x, [0, 1, 2], seed=3, reduce="sum").maps[-1]
    np.testing.assert_allclose(metrics.to_maps(seen[1], reduce="sum"), last, rtol=1e-5, atol=1e-6)
