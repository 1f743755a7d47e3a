"""A final sigmoid is explained at its logit, as a final softmax is.

A confident binary classifier (logit ~ 40) outputs ``sigmoid(40) = 1.0`` in float32: the gradient of
the probability is exactly zero, every map too. In ``"logits"`` mode (the default) the sigmoid of a
``Dense(activation="sigmoid")`` / ``Activation("sigmoid")`` producing the output is bypassed for the
duration of the call (never by changing the model); ``output="probabilities"`` keeps it.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from _autodiff import gradient

import kerascope as ks

RNG = np.random.default_rng(0)


def binary(fused: bool, logit: float = 40.0):
    """A saturated binary classifier and its logit as a function of the input (its own layers, no sigmoid)."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    hidden_layer = keras.layers.Dense(8, activation="tanh", name="hidden")
    head = keras.layers.Dense(1, activation="sigmoid" if fused else None, name="head")
    out = head(hidden_layer(inputs))
    if not fused:
        out = keras.layers.Activation("sigmoid", name="prob")(out)
    model = keras.Model(inputs, out, name="fused" if fused else "separate")
    kernel = RNG.normal(size=(8, 1)).astype(np.float32) * 0.5
    head.set_weights([kernel, np.array([logit], np.float32)])
    return model, lambda v: keras.ops.matmul(hidden_layer(v), kernel) + logit


@pytest.mark.parametrize("fused", [True, False], ids=["dense_sigmoid", "activation_sigmoid"])
def test_saturated_sigmoid_is_explained_at_its_logit(fused, unchanged):
    model, reference = binary(fused)
    x = RNG.normal(size=(3, 6)).astype(np.float32)
    assert np.all(keras.ops.convert_to_numpy(model(x)) == 1.0)  # saturated in float32
    probability_grad = gradient(model, x)
    assert np.abs(probability_grad).max() < 1e-12  # what the probability's gradient gives: nothing
    check = unchanged(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ks.ExplanationWarning)  # a non-zero map: no zero-map warning
        e = ks.Saliency(model).explain(x, 0)
    expected = gradient(lambda v: reference(v)[:, 0], x)
    assert np.abs(expected).max() > 1e-2
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(e.scores, keras.ops.convert_to_numpy(reference(x))[:, 0], rtol=1e-5)
    check()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), 1.0)  # the sigmoid is back
    with pytest.warns(ks.ExplanationWarning):  # opting out: the probability's (vanishing) gradient
        p = ks.Saliency(model, output="probabilities").explain(x, 0)
    np.testing.assert_allclose(p.attributions, probability_grad, atol=1e-12)
    np.testing.assert_allclose(p.scores, 1.0)
    check()


def test_multi_label_sigmoid_head(unchanged):
    keras.utils.set_random_seed(5)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(6, activation="relu", name="hidden")(inputs)
    head = keras.layers.Dense(4, activation="sigmoid", name="labels")
    model = keras.Model(inputs, head(hidden))
    kernel = head.get_weights()[0]
    bias = np.array([30.0, -30.0, 0.0, 25.0], np.float32)
    head.set_weights([kernel, bias])
    hidden_layer = model.get_layer("hidden")

    def logits(v):
        return keras.ops.add(keras.ops.matmul(hidden_layer(v), kernel), bias)
    x = np.abs(RNG.normal(size=(4, 5))).astype(np.float32)
    check = unchanged(model)
    for label in range(4):
        e = ks.Saliency(model).explain(x, label)
        expected = gradient(lambda v, k=label: logits(v)[:, k], x)
        np.testing.assert_allclose(e.attributions, expected, rtol=1e-5, atol=1e-7)
        with warnings.catch_warnings():  # labels 0 and 3 saturate: their probability maps are zero (and said so)
            warnings.simplefilter("ignore", ks.ExplanationWarning)
            prob = ks.Saliency(model, output="probabilities").explain(x, label)
        np.testing.assert_allclose(prob.attributions, gradient(lambda v, k=label: model(v)[:, k], x),
                                   rtol=1e-4, atol=1e-9)
    check()
    assert ks.Saliency(model).engine.bypassed_layers == ["labels"]


def test_inner_sigmoid_is_not_bypassed():
    """A sigmoid gate inside the model (squeeze-and-excitation) keeps its sigmoid: only the output's is bypassed."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((5,))
    gate = keras.layers.Dense(5, activation="sigmoid", name="gate")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(keras.layers.Multiply()([inputs, gate])))
    x = RNG.normal(size=(3, 5)).astype(np.float32)
    method = ks.Saliency(model)
    e = method.explain(x, 1)
    np.testing.assert_allclose(e.attributions, gradient(lambda v: model(v)[:, 1], x), rtol=1e-5, atol=1e-7)
    assert method.engine.bypassed_layers == []
