"""Seed case 1: a checkpoint-restored subclassed VGG-style model with a saturated softmax head.

The gradient of the probability (or of the cross-entropy) w.r.t. the image is
exactly zero in float32; kerascope differentiates the logit instead, without
changing the model.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerascope as ks


class VGGStyle(keras.Model):
    def __init__(self, num_classes: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.base_model = keras.Sequential(
            [
                keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="block1_conv1"),
                keras.layers.MaxPooling2D(name="block1_pool"),
                keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="block2_conv1"),
                keras.layers.MaxPooling2D(name="block2_pool"),
            ],
            name="vgg16",
        )
        self.flatten1 = keras.layers.Flatten(name="flatten")
        self.dense1 = keras.layers.Dense(32, activation="relu", name="fc1")
        self.dense2 = keras.layers.Dense(16, activation="relu", name="fc2")
        self.dense3 = keras.layers.Dense(num_classes, activation="softmax", name="predictions")

    def call(self, inputs):
        x = self.base_model(tf.cast(inputs, tf.float32))
        x = self.flatten1(x)
        x = self.dense1(x)
        x = self.dense2(x)
        return self.dense3(x)


@pytest.fixture(scope="module")
def restored(tmp_path_factory):
    keras.utils.set_random_seed(1)
    images = np.abs(np.random.default_rng(0).normal(size=(4, 32, 32, 3)))  # float64, as in the question
    trained = VGGStyle(num_classes=2)
    trained(images[:1])
    # make the head extremely confident: probabilities saturate to exactly 1.0 / ~1e-25 in float32
    kernel = np.zeros_like(trained.dense3.get_weights()[0])
    kernel[:, 0] = 5.0
    kernel[:, 1] = -5.0
    trained.dense3.set_weights([kernel, np.array([30.0, -30.0], np.float32)])
    path = tmp_path_factory.mktemp("ckpt") / "ckpt"
    tf.train.Checkpoint(net=trained).write(str(path))
    model = VGGStyle(num_classes=2)
    model(images[:1])
    status = tf.train.Checkpoint(net=model).read(str(path))
    status.assert_consumed()
    return model, images


def test_probabilities_are_saturated_and_naive_gradient_is_zero(restored):
    model, images = restored
    probs = model(images).numpy()
    assert np.all(probs[:, 0] == 1.0)
    assert np.all(probs[:, 1] < 1e-20)
    x = tf.convert_to_tensor(images)
    labels = tf.constant([[1.0, 0.0]] * len(images), tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = keras.losses.CategoricalCrossentropy()(labels, model(x))
    assert np.all(tape.gradient(loss, x).numpy() == 0.0)  # the user's problem, reproduced


def test_saliency_of_logit_is_not_zero_and_matches_tape(restored, unchanged):
    model, images = restored
    check = unchanged(model)
    explanation = ks.Saliency(model).explain(images, targets=0)
    grads = explanation.attributions
    assert grads.shape == images.shape
    assert np.abs(grads).max() > 1e-3

    x = tf.convert_to_tensor(images, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        h = model.dense2(model.dense1(model.flatten1(model.base_model(x))))
        logits = tf.matmul(h, model.dense3.kernel) + model.dense3.bias  # the pre-softmax logit, by hand
        score = tf.reduce_sum(logits[:, 0])
    expected = tape.gradient(score, x).numpy()
    np.testing.assert_allclose(grads, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(explanation.scores, logits[:, 0].numpy(), rtol=1e-5)
    assert ks.Saliency(model).engine.bypassed_layers == ["predictions"]
    check()


def test_probabilities_output_opts_back_into_softmax(restored, unchanged):
    model, images = restored
    check = unchanged(model)
    explanation = ks.Saliency(model, output="probabilities").explain(images, targets=0)
    np.testing.assert_array_equal(explanation.scores, np.ones(len(images), np.float32))
    assert np.all(explanation.attributions == 0.0)
    check()


class SoftmaxInCall(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2, name="dense")

    def call(self, inputs):
        return tf.nn.softmax(self.dense(inputs) * 100.0)


def test_unbypassable_saturated_softmax_warns():
    model = SoftmaxInCall()
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    model(x)
    with pytest.warns(RuntimeWarning, match="saturated probabilities"):
        ks.Saliency(model).explain(x, targets=0)
