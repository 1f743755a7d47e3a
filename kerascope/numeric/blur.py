"""Gaussian blur in numpy: the one blur of kerascope (IG's blurred baseline, blur deletion, SSIM).

A leaf module (numpy only), imported by ``methods``, ``metrics`` and anything else that blurs.
"""

from __future__ import annotations

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
