"""Shared pieces of the matplotlib figures: a pyplot-free Figure, colour limits, the sign test."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def legible_ticks(figure: Figure, bar: Any, *, symmetric: bool = False, gap: float = 4.0) -> int:
    """Give a colour bar short tick labels (3 significant digits) and as many ticks as fit without overlap.

    Tries 7, 5, 3 then 2 ticks, measuring the drawn labels; returns how many are shown.

    Example:
        >>> from matplotlib.cm import ScalarMappable
        >>> from matplotlib.colors import Normalize
        >>> fig = new_figure(1.5, 0.8)
        >>> bar = fig.colorbar(ScalarMappable(Normalize(-300000, 300000), "RdBu_r"), ax=fig.subplots(),
        ...                    orientation="horizontal")
        >>> legible_ticks(fig, bar, symmetric=True) <= 3
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    renderer = canvas.get_renderer()
    horizontal = bar.orientation == "horizontal"
    axis = bar.ax.xaxis if horizontal else bar.ax.yaxis
    bar.formatter = FuncFormatter(lambda value, _: "0" if value == 0 else f"{value:.3g}".replace("-", "\u2212"))
    shown = 0
    for bins in (7, 5, 3, 2):
        bar.locator = MaxNLocator(nbins=bins, symmetric=symmetric)
        bar.update_ticks()
        canvas.draw()
        low, high = sorted(bar.ax.get_xlim() if horizontal else bar.ax.get_ylim())
        boxes = sorted(
            (b.x0, b.x1) if horizontal else (b.y0, b.y1)
            for label, value in zip(axis.get_ticklabels(), axis.get_ticklocs())
            if label.get_text() and low - 1e-12 * abs(high - low) <= value <= high + 1e-12 * abs(high - low)
            for b in [label.get_window_extent(renderer)]
        )
        shown = len(boxes)
        if all(boxes[i][1] + gap <= boxes[i + 1][0] for i in range(len(boxes) - 1)):
            break
    return shown
