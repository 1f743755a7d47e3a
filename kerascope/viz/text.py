"""Token attributions as highlighted text: each token's background coloured by its attribution.

Signed maps use ``RdBu_r`` centred at zero (red raises the score, blue lowers it, white does
nothing); unsigned maps use the light end of the sequential ``Oranges`` (white = not important),
so that dark text stays readable on every background. Limits are the largest magnitude.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kerascope.viz._figure import is_signed, legible_ticks, limits, new_figure
from kerascope.viz.colours import DIVERGING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TEXT_SEQUENTIAL = "Oranges"


def token_strings(tokens: Sequence[Any] | np.ndarray | None = None, vocabulary: Sequence[str] | None = None,
                  count: int | None = None) -> list[str]:
    """The tokens as strings: given strings as they are, token ids looked up in ``vocabulary``.

    Ids outside the vocabulary are shown as ``[id]``; without tokens, ``count`` placeholders ``#0, #1, ...``.

    Example:
        >>> token_strings([2, 0, 7], ["<pad>", "the", "cat"])
        ['cat', '<pad>', '[7]']
    """
    if tokens is None:
        return [f"#{i}" for i in range(count or 0)]
    items = list(np.asarray(tokens).tolist()) if isinstance(tokens, np.ndarray) else list(tokens)
    if vocabulary is None or all(isinstance(t, str) for t in items):
        return [str(t) for t in items]
    words = list(vocabulary)
    return [words[int(t)] if 0 <= int(t) < len(words) else f"[{int(t)}]" for t in items]


def per_token(attributions: np.ndarray) -> np.ndarray:
    """One value per token: ``(T,)`` as is, ``(T, E)`` summed over the embedding axis.

    Example:
        >>> per_token(np.ones((3, 4))).tolist()
        [4.0, 4.0, 4.0]
    """
    a = np.asarray(attributions, np.float64)
    if a.ndim == 2:
        a = a.sum(-1)
    if a.ndim != 1:
        raise ValueError(f"Expected token attributions (T,) or (T, E). Received: shape={np.shape(attributions)}.")
    return a


def token_colours(values: np.ndarray, signed: bool | None = None, cmap: str | None = None) -> list[tuple]:
    """RGBA background colour per token (see the module docstring for the conventions).

    Example:
        >>> import matplotlib
        >>> c = token_colours(np.array([1.0, 0.0, -1.0]))
        >>> [matplotlib.colors.to_hex(x) for x in c]  # dark red, near white, dark blue
        ['#67001f', '#f7f6f6', '#053061']
    """
    import matplotlib

    v = np.asarray(values, np.float64)
    signed = is_signed(v) if signed is None else bool(signed)
    low, high = limits(v, signed, 100.0)
    name = cmap or (DIVERGING if signed else TEXT_SEQUENTIAL)
    position = np.clip((v - low) / (high - low), 0.0, 1.0)
    if not signed and cmap is None:
        position = position * 0.75  # the light three quarters of Oranges: dark text stays readable
    return [tuple(c) for c in matplotlib.colormaps[name](position)]


def _text_colour(rgba: tuple) -> str:
    luminance = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
    return "#111111" if luminance > 0.5 else "#ffffff"


def tokens_html(attributions: np.ndarray, tokens: Sequence[Any] | np.ndarray | None = None,
                vocabulary: Sequence[str] | None = None, *, signed: bool | None = None) -> str:
    """The tokens as HTML ``<span>`` elements with their attribution as background colour (text escaped).

    Each span's ``title`` holds the value, so hovering shows it.

    Example:
        >>> tokens_html(np.array([1.0, -1.0]), ["<b>good", "bad"])[:60]
        '<span class="tok" style="background:#67001f;color:#ffffff" t'
    """
    import matplotlib

    values = per_token(attributions)
    words = token_strings(tokens, vocabulary, len(values))
    if len(words) != len(values):
        raise ValueError(f"Expected one token per attribution. Received: {len(words)} tokens, {len(values)} values.")
    spans = []
    for word, value, colour in zip(words, values, token_colours(values, signed)):
        spans.append(
            f'<span class="tok" style="background:{matplotlib.colors.to_hex(colour)};color:{_text_colour(colour)}" '
            f'title="{value:.4g}">{html.escape(word)}</span>'
        )
    return " ".join(spans)


def plot_tokens(
    attributions: np.ndarray,
    tokens: Sequence[Any] | np.ndarray | None = None,
    vocabulary: Sequence[str] | None = None,
    *,
    signed: bool | None = None,
    width: float = 8.0,
    line_height: float = 0.32,
    fontsize: float = 11.0,
    title: str | None = None,
    quantity: str | None = None,
) -> Figure:
    """Highlighted text as a matplotlib Figure: tokens laid out in lines, each on its colour.

    Args:
        attributions: ``(T,)`` per token or ``(T, E)`` per embedding dimension (summed).
        tokens: the tokens as strings, or token ids with ``vocabulary``.
        vocabulary: a list of strings (index = token id), e.g. ``TextVectorization.get_vocabulary()``.
        signed: diverging (``True``) or sequential (``False``) colours; default: from the data.
        width: figure width in inches; the height grows with the number of lines.
        title: figure title.
        quantity: the colour bar's label (e.g. ``"d score / d token [score per token value]"``).

    The colour bar's tick labels are kept short and never overlap (fewer ticks on a narrow figure).

    Example:
        >>> fig = plot_tokens(np.array([0.5, -1.0, 0.1]), [1, 2, 3], ["<pad>", "not", "bad", "at all"])
        >>> [t.get_text() for t in fig.axes[0].texts]
        ['not', 'bad', 'at all']
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    values = per_token(attributions)
    words = token_strings(tokens, vocabulary, len(values))
    if len(words) != len(values):
        raise ValueError(f"Expected one token per attribution. Received: {len(words)} tokens, {len(values)} values.")
    colours = token_colours(values, signed)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    usable = width - 0.2
    figure = new_figure(width, 1.0)
    renderer = FigureCanvasAgg(figure).get_renderer()
    extents = []  # each token's width in inches, measured with the font actually used
    for word in words:
        probe = figure.text(0, 0, word, fontsize=fontsize)
        extents.append(probe.get_window_extent(renderer).width / figure.dpi)
        probe.remove()
    gap, pad = fontsize / 72 * 0.8, fontsize / 72 * 0.25
    lines, x = 0, pad
    placed = []
    for extent in extents:
        if x > pad and x + extent + pad > usable:
            lines, x = lines + 1, pad
        placed.append((x, lines))
        x += extent + gap
    figure.set_size_inches(width, (lines + 1) * line_height + 0.6 + (0.3 if title else 0.0))
    ax = figure.subplots()
    ax.set_xlim(0, usable)
    ax.set_ylim(lines + 0.5, -0.5)
    ax.axis("off")
    for word, (x0, row), colour in zip(words, placed, colours):
        ax.text(x0, row, word, fontsize=fontsize, va="center", ha="left", color=_text_colour(colour),
                bbox={"boxstyle": "round,pad=0.2", "facecolor": colour, "edgecolor": "none"})
    signed_shown = is_signed(values) if signed is None else bool(signed)
    low, high = limits(values, signed_shown, 100.0)
    if signed_shown:
        colours: Any = DIVERGING
    else:  # the light three quarters of Oranges the tokens use, from 0 to the largest value
        import matplotlib
        from matplotlib.colors import ListedColormap

        colours = ListedColormap(matplotlib.colormaps[TEXT_SEQUENTIAL](np.linspace(0.0, 0.75, 192)))
    mappable = ScalarMappable(Normalize(low, high), colours)
    bar = figure.colorbar(mappable, ax=ax, orientation="horizontal", fraction=0.08, pad=0.02, aspect=40)
    bar.set_label((quantity or "attribution") + (" (red raises the score, blue lowers it)" if signed_shown else ""),
                  fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    legible_ticks(figure, bar, symmetric=signed_shown)
    return figure
