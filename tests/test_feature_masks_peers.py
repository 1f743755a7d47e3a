"""KernelSHAP and LIME against the ``shap`` and ``lime`` packages on the same model, mask and baseline.

The peers see the model through a coalition function ``z (M, k) -> logits`` that builds the
perturbed images in numpy (absent superpixels set to the baseline) and calls ``model.predict``.
- shap's KernelExplainer with a budget covering all 2^k - 2 coalitions enumerates them: both give the
  exact Shapley values (equal to 1e-5); with a sampled budget both approach them.
- lime's ``LimeBase.explain_instance_with_data`` fitted on kerascope's coalitions (lime_image's draws:
  the first row all ones, then Bernoulli(1/2), from ``numpy.random.default_rng(seed)``), scores and
  cosine distances gives the same coefficients, intercept and R^2 (lime's ``score``); lime's own
  ``LimeImageExplainer`` (its own random draws) agrees in direction.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods.feature_masks import grid_mask  # noqa: E402

shap = pytest.importorskip("shap")
lime_base = pytest.importorskip("lime.lime_base")
lime_image = pytest.importorskip("lime.lime_image")

BASELINE = 0.1


@pytest.fixture(scope="module")
def case():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(5, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(6, activation="tanh"),
        keras.layers.Dense(3),
    ])
    x = np.random.default_rng(8).uniform(0, 1, (8, 8, 3)).astype(np.float32)
    return model, x


def coalition_fn(model, x, mask, target):
    def f(z: np.ndarray) -> np.ndarray:
        keep = np.asarray(z, bool)[:, mask][..., None]
        images = np.where(keep, x[None], np.float32(BASELINE)).astype(np.float32)
        return model.predict(images, batch_size=512, verbose=0)[:, target].astype(np.float64)

    return f


def test_kernel_shap_matches_shap_kernel_explainer(case):
    model, x = case
    mask = grid_mask((8, 8), (2, 4))  # 8 features
    f = coalition_fn(model, x, mask, 2)
    explainer = shap.KernelExplainer(f, np.zeros((1, 8)))
    theirs = np.asarray(explainer.shap_values(np.ones((1, 8)), nsamples=2**8, l1_reg=False, silent=True))[0]
    ours = ks.KernelSHAP(model, mask=mask, baseline=BASELINE, samples=2**8).explain(x[None], 2)
    np.testing.assert_allclose(ours.extras["feature_attributions"][0], theirs, atol=1e-5)
    np.testing.assert_allclose(ours.extras["base_scores"][0], explainer.expected_value, atol=1e-5)
    # sampled budgets on 16 features: both close to the exact values
    mask16 = grid_mask((8, 8), 4)
    exact = ks.ShapleyExact(model, mask=mask16, baseline=BASELINE, batch_size=4096).explain(x[None], 2)
    exact = exact.extras["feature_attributions"][0]
    f16 = coalition_fn(model, x, mask16, 2)
    np.random.seed(0)  # shap samples with numpy's global generator
    theirs = np.asarray(shap.KernelExplainer(f16, np.zeros((1, 16))).shap_values(
        np.ones((1, 16)), nsamples=300, l1_reg=False, silent=True))[0]
    ours = ks.KernelSHAP(model, mask=mask16, baseline=BASELINE, samples=300).explain(x[None], 2)
    for estimate in (theirs, ours.extras["feature_attributions"][0]):
        assert np.corrcoef(estimate, exact)[0, 1] >= 0.95
        np.testing.assert_allclose(estimate.sum(), exact.sum(), atol=1e-5)


def test_lime_matches_lime_package(case):
    model, x = case
    mask = grid_mask((8, 8), 4)
    k, samples, seed = 16, 500, 3
    ours = ks.LIME(model, mask=mask, baseline=BASELINE, samples=samples, seed=seed).explain(x[None], 1)
    z = np.random.default_rng(seed).integers(0, 2, size=(samples, k))
    z[0] = 1
    labels = np.zeros((samples, 3))
    labels[:, 1] = coalition_fn(model, x, mask, 1)(z)
    from sklearn.metrics import pairwise_distances

    distances = pairwise_distances(z, z[:1], metric="cosine").ravel()
    base = lime_base.LimeBase(lambda d: np.sqrt(np.exp(-(d**2) / 0.25**2)), random_state=0)
    intercept, local_exp, score, local_pred = base.explain_instance_with_data(
        z, labels, distances, 1, num_features=k, feature_selection="none"
    )
    coefficients = np.zeros(k)
    for feature, value in local_exp:
        coefficients[feature] = value
    np.testing.assert_allclose(ours.extras["coefficients"][0], coefficients, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.extras["intercept"][0], intercept, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.extras["r2"][0], score, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.extras["local_prediction"][0], np.ravel(local_pred)[0], rtol=1e-4, atol=1e-5)
    # lime's own image explainer (its own draws): the same picture
    explainer = lime_image.LimeImageExplainer(random_state=0)
    explanation = explainer.explain_instance(
        x.astype(np.float64), lambda images: model.predict(images.astype(np.float32), verbose=0),
        labels=(1,), top_labels=None, hide_color=BASELINE, num_features=k, num_samples=2000,
        segmentation_fn=lambda image: mask, batch_size=256,
    )
    theirs = np.zeros(k)
    for feature, value in explanation.local_exp[1]:
        theirs[feature] = value
    assert np.corrcoef(theirs, ours.extras["coefficients"][0])[0, 1] >= 0.9
