"""Attention probabilities per layer / head, and attention rollout against a numpy re-implementation.

References: Keras' own ``MultiHeadAttention(..., return_attention_scores=True)`` called directly, and a numpy
rollout written here from the paper (Abnar & Zuidema 2020).
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.attention import capture

keras_hub = pytest.importorskip("keras_hub")

#: compile-heavy on JAX: there it runs under -m slow (one lighter test per feature stays in the fast run)
heavy_on_jax = pytest.mark.slow if keras.backend.backend() == "jax" else (lambda test: test)


def two_layer(tokens: int = 5, dim: int = 4):
    keras.utils.set_random_seed(4)
    x = keras.Input((tokens, dim))
    a1 = keras.layers.MultiHeadAttention(2, 3, name="a1")
    a2 = keras.layers.MultiHeadAttention(2, 3, name="a2")
    h = x + a1(x, x)
    h = h + a2(h, h)
    model = keras.Model(x, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
    return model, a1, a2


def numpy_rollout(maps, residual=0.5):
    n, _, t, _ = maps[0].shape
    out = np.zeros((n, t, t))
    for s in range(n):
        r = np.eye(t)
        for a in maps:
            m = a[s].mean(0)
            m = residual * np.eye(t) + (1 - residual) * m
            m = m / m.sum(-1, keepdims=True)
            r = m @ r
        out[s] = r
    return out


@heavy_on_jax
def test_maps_equal_keras_own_attention_scores_and_model_unchanged():
    model, a1, a2 = two_layer()
    x = np.random.RandomState(0).rand(3, 5, 4).astype("float32")
    before = {k: type(v) for k, v in vars(a1).items()}
    reference = keras.ops.convert_to_numpy(model(x))
    maps = ks.attention_maps(model, x, batch_size=2)
    assert list(maps) == ["a1", "a2"]
    _, s1 = a1(x, x, return_attention_scores=True)
    h = x + keras.ops.convert_to_numpy(a1(x, x))
    _, s2 = a2(h, h, return_attention_scores=True)
    np.testing.assert_allclose(maps["a1"], keras.ops.convert_to_numpy(s1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(maps["a2"], keras.ops.convert_to_numpy(s2), rtol=1e-5, atol=1e-6)
    assert {k: type(v) for k, v in vars(a1).items()} == before
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), reference)


def test_rollout_equals_numpy_reimplementation_with_and_without_class_token():
    model, _, _ = two_layer()
    x = np.random.RandomState(1).rand(2, 5, 4).astype("float32")
    maps = ks.attention_maps(model, x)
    want = numpy_rollout([maps["a1"], maps["a2"]])
    mean = ks.AttentionRollout(model, class_token=False).explain(x, 0)
    np.testing.assert_allclose(mean.attributions, want.mean(1), rtol=1e-5, atol=1e-6)
    row = ks.AttentionRollout(model, class_token=True).explain(x, 0)
    np.testing.assert_allclose(row.attributions, want[:, 0, 1:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean.scores, keras.ops.convert_to_numpy(model(x))[:, 0], rtol=1e-5)


@heavy_on_jax
def test_vit_rollout_is_an_image_map_or_the_token_grid():
    keras.utils.set_random_seed(5)
    backbone = keras_hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2,
                                            hidden_dim=8, mlp_dim=16)
    vit = keras_hub.models.ViTImageClassifier(backbone, num_classes=3, preprocessor=None)
    x = np.random.RandomState(2).rand(2, 16, 16, 3).astype("float32")
    maps = ks.attention_maps(vit, x)
    assert len(maps) == 2 and all(a.shape == (2, 2, 17, 17) for a in maps.values())
    want = numpy_rollout(list(maps.values()))[:, 0, 1:].reshape(2, 4, 4)
    grid = ks.AttentionRollout(vit, upsample=False).explain(x, 1)
    np.testing.assert_allclose(grid.attributions, want, rtol=1e-5, atol=1e-6)
    image = ks.explain(vit, x, method="attention_rollout", targets=1)
    assert image.attributions.shape == (2, 16, 16)


@heavy_on_jax
def test_keras_hub_text_masks_give_zero_probability():
    keras.utils.set_random_seed(6)
    bert = keras_hub.models.BertBackbone(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                                         intermediate_dim=16, max_sequence_length=8)
    x = {"token_ids": np.array([[2, 5, 9, 0]]), "padding_mask": np.array([[1, 1, 1, 0]]),
         "segment_ids": np.zeros((1, 4), "int32")}
    maps = ks.attention_maps(bert, x)
    assert len(maps) == 2
    for a in maps.values():
        assert np.all(a[..., 3] == 0.0) and np.allclose(a.sum(-1), 1.0, atol=1e-5)
    gpt2 = keras_hub.models.GPT2Backbone(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                                         intermediate_dim=16, max_sequence_length=8)
    causal = ks.attention_maps(gpt2, {"token_ids": np.array([[2, 5, 9, 4]]), "padding_mask": np.ones((1, 4))})
    for a in causal.values():
        assert np.all(a[0][:, np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0.0)


def test_capture_is_invisible_to_other_threads():
    model, a1, _ = two_layer()
    x = np.random.RandomState(3).rand(1, 5, 4).astype("float32")
    reference = keras.ops.convert_to_numpy(model(x))
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def capturing():
        with capture([a1]) as records:
            inside.set()
            done.wait(60)
            seen["records"] = len(records[id(a1)])

    worker = threading.Thread(target=capturing)
    worker.start()
    assert inside.wait(60)
    other = keras.ops.convert_to_numpy(model(x))  # another thread's call while the capture is active
    done.set()
    worker.join(60)
    np.testing.assert_array_equal(other, reference)
    assert seen["records"] == 0 and "_compute_attention" not in vars(a1)


def test_refusals_name_what_to_do():
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match="no attention layer"):
        ks.attention_maps(plain, np.ones((1, 3)))
    model, _, _ = two_layer()
    with pytest.raises(ValueError, match="not an attention layer"):
        ks.attention_maps(model, np.ones((1, 5, 4)), layers=[model.layers[-1]])
