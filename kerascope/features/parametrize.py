"""Image parametrisations for feature visualisation: pixels, Lucid's Fourier basis, MaCo.

Each parametrisation turns a batch of free parameters (numpy at the start, tensors inside the
compiled step) into images in ``[0, 1]`` with ``keras.ops`` only, so the same code runs and is
differentiated on TensorFlow, JAX and PyTorch.

* ``"pixel"``: ``sigmoid(p)``, one parameter per pixel and colour.
* ``"fourier"`` (Olah et al. 2017, Lucid's ``fft_image`` + ``to_valid_rgb``): the image is the
  inverse real FFT of a spectrum scaled by ``1 / max(f, 1 / max(h, w)) * sqrt(h w)`` (so every
  frequency gets the same power as in natural images), divided by 4, colours decorrelated with
  Lucid's ImageNet colour matrix, then ``sigmoid``.
* ``"maco"`` (Fel et al. 2023, magnitude-constrained optimisation): only the phase of the spectrum
  is optimised, the magnitude is fixed. The phase and image are standardised per image, colours
  recorrelated, then ``sigmoid``, as in Xplique's ``maco_image_parametrization``. The magnitude is
  a parameter: an array (e.g. Xplique's ImageNet average spectrum, if you have the file; resized
  bilinearly to the image's spectrum as Xplique does), the mean Fourier amplitude of your own
  images (:func:`spectrum_magnitude`, as Xplique's ``init_maco_buffer(dataset=...)``), or by
  default the ``1 / f`` law of natural images (the Fourier scale above), which needs no download.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.numeric.resize import upsample

PARAMETRIZATIONS = ("pixel", "fourier", "maco")

# Lucid's square root of the ImageNet colour covariance (lucid/optvis/param/color.py)
COLOR_CORRELATION_SVD_SQRT = np.asarray(
    [[0.26, 0.09, 0.02], [0.27, 0.00, -0.05], [0.27, -0.09, 0.03]], np.float32
)
COLOR_CORRELATION = COLOR_CORRELATION_SVD_SQRT / np.max(np.linalg.norm(COLOR_CORRELATION_SVD_SQRT, axis=0))


def rfft2d_freqs(h: int, w: int) -> np.ndarray:
    """Frequency magnitude of each entry of a real 2-D spectrum, as Lucid's ``rfft2d_freqs``.

    Example:
        >>> rfft2d_freqs(2, 4).round(3).tolist()
        [[0.0, 0.25, 0.5], [0.5, 0.559, 0.707]]
    """
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.fftfreq(w)[: w // 2 + (2 if w % 2 else 1)]
    return np.sqrt(fx * fx + fy * fy)


def fourier_scale(h: int, w: int, decay_power: float = 1.0) -> np.ndarray:
    """Lucid's spectrum scaling ``1 / max(f, 1 / max(h, w)) ** decay_power * sqrt(h w)``, ``(h, w // 2 + 1[+1])``.

    Example:
        >>> s = fourier_scale(4, 4)
        >>> s.shape, float(s[0, 0])
        ((4, 3), 16.0)
    """
    freqs = rfft2d_freqs(h, w)
    scale = 1.0 / np.maximum(freqs, 1.0 / max(w, h)) ** decay_power
    return (scale * np.sqrt(w * h)).astype(np.float32)


def _hermitian_indices(h: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices completing a half spectrum ``(h, width // 2 + 1)`` to a full one."""
    rows = (-np.arange(h)) % h
    cols = np.arange(width // 2 - 1, 0, -1)
    return rows.astype(np.int32), cols.astype(np.int32)


def irfft2(real: Any, imag: Any, width: int) -> Any:
    """Inverse real 2-D FFT over the last two axes (``numpy.fft.irfft2(real + 1j imag, s=(h, width))``, even width).

    Written with ``keras.ops.ifft2`` on the Hermitian completion of the half spectrum, so it is
    differentiable on every backend.

    Example:
        >>> import numpy as np
        >>> z = np.random.default_rng(0).normal(size=(2, 4, 3)) + 1j * np.random.default_rng(1).normal(size=(2, 4, 3))
        >>> ours = keras.ops.convert_to_numpy(irfft2(z.real.astype("float32"), z.imag.astype("float32"), 4))
        >>> bool(np.allclose(ours, np.fft.irfft2(z, s=(4, 4)), atol=1e-5))
        True
    """
    h = int(real.shape[-2])
    rows, cols = _hermitian_indices(h, width)
    mirrored_re = keras.ops.take(keras.ops.take(real, rows, axis=-2), cols, axis=-1)
    mirrored_im = keras.ops.take(keras.ops.take(imag, rows, axis=-2), cols, axis=-1)
    full_re = keras.ops.concatenate([real, mirrored_re], axis=-1)
    full_im = keras.ops.concatenate([imag, -mirrored_im], axis=-1)
    out_re, _ = keras.ops.ifft2((full_re, full_im))
    return out_re


def _colours(image: Any) -> Any:
    """Lucid's colour (de)correlation ``image @ C.T`` on three-channel images, identity otherwise."""
    if int(image.shape[-1]) != 3:
        return image
    return keras.ops.matmul(image, keras.ops.convert_to_tensor(COLOR_CORRELATION.T))


class Parametrization:
    """Free parameters -> images in ``[0, 1]`` of shape ``(rows, h, w, c)``.

    Example:
        >>> p = Parametrization.create("fourier", (8, 8, 3))
        >>> params = p.init(2, np.random.default_rng(0))
        >>> keras.ops.convert_to_numpy(p.image(params)).shape
        (2, 8, 8, 3)
    """

    name = "pixel"

    def __init__(self, shape: tuple[int, int, int], decay_power: float = 1.0) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.decay_power = decay_power

    @staticmethod
    def create(name: str, shape: tuple[int, int, int], magnitude: Any = None) -> Parametrization:
        """The parametrisation called ``name`` (``"pixel"``, ``"fourier"`` or ``"maco"``).

        ``magnitude`` is MaCo's fixed spectrum magnitude (``None``: the ``1 / f`` law).

        Example:
            >>> type(Parametrization.create("maco", (4, 4, 3))).__name__
            'MaCo'
        """
        kinds = {"pixel": Parametrization, "fourier": Fourier, "maco": MaCo}
        if name not in kinds:
            raise ValueError(
                f"Unknown parametrization. Received: parametrization={name!r}. Expected one of {list(kinds)}."
            )
        if name == "maco":
            return MaCo(shape, magnitude=magnitude)
        if magnitude is not None:
            raise ValueError(
                "A spectrum magnitude is used by the MaCo parametrisation only. Received: "
                f"parametrization={name!r} with a magnitude. Pass parametrization='maco', or no magnitude."
            )
        return kinds[name](shape)

    def param_shape(self) -> tuple[int, ...]:
        """Shape of one row's parameters.

        Example:
            >>> Parametrization((4, 5, 3)).param_shape()
            (4, 5, 3)
        """
        return self.shape

    def init(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        """Initial parameters ``(rows, *param_shape)``: normal with standard deviation 0.01 (Lucid).

        Example:
            >>> Parametrization((2, 2, 1)).init(3, np.random.default_rng(0)).shape
            (3, 2, 2, 1)
        """
        return rng.normal(scale=0.01, size=(rows, *self.param_shape())).astype(np.float32)

    def image(self, params: Any) -> Any:
        """Images in ``[0, 1]`` from ``params`` (traceable).

        Example:
            >>> float(keras.ops.convert_to_numpy(Parametrization((1, 1, 1)).image(np.zeros((1, 1, 1, 1)))).item())
            0.5
        """
        return keras.ops.sigmoid(params)


class Fourier(Parametrization):
    """Lucid's decorrelated Fourier parametrisation (``fft_image``, ``to_valid_rgb(decorrelate=True)``).

    Example:
        >>> Fourier((6, 5, 3)).param_shape()
        (2, 3, 6, 4)
    """

    name = "fourier"

    def _even_width(self) -> int:
        return self.shape[1] + self.shape[1] % 2  # Lucid's odd width: one more column, cropped

    def param_shape(self) -> tuple[int, ...]:
        h, _, c = self.shape
        return (2, c, h, self._even_width() // 2 + 1)

    def spectrum_image(self, real: Any, imag: Any) -> Any:
        """``(rows, c, h, wf)`` spectrum -> ``(rows, h, w, c)`` image before colours and sigmoid."""
        h, w, _ = self.shape
        image = irfft2(real, imag, self._even_width())[..., :h, :w]
        return keras.ops.transpose(image, (0, 2, 3, 1))

    def image(self, params: Any) -> Any:
        h, w, _ = self.shape
        params = keras.ops.convert_to_tensor(params)
        scale = keras.ops.convert_to_tensor(fourier_scale(h, w, self.decay_power)[:, : self._even_width() // 2 + 1])
        image = self.spectrum_image(params[:, 0] * scale, params[:, 1] * scale) / 4.0
        return keras.ops.sigmoid(_colours(image))


class MaCo(Fourier):
    """Magnitude-constrained Fourier parametrisation (Fel et al. 2023): only the phase is optimised.

    ``magnitude``: the fixed spectrum magnitude, ``(h', w')`` (every colour channel) or
    ``(c, h', w')``, resized bilinearly to the image's half spectrum ``(h, w // 2 + 1)`` if its size
    differs (as Xplique resizes its ImageNet spectrum); ``None``: the ``1 / f`` law of natural
    images (Lucid's Fourier scale). Only its shape matters, not its scale: the image is
    standardised.

    Example:
        >>> MaCo((6, 6, 3)).param_shape()
        (3, 6, 4)
        >>> MaCo((6, 6, 3), magnitude=np.ones((3, 12, 7))).magnitude().shape
        (3, 6, 4)
    """

    name = "maco"

    def __init__(self, shape: tuple[int, int, int], decay_power: float = 1.0, magnitude: Any = None) -> None:
        super().__init__(shape, decay_power)
        self._fixed = None if magnitude is None else self._checked_magnitude(magnitude)

    def _spectrum_shape(self) -> tuple[int, int]:
        return self.shape[0], self._even_width() // 2 + 1

    def _checked_magnitude(self, magnitude: Any) -> np.ndarray:
        array = np.asarray(magnitude, np.float64)
        channels = self.shape[2]
        if array.ndim == 2:
            array = array[None]
        if array.ndim != 3 or array.shape[0] not in (1, channels) or min(array.shape[1:]) < 1:
            raise ValueError(
                f"A MaCo magnitude must be (h, w) or (channels, h, w) with {channels} channels. Received: "
                f"magnitude of shape {np.shape(magnitude)} for images of shape {self.shape}."
            )
        if not np.all(np.isfinite(array)) or array.min() < 0 or array.max() <= 0:
            raise ValueError(
                "A MaCo magnitude must be finite, non-negative and not all zero. Received: values from "
                f"{np.nanmin(array):.3g} to {np.nanmax(array):.3g}."
            )
        return upsample(array, self._spectrum_shape()).astype(np.float32)

    def param_shape(self) -> tuple[int, ...]:
        return super().param_shape()[1:]

    def init(self, rows: int, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(scale=1.0, size=(rows, *self.param_shape())).astype(np.float32)  # Xplique's std=1

    def magnitude(self) -> np.ndarray:
        """The fixed magnitude, ``(h, w // 2 + 1)`` (the ``1 / f`` default) or ``(c, h, w // 2 + 1)``.

        Odd widths get one more column (the image is computed one pixel wider and cropped).

        Example:
            >>> MaCo((4, 4, 3)).magnitude().shape
            (4, 3)
        """
        if self._fixed is not None:
            return self._fixed
        h, w, _ = self.shape
        return fourier_scale(h, w, self.decay_power)[:, : self._even_width() // 2 + 1]

    def image(self, params: Any) -> Any:
        params = keras.ops.convert_to_tensor(params)
        axes = tuple(range(1, len(params.shape)))
        phase = params - keras.ops.mean(params, axis=axes, keepdims=True)
        phase = phase / (keras.ops.std(phase, axis=axes, keepdims=True) + 1e-5)
        magnitude = keras.ops.convert_to_tensor(self.magnitude())
        image = self.spectrum_image(keras.ops.cos(phase) * magnitude, keras.ops.sin(phase) * magnitude)
        image = image - keras.ops.mean(image, axis=(1, 2, 3), keepdims=True)
        image = image / (keras.ops.std(image, axis=(1, 2, 3), keepdims=True) + 1e-5)
        return keras.ops.sigmoid(_colours(image))


def spectrum_magnitude(images: Any, image_shape: tuple[int, int, int] | None = None,
                       batch_size: int = 64) -> np.ndarray:
    """The mean Fourier amplitude of ``images``, ``(c, h, w // 2 + 1)``: a MaCo magnitude from your data.

    As Xplique's ``init_maco_buffer(dataset=...)``: the average over the images of ``|rfft2|`` of
    each colour channel, computed ``batch_size`` images at a time (memory bounded); an odd width is
    padded with one zero column (the spectrum of the one-pixel-wider image MaCo computes). With
    ``image_shape`` of another size, the spectrum is then resized bilinearly to that image's spectrum.

    Example:
        >>> x = np.random.default_rng(0).uniform(size=(5, 8, 8, 3))
        >>> m = spectrum_magnitude(x)
        >>> m.shape, bool(np.allclose(m, np.abs(np.fft.rfft2(x, axes=(1, 2))).mean(0).transpose(2, 0, 1), atol=1e-5))
        ((3, 8, 5), True)
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}.")
    if not hasattr(images, "shape") or len(images.shape) != 4 or len(images) < 1 or min(images.shape[1:]) < 1:
        raise ValueError(
            "`magnitude_from` must be images (N, H, W, C) with N >= 1. Received: "
            f"{type(images).__name__} of shape {getattr(images, 'shape', None)}."
        )
    h, w = int(images.shape[1]), int(images.shape[2])
    total = np.zeros((h, w // 2 + 1 + w % 2, images.shape[3]), np.float64)
    for start in range(0, len(images), batch_size):
        chunk = np.asarray(images[start:start + batch_size], np.float64)
        total += np.abs(np.fft.rfft2(chunk, s=(h, w + w % 2), axes=(1, 2))).sum(axis=0)
    magnitude = np.moveaxis(total / len(images), -1, 0).astype(np.float32)
    if image_shape is None:
        return magnitude
    if int(image_shape[2]) != magnitude.shape[0]:
        raise ValueError(
            f"`magnitude_from` images have {magnitude.shape[0]} colour channels but the visualised images have "
            f"{image_shape[2]}. Received: images of shape {tuple(images.shape)}, image_shape={tuple(image_shape)}."
        )
    return MaCo(tuple(image_shape), magnitude=magnitude).magnitude()
