"""Token heatmaps in notebooks (``_repr_html_``): the report's token spans and matrix, with their stylesheet.

The rendering is :mod:`kerascope.report.tokens` (the colour scale of every signed map: ``RdBu_r`` centred at
zero, one scale per map, the value as a tooltip, a legend).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kerascope.report.tokens import token_css, token_matrix_html, token_spans_html


def token_html(tokens: Sequence[str], values: np.ndarray, what: str = "the score") -> str:
    """One line of tokens with coloured backgrounds and their values as tooltips, plus a legend.

    Example:
        >>> s = token_html(["a", "<b>"], np.array([1.0, -0.5]))
        >>> "&lt;b&gt;" in s, "background:#67001f" in s, "<style>" in s
        (True, True, True)
    """
    return f"<style>{token_css()}</style>" + token_spans_html(tokens, values, what=what)


def matrix_html(rows: Sequence[str], columns: Sequence[str], values: np.ndarray,
                prompt_length: int | None = None) -> str:
    """The output x input matrix (generated token x earlier token) as a coloured table, one scale.

    Example:
        >>> "<table" in matrix_html(["x"], ["a", "b"], np.array([[0.5, 0.0]]))
        True
    """
    return token_matrix_html(rows, columns, values, prompt_length)
