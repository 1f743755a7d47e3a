"""Feature visualisation: closed-form maximisers, Lucid's Fourier basis, seeds, objectives, errors, the CLI.

Runs on every backend (in the JAX / PyTorch loop of scripts/test.sh).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.features.parametrize import COLOR_CORRELATION, Fourier, MaCo, fourier_scale, irfft2
from kerascope.features.visualize import objective_weights

# JAX compiles each optimisation step function (seconds per model and setting): these run under -m slow there
jax_slow = pytest.mark.slow if keras.backend.backend() == "jax" else pytest.mark.skipif(False, reason="")


def _linear_model(weights: np.ndarray) -> keras.Model:
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(weights.shape[1], name="unit")])
    model.get_layer("unit").set_weights([weights, np.zeros(weights.shape[1], np.float32)])
    return model


def _conv_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                             keras.layers.Conv2D(3, 3, name="conv2"), keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(2, activation="softmax", name="head")])


# ------------------------------------------------------------------ closed forms
def test_pixel_maximiser_of_a_linear_unit_is_one_where_the_weight_is_positive_and_zero_where_negative():
    rng = np.random.default_rng(0)
    weights = rng.choice([-1.0, 1.0], size=(16, 3)).astype(np.float32) * rng.uniform(0.5, 2.0, (16, 3))
    model = _linear_model(weights.astype(np.float32))
    before = [w.copy() for w in model.get_weights()]
    r = ks.visualize_features(model, layer="unit", channels=[0, 1, 2], parametrization="pixel", transforms=None,
                              steps=200, learning_rate=0.2, progress=False, batch_size=2)
    assert r.images.shape == (3, 4, 4, 1) and r.objective.shape == (3, 200)
    expected = (weights.T.reshape(3, 4, 4, 1) > 0).astype(np.float32)
    np.testing.assert_allclose(r.images, expected, atol=0.01)
    # the objective is the unit's output: W . x at the image before each step, rising to sum(max(W, 0))
    assert np.all(np.diff(r.objective, axis=1) > -1e-4)
    np.testing.assert_allclose(r.objective[:, -1], np.maximum(weights, 0).sum(0), rtol=0.01)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert "call" not in vars(model.get_layer("unit"))


@jax_slow
def test_neuron_objective_moves_only_its_receptive_field():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(1, 3, name="conv")])
    kernel = np.array([[1, -1, 1], [-1, 1, -1], [1, 1, -1]], np.float32).reshape(3, 3, 1, 1)
    model.get_layer("conv").set_weights([kernel, np.zeros(1, np.float32)])
    r = ks.visualize_features(model, layer="conv", channels=[0], objective="neuron", position=(2, 3),
                              parametrization="pixel", transforms=None, steps=150, learning_rate=0.2,
                              progress=False)
    image = r.images[0, ..., 0]
    field = np.zeros((8, 8), bool)
    field[2:5, 3:6] = True  # output (2, 3) of a valid 3x3 convolution reads rows 2-4, columns 3-5
    np.testing.assert_allclose(image[field], (kernel[..., 0, 0] > 0).ravel().astype(np.float32), atol=0.02)
    np.testing.assert_allclose(image[~field], 0.5, atol=0.01)  # zero gradient there: still the grey start


def test_class_logit_objective_reads_logits_not_probabilities():
    weights = np.linspace(-1, 2, 32, dtype=np.float32).reshape(16, 2)
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(2, activation="softmax", name="probs")])
    model.get_layer("probs").set_weights([weights, np.zeros(2, np.float32)])
    r = ks.visualize_features(model, channels=[0, 1], objective="logit", parametrization="pixel", transforms=None,
                              steps=1, progress=False)
    np.testing.assert_allclose(r.objective[:, 0], 0.5 * weights.sum(0), atol=0.05)  # the start is grey +- 0.003


def test_objective_weights_sum_kinds_and_channels():
    shape = (3, 3, 4)
    channel = objective_weights("channel", [1], shape)[0]
    neuron = objective_weights("neuron", [2], shape, position=(0, 2))[0]
    mixed = objective_weights({"channel": 1.0, "neuron": 0.5}, [{1: 1.0, 2: -2.0}], shape, position=(0, 2))[0]
    expected = (channel + 0.5 * objective_weights("neuron", [1], shape, position=(0, 2))[0]
                - 2.0 * (objective_weights("channel", [2], shape)[0] + 0.5 * neuron))
    np.testing.assert_allclose(mixed, expected, rtol=1e-6)
    direction = objective_weights("direction", [np.array([0, 1, 0, 0], np.float32)], shape)[0]
    np.testing.assert_allclose(direction, channel)
    assert neuron[0, 2, 2] == 1.0 and neuron.sum() == 1.0


@jax_slow
def test_objective_rises_with_fourier_and_transforms():
    model = _conv_model()
    r = ks.visualize_features(model, layer="conv2", channels=[0, 1, 2], steps=24, progress=False,
                              regularizers={"tv": 0.05, "l1": 0.01, "blur": 0.1})
    assert r.images.min() >= 0.0 and r.images.max() <= 1.0
    assert np.all(r.objective[:, -4:].mean(1) > r.objective[:, :4].mean(1) + 1e-3)


# ------------------------------------------------------------------ Lucid's Fourier basis
def _lucid_rfft2d_freqs(h, w):  # lucid/optvis/param/spatial.py, verbatim
    fy = np.fft.fftfreq(h)[:, None]
    if w % 2 == 1:
        fx = np.fft.fftfreq(w)[: w // 2 + 2]
    else:
        fx = np.fft.fftfreq(w)[: w // 2 + 1]
    return np.sqrt(fx * fx + fy * fy)


@pytest.mark.parametrize(("h", "w"), [(8, 8), (7, 9), (16, 5), (12, 20)])
def test_fourier_scale_equals_lucids_formula(h, w):
    freqs = _lucid_rfft2d_freqs(h, w)
    scale = 1.0 / np.maximum(freqs, 1.0 / max(w, h)) ** 1
    scale *= np.sqrt(w * h)
    np.testing.assert_allclose(fourier_scale(h, w), scale, rtol=1e-6)


@pytest.mark.parametrize(("h", "w"), [(8, 8), (6, 7)])
def test_fourier_image_equals_lucids_fft_image_and_to_valid_rgb(h, w):
    param = Fourier((h, w, 3))
    params = np.random.default_rng(3).normal(size=(2, *param.param_shape())).astype(np.float32)
    ours = keras.ops.convert_to_numpy(param.image(params))
    # Lucid: irfft2d(scale * spectrum)[:h, :w] / 4, decorrelated colours, sigmoid (numpy twin of the TF code)
    scale = fourier_scale(h, w)
    spectrum = (params[:, 0] + 1j * params[:, 1]) * scale
    even = w + w % 2
    image = np.fft.irfft2(spectrum, s=(h, even))[..., :h, :w].transpose(0, 2, 3, 1) / 4.0
    expected = 1 / (1 + np.exp(-(image.reshape(-1, 3) @ COLOR_CORRELATION.T).reshape(image.shape)))
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_irfft2_equals_numpy_and_maco_keeps_its_magnitude():
    z = np.random.default_rng(4).normal(size=(3, 6, 5)) + 1j * np.random.default_rng(5).normal(size=(3, 6, 5))
    ours = keras.ops.convert_to_numpy(irfft2(z.real.astype(np.float32), z.imag.astype(np.float32), 8))
    np.testing.assert_allclose(ours, np.fft.irfft2(z, s=(6, 8)), atol=1e-5)
    maco = MaCo((8, 8, 1))
    phase = np.random.default_rng(6).normal(size=(1, *maco.param_shape())).astype(np.float32)
    image = keras.ops.convert_to_numpy(maco.image(phase))[0, ..., 0]
    logit = np.log(image / (1 - image))  # undo the sigmoid: a standardised irfft2 of magnitude * e^(i phase)
    spectrum = np.abs(np.fft.rfft2(logit))
    inner = spectrum[1:4, 1:4] / maco.magnitude()[1:4, 1:4]  # away from the bins irfft folds (DC, Nyquist)
    np.testing.assert_allclose(inner / inner.mean(), 1.0, rtol=1e-3)


# ------------------------------------------------------------------ seeds, batching, models
def test_same_seed_same_images():
    model = _conv_model()
    kwargs = {"layer": "conv", "channels": [0, 1, 3], "steps": 6, "progress": False, "parametrization": "maco",
              "transforms": None}  # the random transforms' seeding: test_batch_size_does_not_change_the_images
    a = ks.visualize_features(model, seed=3, **kwargs)
    b = ks.visualize_features(model, seed=3, **kwargs)
    c = ks.visualize_features(model, seed=4, **kwargs)
    np.testing.assert_array_equal(a.images, b.images)
    assert np.abs(a.images - c.images).max() > 1e-3


@jax_slow
def test_batch_size_does_not_change_the_images():
    model = _conv_model()
    kwargs = {"layer": "conv", "channels": [0, 1, 3], "steps": 6, "progress": False}
    a = ks.visualize_features(model, seed=2, **kwargs)
    b = ks.visualize_features(model, seed=2, batch_size=1, **kwargs)
    c = ks.visualize_features(model, seed=5, **kwargs)
    assert np.abs(a.images - c.images).max() > 1e-3
    np.testing.assert_allclose(a.images, b.images, atol=1e-5)
    np.testing.assert_allclose(a.objective, b.objective, rtol=1e-4, atol=1e-5)


@jax_slow
def test_a_layer_inside_a_nested_model():
    inner = keras.Sequential([keras.Input((10, 10, 3)), keras.layers.Conv2D(5, 3, name="conv")], name="inner")
    model = keras.Sequential([keras.Input((10, 10, 3)), inner, keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(2)])
    r = ks.visualize_features(model, layer="inner/conv", channels=[4], steps=3, progress=False)
    assert r.images.shape == (1, 10, 10, 3) and r.layer == "inner/conv"


# ------------------------------------------------------------------ errors
def test_clear_errors():
    model = _conv_model()
    with pytest.raises(ValueError, match=r"Channel out of range.*channel 7.*4 channels"):
        ks.visualize_features(model, layer="conv", channels=[7], steps=1, progress=False)
    with pytest.raises(ValueError, match="Unknown parametrization"):
        ks.visualize_features(model, layer="conv", channels=[0], parametrization="jpeg", steps=1, progress=False)
    with pytest.raises(ValueError, match="Pass the layer"):
        ks.visualize_features(model, channels=[0], steps=1, progress=False)
    with pytest.raises(ValueError, match="Received: layer='cnov'"):
        ks.visualize_features(model, layer="cnov", channels=[0], steps=1, progress=False)
    with pytest.raises(ValueError, match="direction vector of length 4"):
        ks.visualize_features(model, layer="conv", channels=[[1.0, 0.0]], objective="direction", steps=1,
                              progress=False)
    scalar = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                               keras.layers.Lambda(lambda t: keras.ops.sum(t, axis=-1), name="total")])
    with pytest.raises(ValueError, match="no channel axis"):
        ks.visualize_features(scalar, layer="total", steps=1, progress=False)
    with pytest.raises(ValueError, match="image_shape"):
        ks.visualize_features(keras.Sequential([keras.layers.Conv2D(2, 3, name="c")]), layer="c", steps=1)


# ------------------------------------------------------------------ command line
@jax_slow
def test_cli_writes_one_png_per_channel_and_an_index(tmp_path, capsys):
    from PIL import Image

    from kerascope.cli import main

    path = tmp_path / "m.keras"
    _conv_model().save(path)
    out = tmp_path / "features"
    code = main(["visualize", str(path), "--layer", "conv", "--channels", "0:3", "--out", str(out), "--steps", "3",
                 "--quiet"])
    assert code == 0
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == ["channel_000.png", "channel_001.png", "channel_002.png"]
    assert Image.open(pngs[0]).size == (12, 12)
    index = (out / "index.html").read_text()
    assert "What each channel of conv detects" in index and index.count("<img") == 3
    assert main(["visualize", str(path), "--layer", "conv", "--channels", "9", "--out", str(out)]) == 2
    assert "Channel out of range" in capsys.readouterr().err


def test_a_channel_off_on_the_grey_start_moves_only_before_its_fused_relu():
    model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(1, 3, activation="relu", name="conv")])
    conv = model.get_layer("conv")
    original = conv.activation
    conv.set_weights([np.full((3, 3, 1, 1), 0.1, np.float32), np.array([-1.0], np.float32)])  # 0.45 - 1 < 0 at grey
    kwargs = {"layer": "conv", "channels": [0], "parametrization": "pixel", "transforms": None, "steps": 40,
              "progress": False}
    stuck = ks.visualize_features(model, pre_relu=False, **kwargs)
    np.testing.assert_array_equal(stuck.objective, 0.0)  # a dead ReLU: no gradient, the grey start stays
    moved = ks.visualize_features(model, **kwargs)
    assert moved.params["pre_relu"] and moved.objective[0, -1] > moved.objective[0, 0] + 0.1
    assert moved.images.mean() > 0.6  # the positive kernel pulls every pixel up
    assert conv.activation is original  # the scoped patch is undone
