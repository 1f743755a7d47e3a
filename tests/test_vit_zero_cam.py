"""A CAM at a ViT layer whose patch tokens do not feed the class token is exactly zero, and says so."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import kerascope as ks


class ClassToken(keras.layers.Layer):
    """Prepends one learned token to ``(N, T, C)`` tokens."""

    def build(self, input_shape):
        self.token = self.add_weight(shape=(1, 1, input_shape[-1]), initializer="random_normal", name="token")

    def call(self, tokens):
        batch = keras.ops.shape(tokens)[0]
        return keras.ops.concatenate([keras.ops.tile(self.token, [batch, 1, 1]), tokens], axis=1)


def tiny_vit() -> keras.Model:
    """8x8 images, 2x2 patches of 4 px, a class token, two attention blocks, the class token classified."""
    keras.utils.set_random_seed(0)
    images = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 4, strides=4, name="patches")(images)
    x = ClassToken(name="cls")(keras.layers.Reshape((4, 8))(x))
    for i in range(2):
        y = keras.layers.LayerNormalization(name=f"norm{i}")(x)
        y = keras.layers.MultiHeadAttention(2, 4, name=f"mha{i}")(y, y)
        x = keras.layers.Add(name=f"block{i}")([x, y])
    cls = keras.layers.Lambda(lambda t: t[:, 0], name="take_cls")(x)
    return keras.Model(images, keras.layers.Dense(3, name="head")(cls), name="tiny_vit")


@pytest.mark.parametrize("method", [ks.GradCAM, ks.LayerCAM])
def test_cam_after_the_last_block_is_zero_and_warned(method, unchanged):
    model = tiny_vit()
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    check = unchanged(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        e = method(model, layer="block1").explain(x, 1)
    assert e.attributions.shape == (2, 8, 8) and np.all(e.attributions == 0)
    said = [str(w.message) for w in seen if issubclass(w.category, ks.ExplanationWarning)]
    assert said and "[0, 1]" in said[0] and "layer 'block1'" in said[0]
    assert "do not reach the explained output" in said[0] and "class token" in said[0]
    # the previous block's tokens do feed the class token (through the last attention): no zero map there
    with warnings.catch_warnings():  # (Grad-CAM's ReLU may clip one sample there: not what is tested)
        warnings.simplefilter("ignore", ks.ExplanationWarning)
        earlier = method(model, layer="block0").explain(x, 1)
    assert np.any(earlier.attributions != 0)
    check()
