"""ShapleyCAM: against pytorch-grad-cam 1.5.7 on the torch twin, and its second-order term by hand on every backend.

The reference is the library's own ``ShapleyCAM`` (see tests/test_cam_library_variants.py for the install and the
empty ``torchvision`` stand-in): its hooked activations and graph-carrying gradients after the double-backward
pass its ``forward`` runs, then its ``get_cam_image`` and ``np.maximum(cam, 0)``. The twin ends in a tanh
convolution after the explained ReLU layer, so the Hessian term is not zero there.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from test_cam_library_variants import TARGETS, _grad_cam, build_keras, torch_twin  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.core.engine import engine_for  # noqa: E402
from kerascope.methods._second_order import hessian_vector_products  # noqa: E402

ON_TF = keras.backend.backend() == "tensorflow"


@pytest.fixture(scope="module")
def model() -> keras.Model:
    return build_keras()


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (len(TARGETS), 12, 12, 3)).astype(np.float32)


def _library_shapley(net, x: np.ndarray, targets: list[int]) -> np.ndarray:
    torch, grad_cam = _grad_cam()
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    layer = net[3]
    cam = grad_cam.ShapleyCAM(model=net, target_layers=[layer])
    tensor = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).requires_grad_(True)
    wanted = [ClassifierOutputTarget(t) for t in targets]
    outputs = cam.activations_and_grads(tensor)  # the library's forward, step by step, before its scaling
    net.zero_grad()
    loss = sum(target(output) for target, output in zip(wanted, outputs, strict=True))
    torch.autograd.grad(loss, tensor, retain_graph=True, create_graph=True)
    activations = cam.activations_and_grads.activations[0]
    gradients = cam.activations_and_grads.gradients[0]
    raw = cam.get_cam_image(tensor, layer, wanted, activations, gradients, False)
    cam.activations_and_grads.release()
    return np.maximum(raw, 0)


@pytest.mark.skipif(not ON_TF, reason="pytorch-grad-cam cross-check: TensorFlow run only")
def test_equals_pytorch_grad_cam(model: keras.Model, x: np.ndarray) -> None:
    expected = _library_shapley(torch_twin(model), x, TARGETS)
    got = ks.ShapleyCAM(model, layer="r2", upsample=False, batch_size=2).explain(x, TARGETS).attributions
    gradcam = ks.GradCAM(model, layer="r2", upsample=False).explain(x, TARGETS).attributions
    assert got.shape == expected.shape == (len(TARGETS), 10, 10)
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    assert not np.allclose(got, gradcam, atol=1e-3 * np.abs(got).max())  # the second-order term matters here


def _hand_hvp(model: keras.Model, x: np.ndarray, targets: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Activations, gradients and H A at "r2" from a hand-built head, by finite differences of exact gradients.

    The head after "r2" (c3 tanh, flatten, the dense logits) in numpy-free Keras ops; ``H A`` as the central
    difference of the head's gradient along ``A`` (float64 would be exact to the step; float32 with a
    relative step of 1e-3 is good to ~1e-4 of the gradient's scale).
    """
    stem = keras.Sequential([model.get_layer("c1"), model.get_layer("c2"), model.get_layer("r2")])
    c3, dense = model.get_layer("c3"), model.get_layer("out")
    a = keras.ops.convert_to_numpy(stem(x)).astype(np.float64)
    k3, b3 = (w.astype(np.float64) for w in c3.get_weights())
    kd, bd = (w.astype(np.float64) for w in dense.get_weights())

    def gradient(acts: np.ndarray) -> np.ndarray:
        # forward: z = conv(acts) valid 3x3; h = tanh(z); logits = flatten(h) kd + bd
        n, s = acts.shape[0], acts.shape[1] - 2
        patches = np.stack([acts[:, i:i + s, j:j + s, :] for i in range(3) for j in range(3)], axis=3)
        z = np.einsum("nhwpc,pco->nhwo", patches, k3.reshape(9, k3.shape[2], k3.shape[3])) + b3
        dh = kd[:, targets].T.reshape(n, s, s, -1)  # d logit_t / d h
        dz = dh * (1.0 - np.tanh(z) ** 2)
        grad = np.zeros_like(acts)
        kernel = k3.reshape(9, k3.shape[2], k3.shape[3])
        for p, (i, j) in enumerate((i, j) for i in range(3) for j in range(3)):
            grad[:, i:i + s, j:j + s, :] += np.einsum("nhwo,co->nhwc", dz, kernel[p])
        return grad

    step = 1e-4
    hvp = (gradient(a * (1 + step)) - gradient(a * (1 - step))) / (2 * step)
    return a, gradient(a), hvp


def test_second_order_terms_equal_a_hand_computation(model: keras.Model, x: np.ndarray) -> None:
    a, g, hvp = _hand_hvp(model, x, TARGETS)
    out = hessian_vector_products(engine_for(model), x, TARGETS, model.get_layer("r2"), batch_size=3)
    np.testing.assert_allclose(out["acts"], a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["grads"], g, rtol=1e-4, atol=1e-5 * np.abs(g).max())
    assert np.abs(hvp).max() > 1e-3
    np.testing.assert_allclose(out["hvp"], hvp, rtol=1e-3, atol=1e-4 * np.abs(hvp).max())
    assert out["targets"].tolist() == TARGETS


def test_map_is_gradcam_with_corrected_weights_and_batch_invariant(model: keras.Model, x: np.ndarray) -> None:
    a, g, hvp = _hand_hvp(model, x, TARGETS)
    weights = (g - 0.5 * hvp).mean(axis=(1, 2))
    expected = np.maximum(np.einsum("nhwc,nc->nhw", a, weights), 0)
    one = ks.ShapleyCAM(model, layer="r2", upsample=False, batch_size=1).explain(x, TARGETS).attributions
    many = ks.ShapleyCAM(model, layer="r2", upsample=False, batch_size=5).explain(x, TARGETS).attributions
    np.testing.assert_allclose(many, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())
    np.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-6 * np.abs(many).max())


def test_piecewise_linear_head_gives_gradcam() -> None:
    """After ReLU convolutions and dense layers the Hessian is zero almost everywhere: ShapleyCAM = Grad-CAM."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, activation="relu", name="c"),
        keras.layers.Conv2D(3, 3, activation="relu"), keras.layers.Flatten(), keras.layers.Dense(3),
    ])
    x = np.random.default_rng(0).random((3, 8, 8, 2)).astype(np.float32)
    shapley = ks.ShapleyCAM(model, layer="c").explain(x, [0, 1, 2]).attributions
    gradcam = ks.GradCAM(model, layer="c").explain(x, [0, 1, 2]).attributions
    np.testing.assert_allclose(shapley, gradcam, rtol=1e-5, atol=1e-6 * max(np.abs(gradcam).max(), 1e-12))


def test_model_unchanged_and_clear_error_for_an_unknown_layer(model: keras.Model, x: np.ndarray) -> None:
    before = [w.copy() for w in model.get_weights()]
    call = model.get_layer("r2").call
    ks.ShapleyCAM(model, layer="r2").explain(x[:2], None)
    assert model.get_layer("r2").call == call
    for old, new in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)
    with pytest.raises(ValueError, match="Received: layer='nope'"):
        ks.ShapleyCAM(model, layer="nope")


def test_tokens_of_an_image_are_weighed_on_their_grid() -> None:
    """A (N, tokens, C) layer on an image leaves the compiled pass as arrays (the map is not computed inside):
    the map is still ``ReLU(sum_c mean_t(g - H A / 2)_c A_c)`` on the patch grid."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 2))
    h = keras.layers.Reshape((16, 4))(keras.layers.Conv2D(4, 2, strides=2)(inp))
    mix = keras.layers.Dense(4, activation="tanh", name="mix")
    h = keras.layers.GlobalAveragePooling1D()(mix(h))
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.Dense(3, activation="tanh")(h)))
    x = np.random.default_rng(0).normal(size=(3, 8, 8, 2)).astype(np.float32)
    out = hessian_vector_products(engine_for(model), x, [0, 1, 2], mix)
    weights = (out["grads"] - 0.5 * out["hvp"]).mean(axis=1)
    expected = np.maximum(np.einsum("ntc,nc->nt", out["acts"], weights), 0).reshape(3, 4, 4)
    assert np.abs(out["hvp"]).max() > 1e-3 and expected.max() > 0
    maps = ks.ShapleyCAM(model, layer="mix", upsample=False).explain(x, [0, 1, 2]).attributions
    np.testing.assert_allclose(maps, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
