"""Cross-checks against Captum on identical weights (the same tiny CNN in PyTorch and Keras).

Needs ``pip install torch==2.13.0 captum`` (the CPU build of torch). Conventions compared like
with like: Keras is channels-last and PyTorch channels-first, so inputs and attributions are
transposed; Captum's ``Saliency`` defaults to ``abs=True`` (kerascope: signed unless
``absolute=True``); Captum's ``riemann_trapezoid`` weights sum to ``(n-1)/n`` where kerascope's
textbook rule sums to 1, so Captum's result is ``(n-1)/n`` times kerascope's.
Agreement: ``max |kerascope - captum| <= 1e-4 * max |captum|`` (float32 on both sides).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

captum_attr = pytest.importorskip("captum.attr")
torch = pytest.importorskip("torch")

import kerascope as ks  # noqa: E402

pytestmark = pytest.mark.captum

SIZE, CHANNELS, CLASSES = 8, 3, 3


def build_pair(seed: int = 0) -> tuple[keras.Model, torch.nn.Module]:
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    bias = lambda: keras.initializers.RandomNormal(0.0, 0.1, seed=int(rng.integers(1 << 30)))  # noqa: E731
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, CHANNELS)),
        keras.layers.Conv2D(4, 3, activation="relu", bias_initializer=bias(), name="c1"),
        keras.layers.Conv2D(6, 3, padding="same", bias_initializer=bias(), name="c2"),
        keras.layers.ReLU(name="r2"),
        keras.layers.AveragePooling2D(2, name="pool"),
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(5, activation="relu", bias_initializer=bias(), name="fc"),
        keras.layers.Dense(CLASSES, activation="softmax", bias_initializer=bias(), name="out"),
    ])
    net = torch.nn.Sequential(
        torch.nn.Conv2d(CHANNELS, 4, 3), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 6, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(6, 5), torch.nn.ReLU(),
        torch.nn.Linear(5, CLASSES),  # logits: kerascope bypasses the final softmax
    )
    torch_layers = [net[0], net[2], net[7], net[9]]
    for name, layer in zip(["c1", "c2", "fc", "out"], torch_layers, strict=True):
        kernel, b = model.get_layer(name).get_weights()
        kernel = kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
            layer.bias.copy_(torch.from_numpy(b))
    net.eval()
    return model, net


@pytest.fixture(scope="module")
def pair():
    return build_pair()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (4, SIZE, SIZE, CHANNELS)).astype(np.float32)
    return x, np.array([0, 1, 2, 1])


def to_torch(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).requires_grad_(True)


def from_torch(a: torch.Tensor) -> np.ndarray:
    return a.detach().numpy().transpose(0, 2, 3, 1)


def assert_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    scale = float(np.max(np.abs(theirs)))
    assert scale > 0
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * scale)


def test_same_network(pair, data):
    model, net = pair
    x, _ = data
    logits = net(to_torch(x)).detach().numpy()
    ours = ks.Engine(model).forward(x)
    np.testing.assert_allclose(ours, logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "ours, theirs, kwargs",
    [
        (lambda m: ks.Saliency(m), lambda n: captum_attr.Saliency(n), {"abs": False}),
        (lambda m: ks.Saliency(m, absolute=True), lambda n: captum_attr.Saliency(n), {}),
        (lambda m: ks.GradientXInput(m), lambda n: captum_attr.InputXGradient(n), {}),
        (lambda m: ks.GuidedBackprop(m), lambda n: captum_attr.GuidedBackprop(n), {}),
        (lambda m: ks.Deconvnet(m), lambda n: captum_attr.Deconvolution(n), {}),
        (lambda m: ks.SmoothGrad(m, samples=3, noise=0.0),
         lambda n: captum_attr.NoiseTunnel(captum_attr.Saliency(n)),
         {"nt_type": "smoothgrad", "nt_samples": 3, "stdevs": 0.0, "abs": False}),
    ],
    ids=["saliency", "saliency_abs", "input_x_gradient", "guided_backprop", "deconvnet", "smoothgrad_noise0"],
)
def test_gradient_methods(pair, data, ours, theirs, kwargs):
    model, net = pair
    x, targets = data
    expected = from_torch(theirs(net).attribute(to_torch(x), target=torch.from_numpy(targets), **kwargs))
    assert_close(ours(model).explain(x, targets).attributions, expected)


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle",
                                    "riemann_trapezoid"])
@pytest.mark.parametrize("baseline", [0.0, 0.3])
def test_integrated_gradients(pair, data, method, baseline):
    model, net = pair
    x, targets = data
    steps = 12
    ig = captum_attr.IntegratedGradients(net)
    theirs = ig.attribute(to_torch(x), baselines=baseline, target=torch.from_numpy(targets), n_steps=steps,
                          method=method)
    expected = from_torch(theirs)
    if method == "riemann_trapezoid":  # Captum's trapezoid weights sum to (n - 1) / n
        expected = expected * steps / (steps - 1)
    ours = ks.IntegratedGradients(model, steps=steps, method=method, baseline=baseline).explain(x, targets)
    assert_close(ours.attributions, expected)


@pytest.mark.parametrize("random_baseline", [False, True])
def test_deeplift(pair, data, random_baseline):
    model, net = pair
    x, targets = data
    baseline = (np.random.default_rng(5).uniform(0, 1, x.shape).astype(np.float32) if random_baseline
                else np.zeros_like(x))
    dl = captum_attr.DeepLift(net)
    theirs, delta = dl.attribute(to_torch(x), baselines=to_torch(baseline), target=torch.from_numpy(targets),
                                 return_convergence_delta=True)
    ours = ks.DeepLIFT(model, baseline=baseline).explain(x, targets)
    assert_close(ours.attributions, from_torch(theirs))
    np.testing.assert_allclose(ours.extras["completeness_error"], delta.detach().numpy(), atol=1e-4)


@pytest.mark.parametrize("window, stride, baseline", [(2, 2, 0.0), (4, 2, 0.0), (3, 1, 0.5)])
def test_occlusion(pair, data, window, stride, baseline):
    model, net = pair
    x, targets = data
    occ = captum_attr.Occlusion(net)
    theirs = occ.attribute(to_torch(x), sliding_window_shapes=(CHANNELS, window, window),
                           strides=(CHANNELS, stride, stride), baselines=baseline,
                           target=torch.from_numpy(targets))
    ours = ks.Occlusion(model, window=window, stride=stride, baseline=baseline).explain(x, targets)
    assert_close(ours.attributions, from_torch(theirs))


def test_layer_gradcam(pair, data):
    """Captum's LayerGradCam with relu_attributions=True is kerascope's GradCAM at the layer's resolution."""
    model, net = pair
    x, targets = data
    expected = captum_attr.LayerGradCam(net, net[3]).attribute(
        to_torch(x), target=torch.from_numpy(targets), relu_attributions=True
    )
    ours = ks.GradCAM(model, layer="r2", upsample=False).explain(x, targets).attributions
    assert ours.shape == (4, 6, 6)
    assert_close(ours, expected.detach().numpy()[:, 0])


def test_guided_gradcam(pair, data):
    """Captum's GuidedGradCam with bilinear interpolation (kerascope upsamples bilinearly, half-pixel centres)."""
    model, net = pair
    x, targets = data
    expected = captum_attr.GuidedGradCam(net, net[3]).attribute(
        to_torch(x), target=torch.from_numpy(targets), interpolate_mode="bilinear"
    )
    ours = ks.GuidedGradCAM(model, layer="r2").explain(x, targets).attributions
    assert_close(ours, from_torch(expected))


@pytest.fixture(scope="module")
def superpixels(data):
    """An 8-superpixel SLIC mask of the first image (scikit-image), shared by the batch."""
    skseg = pytest.importorskip("skimage.segmentation")
    x, _ = data
    seg = skseg.slic(x[0].astype(np.float64), n_segments=12, compactness=0.5, start_label=0, channel_axis=-1)
    assert len(np.unique(seg)) == seg.max() + 1 >= 6
    return seg, torch.from_numpy(seg)[None, None].expand(1, CHANNELS, SIZE, SIZE).contiguous()


def per_feature(attributions: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """(N, H, W, C) attributions where every element carries its feature's value -> (N, k)."""
    return np.stack([attributions[:, seg == g, 0][:, 0] for g in range(seg.max() + 1)], axis=1)


@pytest.mark.parametrize("baseline", [0.0, 0.3])
def test_feature_ablation_superpixels(pair, data, superpixels, baseline):
    model, net = pair
    x, targets = data
    seg, mask = superpixels
    theirs = captum_attr.FeatureAblation(net).attribute(to_torch(x), baselines=baseline,
                                                        target=torch.from_numpy(targets), feature_mask=mask)
    ours = ks.FeatureAblation(model, mask=seg, baseline=baseline).explain(x, targets)
    assert_close(ours.attributions, from_torch(theirs))


def test_shapley_sampling_and_kernel_shap_in_expectation(pair, data, superpixels):
    """Captum's ShapleyValueSampling and KernelShap and kerascope's estimators all approach the exact
    Shapley values (kerascope's ShapleyExact, itself checked against brute force in test_feature_masks)."""
    model, net = pair
    x, targets = data
    seg, mask = superpixels
    exact = ks.ShapleyExact(model, mask=seg, baseline=0.3).explain(x, targets).extras["feature_attributions"]
    scale = np.abs(exact).max()
    torch.manual_seed(0)
    svs = captum_attr.ShapleyValueSampling(net).attribute(to_torch(x), baselines=0.3, target=torch.from_numpy(targets),
                                                          feature_mask=mask, n_samples=30)
    ours = ks.ShapleySampling(model, mask=seg, baseline=0.3, samples=30).explain(x, targets)
    theirs = per_feature(from_torch(svs), seg)
    for estimate in (theirs, ours.extras["feature_attributions"]):
        np.testing.assert_allclose(estimate.sum(1), exact.sum(1), atol=1e-5)  # both exactly efficient
        assert np.abs(estimate - exact).max() <= 0.25 * scale
        assert min(np.corrcoef(e, t)[0, 1] for e, t in zip(estimate, exact)) >= 0.95
    for i in range(2):  # Captum's KernelShap explains one sample at a time
        torch.manual_seed(0)
        kshap = captum_attr.KernelShap(net).attribute(to_torch(x[i:i + 1]), baselines=0.3, target=int(targets[i]),
                                                      feature_mask=mask, n_samples=200)
        theirs = per_feature(from_torch(kshap), seg)[0]
        ours = ks.KernelSHAP(model, mask=seg, baseline=0.3, samples=200).explain(x[i:i + 1], int(targets[i]))
        for estimate in (theirs, ours.extras["feature_attributions"][0]):
            np.testing.assert_allclose(estimate.sum(), exact[i].sum(), atol=1e-4)
            assert np.abs(estimate - exact[i]).max() <= 0.15 * scale


def copy_weights(model: keras.Model, pairs: list[tuple[str, torch.nn.Module]]) -> None:
    """Copy the kernels / biases of the named Keras layers into the torch modules (channels-first)."""
    for name, layer in pairs:
        kernel, b = model.get_layer(name).get_weights()
        kernel = kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
            layer.bias.copy_(torch.from_numpy(b))


class Copy(torch.nn.Module):
    """``x * 1``: a new tensor between a ReLU and a max-pool module, for Captum's hooks (see below)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def build_maxpool_pair(seed: int = 1) -> tuple[keras.Model, torch.nn.Module]:
    """conv -> conv -> max-pool -> conv -> GAP -> dense, the DeepLIFT cross-check's network.

    Captum hooks the ReLU's output tensor and the max-pool's input tensor; when they are the same tensor,
    the ReLU's hook reads the gradient before the max-pool rule replaced it, and Captum's attributions
    no longer sum to f(x) - f(baseline) (convergence delta ~1e-3 here). A ``Copy`` module between the two
    separates the tensors; then Captum applies its own max-pool rule and agrees with kerascope to 1e-8.
    """
    keras.utils.set_random_seed(seed)
    bias = keras.initializers.RandomNormal(0.0, 0.1, seed=seed)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, CHANNELS)),
        keras.layers.Conv2D(4, 3, activation="relu", bias_initializer=bias, name="c1"),
        keras.layers.Conv2D(6, 3, padding="same", activation="relu", bias_initializer=bias, name="c2"),
        keras.layers.MaxPooling2D(2, name="pool"),
        keras.layers.Conv2D(5, 3, padding="same", activation="relu", bias_initializer=bias, name="c3"),
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(CLASSES, activation="softmax", bias_initializer=bias, name="out"),
    ])
    net = torch.nn.Sequential(
        torch.nn.Conv2d(CHANNELS, 4, 3), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 6, 3, padding=1), torch.nn.ReLU(), Copy(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 5, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(5, CLASSES),
    )
    copy_weights(model, [("c1", net[0]), ("c2", net[2]), ("c3", net[6]), ("out", net[10])])
    return model, net.eval()


def build_smooth_pair(seed: int = 2) -> tuple[keras.Model, torch.nn.Module]:
    """Sigmoid, tanh, ELU, softplus and LeakyReLU, fused and as layers, after a convolution."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, CHANNELS)),
        keras.layers.Conv2D(4, 3, activation="elu", name="c1"),
        keras.layers.Conv2D(4, 3, name="c2"),
        keras.layers.Activation("tanh"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(6, activation="sigmoid", name="d1"),
        keras.layers.Dense(6, activation="softplus", name="d2"),
        keras.layers.Dense(5, name="d3"),
        keras.layers.LeakyReLU(negative_slope=0.1),
        keras.layers.Dense(CLASSES, name="out"),
    ])
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.8, w.shape).astype(np.float32) for w in model.get_weights()])
    net = torch.nn.Sequential(
        torch.nn.Conv2d(CHANNELS, 4, 3), torch.nn.ELU(),
        torch.nn.Conv2d(4, 4, 3), torch.nn.Tanh(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, 6), torch.nn.Sigmoid(),
        torch.nn.Linear(6, 6), torch.nn.Softplus(),
        torch.nn.Linear(6, 5), torch.nn.LeakyReLU(0.1),
        torch.nn.Linear(5, CLASSES),
    )
    copy_weights(model, [("c1", net[0]), ("c2", net[2]), ("d1", net[6]), ("d2", net[8]), ("d3", net[10]),
                         ("out", net[12])])
    return model, net.eval()


@pytest.mark.parametrize("build", [build_maxpool_pair, build_smooth_pair], ids=["maxpool", "smooth"])
@pytest.mark.parametrize("random_baseline", [False, True])
@pytest.mark.parametrize("fuse", [None, True], ids=["default", "fused"])
def test_deeplift_nonlinear_models(build, data, random_baseline, fuse):
    model, net = build()
    x, targets = data
    np.testing.assert_allclose(ks.Engine(model).forward(x), net(to_torch(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    baseline = (np.random.default_rng(5).uniform(0, 1, x.shape).astype(np.float32) if random_baseline
                else np.zeros_like(x))
    theirs, delta = captum_attr.DeepLift(net).attribute(
        to_torch(x), baselines=to_torch(baseline), target=torch.from_numpy(targets), return_convergence_delta=True)
    ours = ks.DeepLIFT(model, baseline=baseline, fuse_rules=fuse).explain(x, targets)
    # The rescale multiplier (f(z) - f(z')) / (z - z') of a smooth f loses float32 digits where z - z' is
    # small (after the global pooling), so Keras' and torch's sigmoid / softplus / ELU, equal to a few ulps,
    # give multipliers that differ at ~1e-4 relative: 1e-3 of the map's scale there, 1e-4 elsewhere.
    scale = float(np.max(np.abs(theirs.detach().numpy())))
    tolerance = 1e-3 if build is build_smooth_pair and random_baseline else 1e-4
    np.testing.assert_allclose(ours.attributions, from_torch(theirs), rtol=0, atol=tolerance * scale)
    np.testing.assert_allclose(ours.extras["completeness_error"], delta.detach().numpy(), atol=1e-4)


@pytest.mark.parametrize("build", [build_maxpool_pair, build_smooth_pair], ids=["maxpool", "smooth"])
@pytest.mark.parametrize("fuse", [None, True], ids=["default", "fused"])
def test_deeplift_shap(build, data, fuse):
    model, net = build()
    x, targets = data
    background = np.random.default_rng(7).uniform(0, 1, (3, *x.shape[1:])).astype(np.float32)
    theirs = captum_attr.DeepLiftShap(net).attribute(to_torch(x), baselines=to_torch(background),
                                                     target=torch.from_numpy(targets))
    ours = ks.DeepLiftShap(model, baseline=background, fuse_rules=fuse).explain(x, targets)
    scale = float(np.max(np.abs(theirs.detach().numpy())))  # 1e-3 for the smooth model: see above
    tolerance = 1e-3 if build is build_smooth_pair else 1e-4
    np.testing.assert_allclose(ours.attributions, from_torch(theirs), rtol=0, atol=tolerance * scale)
