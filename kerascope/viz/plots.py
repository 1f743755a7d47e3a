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

from kerascope.viz._figure import is_signed, limits, new_figure
from kerascope.viz.colours import DIVERGING, SEQUENTIAL, sign_convention
from kerascope.viz.sequence import plot_sequence
from kerascope.viz.tabular import plot_tabular
from kerascope.viz.text import plot_tokens

__all__ = ["DIVERGING", "SEQUENTIAL", "display_map", "is_signed", "plot_explanation", "plot_grid", "plot_sequence",
           "plot_tabular", "plot_tokens", "save_figure"]
_SIGNS = ("auto", "signed", "absolute", "positive")


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
    figure = new_figure(ncols * size, len(rows) * size + (0.3 if title else 0.0))
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
            vmin, vmax = limits(values, signed, percentile)
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


def _first(inputs: Any) -> np.ndarray | None:
    if inputs is None:
        return None
    return np.asarray(inputs[0] if isinstance(inputs, (list, tuple)) else inputs)


def data_kind(attributions: np.ndarray, inputs: Any = None, tokens: Any = None) -> str:
    """Which picture suits an attribution ``(N, ...)``: ``"image"``, ``"sequence"``, ``"tabular"`` or ``"text"``.

    ``(N, H, W[, C])`` maps are images; ``(N, T)`` maps are text when tokens or a vocabulary
    are given or the inputs are integer ids, a sequence when the inputs are ``(N, T, F)``
    series, tabular otherwise; ``(N, T, F)`` maps of ``(N, T, F)`` float inputs are sequences
    and ``(N, T, E)`` maps of integer ``(N, T)`` inputs (attributions at an embedding) are text.

    Example:
        >>> data_kind(np.zeros((2, 5))), data_kind(np.zeros((2, 5)), np.zeros((2, 5, 3)))
        ('tabular', 'sequence')
        >>> data_kind(np.zeros((2, 5)), np.zeros((2, 5), np.int32)), data_kind(np.zeros((2, 8, 8)))
        ('text', 'image')
    """
    a = np.asarray(attributions)
    x = _first(inputs)
    integer_inputs = x is not None and np.issubdtype(x.dtype, np.integer) and x.ndim == 2
    if tokens is not None or (integer_inputs and a.ndim in (2, 3) and a.shape[:2] == x.shape):
        return "text"
    if a.ndim == 2:
        return "sequence" if x is not None and x.ndim == 3 and x.shape[:2] == a.shape else "tabular"
    if a.ndim == 3 and x is not None and x.ndim == 3 and x.shape == a.shape:
        return "sequence"
    return "image"


def plot_explanation(explanation: Any, inputs: Any = None, *, kind: str = "auto", index: int = 0,
                     **kwargs: Any) -> Figure:
    """Plot an :class:`~kerascope.Explanation` (what :meth:`Explanation.plot` calls).

    ``kind``: ``"image"`` (a :func:`plot_grid` row per sample), ``"sequence"``
    (:func:`~kerascope.viz.sequence.plot_sequence` of sample ``index``: the series with the
    attribution as a heat strip), ``"tabular"`` (:func:`~kerascope.viz.tabular.plot_tabular`
    bars of sample ``index``, ``feature_names=``), ``"text"``
    (:func:`~kerascope.viz.text.plot_tokens` of sample ``index``: ``tokens=`` strings, or
    ``vocabulary=`` with integer inputs) or ``"auto"`` (:func:`data_kind`). Extra keyword
    arguments go to that function. Colours follow the method's sign convention
    (:func:`kerascope.viz.colours.sign_convention`).

    Example:
        >>> import numpy as np
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.random.rand(2, 8, 8), "gradcam", {}, np.array([0, 1]), np.ones(2))
        >>> plot_explanation(e).axes[0].get_title()
        'gradcam\\n0'
    """
    a = _attributions(explanation)
    if kind == "auto":
        kind = data_kind(a, inputs, kwargs.get("tokens", kwargs.get("vocabulary")))
    convention = sign_convention(getattr(explanation, "method", ""), getattr(explanation, "params", None))
    signed = None if convention is None else convention == "signed"
    targets = getattr(explanation, "targets", None)
    heading = getattr(explanation, "method", "attribution") + (
        f" · target {int(targets[index])}" if targets is not None and len(targets) > index else "")
    if kind == "image":
        return plot_grid(inputs, explanation, **kwargs)
    if kind in ("sequence", "tabular", "text") and not 0 <= index < len(a):
        raise IndexError(f"No sample {index}. Received: index={index}; the explanation has {len(a)} samples.")
    x = _first(inputs)
    if kind == "sequence":
        kwargs.setdefault("title", heading)
        kwargs.setdefault("signed", signed)
        return plot_sequence(None if x is None else x[index], a[index], **kwargs)
    if kind == "tabular":
        kwargs.setdefault("title", heading)
        return plot_tabular(a[index], values=None if x is None else x[index], **kwargs)
    if kind == "text":
        kwargs.setdefault("title", heading)
        kwargs.setdefault("signed", signed)
        tokens = kwargs.pop("tokens", None)
        if tokens is None and x is not None:
            tokens = x[index]
        elif tokens is not None and len(tokens) == len(a) and not isinstance(tokens[0], str):
            tokens = tokens[index]  # one token list per sample
        return plot_tokens(a[index], tokens, **kwargs)
    raise ValueError(
        f"Unknown plot kind. Received: kind={kind!r}. Expected 'auto', 'image', 'sequence', 'tabular' or 'text'."
    )
