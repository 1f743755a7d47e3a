"""Bilinear resizing in numpy (half-pixel centres, no antialias), the same on every backend.

Resizing is separable: a map is resized by one matrix product per axis with
the 1-D interpolation weights of :func:`interpolation_matrix`. Used for CAM
upsampling, RISE masks, metric maps and batch-run maps, so no eager backend
op runs per call and every backend gives the same numbers.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["interpolation_matrix", "resize_maps", "upsample"]


@functools.lru_cache(maxsize=64)
def interpolation_matrix(size_out: int, size_in: int) -> np.ndarray:
    """``(size_out, size_in)`` float64 weights of 1-D linear resizing with half-pixel centres, edges clamped.

    The same sampling as ``tf.image.resize(..., "bilinear", antialias=False)`` and
    ``torch.nn.functional.interpolate(..., align_corners=False)``: output pixel ``i``
    reads the input at ``(i + 0.5) * size_in / size_out - 0.5``.

    Example:
        >>> interpolation_matrix(4, 2).tolist()
        [[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]]
    """
    source = (np.arange(size_out, dtype=np.float64) + 0.5) * (size_in / size_out) - 0.5
    source = np.clip(source, 0.0, size_in - 1)
    low = np.floor(source).astype(np.int64)
    high = np.minimum(low + 1, size_in - 1)
    frac = source - low
    matrix = np.zeros((size_out, size_in), np.float64)
    rows = np.arange(size_out)
    np.add.at(matrix, (rows, low), 1.0 - frac)
    np.add.at(matrix, (rows, high), frac)
    matrix.flags.writeable = False  # cached and shared between calls
    return matrix


def upsample(maps: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """Resize ``(N, h, w)`` maps to ``(N, *size)`` bilinearly (half-pixel centres, no antialias).

    1-D maps ``(N, t)`` are resized linearly to ``(N, size[0])``. Bilinear
    resizing is separable, so it is two small matrix products in numpy: the
    same numbers as ``keras.ops.image.resize`` on every backend, without an
    eager op per call.

    Example:
        >>> import numpy as np
        >>> upsample(np.ones((2, 3, 3)), (6, 6)).shape
        (2, 6, 6)
    """
    maps = np.asarray(maps, np.float32)
    if maps.ndim == 2:
        if maps.shape[1] == size[0]:
            return maps
        return maps @ interpolation_matrix(size[0], maps.shape[1]).T.astype(np.float32)
    if tuple(maps.shape[1:]) == tuple(size[:2]):
        return maps
    rows = interpolation_matrix(size[0], maps.shape[1]).astype(np.float32)
    cols = interpolation_matrix(size[1], maps.shape[2]).astype(np.float32)
    return (rows @ maps) @ cols.T


def resize_maps(maps: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """Bilinear resize of ``(N, h, w)`` or ``(N, h, w, C)`` maps to ``size`` (no-op when equal or None).

    Example:
        >>> import numpy as np
        >>> resize_maps(np.ones((1, 2, 2, 3)), (4, 4)).shape
        (1, 4, 4, 3)
    """
    if size is None or tuple(maps.shape[1:3]) == tuple(size):
        return maps
    if maps.ndim == 3:
        return upsample(maps, tuple(size))
    n, h, w, c = maps.shape
    planes = np.moveaxis(maps, -1, 1).reshape(n * c, h, w)
    return np.moveaxis(upsample(planes, tuple(size)).reshape(n, c, *size), 1, -1)
