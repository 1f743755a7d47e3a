"""Shared fixtures: tiny real Keras models, and a model-unchanged checker."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from kerascope.core.layers import iter_layers  # noqa: E402

# Hypothesis profiles for the property-based tests (tests/test_fuzz.py). "ci" (default) is bounded and
# derandomized, so CI is reproducible; "long" explores: pytest tests/test_fuzz.py --hypothesis-profile=long
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=3, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("ci-small", parent=settings.get_profile("ci"), max_examples=1)  # JAX/PyTorch CI runs
settings.register_profile("long", max_examples=300, deadline=None, suppress_health_check=_SLOW_OK,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def snapshot(model: keras.Layer) -> dict:
    """Everything that must not change: weights, config, and every layer's instance attributes."""
    state = {
        "weights": [np.array(w) for w in model.get_weights()],
        "layers": {
            path: (dict(vars(layer)), getattr(layer, "activation", None))
            for path, layer in iter_layers(model)
        },
    }
    try:
        state["config"] = model.get_config()
    except Exception:
        state["config"] = None
    return state


def assert_unchanged(model: keras.Layer, before: dict) -> None:
    after = snapshot(model)
    assert len(after["weights"]) == len(before["weights"])
    for a, b in zip(after["weights"], before["weights"]):
        np.testing.assert_array_equal(a, b)
    assert after["config"] == before["config"]
    assert set(after["layers"]) == set(before["layers"])
    for path, (attrs, activation) in before["layers"].items():
        now_attrs, now_activation = after["layers"][path]
        assert set(now_attrs) == set(attrs), f"instance attributes changed on {path}: {set(now_attrs) ^ set(attrs)}"
        assert "call" not in now_attrs or now_attrs["call"] is attrs.get("call"), f"call left patched on {path}"
        assert now_activation is activation, f"activation changed on {path}"


@pytest.fixture
def unchanged():
    """Usage: ``check = unchanged(model)`` ... ``check()``."""

    def start(model):
        before = snapshot(model)
        return lambda: assert_unchanged(model, before)

    return start


def small_cnn(name: str = "small_cnn", softmax: bool = True, size: int = 16, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv1")(inputs)
    x = keras.layers.Conv2D(6, 3, activation="relu", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(3, activation="softmax" if softmax else None, name="head")(x)
    return keras.Model(inputs, x, name=name)


@pytest.fixture
def cnn():
    return small_cnn()


@pytest.fixture
def images():
    return np.random.default_rng(0).uniform(0, 1, (4, 16, 16, 3)).astype(np.float32)
