"""MaCo's fixed magnitude: given, estimated from images, kept fixed by the phase-only optimisation, as Xplique.

Runs on every backend (in the JAX / PyTorch loop of scripts/test.sh); the Xplique cross-check runs on TensorFlow.
"""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.features.parametrize import COLOR_CORRELATION, MaCo, spectrum_magnitude

jax_slow = pytest.mark.slow if keras.backend.backend() == "jax" else pytest.mark.skipif(False, reason="")


def _conv_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2, name="head")])


def _pre_sigmoid_spectrum(images: np.ndarray) -> np.ndarray:
    """``|rfft2|`` ``(rows, c, h, w // 2 + 1)`` of the standardised image MaCo builds before colours and sigmoid."""
    x = np.clip(images.astype(np.float64), 1e-7, 1 - 1e-7)
    logits = np.log(x / (1 - x))  # the inverse of the sigmoid
    decorrelated = logits @ np.linalg.inv(COLOR_CORRELATION.T.astype(np.float64))  # the inverse colour map
    return np.abs(np.fft.rfft2(decorrelated, axes=(1, 2))).transpose(0, 3, 1, 2)


def test_estimated_spectrum_equals_numpy_in_any_chunking():
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(7, 10, 8, 3)).astype(np.float32)
    expected = np.abs(np.fft.rfft2(images.astype(np.float64), axes=(1, 2))).mean(axis=0).transpose(2, 0, 1)
    for batch_size in (1, 3, 64):
        np.testing.assert_allclose(spectrum_magnitude(images, batch_size=batch_size), expected, rtol=1e-5)
    odd = rng.uniform(size=(4, 6, 5, 1))  # an odd width: the spectrum of the image padded by one zero column
    padded = np.concatenate([odd, np.zeros((4, 6, 1, 1))], axis=2)
    np.testing.assert_allclose(spectrum_magnitude(odd), np.abs(np.fft.rfft2(padded, axes=(1, 2))).mean(0)
                               .transpose(2, 0, 1), rtol=1e-5)
    # another image size: the spectrum resized bilinearly (half-pixel centres) to the visualised image's
    small = spectrum_magnitude(images, image_shape=(5, 4, 3))
    rows = 0.5 * (expected[:, 0::2] + expected[:, 1::2])  # 10 -> 5 rows: half-pixel centres 2i + 0.5
    source = (np.arange(3) + 0.5) * 5 / 3 - 0.5  # 5 -> 3 columns
    resized = np.apply_along_axis(lambda row: np.interp(source, np.arange(5), row), -1, rows)
    np.testing.assert_allclose(small, resized, rtol=1e-5)


@jax_slow
@pytest.mark.parametrize("source", ["magnitude", "magnitude_from"])
def test_phase_only_optimisation_keeps_the_magnitude_fixed(source):
    rng = np.random.default_rng(1)
    if source == "magnitude":
        magnitude = rng.uniform(0.5, 2.0, size=(3, 12, 7)).astype(np.float32)
        options = {"magnitude": magnitude}
    else:
        images = rng.uniform(size=(9, 12, 12, 3)).astype(np.float32)
        magnitude = np.abs(np.fft.rfft2(images.astype(np.float64), axes=(1, 2))).mean(0).transpose(2, 0, 1)
        options = {"magnitude_from": images}
    model = _conv_model()
    r = ks.visualize_features(model, layer="conv", channels=[0, 1], parametrization="maco", transforms=None,
                              steps=12, seed=0, progress=False, **options)
    start = ks.visualize_features(model, layer="conv", channels=[0, 1], parametrization="maco", transforms=None,
                                  steps=1, learning_rate=0.0, seed=0, progress=False, **options)
    assert np.abs(r.images - start.images).max() > 0.05  # the phase moved: the image changed
    assert np.all(r.objective[:, -1] > r.objective[:, 0])
    for images in (start.images, r.images):
        ratio = _pre_sigmoid_spectrum(images)[:, :, :, 1:-1] / magnitude[None, :, :, 1:-1]  # not DC / Nyquist columns
        # the same magnitude up to one scale per image (the standardisation), before and after optimising
        spread = ratio / ratio.mean(axis=(1, 2, 3), keepdims=True)
        np.testing.assert_allclose(spread, 1.0, atol=2e-3)


def test_default_magnitude_is_the_one_over_f_law_and_errors_are_clear():
    from kerascope.features.parametrize import fourier_scale

    np.testing.assert_array_equal(MaCo((8, 8, 3)).magnitude(), fourier_scale(8, 8)[:, :5])
    model = _conv_model()
    with pytest.raises(ValueError, match="MaCo parametrisation only.*parametrization='fourier'"):
        ks.visualize_features(model, layer="conv", channels=[0], magnitude=np.ones((12, 7)), steps=1, progress=False)
    with pytest.raises(ValueError, match="parametrization='maco'"):
        ks.visualize_features(model, layer="conv", channels=[0], magnitude_from=np.ones((2, 12, 12, 3)), steps=1,
                              progress=False)
    with pytest.raises(ValueError, match="not both"):
        ks.visualize_features(model, layer="conv", channels=[0], parametrization="maco", magnitude=np.ones((12, 7)),
                              magnitude_from=np.ones((2, 12, 12, 3)), steps=1, progress=False)
    with pytest.raises(ValueError, match=r"\(channels, h, w\) with 3 channels.*shape \(2, 12, 7\)"):
        MaCo((12, 12, 3), magnitude=np.ones((2, 12, 7)))
    with pytest.raises(ValueError, match="non-negative"):
        MaCo((12, 12, 3), magnitude=-np.ones((12, 7)))
    with pytest.raises(ValueError, match="3 colour channels but the visualised images have 1"):
        spectrum_magnitude(np.ones((2, 4, 4, 3)), image_shape=(4, 4, 1))
    with pytest.raises(ValueError, match=r"images \(N, H, W, C\)"):
        spectrum_magnitude(np.ones((4, 4, 3)))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow" or importlib.util.find_spec("xplique") is None,
                    reason="Xplique's MaCo is TensorFlow code (cross-checked on the TensorFlow backend)")
def test_image_and_estimated_magnitude_equal_xpliques():
    import tensorflow as tf
    from xplique.features_visualizations.preconditioning import init_maco_buffer, maco_image_parametrization

    rng = np.random.default_rng(2)
    images = rng.uniform(size=(6, 16, 16, 3)).astype(np.float32)
    theirs, _ = init_maco_buffer((16, 16), dataset=tf.data.Dataset.from_tensor_slices(images).batch(4))
    ours = spectrum_magnitude(images, image_shape=(16, 16, 3))
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-4)
    phase = rng.normal(size=(3, 16, 9)).astype(np.float32)
    expected = maco_image_parametrization(tf.constant(ours), tf.constant(phase), (0.0, 1.0)).numpy()
    image = keras.ops.convert_to_numpy(MaCo((16, 16, 3), magnitude=ours).image(phase[None]))[0]
    np.testing.assert_allclose(image, expected, atol=1e-5)
    # a spectrum of another size (as Xplique's ImageNet file, 512 x 257) is resized as Xplique resizes it
    big = rng.uniform(0.1, 5.0, size=(3, 40, 21)).astype(np.float32)
    resized = np.moveaxis(tf.image.resize(np.moveaxis(big, 0, -1), (16, 9)).numpy(), -1, 0)
    np.testing.assert_allclose(MaCo((16, 16, 3), magnitude=big).magnitude(), resized, rtol=1e-5)
