"""Seed case 2: gradients at ``mixed10`` of an InceptionV3 nested in a Sequential.

Re-building a sub-model from the outer Sequential fails on Keras 3; kerascope
probes the layer during the forward pass instead. Every scenario of the
question's answers is checked here against a hand-written tf.GradientTape
computation on the inner functional model.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerascope as ks
from kerascope.viz import overlay


@pytest.fixture(scope="module")
def nested():
    keras.utils.set_random_seed(0)
    base = keras.applications.InceptionV3(weights=None, input_shape=(75, 75, 3), classes=10)
    model = keras.Sequential([keras.Input((75, 75, 3)), base, keras.layers.Dense(2, name="dense_5")])
    x = np.random.default_rng(0).uniform(-1, 1, (2, 75, 75, 3)).astype(np.float32)
    return model, base, x


def _hand_computation(model, base, x, targets):
    """The question's intent, written by hand on the inner functional model."""
    inner = keras.Model(base.inputs, [base.get_layer("mixed10").output, base.output])
    dense = model.get_layer("dense_5")
    with tf.GradientTape() as tape:
        mixed10, probs = inner(x, training=False)
        out = dense(probs)
        score = tf.reduce_sum(tf.gather(out, targets, axis=1, batch_dims=1))
    grads = tape.gradient(score, mixed10)
    return mixed10.numpy(), grads.numpy(), out.numpy()


def test_rebuilding_a_submodel_fails_on_keras3(nested):
    model, _, _ = nested
    with pytest.raises((ValueError, AttributeError)):
        keras.Model(model.inputs, [model.get_layer("inception_v3").get_layer("mixed10").output, model.output])


def test_gradient_at_nested_mixed10_matches_hand_computation(nested, unchanged):
    model, base, x = nested
    check = unchanged(model)
    acts, grads = ks.layer_gradients(model, x, "inception_v3/mixed10", targets=[0, 1])
    hand_acts, hand_grads, _ = _hand_computation(model, base, x, [0, 1])
    assert grads is not None and np.abs(grads).max() > 0
    np.testing.assert_allclose(acts, hand_acts, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads, hand_grads, rtol=1e-4, atol=1e-7)
    check()


def test_gradcam_on_mixed10_equals_formula(nested, unchanged, tmp_path):
    model, base, x = nested
    check = unchanged(model)
    explanation = ks.GradCAM(model, layer="inception_v3/mixed10", upsample=False).explain(x)
    targets = explanation.targets
    hand_acts, hand_grads, out = _hand_computation(model, base, x, targets)
    np.testing.assert_array_equal(targets, out.argmax(-1))
    weights = hand_grads.mean(axis=(1, 2))
    expected = np.maximum(np.einsum("nhwc,nc->nhw", hand_acts, weights), 0)
    assert explanation.attributions.shape == expected.shape == (2, 1, 1)
    assert np.max(np.abs(explanation.attributions - expected)) < 1e-5
    check()


def test_gradcam_reference_mse_and_magma_overlay(nested, tmp_path):
    """The question's Grad-CAM check: normalised CAM vs a reference, MSE < 0.05, drawn with magma at alpha 0.5."""
    model, base, x = nested
    cam = ks.GradCAM(model, layer="inception_v3/mixed7").explain(x, targets=1).attributions
    inner = keras.Model(base.inputs, [base.get_layer("mixed7").output, base.output])
    with tf.GradientTape() as tape:
        conv, probs = inner(x, training=False)
        score = tf.reduce_sum(model.get_layer("dense_5")(probs)[:, 1])
    grads = tape.gradient(score, conv).numpy()
    ref = np.maximum(np.einsum("nhwc,nc->nhw", conv.numpy(), grads.mean(axis=(1, 2))), 0)
    ref = tf.image.resize(ref[..., None], (75, 75), method="bilinear").numpy()[..., 0]
    for ours, theirs in zip(cam, ref):
        ours = ours / max(ours.max(), 1e-12)
        theirs = theirs / max(theirs.max(), 1e-12)
        assert np.mean((ours - theirs) ** 2) < 0.05
        assert np.mean((ours - theirs) ** 2) < 1e-8  # in fact they are the same computation
    picture = overlay(x[0], cam[0], cmap="magma", alpha=0.5)
    assert picture.shape == (75, 75, 3) and picture.std() > 0


def test_weight_gradients_equal_tape(nested):
    model, base, x = nested
    layer = [candidate for candidate in base.layers if isinstance(candidate, keras.layers.Conv2D)][-1]
    variables = [v for v in layer.trainable_variables]
    grads = ks.weight_gradients(model, x, "inception_v3/" + layer.name, targets=0)
    with tf.GradientTape() as tape:
        score = tf.reduce_sum(model(x, training=False)[:, 0])
    expected = tape.gradient(score, variables)
    assert list(grads) == [v.path for v in variables]
    for got, want in zip(grads.values(), expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-6)


def test_unknown_layer_lists_close_matches(nested):
    model, _, x = nested
    with pytest.raises(ValueError, match=r"Received: layer='inception_v3/mixed11'.*mixed1"):
        ks.layer_gradients(model, x, "inception_v3/mixed11")


def test_all_layer_gradients_one_entry_per_layer():
    """'Gradients w.r.t. every layer's output' (the question's third answer) in one pass."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(10, activation="relu", name="fc1"), keras.layers.Dense(3, name="fc2")]
    )
    x = np.ones((1, 3), np.float32)
    result = ks.layers_gradients(model, x, targets=2)
    assert list(result) == ["fc1", "fc2"]
    np.testing.assert_allclose(result["fc2"].gradients, [[0.0, 0.0, 1.0]])
    fc1 = model.get_layer("fc1")
    with tf.GradientTape() as tape:
        h = fc1(x)
        tape.watch(h)
        score = model.get_layer("fc2")(h)[:, 2]
    np.testing.assert_allclose(result["fc1"].gradients, tape.gradient(score, h).numpy(), rtol=1e-6)


class SubclassedCNN(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.stem = keras.layers.Conv2D(4, 3, activation="relu", name="stem")
        self.block = keras.layers.Conv2D(6, 3, activation="relu", name="block")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(3, activation="softmax", name="head")

    def call(self, x):
        return self.head(self.pool(self.block(self.stem(x))))


def test_layer_inside_subclassed_model(unchanged):
    keras.utils.set_random_seed(3)
    model = SubclassedCNN()
    x = np.random.default_rng(1).uniform(0, 1, (3, 12, 12, 3)).astype(np.float32)
    model(x)
    check = unchanged(model)
    explanation = ks.GradCAM(model, layer="block", upsample=False).explain(x, targets=[0, 1, 2])
    with tf.GradientTape() as tape:
        a = model.block(model.stem(x))
        tape.watch(a)
        logits = tf.matmul(model.pool(a), model.head.kernel) + model.head.bias
        score = tf.reduce_sum(tf.gather(logits, [0, 1, 2], axis=1, batch_dims=1))
    g = tape.gradient(score, a).numpy()
    expected = np.maximum(np.einsum("nhwc,nc->nhw", a.numpy(), g.mean(axis=(1, 2))), 0)
    assert np.max(np.abs(explanation.attributions - expected)) < 1e-5
    check()
