"""A CAM on token ids with no ``layer=``: a tied embedding (called twice: tokens in, logits out) is never the default.

The default layer is one called once per forward pass, so no ``call_index`` the user never gave is asked for.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks

T, V, D = 6, 11, 8


def tied_lm() -> keras.Model:
    """ids -> tied embedding -> Dense(tanh) -> the same embedding reversed (logits over the vocabulary)."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(2)
    ids = keras.Input((T,), dtype="int32", name="token_ids")
    embedding = keras_hub.layers.ReversibleEmbedding(V, D, tie_weights=True, name="tied")
    hidden = keras.layers.Dense(D, activation="tanh", name="hidden")(embedding(ids))
    return keras.Model(ids, embedding(hidden, reverse=True), name="tied_lm")


def test_default_cam_layer_skips_the_tied_embedding(unchanged):
    model = tied_lm()
    ids = np.random.default_rng(0).integers(0, V, size=(3, T)).astype("int32")
    check = unchanged(model)
    target = ks.targets.position(-1, 4)
    e = ks.GradCAM(model, input_index="token_ids").explain({"token_ids": ids}, target)
    assert e.layer == "hidden"
    # Grad-CAM by hand: score = hidden[:, -1] . E[4], so the channel weights are E[4] / T
    hidden = keras.ops.convert_to_numpy(model.get_layer("hidden")(model.get_layer("tied")(ids)))
    table = keras.ops.convert_to_numpy(model.get_layer("tied").embeddings)
    expected = np.maximum(hidden @ table[4] / T, 0.0)
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-4, atol=1e-6)
    check()


def test_gpt2_cam_on_token_ids_without_layer():
    pytest.importorskip("keras_hub")
    from test_language import tiny_gpt2

    model, _ = tiny_gpt2()
    x = {"token_ids": np.array([[1, 5, 6, 8, 2, 3]]), "padding_mask": np.ones((1, 6), "int32")}
    target = ks.targets.position(-1, 3)
    e = ks.GradCAM(model, input_index="token_ids").explain(x, target)
    assert "token_embedding" not in e.layer and e.attributions.shape == (1, 6)
    explicit = ks.GradCAM(model, input_index="token_ids", layer=e.layer).explain(x, target)
    np.testing.assert_allclose(e.attributions, explicit.attributions, rtol=1e-6)
    assert np.isfinite(e.attributions).all() and np.abs(e.attributions).max() > 0
