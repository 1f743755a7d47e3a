"""Shared pieces of the matplotlib figures: a pyplot-free Figure, colour limits, the sign test."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout Figure of ``width x height`` inches, without pyplot (renders with Agg).

    Example:
        >>> new_figure(2.0, 1.0).get_size_inches().tolist()
        [2.0, 1.0]
    """
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def is_signed(attribution: np.ndarray, tolerance: float = 1e-3) -> bool:
    """Whether an attribution has meaningful values of both signs (negatives beyond ``tolerance`` x max).

    Example:
        >>> import numpy as np
        >>> is_signed(np.array([-1.0, 2.0])), is_signed(np.array([0.0, 2.0]))
        (True, False)
    """
    a = np.asarray(attribution, np.float64)
    top = float(np.max(np.abs(a))) if a.size else 0.0
    return bool(top > 0 and a.min() < -tolerance * top and a.max() > 0)


def limits(values: np.ndarray, signed: bool, percentile: float) -> tuple[float, float]:
    """Colour limits: ``(-top, top)`` when signed, else ``(0, top)``; ``top`` = the percentile of ``|values|``.

    Example:
        >>> limits(np.array([-1.0, 3.0]), True, 100.0), limits(np.array([0.0, 0.0]), False, 100.0)
        ((-3.0, 3.0), (0.0, 1.0))
    """
    magnitude = np.abs(values[np.isfinite(values)])
    top = float(np.percentile(magnitude, percentile)) if magnitude.size else 0.0
    top = top if top > 0 else (float(magnitude.max()) if magnitude.size and magnitude.max() > 0 else 1.0)
    return (-top, top) if signed else (0.0, top)
