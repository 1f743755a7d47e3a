"""FEM, EigenGradCAM, GradCAMElementWise and KPCACAM against pytorch-grad-cam 1.5.7 on a torch twin.

The reference is the library itself (``pip install --no-deps grad-cam==1.5.7 ttach opencv-python-headless``,
see scripts/test.sh). Its package ``__init__`` imports every module, and three of them import torchvision only
for helpers these tests never call (``sess.py``: ``transforms.functional.resize``; ``utils/image.py``:
``Compose, Normalize, ToTensor``; ``utils/model_targets.py``: ``ops.box_iou`` of the detection target).
torchvision from PyPI does not load beside torch 2.13, so :func:`_grad_cam` registers an empty stand-in module
for ``torchvision`` in ``sys.modules`` before the import; nothing of the stand-in is ever called.

The same weights in Keras (channels last) and torch (channels first). The library's raw map is its own
``get_cam_image`` on its own hooked activations and gradients, then ``np.maximum(cam, 0)`` (the first line of
its ``compute_cam_per_layer``); its later steps (min-max scaling, cv2 resize) are display post-processing that
kerascope leaves to ``viz``, so the maps are compared at the layer (``upsample=False``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import sys  # noqa: E402
import types  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods.cam_library_variants import kernel_projection  # noqa: E402
from kerascope.methods.cam_variants import principal_projection  # noqa: E402

SIZE, CHANNELS, CLASSES = 12, 3, 4
TARGETS = [0, 3, 1, 2, 3]
ON_TF = keras.backend.backend() == "tensorflow"


def _grad_cam():
    """``pytorch_grad_cam`` with an empty ``torchvision`` stand-in (see the module notes), or skip."""
    torch = pytest.importorskip("torch")
    if "torchvision" not in sys.modules:
        vision = types.ModuleType("torchvision")
        transforms = types.ModuleType("torchvision.transforms")
        functional = types.ModuleType("torchvision.transforms.functional")
        for name in ("Compose", "Normalize", "ToTensor"):
            setattr(transforms, name, None)
        functional.resize = None
        vision.transforms, transforms.functional = transforms, functional
        sys.modules.update({
            "torchvision": vision, "torchvision.transforms": transforms,
            "torchvision.transforms.functional": functional,
        })
    return torch, pytest.importorskip("pytorch_grad_cam")


def build_keras(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    bias = keras.initializers.RandomNormal(0.0, 0.1, seed=seed)
    return keras.Sequential([
        keras.Input((SIZE, SIZE, CHANNELS)),
        keras.layers.Conv2D(5, 3, activation="relu", bias_initializer=bias, name="c1"),
        keras.layers.Conv2D(6, 3, padding="same", bias_initializer=bias, name="c2"),
        keras.layers.ReLU(name="r2"),
        keras.layers.Conv2D(4, 3, activation="tanh", bias_initializer=bias, name="c3"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(CLASSES, activation="softmax", bias_initializer=bias, name="out"),
    ])


def torch_twin(model: keras.Model):
    torch, _ = _grad_cam()
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(CHANNELS, 5, 3), nn.ReLU(), nn.Conv2d(5, 6, 3, padding=1), nn.ReLU(),
        nn.Conv2d(6, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 8 * 8, CLASSES),  # logits
    )
    for name, index in (("c1", 0), ("c2", 2), ("c3", 4)):
        kernel, bias = model.get_layer(name).get_weights()
        with torch.no_grad():
            net[index].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))))
            net[index].bias.copy_(torch.from_numpy(bias))
    kernel, bias = model.get_layer("out").get_weights()
    # Keras flattens (h, w, c), torch (c, h, w): permute the dense rows to match
    kernel = kernel.reshape(8, 8, 4, CLASSES).transpose(2, 0, 1, 3).reshape(-1, CLASSES)
    with torch.no_grad():
        net[7].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
        net[7].bias.copy_(torch.from_numpy(bias))
    return net.eval()


@pytest.fixture(scope="module")
def model() -> keras.Model:
    return build_keras()


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (len(TARGETS), SIZE, SIZE, CHANNELS)).astype(np.float32)


def library_raw(cls, net, x: np.ndarray, targets: list[int], **params) -> np.ndarray:
    """pytorch-grad-cam's map at the layer before its display post-processing, channels-last positions."""
    torch, grad_cam = _grad_cam()
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    layer = net[3]
    cam = cls(model=net, target_layers=[layer], **params)
    tensor = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    wanted = [ClassifierOutputTarget(t) for t in targets]
    outputs = cam.activations_and_grads(tensor)
    if cam.uses_gradients:
        net.zero_grad()
        sum(target(output) for target, output in zip(wanted, outputs, strict=True)).backward(retain_graph=True)
    activations = cam.activations_and_grads.activations[0].numpy()
    gradients = cam.activations_and_grads.gradients[0].numpy() if cam.uses_gradients else None
    raw = cam.get_cam_image(tensor, layer, wanted, activations, gradients, False)
    cam.activations_and_grads.release()
    return np.maximum(raw, 0)


reference_only = pytest.mark.skipif(not ON_TF, reason="pytorch-grad-cam cross-check: TensorFlow run only")


@reference_only
@pytest.mark.parametrize("name", ["FEM", "GradCAMElementWise", "KPCA_CAM"])
def test_equals_pytorch_grad_cam(model: keras.Model, x: np.ndarray, name: str) -> None:
    _, grad_cam = _grad_cam()
    ours = {"FEM": ks.FEM, "GradCAMElementWise": ks.GradCAMElementWise, "KPCA_CAM": ks.KPCACAM}[name]
    expected = library_raw(getattr(grad_cam, name), torch_twin(model), x, TARGETS)
    got = ours(model, layer="r2", upsample=False).explain(x, TARGETS).attributions
    assert got.shape == expected.shape == (len(TARGETS), 10, 10)
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@reference_only
@pytest.mark.parametrize("kernel", ["rbf", "poly", "cosine"])
def test_kpcacam_kernels_equal_pytorch_grad_cam(model: keras.Model, x: np.ndarray, kernel: str) -> None:
    _, grad_cam = _grad_cam()
    expected = library_raw(grad_cam.KPCA_CAM, torch_twin(model), x, TARGETS, kernel=kernel, gamma=0.3)
    got = ks.KPCACAM(model, layer="r2", upsample=False, kernel=kernel, gamma=0.3).explain(x, TARGETS).attributions
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@reference_only
def test_fem_other_k_equals_pytorch_grad_cam(model: keras.Model, x: np.ndarray) -> None:
    _, grad_cam = _grad_cam()
    expected = library_raw(grad_cam.FEM, torch_twin(model), x, TARGETS, k=1)
    got = ks.FEM(model, layer="r2", upsample=False, k=1).explain(x, TARGETS).attributions
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@reference_only
def test_eigengradcam_equals_pytorch_grad_cam_up_to_the_svd_sign(model: keras.Model, x: np.ndarray) -> None:
    """pytorch-grad-cam leaves the singular vector's sign to LAPACK; per sample, one of the two signs matches."""
    _, grad_cam = _grad_cam()
    net = torch_twin(model)
    positive = library_raw(grad_cam.EigenGradCAM, net, x, TARGETS)
    torch, _ = _grad_cam()
    got = ks.EigenGradCAM(model, layer="r2", upsample=False).explain(x, TARGETS).attributions
    # the library's signed projection: recover it from its own helper on its own g * A
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection

    cam = grad_cam.EigenGradCAM(model=net, target_layers=[net[3]])
    outputs = cam.activations_and_grads(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))))
    net.zero_grad()
    sum(outputs[i, t] for i, t in enumerate(TARGETS)).backward()
    acts = cam.activations_and_grads.activations[0].numpy()
    grads = cam.activations_and_grads.gradients[0].numpy()
    cam.activations_and_grads.release()
    signed = get_2d_projection(grads * acts)
    np.testing.assert_allclose(np.maximum(signed, 0), positive, rtol=1e-6, atol=1e-7)  # same raw map
    scale = np.abs(signed).max()
    for ours, theirs in zip(got, signed, strict=True):
        close = [np.allclose(ours, np.maximum(s * theirs, 0), rtol=1e-4, atol=1e-5 * scale) for s in (1, -1)]
        assert any(close), "EigenGradCAM differs from pytorch-grad-cam for both signs"


def test_elementwise_dominates_hirescam_and_equals_it_on_one_channel(model: keras.Model, x: np.ndarray) -> None:
    """sum_c ReLU(g A) >= ReLU(sum_c g A) everywhere, with equality when one channel carries every term."""
    element = ks.GradCAMElementWise(model, layer="r2", upsample=False).explain(x, TARGETS).attributions
    hires = ks.HiResCAM(model, layer="r2", upsample=False).explain(x, TARGETS).attributions
    assert np.all(element >= hires - 1e-6)
    assert np.any(element > hires + 1e-4)
    one = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(1, 3, name="c"),
                            keras.layers.Flatten(), keras.layers.Dense(2)])
    xs = np.random.default_rng(2).normal(size=(2, 6, 6, 1)).astype(np.float32)
    np.testing.assert_allclose(
        ks.GradCAMElementWise(one, layer="c", upsample=False).explain(xs, 1).attributions,
        ks.HiResCAM(one, layer="c", upsample=False).explain(xs, 1).attributions, rtol=1e-5, atol=1e-6)


def test_fem_weights_by_hand(model: keras.Model, x: np.ndarray) -> None:
    """The k-sigma rule with numpy on the layer's activations, and k large enough leaves no channel."""
    result = ks.GradCAM(model, layer="r2", upsample=False).layer_data(ks.core.inputs.Inputs(x), TARGETS,
                                                                       model.get_layer("r2"))
    a = np.asarray(result.activations[0], np.float64)
    threshold = a.mean(axis=(1, 2), keepdims=True) + 2 * a.std(axis=(1, 2), keepdims=True)
    expected = np.maximum(np.einsum("nhwc,nc->nhw", a, (a > threshold).mean(axis=(1, 2))), 0)
    got = ks.FEM(model, layer="r2", upsample=False).explain(x, TARGETS).attributions
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * expected.max())
    assert not ks.FEM(model, layer="r2", upsample=False, k=100).explain(x, TARGETS).attributions.any()


def test_kpca_linear_kernel_is_eigencam(model: keras.Model, x: np.ndarray) -> None:
    """Kernel PCA with a linear kernel is PCA: the projection is Eigen-CAM's up to the sign."""
    a = np.random.default_rng(3).normal(size=(3, 5, 5, 6))
    linear, principal = kernel_projection(a, "linear"), principal_projection(a)
    for k, p in zip(linear, principal, strict=True):
        sign = np.sign(np.sum(k * p))
        np.testing.assert_allclose(k, sign * p, rtol=1e-4, atol=1e-5)


def test_batch_invariance_and_clear_errors(model: keras.Model, x: np.ndarray) -> None:
    for cls in (ks.FEM, ks.EigenGradCAM, ks.GradCAMElementWise, ks.KPCACAM):
        full = cls(model, layer="r2").explain(x, TARGETS).attributions
        parts = cls(model, layer="r2", batch_size=2).explain(x, TARGETS).attributions
        np.testing.assert_allclose(parts, full, rtol=1e-5, atol=1e-6)
        assert full.shape == (len(TARGETS), SIZE, SIZE)
    with pytest.raises(ValueError, match="Received: kernel='tanh'. Available"):
        ks.KPCACAM(model, kernel="tanh")
    with pytest.raises(ValueError, match="gamma"):
        ks.KPCACAM(model, gamma=-1.0)
    with pytest.raises(ValueError, match="Received: k='2'"):
        ks.FEM(model, k="2")


def test_registered_by_name(model: keras.Model, x: np.ndarray) -> None:
    for name, cls in (("fem", ks.FEM), ("eigen_grad_cam", ks.EigenGradCAM),
                      ("gradcam-elementwise", ks.GradCAMElementWise), ("kpca_cam", ks.KPCACAM)):
        assert isinstance(ks.methods.build(name, model, {"layer": "r2"}), cls)


# ----------------------------------------------------------------------------------------- FullGrad
def build_bn_pair():
    torch, _ = _grad_cam()
    nn = torch.nn
    keras.utils.set_random_seed(4)
    rng = np.random.default_rng(4)
    bias = keras.initializers.RandomNormal(0.0, 0.2, seed=4)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, CHANNELS)),
        keras.layers.Conv2D(5, 3, activation="relu", bias_initializer=bias, name="c1"),
        keras.layers.Conv2D(6, 3, padding="same", use_bias=False, name="c2"),
        keras.layers.BatchNormalization(epsilon=1e-3, name="bn"),
        keras.layers.ReLU(name="r2"),
        keras.layers.Conv2D(4, 3, activation="tanh", bias_initializer=bias, name="c3"),
        keras.layers.Flatten(),
        keras.layers.Dense(CLASSES, name="out"),
    ])
    bn = model.get_layer("bn")
    bn.set_weights([rng.uniform(0.5, 1.5, 6), rng.normal(0, 0.3, 6), rng.normal(0, 0.5, 6), rng.uniform(0.5, 2, 6)])
    net = nn.Sequential(
        nn.Conv2d(CHANNELS, 5, 3), nn.ReLU(), nn.Conv2d(5, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6, eps=1e-3), nn.ReLU(), nn.Conv2d(6, 4, 3), nn.Tanh(), nn.Flatten(),
        nn.Linear(4 * 8 * 8, CLASSES),
    )
    with torch.no_grad():
        for name, index in (("c1", 0), ("c3", 5)):
            kernel, b = model.get_layer(name).get_weights()
            net[index].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))))
            net[index].bias.copy_(torch.from_numpy(b))
        net[2].weight.copy_(torch.from_numpy(np.ascontiguousarray(model.get_layer("c2").get_weights()[0]
                                                                  .transpose(3, 2, 0, 1))))
        gamma, beta, mean, var = (torch.from_numpy(w.astype(np.float32)) for w in bn.get_weights())
        net[3].weight.copy_(gamma)
        net[3].bias.copy_(beta)
        net[3].running_mean.copy_(mean)
        net[3].running_var.copy_(var)
        kernel, b = model.get_layer("out").get_weights()
        kernel = kernel.reshape(8, 8, 4, CLASSES).transpose(2, 0, 1, 3).reshape(-1, CLASSES)
        net[8].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
        net[8].bias.copy_(torch.from_numpy(b))
    return model, net.eval()


@reference_only
def test_fullgrad_equals_pytorch_grad_cam(x: np.ndarray) -> None:
    """The library's summed per-layer maps (input-gradient and bias-gradient parts) before its final scaling."""
    torch, grad_cam = _grad_cam()
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model, net = build_bn_pair()
    cam = grad_cam.FullGrad(model=net, target_layers=[])
    tensor = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).requires_grad_(True)
    wanted = [ClassifierOutputTarget(t) for t in TARGETS]
    outputs = cam.activations_and_grads(tensor)
    net.zero_grad()
    sum(target(output) for target, output in zip(wanted, outputs, strict=True)).backward(retain_graph=True)
    expected = cam.compute_cam_per_layer(tensor, wanted, False).sum(axis=1)
    cam.activations_and_grads.release()
    assert len(cam.bias_data) == 3  # c1, bn, c3 (c2 has no bias)
    got = ks.FullGrad(model).explain(x, TARGETS)
    assert got.attributions.shape == expected.shape == (len(TARGETS), SIZE, SIZE)
    np.testing.assert_allclose(got.attributions, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got.scores, net(tensor).detach().numpy()[np.arange(len(TARGETS)), TARGETS], rtol=1e-4)


def test_fullgrad_parts_by_hand() -> None:
    """One biased linear convolution: the input part plus the bias part, both with numpy."""
    layer = keras.layers.Conv2D(2, 3, bias_initializer=keras.initializers.Constant([0.5, -1.0]), name="c")
    model = keras.Sequential([keras.Input((6, 6, 1)), layer, keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant([[1.0], [2.0]]))])
    x = np.random.default_rng(5).normal(size=(2, 6, 6, 1)).astype(np.float32)
    got = ks.FullGrad(model).explain(x, 0).attributions
    kernel = layer.get_weights()[0]  # (3, 3, 1, 2); score = mean over 4x4 of (conv . [1, 2]) + ...
    g_out = np.broadcast_to(np.array([1.0, 2.0]) / 16, (2, 4, 4, 2))  # gradient at the conv output
    grad_x = np.zeros_like(x, dtype=np.float64)
    for i in range(4):
        for j in range(4):
            grad_x[:, i:i + 3, j:j + 3, 0] += np.einsum("khc,nc->nkh", kernel[:, :, 0, :], g_out[:, i, j])

    def psi(m):
        m = m - m.min(axis=(1, 2), keepdims=True)
        return (m / (m.max(axis=(1, 2), keepdims=True) + 1e-7)).sum(axis=-1)

    bias_part = psi(np.abs(np.array([0.5, -1.0]) * g_out))  # constant maps scale to 0
    expected = psi(np.abs(x * grad_x)) + ks.numeric.resize.upsample(bias_part, (6, 6))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_fullgrad_refuses_what_it_cannot_read() -> None:
    gelu = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3, activation="gelu", name="c"),
                             keras.layers.Flatten(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="activation='gelu'"):
        ks.FullGrad(gelu).explain(np.ones((1, 6, 6, 1), np.float32), 0)
    table = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="image inputs"):
        ks.FullGrad(table).explain(np.ones((1, 4), np.float32), 0)


@reference_only
def test_kpca_projection_on_large_layers_equals_the_library_helper() -> None:
    """Above 200 positions scikit-learn (ARPACK) and kerascope (batched Lanczos) find only the leading pair."""
    _grad_cam()
    from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection_kernel

    a = np.abs(np.random.default_rng(7).normal(size=(3, 18, 18, 8))).astype(np.float32)  # 324 positions
    for kernel in ("sigmoid", "rbf"):
        expected = get_2d_projection_kernel(a.transpose(0, 3, 1, 2), kernel, None)
        np.testing.assert_allclose(kernel_projection(a, kernel), expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
