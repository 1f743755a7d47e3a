"""LRP / DeepLIFT with callable targets and multi-head models; ``layer=`` on a subclassed model before any call."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _autodiff import gradient

import kerascope as ks
from kerascope.core.calls import SharedLayerError
from kerascope.methods.base import UnsupportedModelError

RNG = np.random.default_rng(0)


def _linear(outputs: int = 4) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(outputs, use_bias=False, name="d")])


def _relu_cnn() -> keras.Model:
    """Bias-free convolutions with ReLU: piecewise linear, so LRP-0 is gradient x input."""
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((8, 8, 2)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", use_bias=False),
        keras.layers.Conv2D(3, 3, padding="same", use_bias=False, name="seg"),
    ])


def _region(o):  # the sum of class 1 over a 3x3 region of a per-pixel output
    return keras.ops.sum(o[:, 2:5, 3:6, 1], axis=(1, 2))


LINEAR_TARGETS = [
    ("two_logits", lambda o: o[:, 0] + o[:, 1]),
    ("weighted", lambda o: 2.0 * o[:, 0] - 0.5 * o[:, 3]),
]


@pytest.mark.parametrize("name,target", LINEAR_TARGETS, ids=[n for n, _ in LINEAR_TARGETS])
def test_lrp0_with_a_callable_target_is_gradient_times_input(name, target):
    model = _linear()
    x = RNG.normal(size=(3, 6)).astype("float32")
    e = ks.LRP(model, composite="epsilon", epsilon=1e-9).explain(x, target)
    expected = x * gradient(lambda v: target(model(v)), x)
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(e.attributions.sum(axis=1), keras.ops.convert_to_numpy(target(model(x))),
                               rtol=1e-4, atol=1e-5)  # conservation: the relevance totals S(x), not 2 S(x)
    np.testing.assert_allclose(e.extras["conservation"], 1.0, atol=1e-4)


def test_lrp0_region_target_on_a_relu_cnn_is_gradient_times_input():
    model = _relu_cnn()
    x = RNG.normal(size=(2, 8, 8, 2)).astype("float32")
    e = ks.LRP(model, composite="epsilon", epsilon=1e-9).explain(x, _region)
    expected = x * gradient(lambda v: _region(model(v)), x)
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(e.attributions, expected, atol=1e-4 * scale)
    np.testing.assert_allclose(e.attributions.reshape(2, -1).sum(1),
                               keras.ops.convert_to_numpy(_region(model(x))), rtol=1e-3, atol=1e-4 * scale)


def test_deeplift_with_callable_targets_sums_to_the_score():
    model = _linear()
    x = RNG.normal(size=(3, 6)).astype("float32")
    for _, target in LINEAR_TARGETS:  # zero reference, bias-free: S(0) = 0
        e = ks.DeepLIFT(model).explain(x, target)
        np.testing.assert_allclose(e.attributions, x * gradient(lambda v, t=target: t(model(v)), x),
                                   rtol=1e-4, atol=1e-5)
    cnn = _relu_cnn()
    xs = RNG.normal(size=(2, 8, 8, 2)).astype("float32")
    e = ks.DeepLIFT(cnn).explain(xs, _region)
    np.testing.assert_allclose(e.attributions.reshape(2, -1).sum(1),
                               keras.ops.convert_to_numpy(_region(cnn(xs))), rtol=1e-3, atol=1e-4)


def _two_heads(head: str) -> keras.Model:
    keras.utils.set_random_seed(2)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(6, activation="relu", use_bias=False)(inputs)
    if head == "layernorm":  # a layer neither method has a rule for
        policy = keras.layers.Dense(3, name="policy")(keras.layers.LayerNormalization(name="policy_norm")(h))
    else:
        policy = keras.layers.Dense(3, activation="softmax", name="policy")(h)
    value = keras.layers.Dense(1, use_bias=False, name="value")(h)
    return keras.Model(inputs, {"policy": policy, "value": value})


@pytest.mark.parametrize("head", ["softmax", "layernorm"])  # a softmax / a layer with no rule on the other head
@pytest.mark.parametrize("method", ["lrp", "deeplift"])
def test_the_other_heads_layers_do_not_refuse(method, head):
    model = _two_heads(head)
    x = RNG.uniform(0.1, 1.0, size=(3, 5)).astype("float32")
    params = {"composite": "epsilon", "epsilon": 1e-9} if method == "lrp" else {}
    e = ks.explain(model, x, method=method, targets=0, output_index="value", **params)

    def value(v):
        return model(v)["value"][:, 0]

    # bias-free ReLU path to the value head: LRP-0 and DeepLIFT (zero reference) are gradient x input
    np.testing.assert_allclose(e.attributions, x * gradient(value, x), rtol=1e-4, atol=1e-5)
    if head == "layernorm":  # the head that is explained is still checked
        with pytest.raises(UnsupportedModelError, match="policy_norm"):
            ks.explain(model, x, method=method, targets=0, output_index="policy", **params)


class Subclassed(keras.Model):
    def __init__(self, twice: bool = False) -> None:
        super().__init__(name="subclassed")
        self.twice = twice
        self.conv = keras.layers.Conv2D(3, 3, padding="same", name="conv")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(2)

    def call(self, x):
        h = self.conv(x)
        if self.twice:  # a really shared layer: still refused without call_index
            h = self.conv(keras.ops.relu(h)[..., :1] * keras.ops.ones_like(x))
        return self.head(self.pool(h))


@pytest.mark.parametrize("method", ["gradcam", "layercam"])
def test_layer_on_a_subclassed_model_never_called(method):
    x = RNG.normal(size=(2, 8, 8, 1)).astype("float32")
    keras.utils.set_random_seed(3)
    fresh = Subclassed()
    first = ks.explain(fresh, x, method=method, layer="conv", targets=1).attributions
    second = ks.explain(fresh, x, method=method, layer="conv", targets=1).attributions
    keras.utils.set_random_seed(3)
    called = Subclassed()
    called(x)
    np.testing.assert_allclose(first, second, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first, ks.explain(called, x, method=method, layer="conv", targets=1).attributions,
                               rtol=1e-5, atol=1e-6)
    keras.utils.set_random_seed(3)
    shared = Subclassed(twice=True)
    with pytest.raises(SharedLayerError, match="2 times"):
        ks.explain(shared, x, method=method, layer="conv", targets=1)
