"""Token heatmaps as HTML: each token's background coloured by its attribution (signed, one scale per map)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np


def _colour(value: float, scale: float) -> str:
    """Red for positive, blue for negative, white for 0; opacity ``|value| / scale``."""
    alpha = 0.0 if scale <= 0 else min(1.0, abs(float(value)) / scale)
    rgb = "220,40,40" if value > 0 else "40,90,220"
    return f"rgba({rgb},{alpha:.3f})"


def token_html(tokens: Sequence[str], values: np.ndarray, scale: float | None = None) -> str:
    """One line of tokens with coloured backgrounds and their values as tooltips, plus a legend.

    Example:
        >>> s = token_html(["a", "<b>"], np.array([1.0, -0.5]))
        >>> "&lt;b&gt;" in s, "rgba(220,40,40,1.000)" in s, "rgba(40,90,220,0.500)" in s
        (True, True, True)
    """
    values = np.asarray(values, np.float64).ravel()
    if len(tokens) != len(values):
        raise ValueError(f"One value per token. Received: {len(tokens)} tokens and {len(values)} values.")
    scale = float(np.max(np.abs(values))) if scale is None and values.size else float(scale or 0.0)
    spans = "".join(
        f'<span title="{v:+.4g}" style="background:{_colour(v, scale)};padding:1px 2px;margin:1px;'
        f'border-radius:3px;font-family:monospace">{html.escape(str(t))}</span>'
        for t, v in zip(tokens, values)
    )
    legend = (f'<div style="font-size:smaller">colour: <span style="background:{_colour(-1, 1)}">'
              f"&nbsp;-{scale:.3g}&nbsp;</span> 0 <span style=\"background:{_colour(1, 1)}\">"
              f"&nbsp;+{scale:.3g}&nbsp;</span></div>")
    return f"<div>{spans}</div>{legend}"


def matrix_html(rows: Sequence[str], columns: Sequence[str], values: np.ndarray) -> str:
    """The output x input matrix (generated token x earlier token) as a coloured table, one scale.

    Example:
        >>> "<table" in matrix_html(["x"], ["a", "b"], np.array([[0.5, 0.0]]))
        True
    """
    values = np.asarray(values, np.float64)
    scale = float(np.max(np.abs(values))) if values.size else 0.0
    head = "".join(f"<th style='font-family:monospace'>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        f"<tr><th style='font-family:monospace'>{html.escape(str(r))}</th>"
        + "".join(f"<td title='{v:+.4g}' style='background:{_colour(v, scale)};min-width:1.5em'></td>" for v in row)
        + "</tr>"
        for r, row in zip(rows, values)
    )
    return f"<table style='border-collapse:collapse'><tr><th></th>{head}</tr>{body}</table>"
