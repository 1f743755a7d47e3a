"""LRP: closed forms, conservation, BatchNormalization canonisation, composites and rule maps, model kinds,
refusals and the model left unchanged. Backend-independent (runs on TensorFlow, JAX and PyTorch); the
cross-check against zennit on identical weights is in tests/test_lrp_zennit.py."""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.engine import engine_for
from kerascope.methods.base import UnsupportedModelError
from kerascope.methods.lrp import Epsilon

RNG = np.random.default_rng(0)
# Parameter checks, refusals and caching are backend-free logic: TensorFlow only, to keep the JAX / PyTorch runs
# (compiling a model costs seconds there) to what can differ between backends: the relevance numbers.
logic = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="backend-free logic: TensorFlow run")


def _randomise(model: keras.Model, seed: int = 1) -> keras.Model:
    rng = np.random.default_rng(seed)
    for v in model.weights:
        low = "variance" in v.path or "gamma" in v.path
        v.assign((rng.uniform(0.5, 1.5, v.shape) if low else rng.normal(0, 0.5, v.shape)).astype(np.float32))
    return model


@functools.cache  # one model (one engine, shared compiled functions) for the whole file; never modified
def biasfree_cnn() -> keras.Model:
    """Bias-free ReLU conv net with max pooling, a residual Add, average pooling and GAP."""
    inp = keras.Input((8, 8, 2))
    a = keras.layers.Conv2D(3, 3, padding="same", use_bias=False, activation="relu", name="c1")(inp)
    a = keras.layers.MaxPooling2D(2)(a)
    b = keras.layers.Conv2D(3, 3, padding="same", use_bias=False, name="c2")(a)
    h = keras.layers.ReLU()(keras.layers.Add()([a, b]))
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.AveragePooling2D(2)(h))
    return _randomise(keras.Model(inp, keras.layers.Dense(3, use_bias=False, name="out")(h)))


# ------------------------------------------------------------------------------------ closed forms
def test_linear_model_epsilon_is_weight_times_input():
    model = _randomise(keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)]))
    w, _ = model.get_weights()
    x = RNG.normal(size=(4, 5)).astype(np.float32)
    e = ks.LRP(model, composite="epsilon", epsilon=0.0).explain(x, [0, 1, 2, 1])
    np.testing.assert_allclose(e.attributions, w[:, [0, 1, 2, 1]].T * x, rtol=1e-5, atol=1e-6)


def test_lrp0_on_biasfree_relu_net_is_gradient_times_input():
    model = _randomise(keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(5, use_bias=False, activation="relu"),
        keras.layers.Dense(4, use_bias=False), keras.layers.ReLU(), keras.layers.Dense(2, use_bias=False),
    ]))
    w1, w2, w3 = model.get_weights()
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    mask1, mask2 = (x @ w1 > 0), (np.maximum(x @ w1, 0) @ w2 > 0)
    gradient = ((w3[:, 1] * mask2) @ w2.T * mask1) @ w1.T  # hand-written backward pass for target 1
    e = ks.LRP(model, composite="epsilon", epsilon=0.0).explain(x, 1)  # R_out = f(x): LRP-0 = x * gradient
    np.testing.assert_allclose(e.attributions, x * gradient, rtol=1e-4, atol=1e-6)


def test_zplus_closed_form_on_one_dense_layer():
    model = _randomise(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d")]))
    w, b = model.get_weights()
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    contributions = np.maximum(x, 0)[:, :, None] * np.maximum(w, 0) + np.minimum(x, 0)[:, :, None] * np.minimum(w, 0)
    z = contributions.sum(axis=1) + np.maximum(b, 0)
    expected = contributions[:, :, 0] / z[:, :1]
    e = ks.LRP(model, composite=None, rules={"Dense": "zplus"}, init="one_hot").explain(x, 0)
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------ conservation
def test_conservation_on_biasfree_relu_cnn_with_residual_and_pooling():
    model = biasfree_cnn()
    x = RNG.uniform(0, 1, (3, 8, 8, 2)).astype(np.float32)
    e = ks.LRP(model, composite="epsilon", epsilon=1e-9).explain(x, [0, 1, 2])
    logits = keras.ops.convert_to_numpy(model(x))[np.arange(3), [0, 1, 2]]
    np.testing.assert_allclose(e.attributions.reshape(3, -1).sum(axis=1), logits, rtol=1e-4)
    np.testing.assert_allclose(e.extras["conservation"], 1.0, atol=1e-4)
    # init: one-hot relevance is the logit-initialised relevance divided by the logit
    one = ks.LRP(model, composite="epsilon", epsilon=1e-9, init="one_hot").explain(x, [0, 1, 2])
    np.testing.assert_allclose(one.attributions * logits[:, None, None, None], e.attributions, rtol=1e-4, atol=1e-7)


def test_final_softmax_is_bypassed():
    plain = _randomise(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, use_bias=False, name="d")]))
    soft = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, use_bias=False, activation="softmax", name="d")])
    soft.set_weights(plain.get_weights())
    x = RNG.normal(size=(2, 4)).astype(np.float32)
    a = ks.LRP(plain, composite="epsilon").explain(x, 2).attributions
    np.testing.assert_allclose(ks.LRP(soft, composite="epsilon").explain(x, 2).attributions, a, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ canonisation
# epsilon_gamma_box: zᴮ / γ / ε; epsilon: every pair's output is its rule's first term (one evaluation)
@pytest.mark.parametrize("composite", ["epsilon_gamma_box", "epsilon"])
def test_batchnorm_canonised_equals_the_fused_network(composite):  # after Conv2D, DepthwiseConv2D and Dense
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, name="c1")(inp)
    h = keras.layers.ReLU()(keras.layers.BatchNormalization(name="bn1")(h))
    h = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw")(h)
    h = keras.layers.ReLU()(keras.layers.BatchNormalization(name="bn3")(h))
    h = keras.layers.Flatten()(keras.layers.Conv2D(2, 3, strides=2, name="c2")(h))
    h = keras.layers.Dense(3, name="d")(h)
    h = keras.layers.BatchNormalization(name="bn2")(h)
    model = _randomise(keras.Model(inp, keras.layers.Dense(2, name="out")(h)))
    fused = keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="c1"),
        keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu", name="dw"),
        keras.layers.Conv2D(2, 3, strides=2, name="c2"), keras.layers.Flatten(), keras.layers.Dense(3, name="d"),
        keras.layers.Dense(2, name="out"),
    ])
    for conv, bn in (("c1", "bn1"), ("dw", "bn3"), ("d", "bn2")):
        k, b = model.get_layer(conv).get_weights()
        g, beta, mean, var = model.get_layer(bn).get_weights()
        scale = g / np.sqrt(var + model.get_layer(bn).epsilon)
        kernel_scale = scale.reshape(k.shape[-2:]) if conv == "dw" else scale  # depthwise: (in, multiplier)
        fused.get_layer(conv).set_weights([k * kernel_scale, (b - mean) * scale + beta])
    for name in ("c2", "out"):
        fused.get_layer(name).set_weights(model.get_layer(name).get_weights())
    x = RNG.uniform(0, 1, (2, 8, 8, 3)).astype(np.float32)
    ours = ks.LRP(model, composite=composite).explain(x, 1)  # the rules on the fused convolutions
    ref = ks.LRP(fused, composite=composite).explain(x, 1)
    np.testing.assert_allclose(ours.attributions, ref.attributions, rtol=1e-3, atol=1e-4 * np.abs(ref.attributions).max())
    np.testing.assert_allclose(ours.scores, ref.scores, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ rule maps
@logic
def test_rules_by_type_and_name_and_composite_first_layers():
    model = biasfree_cnn()
    x = RNG.uniform(0, 1, (2, 8, 8, 2)).astype(np.float32)
    assert {p: r.name for p, r in ks.LRP(model, composite="epsilon_plus_flat").layer_rules().items()} == {
        "c1": "flat", "c2": "zplus", "out": "epsilon"}
    by_name = ks.LRP(model, composite="epsilon_plus", rules={"c1": "flat"}).explain(x, 0).attributions
    flat = ks.LRP(model, composite="epsilon_plus_flat").explain(x, 0).attributions
    np.testing.assert_allclose(by_name, flat, rtol=1e-6)
    by_type = ks.LRP(model, composite=None, rules={"Conv2D": "epsilon", "Dense": Epsilon()}).explain(x, 0)
    np.testing.assert_allclose(by_type.attributions, ks.LRP(model, composite="epsilon").explain(x, 0).attributions,
                               rtol=1e-6)
    with pytest.raises(ValueError, match=r"Received: \['conv9'\]\. Dense / Conv layers: \['c1', 'c2', 'out'\]"):
        ks.LRP(model, rules={"conv9": "flat"}).explain(x, 0)
    with pytest.raises(ValueError, match="Unknown LRP rule. Received: rule='lrp0'"):
        ks.LRP(model, rules={"c1": "lrp0"})
    with pytest.raises(ValueError, match="no rule for"):
        ks.LRP(model, composite=None, rules={"Dense": "epsilon"}).explain(x, 0)


@logic
def test_zbox_refuses_inputs_outside_the_box():
    model = biasfree_cnn()
    with pytest.raises(ValueError, match=r"within \[low, high\].*low=0.0, high=1.0"):
        ks.LRP(model, composite="epsilon_gamma_box").explain(np.full((1, 8, 8, 2), 2.0, np.float32), 0)
    e = ks.LRP(model, composite="epsilon_gamma_box", low=-2.0, high=np.full(2, 2.0)).explain(
        np.full((1, 8, 8, 2), 2.0, np.float32), 0)
    assert np.isfinite(e.attributions).all() and e.params["high"] == "array(2,)"


# ------------------------------------------------------------------------------------ model kinds
class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = keras.layers.Conv2D(3, 3, padding="same", use_bias=False, activation="relu")
        self.pool = keras.layers.MaxPooling2D(2)
        self.c2 = keras.layers.Conv2D(3, 3, padding="same", use_bias=False)
        self.add = keras.layers.Add()
        self.relu = keras.layers.ReLU()
        self.avg = keras.layers.AveragePooling2D(2)
        self.gap = keras.layers.GlobalAveragePooling2D()
        self.out = keras.layers.Dense(3, use_bias=False)

    def call(self, x: object) -> object:
        a = self.pool(self.c1(x))
        return self.out(self.gap(self.avg(self.relu(self.add([a, self.c2(a)])))))


def test_same_relevance_on_functional_nested_and_subclassed_models():
    functional = biasfree_cnn()
    weights = functional.get_weights()
    inner = keras.Model(functional.input, functional.get_layer("out").input, name="features")
    nested = keras.Sequential([keras.Input((8, 8, 2)), inner, functional.get_layer("out")])
    sub = Subclassed()
    sub(np.zeros((1, 8, 8, 2), np.float32))
    sub.set_weights(weights)
    x = RNG.uniform(0, 1, (2, 8, 8, 2)).astype(np.float32)
    ref = ks.LRP(functional, composite="epsilon_alpha2_beta1").explain(x, 1).attributions
    for model in (nested, sub):
        got = ks.LRP(model, composite="epsilon_alpha2_beta1").explain(x, 1).attributions
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)


@logic
def test_one_compiled_function_reused_across_calls_and_chunks():
    model = biasfree_cnn()
    method = ks.LRP(model, batch_size=2)
    x = RNG.uniform(0, 1, (5, 8, 8, 2)).astype(np.float32)
    whole = method.explain(x, 0).attributions
    traces = engine_for(model).trace_count
    again = method.explain(x[:4], 0).attributions
    assert engine_for(model).trace_count == traces
    np.testing.assert_allclose(again, whole[:4], rtol=1e-6)  # batch invariance


@logic
def test_registered_by_name():
    model = biasfree_cnn()
    x = RNG.uniform(0, 1, (1, 8, 8, 2)).astype(np.float32)
    e = ks.explain(model, x, method="lrp", targets=0, composite="epsilon")
    assert e.method == "lrp" and e.params["composite"] == "epsilon"


# ------------------------------------------------------------------------------------ refusals
@logic
def test_unsupported_layers_are_named():
    inp = keras.Input((4, 3))
    h = keras.layers.MultiHeadAttention(1, 2, name="attn")(inp, inp)
    h = keras.layers.LSTM(2, name="rnn")(h)
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    with pytest.raises(UnsupportedModelError, match=r"'attn' \(MultiHeadAttention\), 'rnn' \(LSTM\)"):
        ks.LRP(model).explain(np.ones((1, 4, 3), np.float32), 0)
    mid_softmax = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="softmax", name="s"),
                                    keras.layers.Dense(2)])
    with pytest.raises(UnsupportedModelError, match="'s' \\(Dense with activation 'softmax'\\)"):
        ks.LRP(mid_softmax).explain(np.ones((1, 3), np.float32), 0)


# ------------------------------------------------------------------------------------ model unchanged
class Boom(keras.layers.Identity):
    armed = False

    def call(self, inputs: object) -> object:
        if Boom.armed:
            raise RuntimeError("boom")
        return inputs


def _state(model: keras.Model) -> list:
    return [(path, sorted(vars(layer)), layer.__dict__.get("activation")) for path, layer in
            ((layer.name, layer) for layer in model._flatten_layers(include_self=True))]


def test_model_unchanged_after_calls_and_after_an_exception():
    model = _randomise(keras.Sequential([
        keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3, name="c"), keras.layers.BatchNormalization(),
        keras.layers.ReLU(), Boom(name="boom"), keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax"),
    ]))
    x = RNG.uniform(0, 1, (2, 6, 6, 1)).astype(np.float32)
    state, weights, before = _state(model), model.get_weights(), keras.ops.convert_to_numpy(model(x))
    ks.LRP(model, composite="epsilon_gamma_box").explain(x, 0)
    Boom.armed = True
    try:
        with pytest.raises(Exception, match="boom"):
            ks.LRP(model, composite="epsilon_alpha2_beta1").explain(x, 0)
    finally:
        Boom.armed = False
    assert _state(model) == state
    for w, v in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(w, v)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), before)

