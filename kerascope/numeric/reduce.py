"""Reducing the channel axis of attributions to one value per position."""

from __future__ import annotations

import numpy as np

__all__ = ["REDUCTIONS", "reduce_channels"]

REDUCTIONS = ("abs_sum", "sum", "max_abs", "positive")


def reduce_channels(attributions: np.ndarray, reduce: str = "abs_sum") -> np.ndarray:
    """Reduce the last (channel) axis: ``"abs_sum"``, ``"sum"``, ``"max_abs"`` or ``"positive"`` (sum of positives).

    Example:
        >>> import numpy as np
        >>> reduce_channels(np.array([[1.0, -2.0]]), "abs_sum").tolist(), reduce_channels(np.array([[1.0, -2.0]]), "sum").tolist()
        ([3.0], [-1.0])
    """
    a = np.asarray(attributions, np.float32)
    if reduce == "abs_sum":
        return np.abs(a).sum(-1)
    if reduce == "sum":
        return a.sum(-1)
    if reduce == "max_abs":
        return np.abs(a).max(-1)
    if reduce == "positive":
        return np.maximum(a, 0).sum(-1)
    raise ValueError(f"Unknown channel reduction. Received: reduce={reduce!r}. Expected one of {REDUCTIONS}.")
