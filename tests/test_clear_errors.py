"""Cases that used to end in a backend's raw traceback: each now gives kerascope's own error, or just works."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.metrics._common import Scorer

BACKEND = keras.backend.backend()


def _lstm_with_states(return_sequences: bool) -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((5, 3))
    seq, h, c = keras.layers.LSTM(4, return_state=True, return_sequences=return_sequences, name="lstm")(x)
    head = keras.layers.Flatten()(seq) if return_sequences else seq
    return keras.Model(x, keras.layers.Dense(2)(keras.layers.Concatenate()([head, h])))


SEVERAL = r"Layer 'lstm' returns several tensors \(a (tuple|list) of 3\).*Received: layer='lstm'"


@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("call", ["gradcam", "saliency_layer", "layer_gradients", "layercam"])
def test_a_layer_with_several_output_tensors_is_refused_by_name(call, return_sequences):
    m = _lstm_with_states(return_sequences)
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32")
    run = {
        "gradcam": lambda: ks.GradCAM(m, layer="lstm").explain(x, 0),
        "layercam": lambda: ks.LayerCAM(m, layer="lstm").explain(x, 0),
        "saliency_layer": lambda: ks.Saliency(m, layer="lstm").explain(x, 0),
        "layer_gradients": lambda: ks.layer_gradients(m, x, "lstm", 0),
    }[call]
    with pytest.raises(ValueError, match=SEVERAL):
        run()


@pytest.mark.parametrize("ids", [[[1, 2, 3, 1]], [[0, 0, 0, 0], [4, 2, 4, 9]]])
def test_weight_gradients_at_an_embedding_are_the_dense_gradient(ids):
    keras.utils.set_random_seed(0)
    emb = keras.layers.Embedding(10, 3, name="emb")
    dense = keras.layers.Dense(2, name="out")
    m = keras.Sequential([keras.Input((4,), dtype="int32"), emb, keras.layers.Flatten(), dense])
    ids = np.asarray(ids, np.int32)
    grads = ks.weight_gradients(m, ids, "emb", targets=1)
    (gradient,) = grads.values()
    assert isinstance(gradient, np.ndarray) and gradient.shape == (10, 3)
    # closed form: the score is sum_p E[id_p] . W[3p:3p+3, 1], so row r gets the sum of W's blocks where id_p = r
    kernel = np.asarray(dense.kernel)[:, 1].reshape(4, 3)
    expected = np.zeros((10, 3))
    for sample in ids:
        for position, row in enumerate(sample):
            expected[row] += kernel[position]
    np.testing.assert_allclose(gradient, expected, rtol=1e-5, atol=1e-6)


def test_a_torch_tensor_that_requires_grad_is_detached_and_explained():
    torch = pytest.importorskip("torch")
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, use_bias=False)])
    m.layers[0].set_weights([np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]])])
    x = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.0, 2.0]], requires_grad=True)
    e = ks.GradientXInput(m).explain(x, 0)
    np.testing.assert_allclose(e.attributions, [[1.0, 2.0, 3.0], [0.5, 0.0, 6.0]], rtol=1e-6)
    leaf = torch.ones((2, 3), requires_grad=True) * 2.0  # not a leaf: the output of an op under autograd
    np.testing.assert_allclose(ks.Saliency(m).explain(leaf, 0).attributions, [[1.0, 2.0, 3.0]] * 2, rtol=1e-6)
    assert x.grad is None  # the user's tensor is read, never differentiated


@pytest.mark.parametrize("integer", [np.int64(8), np.int32(3), np.uint8(2)])
def test_numpy_integers_are_accepted_as_batch_size_steps_and_samples(integer):
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, kernel_initializer="ones")])
    x = np.ones((5, 3), "float32")
    reference = ks.IntegratedGradients(m, steps=8, batch_size=4).explain(x, 0).attributions
    e = ks.IntegratedGradients(m, steps=np.int64(8), batch_size=integer).explain(x, 0)
    np.testing.assert_allclose(e.attributions, reference, rtol=1e-6)
    assert ks.layer_gradients(m, x, m.layers[0], 0, batch_size=integer).gradients.shape == (5, 2)
    assert Scorer(m, batch_size=integer).batch_size == int(integer)
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int. Received: batch_size=np.int64\(0\)"):
        ks.Saliency(m, batch_size=np.int64(0))
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        ks.Saliency(m, batch_size=np.bool_(True))
