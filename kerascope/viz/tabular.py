"""Tabular attributions: a horizontal bar chart of the features, largest magnitude on top."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kerascope.viz._figure import new_figure
from kerascope.viz.colours import DIVERGING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_tabular(
    attributions: np.ndarray,
    feature_names: Sequence[str] | None = None,
    *,
    values: np.ndarray | None = None,
    top_k: int = 20,
    cmap: str = DIVERGING,
    size: tuple[float, float] | None = None,
    title: str | None = None,
) -> Figure:
    """Horizontal bar chart of feature attributions, largest magnitude on top.

    Positive bars take the warm end of ``cmap``, negative bars the cold end.
    With ``values``, each label reads ``name = value``.

    Args:
        attributions: one sample's attributions ``(F,)``.
        feature_names: a name per feature (default ``feature 0..F-1``).
        values: the sample's feature values, shown in the labels.
        top_k: show the ``top_k`` largest magnitudes.
        size: ``(width, height)`` in inches (default: grows with the number of bars).
        title: figure title.

    Example:
        >>> import numpy as np
        >>> fig = plot_tabular(np.array([0.5, -0.2, 0.1]), ["age", "income", "<b>"])
        >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
        ['<b>', 'income', 'age']
    """
    import matplotlib

    a = np.asarray(attributions, np.float64)
    if a.ndim != 1:
        raise ValueError(f"Expected one sample's attributions of shape (F,). Received: shape={a.shape}.")
    names = list(feature_names) if feature_names is not None else [f"feature {i}" for i in range(len(a))]
    if len(names) != len(a):
        raise ValueError(f"Expected one name per feature. Received: {len(names)} names for {len(a)} features.")
    order = np.argsort(-np.abs(a), kind="stable")[:top_k][::-1]
    labels = [names[i] if values is None else f"{names[i]} = {float(np.asarray(values)[i]):.3g}" for i in order]
    colormap = matplotlib.colormaps[cmap]
    colours = [colormap(0.85) if a[i] >= 0 else colormap(0.15) for i in order]
    width, height = size or (6.0, 0.8 + 0.3 * len(order))
    figure = new_figure(width, height)
    ax = figure.subplots()
    ax.barh(np.arange(len(order)), a[order], color=colours)
    ax.set_yticks(np.arange(len(order)), labels, fontsize=8)
    ax.axvline(0, color="#444", linewidth=0.8)
    ax.set_xlabel("attribution", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return figure
