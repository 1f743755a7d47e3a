"""Generated text as a picture: the generated-token x earlier-token matrix of a language model's attributions.

Row ``j`` is one generated token, column ``i`` one token of the prompt and continuation; the cell is token
``i``'s part in ``log p(c_j | prompt, c_<j)``. Signed values use the diverging ``RdBu_r`` map centred at zero
with symmetric limits (red raises the log-probability, blue lowers it, white: no effect), as every signed
map in :mod:`kerascope.viz`; cells a row cannot see (later tokens) are grey.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kerascope.viz._figure import is_signed, limits, new_figure
from kerascope.viz.colours import DIVERGING, SEQUENTIAL

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_token_matrix(
    values: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    *,
    prompt_length: int | None = None,
    signed: bool | None = None,
    title: str | None = None,
    cell: float = 0.28,
) -> Figure:
    """The output x input matrix (generated token x earlier token) as a heatmap with a colour bar.

    Args:
        values: ``(rows, columns)`` attributions, e.g. ``GenerationExplanation.token_attributions``.
        rows: the generated tokens' labels (one per row).
        columns: every token's label (prompt then continuation, one per column).
        prompt_length: where the prompt ends (a vertical line), if given.
        signed: diverging (``True``) or sequential (``False``) colours; default: from the data.
        title: figure title.
        cell: inches per cell (the figure grows with the matrix, within 4..16 inches wide).

    Cells at or after each row's own position (``i >= prompt_length + j``) are masked (grey).

    Example:
        >>> fig = plot_token_matrix(np.array([[0.5, -1.0, 0.0]]), ["c"], ["a", "b", "c"], prompt_length=2)
        >>> [t.get_text() for t in fig.axes[0].get_xticklabels()], fig.axes[1].get_ylabel()
        (['a', 'b', 'c'], 'attribution (red raises the log-probability, blue lowers it)')
    """
    import matplotlib

    v = np.asarray(values, np.float64)
    if v.ndim != 2 or v.shape != (len(rows), len(columns)):
        raise ValueError(
            f"Expected a (rows, columns) matrix with one label per row and column. Received: values of shape "
            f"{v.shape}, {len(rows)} row labels and {len(columns)} column labels."
        )
    hidden = np.zeros(v.shape, bool)
    if prompt_length is not None:
        hidden = np.arange(v.shape[1])[None, :] >= (prompt_length + np.arange(v.shape[0]))[:, None]
    shown = v[~hidden] if (~hidden).any() else v.ravel()
    signed = is_signed(shown) if signed is None else bool(signed)
    low, high = limits(shown, signed, 100.0)
    width = float(np.clip(1.6 + cell * v.shape[1], 4.0, 16.0))
    height = float(np.clip(1.4 + cell * v.shape[0], 2.0, 16.0)) + (0.3 if title else 0.0)
    figure = new_figure(width, height)
    ax = figure.subplots()
    colours = matplotlib.colormaps[DIVERGING if signed else SEQUENTIAL].with_extremes(bad="#d9d9d9")
    image = ax.imshow(np.ma.masked_array(v, hidden), cmap=colours, vmin=low, vmax=high, aspect="auto",
                      interpolation="nearest")
    size = 8 if max(v.shape) <= 40 else 6
    ax.set_xticks(range(v.shape[1]), [str(c) for c in columns], rotation=90, fontsize=size)
    ax.set_yticks(range(v.shape[0]), [str(r) for r in rows], fontsize=size)
    ax.set_xlabel("earlier token (prompt, then continuation)", fontsize=8)
    ax.set_ylabel("generated token", fontsize=8)
    if prompt_length is not None and 0 < prompt_length < v.shape[1]:
        ax.axvline(prompt_length - 0.5, color="#333333", linewidth=1.0)
    bar = figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("attribution" + (" (red raises the log-probability, blue lowers it)" if signed else ""),
                  fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return figure


def save_token_png(explanation: Any, path: str | Path, what: str = "matrix", sample: int = 0,
                   dpi: int = 100) -> Path:
    """Save a language explanation's picture as PNG; returns the path.

    ``what="matrix"`` (a ``GenerationExplanation``): the generated x earlier token matrix;
    ``what="tokens"``: the token heatmap (coloured text backgrounds, with a colour bar), of the whole
    continuation's log-probability per token, or of ``sample`` for a ``TokenExplanation``.

    Example:
        >>> import keras, numpy as np, tempfile, os, kerascope as ks
        >>> keras.utils.set_random_seed(0)
        >>> lm = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(20, 8),
        ...                        keras.layers.Dense(20)])
        >>> g = ks.explain_generation(lm, np.array([3, 5, 7]), np.array([2, 4]), method="gradient_x_input")
        >>> save_token_png(g, os.path.join(tempfile.mkdtemp(), "g.png")).suffix
        '.png'
    """
    from kerascope.viz.plots import save_figure
    from kerascope.viz.text import plot_tokens

    if what not in ("matrix", "tokens"):
        raise ValueError(f"`what` is 'matrix' or 'tokens'. Received: what={what!r}.")
    matrix = getattr(explanation, "token_attributions", None)
    if matrix is not None:  # generated text
        labels = explanation.tokens or [str(int(i)) for i in explanation.token_ids]
        title = f"{explanation.method}: log p(continuation) = {explanation.log_prob:.4g}"
        if what == "matrix":
            figure = plot_token_matrix(matrix, labels[explanation.prompt_length:], labels,
                                       prompt_length=explanation.prompt_length, title=title)
        else:
            figure = plot_tokens(explanation.attributions, labels, title=title)
    else:
        if what == "matrix":
            raise ValueError("A classifier's token explanation has no generated x earlier token matrix. "
                             "Received: what='matrix'. Pass what='tokens'.")
        count = len(explanation.attributions)
        if not 0 <= sample < count:
            raise ValueError(f"`sample` must be in [0, {count}). Received: sample={sample}.")
        ids = explanation.token_ids[sample]
        labels = explanation.tokens[sample] if explanation.tokens is not None else [str(int(i)) for i in ids]
        figure = plot_tokens(explanation.attributions[sample], labels,
                             title=f"{explanation.method}: target {int(explanation.targets[sample])}")
    return save_figure(figure, path, dpi=dpi)
