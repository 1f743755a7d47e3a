"""One number per token from an attribution at the token embedding ``(N, T, D)``."""

from __future__ import annotations

import numpy as np

REDUCTIONS = ("sum", "norm")


def reduce_embedding(attributions: np.ndarray, reduce: str = "sum") -> np.ndarray:
    """``(N, T, D) -> (N, T)``: the sum over the embedding dimension (signed), or its L2 norm (``"norm"``).

    The sum keeps completeness: the tokens' values add up to what the method's
    map adds up to (IG: ``f(x) - f(baseline)``). The norm is unsigned: how much a
    token matters, not in which direction.

    Example:
        >>> a = np.array([[[3.0, -4.0], [1.0, 1.0]]])
        >>> reduce_embedding(a).tolist(), np.round(reduce_embedding(a, "norm").astype(float), 3).tolist()
        ([[-1.0, 2.0]], [[5.0, 1.414]])
    """
    a = np.asarray(attributions, np.float64)
    if reduce not in REDUCTIONS:
        raise ValueError(
            f"`reduce` must be one of {REDUCTIONS}: per token, the sum over the embedding dimension or its L2 "
            f"norm. Received: reduce={reduce!r}."
        )
    if a.ndim != 3:
        raise ValueError(
            "Token attributions need one vector per token at the embedding, shape (N, tokens, dim). "
            f"Received: attributions of shape {a.shape}. Pass `layer=` naming the token embedding."
        )
    out = a.sum(axis=-1) if reduce == "sum" else np.sqrt((a * a).sum(axis=-1))
    return out.astype(np.float32)
