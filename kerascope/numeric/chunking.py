"""Splitting ``n`` rows into chunks of at most ``batch_size``: the one chunker of kerascope.

A leaf module (numpy only). :meth:`~kerascope.core.inputs.Inputs.chunks`, the folded
methods (noise samples, IG steps, masks, variants) and the metrics' scorers all use it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def check_batch_size(batch_size: object) -> None:
    """Raise the standard error unless ``batch_size`` is a positive int.

    Example:
        >>> check_batch_size(0)
        Traceback (most recent call last):
        ...
        ValueError: `batch_size` must be a positive int. Received: batch_size=0.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}.")


def chunk_bounds(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of at most ``size`` items.

    Example:
        >>> list(chunk_bounds(5, 2))
        [(0, 2), (2, 4), (4, 5)]
    """
    for start in range(0, n, size):
        yield start, min(start + size, n)


def chunk_ranges(total: int, batch_size: int) -> Iterator[np.ndarray]:
    """Flat row indices ``[start, stop)`` of each chunk of at most ``batch_size`` rows.

    Example:
        >>> [r.tolist() for r in chunk_ranges(5, 2)]
        [[0, 1], [2, 3], [4]]
    """
    check_batch_size(batch_size)
    for start, stop in chunk_bounds(total, batch_size):
        yield np.arange(start, stop)
