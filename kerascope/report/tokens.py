"""Language-model explanations in the HTML report and in notebooks: token heatmaps and the token matrix.

Each token is a ``<span>`` whose background is its attribution on the colour scale of every signed map in
:mod:`kerascope.viz` (``RdBu_r`` centred at zero, symmetric limits: red raises the score, blue lowers it,
white: no effect; unsigned maps on the light part of ``Oranges``). The colour is quantised to
:data:`LEVELS` steps per sign and carried twice: as an inline ``style`` (notebooks, fresh pages) and as a
class ``tk p7`` / ``tk n3`` / ``tk u5`` whose colour the report's stylesheet (:func:`token_css`) defines, so
a page rebuilt from ``report.json`` (where inline styles are dropped) keeps its colours.

Use in a report: ``write_report(path, [], tables=token_tables(explanation))``.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

LEVELS = 10
"""Colour steps per sign (a signed map has ``2 * LEVELS + 1`` colours, zero included)."""


@functools.cache
def _palette() -> dict[str, str]:
    """Class name -> ``#rrggbb``: ``n10..n1``, ``p0``, ``p1..p10`` on ``RdBu_r``; ``u0..u10`` on light ``Oranges``."""
    import matplotlib

    from kerascope.viz.colours import DIVERGING
    from kerascope.viz.text import TEXT_SEQUENTIAL

    diverging, sequential = matplotlib.colormaps[DIVERGING], matplotlib.colormaps[TEXT_SEQUENTIAL]
    colours = {}
    for k in range(-LEVELS, LEVELS + 1):
        colours[_signed_class(k)] = matplotlib.colors.to_hex(diverging(0.5 + 0.5 * k / LEVELS))
    for k in range(LEVELS + 1):
        colours[f"u{k}"] = matplotlib.colors.to_hex(sequential(0.75 * k / LEVELS))
    return colours


def _signed_class(level: int) -> str:
    return f"n{-level}" if level < 0 else f"p{level}"


def _ink(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#111111" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "#ffffff"


def token_css() -> str:
    """The report's stylesheet for token heatmaps: one rule per colour class, plus the span and matrix layout.

    Example:
        >>> ".tk.p10{background:#67001f;color:#ffffff}" in token_css()
        True
    """
    rules = "".join(f".tk.{name}{{background:{c};color:{_ink(c)}}}" for name, c in _palette().items())
    return (".tk{font-family:monospace;padding:1px 3px;margin:1px;border-radius:3px;display:inline-block;"
            "white-space:pre}.tkm td{min-width:14px;height:14px;padding:0;border:1px solid #fff}"
            ".tkm th{font-family:monospace;font-size:11px;font-weight:normal;padding:0 3px}"
            ".tkm th.col{writing-mode:vertical-rl;transform:rotate(180deg)}.tkm td.hid{background:#d9d9d9}"
            + rules)


def token_classes(values: np.ndarray, signed: bool | None = None) -> tuple[list[str], float, bool]:
    """Each value's colour class, the scale (largest ``|value|``) and whether the scale is signed.

    Example:
        >>> token_classes(np.array([1.0, -0.5, 0.0]))
        (['p10', 'n5', 'p0'], 1.0, True)
    """
    from kerascope.viz._figure import is_signed

    v = np.asarray(values, np.float64).ravel()
    finite = v[np.isfinite(v)]
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    signed = is_signed(finite) if signed is None else bool(signed)
    relative = np.zeros_like(v) if scale <= 0 else np.nan_to_num(v / scale)
    if signed:
        levels = np.rint(np.clip(relative, -1.0, 1.0) * LEVELS).astype(int)
        return [_signed_class(int(k)) for k in levels], scale, True
    levels = np.rint(np.clip(np.abs(relative), 0.0, 1.0) * LEVELS).astype(int)
    return [f"u{int(k)}" for k in levels], scale, False


def _legend(scale: float, signed: bool, what: str) -> str:
    palette = _palette()
    names = ([_signed_class(k) for k in range(-LEVELS, LEVELS + 1, 2)] if signed
             else [f"u{k}" for k in range(0, LEVELS + 1, 2)])
    swatches = "".join(f"<span class='tk {n}' style='background:{palette[n]}'>&nbsp;</span>" for n in names)
    low = f"-{scale:.3g}" if signed else "0"
    meaning = (f"red raises {what}, blue lowers it, white: no effect" if signed
               else f"darker: more important to {what}")
    return (f"<div class='legend tkl'>{low} {swatches} +{scale:.3g} &nbsp; <i>{html.escape(meaning)}</i>"
            "</div>")


def token_spans_html(tokens: Sequence[Any], values: np.ndarray, *, signed: bool | None = None,
                     what: str = "the score") -> str:
    """One line of tokens with coloured backgrounds, their values as tooltips, and a legend (text escaped).

    Example:
        >>> s = token_spans_html(["a", "<b>"], np.array([1.0, -0.5]))
        >>> "&lt;b&gt;" in s, "class='tk p10'" in s, "class='tk n5'" in s, "-1 " in s
        (True, True, True, True)
    """
    values = np.asarray(values, np.float64).ravel()
    if len(tokens) != len(values):
        raise ValueError(f"One value per token. Received: {len(tokens)} tokens and {len(values)} values.")
    classes, scale, signed = token_classes(values, signed)
    palette = _palette()
    spans = "".join(
        f"<span class='tk {c}' style='background:{palette[c]};color:{_ink(palette[c])}' title='{v:+.4g}'>"
        f"{html.escape(str(t))}</span>"
        for t, v, c in zip(tokens, values, classes)
    )
    return f"<div class='tks'>{spans}</div>{_legend(scale, signed, what)}"


def token_matrix_html(rows: Sequence[Any], columns: Sequence[Any], values: np.ndarray,
                      prompt_length: int | None = None) -> str:
    """The generated x earlier token matrix as a coloured table (one signed scale), with a legend.

    Cells a row cannot see (``i >= prompt_length + j``) are grey when ``prompt_length`` is given.

    Example:
        >>> t = token_matrix_html(["x"], ["a", "b"], np.array([[0.5, -1.0]]))
        >>> "<table class='tkm'>" in t, t.count("<td class='tk"), "class='tk n10'" in t
        (True, 2, True)
    """
    values = np.asarray(values, np.float64)
    if values.shape != (len(rows), len(columns)):
        raise ValueError(f"Expected one label per row and column. Received: values of shape {values.shape}, "
                         f"{len(rows)} rows and {len(columns)} columns.")
    hidden = np.zeros(values.shape, bool)
    if prompt_length is not None:
        hidden = np.arange(values.shape[1])[None, :] >= (prompt_length + np.arange(values.shape[0]))[:, None]
    classes, scale, signed = token_classes(np.where(hidden, 0.0, values))
    palette = _palette()
    grid = np.asarray(classes).reshape(values.shape)
    head = "".join(f"<th class='col'>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        f"<tr><th>{html.escape(str(r))}</th>"
        + "".join("<td class='hid'></td>" if hidden[j, i] else
                  f"<td class='tk {grid[j, i]}' style='background:{palette[grid[j, i]]}' "
                  f"title='{values[j, i]:+.4g}'></td>" for i in range(values.shape[1]))
        + "</tr>"
        for j, r in enumerate(rows)
    )
    return (f"<table class='tkm'><tr><th></th>{head}</tr>{body}</table>"
            + _legend(scale, signed, "the generated token's log-probability"))


def token_tables(explanation: Any, name: str | None = None) -> Mapping[str, str]:
    """Report sections of a ``GenerationExplanation`` or ``TokenExplanation``: ``{heading: trusted html}``.

    Pass them as ``tables=`` of :func:`kerascope.report.write_report` (or ``render``): a generated text gives
    its token heatmap (the whole continuation's log-probability per token) and its matrix; a classifier's
    token explanation gives one heatmap per sample.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> keras.utils.set_random_seed(0)
        >>> lm = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(20, 8),
        ...                        keras.layers.Dense(20)])
        >>> g = ks.explain_generation(lm, np.array([3, 5, 7]), np.array([2, 4]), method="gradient_x_input")
        >>> sorted(token_tables(g))
        ['gradient_x_input: generated token x earlier token', 'gradient_x_input: tokens']
    """
    name = name or str(explanation.method)
    matrix = getattr(explanation, "token_attributions", None)
    if matrix is not None:
        labels = explanation.tokens or [str(int(i)) for i in explanation.token_ids]
        start = explanation.prompt_length
        return {
            f"{name}: tokens": token_spans_html(labels, explanation.attributions,
                                                what="the continuation's log-probability"),
            f"{name}: generated token x earlier token": token_matrix_html(labels[start:], labels, matrix, start),
        }
    parts = []
    for i, ids in enumerate(explanation.token_ids):
        labels = explanation.tokens[i] if explanation.tokens is not None else [str(int(t)) for t in ids]
        parts.append(f"<p>sample {i}, target {int(explanation.targets[i])}</p>"
                     + token_spans_html(labels, explanation.attributions[i], what="the score"))
    return {f"{name}: tokens": "".join(parts)}


def css_for_tables(tables: Mapping[str, Any] | None) -> str:
    """:func:`token_css` when a report table holds token heatmaps (their ``tk`` classes), else nothing.

    Example:
        >>> css_for_tables({"metrics": [{"auc": 0.5}]}), css_for_tables({"t": "<span class='tk p1'>a</span>"})[:4]
        ('', '.tk{')
    """
    if any(isinstance(t, str) and "class='tk " in t for t in (tables or {}).values()):
        return token_css()
    return ""
