"""A sample's explanation does not depend on the other samples of its call (every stochastic method)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from kerascope.methods.registry import build

STOCHASTIC = [
    ("kernel_shap", {"samples": 40}),
    ("shapley_sampling", {"samples": 4}),
    ("lime", {"samples": 40}),
    ("smoothgrad", {"samples": 4}),
    ("smoothgrad_squared", {"samples": 4}),
    ("vargrad", {"samples": 4}),
    ("rise", {"masks": 16}),
    ("expected_gradients", {"samples": 4}),
    ("gradient_shap", {"samples": 4}),
    ("deeplift_shap", {}),
]


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(3, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(2),
    ])


@pytest.mark.parametrize("name,params", STOCHASTIC, ids=[n for n, _ in STOCHASTIC])
def test_alone_equals_inside_a_batch_at_any_position(name, params):
    model = _model()
    rng = np.random.default_rng(0)
    images = rng.normal(size=(4, 8, 8, 1)).astype("float32")
    mask = np.repeat(np.repeat(np.arange(16).reshape(4, 4), 2, 0), 2, 1)  # 16 features of 2x2 pixels
    extra = {"mask": mask} if name in ("kernel_shap", "shapley_sampling", "lime") else {}
    if name in ("expected_gradients", "gradient_shap", "deeplift_shap"):
        extra["baseline"] = rng.normal(size=(3, 8, 8, 1)).astype("float32")


    method = build(name, model, {**params, **extra, "seed": 7})
    alone = method.explain(images[1:2], targets=0).attributions[0]
    scale = float(np.abs(alone).max()) or 1.0
    at_end = method.explain(images[[2, 3, 0, 1]], targets=0).attributions[3]  # the same image, last of four
    at_start = method.explain(images[[1, 0]], targets=0).attributions[0]  # first of two, other companions
    np.testing.assert_allclose(at_end, alone, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(at_start, alone, rtol=1e-4, atol=1e-5 * scale)
