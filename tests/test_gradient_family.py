"""Gradient family: SmoothGrad / SmoothGrad² / VarGrad, IntegratedGradients, ExpectedGradients,
GradientXInput, Deconvnet, DeepLIFT, checked against closed forms on analytic Keras models."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods.base import UnsupportedModelError  # noqa: E402
from kerascope.methods.integrated import gaussian_blur, quadrature  # noqa: E402

RNG = np.random.default_rng(7)
A = np.array([0.5, -1.0, 2.0], np.float32)
B = np.array([1.5, 0.25, -0.75], np.float32)


def dense1(vector: np.ndarray, name: str) -> keras.layers.Dense:
    layer = keras.layers.Dense(1, use_bias=False, name=name)
    layer.build((None, len(vector)))
    layer.set_weights([vector.reshape(-1, 1)])
    return layer


def linear_model() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    w = RNG.normal(size=(3, 2)).astype(np.float32)
    b = np.array([0.3, -0.2], np.float32)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="lin")])
    model.get_layer("lin").set_weights([w, b])
    return model, w, b


def product_model(*vectors: np.ndarray) -> keras.Model:
    """f(x) = prod_k (v_k . x), built from Dense and Multiply layers."""
    inputs = keras.Input((3,))
    factors = [dense1(v, f"d{k}")(inputs) for k, v in enumerate(vectors)]
    return keras.Model(inputs, keras.layers.Multiply()(factors) if len(factors) > 1 else factors[0])


def cnn(final_softmax: bool = True, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12, 12, 2))
    x = keras.layers.Conv2D(4, 3, activation="relu", name="c1")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.AveragePooling2D(2, name="pool")(x)
    y = keras.layers.Conv2D(4, 3, padding="same", name="c2")(x)
    x = keras.layers.Add(name="add")([x, y])
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(8, activation="relu", name="fc")(x)
    out = keras.layers.Dense(3, activation="softmax" if final_softmax else None, name="out")(x)
    model = keras.Model(inputs, out)
    bn = model.get_layer("bn")
    local = np.random.default_rng(seed)
    bn.set_weights([w + local.uniform(0.1, 0.5, w.shape).astype(np.float32) for w in bn.get_weights()])
    return model


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return RNG.uniform(-1, 1, (3, 12, 12, 2)).astype(np.float32)


# ---------------------------------------------------------------- closed forms
def test_gradient_x_input_and_smoothing_on_linear_model():
    model, w, _ = linear_model()
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(ks.GradientXInput(model).explain(x, 1).attributions, x * w[:, 1], rtol=1e-6)
    # The gradient of a linear model is constant: noise changes nothing.
    smooth = ks.SmoothGrad(model, samples=7, noise=0.5).explain(x, 1).attributions
    np.testing.assert_allclose(smooth, np.broadcast_to(w[:, 1], x.shape), rtol=1e-6)
    squared = ks.SmoothGradSquared(model, samples=7, noise=0.5).explain(x, 1).attributions
    np.testing.assert_allclose(squared, np.broadcast_to(w[:, 1] ** 2, x.shape), rtol=1e-6)
    var = ks.VarGrad(model, samples=7, noise=0.5).explain(x, 1).attributions
    np.testing.assert_allclose(var, 0.0, atol=1e-6)


def test_noise_is_relative_to_each_inputs_range():
    # f = (a.x)^2: grad = 2 (a.x) a, so with noise sigma z: Var = 4 sigma^2 |a|^2 a^2.
    model = product_model(A, A)
    x = np.array([[0.0, 1.0, 2.0], [-10.0, 0.0, 10.0]], np.float32)  # ranges 2 and 20
    noise, samples = 0.1, 4000
    var = ks.VarGrad(model, samples=samples, noise=noise, seed=3, batch_size=1000).explain(x, 0).attributions
    sigma = noise * (x.max(axis=1) - x.min(axis=1))
    expected = 4 * sigma[:, None] ** 2 * np.sum(A**2) * A[None] ** 2
    np.testing.assert_allclose(var, expected, rtol=0.1)
    mean = ks.SmoothGrad(model, samples=samples, noise=noise, seed=3, batch_size=1000).explain(x, 0)
    squared = ks.SmoothGradSquared(model, samples=samples, noise=noise, seed=3, batch_size=1000).explain(x, 0)
    # Same seed, same noise: the three reductions are consistent.
    np.testing.assert_allclose(squared.attributions - mean.attributions**2, var, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 5])
def test_ig_quadrature_rules_on_quadratic_model(steps):
    # f = (a.x)(b.x): grad f(alpha x) = alpha G, so IG_rule = x * G * sum(w_k alpha_k).
    model = product_model(A, B)
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    g = (x @ B)[:, None] * A + (x @ A)[:, None] * B
    n = steps
    factors = {
        "gausslegendre": 0.5,
        "riemann_middle": 0.5,
        "riemann_left": (n - 1) / (2 * n),
        "riemann_right": (n + 1) / (2 * n),
    }
    if steps > 1:
        factors["riemann_trapezoid"] = 0.5
    for method, factor in factors.items():
        e = ks.IntegratedGradients(model, steps=steps, method=method).explain(x, 0)
        np.testing.assert_allclose(e.attributions, x * g * factor, rtol=1e-5, atol=1e-6, err_msg=method)


def test_ig_quadrature_rules_on_cubic_model():
    # f = (a.x)^2 (b.x): grad f(alpha x) = alpha^2 H, so IG_rule = x * H * sum(w_k alpha_k^2).
    model = product_model(A, A, B)
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    ax, bx = x @ A, x @ B
    h = (2 * ax * bx)[:, None] * A + (ax**2)[:, None] * B
    n = 5
    factors = {
        "gausslegendre": 1 / 3,  # exact for degree <= 2n - 1
        "riemann_middle": 1 / 3 - 1 / (12 * n**2),
        "riemann_trapezoid": 1 / 3 + 1 / (6 * (n - 1) ** 2),
        "riemann_left": (n - 1) * (2 * n - 1) / (6 * n**2),
        "riemann_right": (n + 1) * (2 * n + 1) / (6 * n**2),
    }
    for method, factor in factors.items():
        e = ks.IntegratedGradients(model, steps=n, method=method).explain(x, 0)
        np.testing.assert_allclose(e.attributions, x * h * factor, rtol=1e-5, atol=1e-6, err_msg=method)
        assert factor == pytest.approx(float(np.sum(quadrature(n, method)[1] * quadrature(n, method)[0] ** 2)))
    exact = ks.IntegratedGradients(model, steps=n).explain(x, 0)
    np.testing.assert_allclose(exact.extras["completeness_error"], 0.0, atol=1e-5)


def test_ig_baselines_on_linear_model():
    model, w, b = linear_model()
    x = RNG.normal(size=(3, 3)).astype(np.float32)
    e = ks.IntegratedGradients(model, steps=3, baseline=0.5).explain(x, 0)
    np.testing.assert_allclose(e.attributions, (x - 0.5) * w[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.extras["baseline_scores"], 0.5 * w[:, 0].sum() + b[0], rtol=1e-5)
    np.testing.assert_allclose(e.extras["completeness_error"], 0.0, atol=1e-5)
    ref = np.array([1.0, -2.0, 0.5], np.float32)
    e = ks.IntegratedGradients(model, steps=2, baseline=ref).explain(x, 1)
    np.testing.assert_allclose(e.attributions, (x - ref) * w[:, 1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="baseline"):
        ks.IntegratedGradients(model, baseline=np.zeros(5)).explain(x, 0)
    with pytest.raises(ValueError, match="blur"):
        ks.IntegratedGradients(model, baseline="blur").explain(x, 0)


@pytest.mark.parametrize("rule", ["riemann_trapezoid", "riemann_left", "riemann_right", "gausslegendre"])
@pytest.mark.parametrize("explicit", [True, False])
def test_ig_scores_from_path_end_points_equal_forward_scores(images, rule, explicit):
    """f(x) and f(baseline) read from the alpha = 1 / alpha = 0 path rows equal the model's logits."""
    model = cnn(final_softmax=True, seed=3)
    keras_logits = keras.ops.convert_to_numpy(keras.ops.matmul(
        keras.Model(model.inputs, model.get_layer("fc").output)(images), model.get_layer("out").kernel
    ) + model.get_layer("out").bias)
    targets = [2, 0, 1] if explicit else None
    e = ks.IntegratedGradients(model, steps=6, method=rule, baseline=0.25, batch_size=4).explain(images, targets)
    chosen = np.asarray(e.targets)
    expected = keras_logits[np.arange(3), chosen] if explicit else keras_logits.max(axis=1)
    np.testing.assert_allclose(e.scores, expected, rtol=1e-5, atol=1e-5)
    base = np.full_like(images, 0.25)
    base_logits = keras.ops.convert_to_numpy(keras.ops.matmul(
        keras.Model(model.inputs, model.get_layer("fc").output)(base), model.get_layer("out").kernel
    ) + model.get_layer("out").bias)
    np.testing.assert_allclose(e.extras["baseline_scores"], base_logits[np.arange(3), chosen], rtol=1e-5, atol=1e-5)
    total = e.attributions.reshape(3, -1).sum(axis=1)
    np.testing.assert_allclose(e.extras["completeness_error"], total - (e.scores - e.extras["baseline_scores"]),
                               atol=1e-4)


def test_blur_baseline_matches_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    x = RNG.normal(size=(2, 10, 9, 2)).astype(np.float32)
    # radius ceil(3 sigma) = 5 = int(truncate * sigma + 0.5) with truncate = 3.0
    expected = ndimage.gaussian_filter(x, sigma=(0, 1.5, 1.5, 0), mode="mirror", truncate=3.0)
    np.testing.assert_allclose(gaussian_blur(x, 1.5), expected, rtol=1e-4, atol=1e-6)
    model = keras.Sequential([keras.Input((10, 9, 2)), keras.layers.Flatten(), keras.layers.Dense(2)])
    w = model.layers[-1].get_weights()[0][:, 0].reshape(10, 9, 2)
    e = ks.IntegratedGradients(model, steps=2, baseline="blur", blur_sigma=1.5).explain(x, 0)
    np.testing.assert_allclose(e.attributions, (x - expected) * w, rtol=1e-4, atol=1e-5)


def image_cnn(seed: int) -> keras.Model:
    """Conv-ReLU-Conv-ReLU-GAP-Dense on 16x16x3 images, with random (non-zero) biases."""
    keras.utils.set_random_seed(seed)
    bias = [keras.initializers.RandomNormal(0.0, 0.1, seed=seed + k) for k in range(3)]
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same", bias_initializer=bias[0])(inputs)
    x = keras.layers.Conv2D(6, 3, activation="relu", bias_initializer=bias[1])(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, bias_initializer=bias[2])(x))
    # numpy-drawn weights: the same model on every Keras backend (their initialisers' RNGs differ)
    rng = np.random.default_rng(seed + 100)
    for layer in model.layers:
        weights = layer.get_weights()
        if weights:
            kernel, b = weights
            limit = np.sqrt(6.0 / (np.prod(kernel.shape[:-1]) + kernel.shape[-1]))
            layer.set_weights([rng.uniform(-limit, limit, kernel.shape).astype(np.float32),
                               rng.normal(0.0, 0.1, b.shape).astype(np.float32)])
    return model


@pytest.mark.parametrize("seed", [0, 1])
def test_ig_completeness_within_one_percent_on_cnn(seed):
    # 64 steps, zeros baseline, images in [0, 1]: every sample's completeness error is within 1% of
    # |f(x) - f(baseline)| (measured: at most 0.3% for seeds 0-3 and all three rules below).
    model = image_cnn(seed)
    x = np.random.default_rng(seed).uniform(0, 1, (8, 16, 16, 3)).astype(np.float32)
    for method in ("gausslegendre", "riemann_middle", "riemann_trapezoid"):
        e = ks.IntegratedGradients(model, steps=64, method=method, batch_size=256).explain(x)
        gap = np.abs(e.scores - e.extras["baseline_scores"])
        assert np.all(np.abs(e.extras["completeness_error"]) <= 0.01 * gap), method
        total = e.attributions.reshape(len(x), -1).sum(axis=1)
        np.testing.assert_allclose(total - (e.scores - e.extras["baseline_scores"]),
                                   e.extras["completeness_error"], atol=1e-5)


def test_ig_exact_on_homogeneous_relu_cnn():
    # Without biases f(alpha x) = alpha f(x) for alpha > 0: the integrand is constant on (0, 1].
    model = cnn(final_softmax=False)
    for layer in model.layers:
        weights = layer.get_weights()
        if layer.name in ("c1", "c2", "fc", "out"):
            layer.set_weights([weights[0], np.zeros_like(weights[1])])
        if layer.name == "bn":
            gamma, _, _, var = weights
            layer.set_weights([gamma, np.zeros_like(gamma), np.zeros_like(gamma), var])
    x = RNG.uniform(-1, 1, (3, 12, 12, 2)).astype(np.float32)
    e = ks.IntegratedGradients(model, steps=8).explain(x)
    np.testing.assert_allclose(e.extras["completeness_error"], 0.0, atol=1e-5)
    np.testing.assert_allclose(e.attributions, x * ks.Saliency(model).explain(x).attributions, rtol=1e-4, atol=1e-6)


def test_expected_gradients_linear_and_seeded(images):
    model, w, _ = linear_model()
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    ref = np.array([1.0, 2.0, -1.0], np.float32)
    background = np.stack([ref] * 4)
    e = ks.ExpectedGradients(model, samples=6, baseline=background).explain(x, 0)
    np.testing.assert_allclose(e.attributions, (x - ref) * w[:, 0], rtol=1e-5, atol=1e-6)
    assert ks.GradientSHAP is ks.ExpectedGradients
    m = cnn()
    bg = RNG.uniform(-1, 1, (5, 12, 12, 2)).astype(np.float32)
    one = ks.ExpectedGradients(m, samples=8, baseline=bg, seed=1).explain(images, 0).attributions
    two = ks.ExpectedGradients(m, samples=8, baseline=bg, seed=1, batch_size=5).explain(images, 0).attributions
    other = ks.ExpectedGradients(m, samples=8, baseline=bg, seed=2).explain(images, 0).attributions
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)
    assert not np.allclose(one, other)


# ------------------------------------------------------------ noise wrappers
def test_noise_zero_equals_base_methods(images):
    model = cnn()
    for base in ("saliency", "gradient_x_input", "guided_backprop", "deconvnet"):
        plain = ks.methods.get(base)(model).explain(images).attributions
        smooth = ks.SmoothGrad(model, samples=3, noise=0.0, base=base).explain(images).attributions
        np.testing.assert_allclose(smooth, plain, rtol=1e-5, atol=1e-7, err_msg=base)
    ig = ks.IntegratedGradients(model, steps=4)
    plain = ig.explain(images, 1).attributions
    smooth = ks.SmoothGrad(model, samples=2, noise=0.0, base=ig).explain(images, 1)
    np.testing.assert_allclose(smooth.attributions, plain, rtol=1e-5, atol=1e-7)
    assert smooth.params["base"] == "integrated_gradients"


def test_seeds_batch_size_and_batch_invariance(images):
    model = cnn()
    kwargs = {"samples": 6, "noise": 0.2}
    full = ks.SmoothGrad(model, seed=5, **kwargs).explain(images, 2).attributions
    again = ks.SmoothGrad(model, seed=5, batch_size=4, **kwargs).explain(images, 2).attributions
    other = ks.SmoothGrad(model, seed=6, **kwargs).explain(images, 2).attributions
    np.testing.assert_allclose(full, again, rtol=1e-5, atol=1e-7)
    assert not np.allclose(full, other)
    for method in (
        ks.SmoothGrad(model, seed=5, **kwargs),
        ks.VarGrad(model, seed=5, **kwargs),
        ks.IntegratedGradients(model, steps=8, method="riemann_middle"),
        ks.ExpectedGradients(model, samples=4, baseline=images[::-1]),
        ks.DeepLIFT(model, baseline=0.1),
        ks.Deconvnet(model),
    ):
        batch = method.explain(images)
        for i in range(len(images)):
            alone = method.explain(images[i : i + 1])
            np.testing.assert_allclose(alone.attributions[0], batch.attributions[i], rtol=1e-4, atol=1e-6,
                                       err_msg=method.name)
            assert alone.targets[0] == batch.targets[i]


def test_models_unchanged(images, unchanged):
    model = cnn()
    check = unchanged(model)
    bg = images[:2]
    for method in (
        ks.SmoothGrad(model, samples=2), ks.SmoothGradSquared(model, samples=2, base="guided_backprop"),
        ks.VarGrad(model, samples=2), ks.IntegratedGradients(model, steps=3, baseline="blur"),
        ks.ExpectedGradients(model, samples=2, baseline=bg), ks.DeepLIFT(model), ks.Deconvnet(model),
    ):
        method.explain(images)
    check()
    norm = keras.Sequential([keras.Input((3,)), keras.layers.LayerNormalization(), keras.layers.Dense(2)])
    check = unchanged(norm)
    with pytest.raises(ValueError, match="unsupported layers"):
        ks.DeepLIFT(norm).explain(np.ones((1, 3)))
    check()


# ---------------------------------------------------------- modified backprop
def relu_net() -> tuple[keras.Model, list[np.ndarray]]:
    w1 = RNG.normal(size=(4, 6)).astype(np.float32)
    b1 = RNG.normal(size=6).astype(np.float32)
    w2 = RNG.normal(size=(6, 2)).astype(np.float32)
    b2 = RNG.normal(size=2).astype(np.float32)
    model = keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(6, activation="relu", name="h"), keras.layers.Dense(2, name="o")
    ])
    model.get_layer("h").set_weights([w1, b1])
    model.get_layer("o").set_weights([w2, b2])
    return model, [w1, b1, w2, b2]


def test_deeplift_rescale_closed_form():
    model, (w1, b1, w2, b2) = relu_net()
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    ref = RNG.normal(size=4).astype(np.float32)
    z, z0 = x @ w1 + b1, ref @ w1 + b1
    dz = z - z0
    m = np.where(np.abs(dz) < 1e-10, (z > 0).astype(np.float32),
                 (np.maximum(z, 0) - np.maximum(z0, 0)) / np.where(dz == 0, 1, dz))
    expected = (x - ref) * ((m * w2[:, 1]) @ w1.T)
    e = ks.DeepLIFT(model, baseline=ref).explain(x, 1)
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-4, atol=1e-5)
    f = lambda v: np.maximum(v @ w1 + b1, 0) @ w2 + b2  # noqa: E731
    np.testing.assert_allclose(e.attributions.sum(axis=1), f(x)[:, 1] - f(ref[None])[0, 1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(e.extras["completeness_error"], 0.0, atol=1e-4)


def test_deconvnet_closed_form():
    model, (w1, _, w2, _) = relu_net()
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    e = ks.Deconvnet(model).explain(x, 0)
    np.testing.assert_allclose(e.attributions, np.broadcast_to(w1 @ np.maximum(w2[:, 0], 0), x.shape), rtol=1e-5)


def test_deeplift_summation_to_delta_on_cnn(images):
    for softmax in (True, False):
        model = cnn(final_softmax=softmax)
        e = ks.DeepLIFT(model, baseline=0.2).explain(images)
        gap = np.abs(e.scores - e.extras["baseline_scores"])
        assert np.all(np.abs(e.extras["completeness_error"]) <= 1e-4 * np.maximum(gap, 1.0))


@pytest.mark.parametrize(
    "layer, needle",
    [
        (keras.layers.Dense(4, activation="softmax", name="bad"), "'bad' (Dense with activation 'softmax')"),
        (keras.layers.Activation("log_softmax", name="bad"), "'bad' (Activation with activation 'log_softmax')"),
        (keras.layers.Softmax(name="bad"), "'bad' (Softmax)"),
        (keras.layers.LayerNormalization(name="bad"), "'bad' (LayerNormalization)"),
    ],
)
def test_deeplift_rejects_unsupported_layers(layer, needle):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), layer, keras.layers.Dense(2)])
    with pytest.raises(UnsupportedModelError) as info:
        ks.DeepLIFT(model).explain(np.ones((1, 3), np.float32))
    assert needle in str(info.value)


# ---------------------------------------------------------------- other inputs
def test_multi_input_and_callable_targets():
    a_in, b_in = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    x = keras.layers.Concatenate()([a_in, b_in])
    x = keras.layers.Dense(5, activation="relu")(x)
    model = keras.Model([a_in, b_in], keras.layers.Dense(2)(x))
    xa, xb = RNG.normal(size=(3, 3)).astype(np.float32), RNG.normal(size=(3, 2)).astype(np.float32)
    with pytest.raises(ValueError, match=r"input_index=.*\[0, 1\] for every input"):
        ks.IntegratedGradients(model, steps=4).explain([xa, xb], 1)  # two float inputs, no image: choose
    e = ks.IntegratedGradients(model, steps=64, input_index=[0, 1]).explain([xa, xb], 1)
    assert [a.shape for a in e.attributions] == [(3, 3), (3, 2)]
    gap = np.abs(e.scores - e.extras["baseline_scores"])
    assert np.all(np.abs(e.extras["completeness_error"]) <= 0.01 * np.maximum(gap, 1e-2))
    d = ks.DeepLIFT(model).explain([xa, xb], 1)
    np.testing.assert_allclose(d.extras["completeness_error"], 0.0, atol=1e-4)
    s = ks.SmoothGrad(model, samples=3, noise=0.0, input_index=["a", "b"]).explain([xa, xb], 1)
    plain = ks.Saliency(model, input_index=[0, 1]).explain([xa, xb], 1)
    for got, want in zip(s.attributions, plain.attributions, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

    def difference(outputs):
        return outputs[:, 0] - outputs[:, 1]

    lin, w, _ = linear_model()
    xs = RNG.normal(size=(2, 3)).astype(np.float32)
    e = ks.IntegratedGradients(lin, steps=2).explain(xs, difference)
    np.testing.assert_allclose(e.attributions, xs * (w[:, 0] - w[:, 1]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.extras["completeness_error"], 0.0, atol=1e-5)
    g = ks.SmoothGrad(lin, samples=3).explain(xs, difference)
    np.testing.assert_allclose(g.attributions, np.broadcast_to(w[:, 0] - w[:, 1], xs.shape), rtol=1e-5)


def test_parameter_validation():
    model, _, _ = linear_model()
    with pytest.raises(ValueError, match="method='simpson'"):
        ks.IntegratedGradients(model, method="simpson")
    with pytest.raises(ValueError, match="samples=0"):
        ks.SmoothGrad(model, samples=0)
    with pytest.raises(ValueError, match="noise=-1"):
        ks.SmoothGrad(model, noise=-1)
    with pytest.raises(ValueError, match="Unknown method"):
        ks.SmoothGrad(model, base="nope")
    with pytest.raises(ValueError, match="noise wrapper"):
        ks.SmoothGrad(model, base="vargrad")
    with pytest.raises(ValueError, match="trapezoid rule needs steps >= 2"):
        ks.IntegratedGradients(model, steps=1, method="riemann_trapezoid")


@pytest.mark.parametrize(
    "shape, size",
    [((3, 3), (96, 96)), ((7, 5), (224, 160)), ((10, 6), (3, 7)), ((1, 1), (5, 5)), ((7,), (30,))],
)
def test_cam_upsampling_equals_bilinear_resize(shape, size):
    """The separable numpy resize equals keras.ops.image.resize (bilinear, half-pixel, no antialias)."""
    from kerascope.numeric.resize import upsample

    maps = np.random.default_rng(0).normal(size=(3, *shape)).astype("float32")
    grid = maps if len(shape) == 2 else maps[:, :, None]
    target = size if len(size) == 2 else (size[0], 1)
    expected = keras.ops.convert_to_numpy(
        keras.ops.image.resize(grid[..., None], target, interpolation="bilinear", antialias=False)
    )[..., 0]
    expected = expected if len(shape) == 2 else expected[:, :, 0]
    np.testing.assert_allclose(upsample(maps, size), expected, atol=2e-6)
