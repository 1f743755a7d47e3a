"""Matplotlib figures of attributions: image grids, time series and tabular bar charts.

Every function builds a :class:`matplotlib.figure.Figure` directly (no
``pyplot`` state, no GUI: it renders with Agg) and returns it; save it with
:func:`save_figure` or ``fig.savefig``. In Jupyter a returned figure shows itself.

Colour conventions: signed attributions (gradients, gradient x input, IG) use
a *diverging* colormap centred on zero with symmetric limits (red = pushes the
score up, blue = pushes it down); non-negative heatmaps (CAMs, absolute
saliency) use a *sequential* one starting at zero. Limits are clipped at the
99.5th percentile of the magnitude so that a few extreme pixels do not wash
the picture out. Each attribution panel has its own colour bar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DIVERGING = "RdBu_r"
SEQUENTIAL = "magma"
_SIGNS = ("auto", "signed", "absolute", "positive")


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save_figure(figure: Figure, path: str | Path, *, dpi: int = 100) -> Path:
    """Save a figure as a file (format from the suffix; PNG size = figsize x dpi); returns the path.

    Example:
        >>> import numpy as np, tempfile, os
        >>> fig = plot_tabular(np.array([0.5, -0.2, 0.1]))
        >>> save_figure(fig, os.path.join(tempfile.mkdtemp(), "bars.png")).suffix
        '.png'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


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


def display_map(attribution: np.ndarray, sign: str = "auto") -> tuple[np.ndarray, bool]:
    """Reduce one image attribution to a 2-D map and say whether it is signed.

    ``(H, W, C)`` attributions are summed over channels when shown signed, and
    their absolute values summed otherwise. ``sign``: ``"auto"`` (signed when
    both signs occur), ``"signed"``, ``"absolute"`` or ``"positive"`` (negatives dropped).

    Example:
        >>> import numpy as np
        >>> m, signed = display_map(np.stack([np.eye(2), -np.eye(2)], -1) * [1.0, 0.5])
        >>> m.tolist(), signed
        ([[0.5, 0.0], [0.0, 0.5]], True)
    """
    if sign not in _SIGNS:
        raise ValueError(f"Unknown sign mode. Received: sign={sign!r}. Expected one of {', '.join(_SIGNS)}.")
    a = np.asarray(attribution, np.float64)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3):
        raise ValueError(
            f"Expected an image attribution of shape (H, W) or (H, W, C). Received: shape={a.shape}."
        )
    signed = is_signed(a) if sign == "auto" else sign == "signed"
    if signed:
        return (a.sum(-1) if a.ndim == 3 else a), True
    if sign == "positive":
        a = np.maximum(a, 0)
    return (np.abs(a).sum(-1) if a.ndim == 3 else np.abs(a)), False


def _limits(values: np.ndarray, signed: bool, percentile: float) -> tuple[float, float]:
    magnitude = np.abs(values[np.isfinite(values)])
    top = float(np.percentile(magnitude, percentile)) if magnitude.size else 0.0
    top = top if top > 0 else (float(magnitude.max()) if magnitude.size and magnitude.max() > 0 else 1.0)
    return (-top, top) if signed else (0.0, top)


def _as_list(explanations: Any) -> list[tuple[str, Any]]:
    """Normalise explanations (one, a list, or a dict name -> one) to ``[(title, explanation)]``."""
    if isinstance(explanations, Mapping):
        return [(str(k), v) for k, v in explanations.items()]
    if isinstance(explanations, np.ndarray) or hasattr(explanations, "attributions"):
        explanations = [explanations]
    out = []
    for i, e in enumerate(explanations):
        out.append((getattr(e, "method", f"attribution {i}"), e))
    return out


def _attributions(explanation: Any) -> np.ndarray:
    a = getattr(explanation, "attributions", explanation)
    if isinstance(a, (list, tuple)):
        a = a[0]
    return np.asarray(a)


def plot_grid(
    images: np.ndarray | Sequence[np.ndarray] | None,
    explanations: Any,
    *,
    indices: Sequence[int] | None = None,
    sign: str = "auto",
    cmap: str | None = None,
    alpha: float | None = None,
    class_names: Sequence[str] | None = None,
    colorbar: bool = True,
    percentile: float = 99.5,
    max_images: int = 8,
    size: float = 2.4,
    title: str | None = None,
) -> Figure:
    """A grid of images (rows) by methods (columns), each attribution with a colour bar.

    Args:
        images: the inputs ``(N, H, W, C)`` shown in the first column (any range:
            uint8, [0, 1], standardised), or ``None`` for attributions only.
        explanations: an :class:`~kerascope.Explanation`, a list of them, a dict
            ``{title: explanation}``, or raw arrays ``(N, H, W[, C])``.
        indices: which samples to show (default: the first ``max_images``).
        sign: ``"auto"``, ``"signed"``, ``"absolute"`` or ``"positive"`` (see :func:`display_map`).
        cmap: colormap for every panel (default: ``"RdBu_r"`` for signed, ``"magma"`` otherwise).
        alpha: when given and images are given, draw each map over its image with this opacity.
        class_names: names for the targets in row titles.
        colorbar: draw a colour bar per attribution panel.
        percentile: colour limits at this percentile of the magnitude.
        size: inches per panel; the figure is ``(columns * size, rows * size)``.
        title: figure title.

    Example:
        >>> import numpy as np
        >>> fig = plot_grid(np.random.rand(2, 8, 8, 3), {"saliency": np.random.randn(2, 8, 8, 3)})
        >>> len(fig.axes) >= 4, fig.get_size_inches().tolist()
        (True, [4.8, 4.8])
    """
    columns = _as_list(explanations)
    if not columns:
        raise ValueError("Expected at least one explanation. Received: explanations=[].")
    arrays = [_attributions(e) for _, e in columns]
    count = len(arrays[0])
    for (name, _), a in zip(columns, arrays):
        if len(a) != count:
            raise ValueError(
                f"All explanations must cover the same samples. Received: {name!r} has {len(a)}, expected {count}."
            )
    if images is not None and len(images) != count:
        raise ValueError(f"Expected one image per explained sample. Received: {len(images)} images, {count} samples.")
    rows = list(indices) if indices is not None else list(range(min(count, max_images)))
    ncols = len(columns) + (images is not None)
    figure = _new_figure(ncols * size, len(rows) * size + (0.3 if title else 0.0))
    axes = np.asarray(figure.subplots(len(rows), ncols, squeeze=False))
    from kerascope.viz.overlay import _resize, to_display

    for r, index in enumerate(rows):
        col = 0
        base = None
        if images is not None:
            base = to_display(np.asarray(images[index]))
            axes[r, 0].imshow(base, interpolation="nearest")
            axes[r, 0].set_title("input" if r == 0 else "", fontsize=9)
            col = 1
        for c, ((name, explanation), a) in enumerate(zip(columns, arrays)):
            ax = axes[r, col + c]
            values, signed = display_map(a[index], sign)
            vmin, vmax = _limits(values, signed, percentile)
            colours = cmap or (DIVERGING if signed else SEQUENTIAL)
            label = name
            targets = getattr(explanation, "targets", None)
            if targets is not None and len(targets) > index:
                target = int(targets[index])
                label += f"\n{class_names[target] if class_names and target < len(class_names) else target}"
            if alpha is not None and base is not None:
                ax.imshow(base, interpolation="nearest")
                values = _resize(values.astype(np.float32), base.shape[:2])
                shown = ax.imshow(values, cmap=colours, vmin=vmin, vmax=vmax, alpha=alpha, interpolation="bilinear")
            else:
                shown = ax.imshow(values, cmap=colours, vmin=vmin, vmax=vmax, interpolation="nearest")
            ax.set_title(label, fontsize=9)
            if colorbar:
                bar = figure.colorbar(shown, ax=ax, fraction=0.046, pad=0.02)
                bar.ax.tick_params(labelsize=7)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


def plot_sequence(
    values: np.ndarray,
    attributions: np.ndarray,
    *,
    time: np.ndarray | None = None,
    channel_names: Sequence[str] | None = None,
    cmap: str | None = None,
    percentile: float = 100.0,
    max_channels: int = 8,
    size: tuple[float, float] = (8.0, 1.8),
    title: str | None = None,
) -> Figure:
    """A time series with each time step coloured by its attribution (one panel per channel).

    Args:
        values: the input sequence ``(T,)`` or ``(T, C)``.
        attributions: same shape (e.g. ``explanation.attributions[i]``).
        time: x values (default ``0..T-1``).
        channel_names: a name per channel.
        cmap: colormap (default: diverging ``"RdBu_r"`` when signed, ``"magma"`` otherwise).
        percentile: colour limits at this percentile of the magnitude (shared by all channels).
        size: ``(width, height per channel)`` in inches.
        title: figure title.

    Example:
        >>> import numpy as np
        >>> t = np.linspace(0, 6, 50)
        >>> fig = plot_sequence(np.sin(t), np.cos(t))
        >>> fig.get_size_inches().tolist()
        [8.0, 1.8]
    """
    from matplotlib.collections import LineCollection
    from matplotlib.colors import Normalize

    x = np.asarray(values, np.float64)
    a = np.asarray(attributions, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if a.ndim == 1:
        a = a[:, None]
    if x.ndim != 2 or a.shape != x.shape:
        raise ValueError(
            "Expected values (T,) or (T, C) and attributions of the same shape. "
            f"Received: values.shape={np.shape(values)}, attributions.shape={np.shape(attributions)}."
        )
    steps, channels = x.shape
    channels = min(channels, max_channels)
    t = np.arange(steps, dtype=np.float64) if time is None else np.asarray(time, np.float64)
    signed = is_signed(a)
    vmin, vmax = _limits(a[:, :channels], signed, percentile)
    norm = Normalize(vmin, vmax)
    colours = cmap or (DIVERGING if signed else SEQUENTIAL)
    figure = _new_figure(size[0], size[1] * channels + (0.3 if title else 0.0))
    axes = np.atleast_1d(figure.subplots(channels, 1, sharex=True, squeeze=False)[:, 0])
    mapped = None
    for c, ax in enumerate(axes):
        points = np.stack([t, x[:, c]], axis=-1)
        segments = np.stack([points[:-1], points[1:]], axis=1)
        line = LineCollection(segments, cmap=colours, norm=norm, linewidths=2.0)
        line.set_array((a[:-1, c] + a[1:, c]) / 2)
        ax.add_collection(line)
        mapped = ax.scatter(t, x[:, c], c=a[:, c], cmap=colours, norm=norm, s=10, zorder=3)
        span = float(x[:, c].max() - x[:, c].min()) or 1.0
        ax.set_xlim(t.min(), t.max() if t.max() > t.min() else t.min() + 1)
        ax.set_ylim(x[:, c].min() - 0.1 * span, x[:, c].max() + 0.1 * span)
        ax.set_ylabel(channel_names[c] if channel_names and c < len(channel_names) else f"channel {c}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel("time step", fontsize=8)
    bar = figure.colorbar(mapped, ax=list(axes), fraction=0.03, pad=0.01)
    bar.set_label("attribution", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


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
    figure = _new_figure(width, height)
    ax = figure.subplots()
    ax.barh(np.arange(len(order)), a[order], color=colours)
    ax.set_yticks(np.arange(len(order)), labels, fontsize=8)
    ax.axvline(0, color="#444", linewidth=0.8)
    ax.set_xlabel("attribution", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return figure


def plot_explanation(explanation: Any, inputs: Any = None, *, kind: str = "auto", index: int = 0,
                     **kwargs: Any) -> Figure:
    """Plot an :class:`~kerascope.Explanation` (what :meth:`Explanation.plot` calls).

    ``kind``: ``"image"`` (a :func:`plot_grid` row per sample), ``"sequence"``
    (:func:`plot_sequence` of sample ``index``; needs ``inputs``), ``"tabular"``
    (:func:`plot_tabular` of sample ``index``) or ``"auto"``: tabular for one
    value per feature, image otherwise. Extra keyword arguments go to that function.

    Example:
        >>> import numpy as np
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.random.rand(2, 8, 8), "gradcam", {}, np.array([0, 1]), np.ones(2))
        >>> plot_explanation(e).axes[0].get_title()
        'gradcam\\n0'
    """
    a = _attributions(explanation)
    if kind == "auto":
        kind = "tabular" if a.ndim == 2 and inputs is None else "image"
    if kind == "image":
        return plot_grid(inputs, explanation, **kwargs)
    if kind == "sequence":
        if inputs is None:
            raise ValueError("A sequence plot needs the input values. Received: inputs=None.")
        x = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        kwargs.setdefault("title", f"{explanation.method} · target {int(explanation.targets[index])}")
        return plot_sequence(np.asarray(x)[index], a[index], **kwargs)
    if kind == "tabular":
        values = None
        if inputs is not None:
            values = np.asarray(inputs[0] if isinstance(inputs, (list, tuple)) else inputs)[index]
        kwargs.setdefault("title", f"{explanation.method} · target {int(explanation.targets[index])}")
        return plot_tabular(a[index], values=values, **kwargs)
    raise ValueError(
        f"Unknown plot kind. Received: kind={kind!r}. Expected 'auto', 'image', 'sequence' or 'tabular'."
    )
