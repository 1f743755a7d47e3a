"""Gaussian blur in numpy: the one blur of kerascope (IG's blurred baseline, blur deletion, SSIM).

A leaf module (numpy only), imported by ``methods``, ``metrics`` and anything else that blurs.
"""

from __future__ import annotations

import functools

import numpy as np


def gaussian_blur(array: np.ndarray, sigma: float) -> np.ndarray:
    """Blur the spatial axes (all but the first and last) with a Gaussian of std ``sigma`` pixels.

    Separable, reflect padding (edge padding for axes shorter than the radius), kernel
    radius ``ceil(3 sigma)``, computed in float64 and returned as float32; ``sigma <= 0``
    returns the input. Inputs are channels-last with a batch axis: ``(N, H, W, C)``,
    ``(N, T, C)``, ...

    Example:
        >>> import numpy as np
        >>> x = np.zeros((1, 15, 15, 1)); x[0, 7, 7, 0] = 1.0
        >>> y = gaussian_blur(x, 1.0)
        >>> round(float(y.sum()), 5), bool(y[0, 7, 7, 0] < 1.0)
        (1.0, True)
    """
    out = np.asarray(array, np.float64)
    if out.ndim < 3:
        raise ValueError(
            "A blur needs inputs with spatial axes (batch, ..., channels). Received: "
            f"shape={out.shape}. Use a constant or array baseline for tabular inputs."
        )
    if sigma <= 0:
        return out.astype(np.float32)
    radius = int(np.ceil(3 * sigma))
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    taps /= taps.sum()
    for axis in range(1, out.ndim - 1):
        pad = [(0, 0)] * out.ndim
        pad[axis] = (radius, radius)
        padded = np.pad(out, pad, mode="reflect" if out.shape[axis] > radius else "edge")
        windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * radius + 1, axis=axis)
        out = windows @ taps
    return out.astype(np.float32)


def gaussian_matrix(length: int, sigma: float, truncate: float = 4.0) -> np.ndarray:
    """The ``(length, length)`` matrix of a 1-D Gaussian blur with zero padding (float64).

    ``matrix @ v`` equals ``scipy.ndimage.gaussian_filter1d(v, sigma, mode="constant",
    truncate=truncate)``: taps ``exp(-x^2 / (2 sigma^2))`` for ``|x| <= int(truncate sigma + 0.5)``,
    normalised to sum 1, the values beyond the edges taken as zero. ``sigma == 0``: the identity.

    Example:
        >>> gaussian_matrix(3, 0.0).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
        >>> round(float(gaussian_matrix(50, 2.0)[25].sum()), 6)
        1.0
    """
    if sigma <= 0:
        return np.eye(length)
    radius = int(truncate * float(sigma) + 0.5)
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / float(sigma)) ** 2)
    taps /= taps.sum()
    offset = np.arange(length)[None, :] - np.arange(length)[:, None]
    return np.where(np.abs(offset) <= radius, taps[np.clip(offset + radius, 0, 2 * radius)], 0.0)


@functools.lru_cache(maxsize=1024)
def _matrix(length: int, sigma: float, truncate: float) -> np.ndarray:
    """:func:`gaussian_matrix`, cached (read-only): a path reuses its blur levels for every chunk."""
    matrix = gaussian_matrix(length, sigma, truncate)
    matrix.flags.writeable = False
    return matrix


def gaussian_blur_rows(array: np.ndarray, sigmas: np.ndarray, truncate: float = 4.0) -> np.ndarray:
    """Blur each row ``r`` of ``(R, *spatial, C)`` with its own ``sigmas[r]``, zero padding, float64.

    The same as ``scipy.ndimage.gaussian_filter(array[r], [s, ..., s, 0], mode="constant")`` per row
    (PAIR's Blur IG path), as one batched matrix product per spatial axis.

    Example:
        >>> import numpy as np
        >>> x = np.zeros((2, 9, 9, 1)); x[:, 4, 4, 0] = 1.0
        >>> y = gaussian_blur_rows(x, np.array([0.0, 1.0]))
        >>> float(y[0, 4, 4, 0]), bool(y[1, 4, 4, 0] < 0.2), round(float(y[1].sum()), 6)
        (1.0, True, 1.0)
    """
    out = np.asarray(array, np.float64)
    if out.ndim < 3:
        raise ValueError(
            "A blur needs inputs with spatial axes (batch, ..., channels). Received: "
            f"shape={out.shape}."
        )
    sigmas = np.asarray(sigmas, np.float64).reshape(-1)
    for axis in range(1, out.ndim - 1):
        length = out.shape[axis]
        unique, which = np.unique(sigmas, return_inverse=True)
        matrices = np.stack([_matrix(length, float(s), truncate) for s in unique])[which]  # (R, L, L)
        moved = np.moveaxis(out, axis, 1)
        shape = moved.shape
        blurred = np.matmul(matrices, moved.reshape(shape[0], length, -1)).reshape(shape)
        out = np.moveaxis(blurred, 1, axis)
    return out


def blur_and_slope_rows(
    array: np.ndarray, sigmas: np.ndarray, step: float, truncate: float = 4.0
) -> tuple[np.ndarray, np.ndarray]:
    """Each row blurred with its own ``sigmas[r]`` and the blur's finite-difference slope, float32.

    Returns ``(blur(x, s), (blur(x, s + step) - blur(x, s)) / step)`` per row (zero padding, as
    :func:`gaussian_blur_rows`). The slope is computed without subtracting two blurs: along axes
    ``1..k`` it telescopes to ``sum_a B'_k..B'_{a+1} D_a B_{a-1}..B_1 x`` with
    ``D = (B(s + step) - B(s)) / step`` formed in float64, so float32 products lose nothing to
    cancellation (Blur IG's path, ``step`` 0.01).

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(size=(2, 9, 7, 1))
        >>> p, d = blur_and_slope_rows(x, np.array([1.0, 2.0]), 0.01)
        >>> ref = (gaussian_blur_rows(x, np.array([1.01, 2.01])) - gaussian_blur_rows(x, np.array([1.0, 2.0]))) / 0.01
        >>> bool(np.allclose(d, ref, atol=1e-5)), bool(np.allclose(p, gaussian_blur_rows(x, [1.0, 2.0]), atol=1e-6))
        (True, True)
    """
    # channels first, (R, C, *spatial): the last two axes are blurred as matrix products on their own
    # (``M @ v`` and ``v @ M^T``, C x R GEMMs of the spatial size), without a moved copy per product
    low = np.moveaxis(np.asarray(array, np.float32), -1, 1)
    slope = None
    sigmas = np.asarray(sigmas, np.float64).reshape(-1)
    unique, which = np.unique(sigmas, return_inverse=True)
    ones = (1,) * (low.ndim - 3)

    def along(values: np.ndarray, matrices: np.ndarray, axis: int) -> np.ndarray:
        stacked = matrices.reshape(matrices.shape[0], *ones, *matrices.shape[1:])
        if axis == values.ndim - 1:
            return np.matmul(values, np.swapaxes(stacked, -1, -2))
        moved = np.ascontiguousarray(np.moveaxis(values, axis, -2))  # copies only a strided input or a volume
        return np.moveaxis(np.matmul(stacked, moved), -2, axis)

    for axis in range(2, low.ndim):
        length = low.shape[axis]
        now = np.stack([_matrix(length, float(s), truncate) for s in unique])
        later = np.stack([_matrix(length, float(s) + step, truncate) for s in unique])
        derivative = ((later - now) / step).astype(np.float32)[which]
        later, now = later.astype(np.float32)[which], now.astype(np.float32)[which]
        slope = along(low, derivative, axis) if slope is None else along(slope, later, axis) + along(low, derivative, axis)
        low = along(low, now, axis)
    return np.ascontiguousarray(np.moveaxis(low, 1, -1)), np.ascontiguousarray(np.moveaxis(slope, 1, -1))
