"""Splitting ``n`` rows into chunks of at most ``batch_size``: the one chunker of kerascope.

A leaf module (numpy only). :meth:`~kerascope.core.inputs.Inputs.chunks`, the folded
methods (noise samples, IG steps, masks, variants) and the metrics' scorers all use it.

Because every loop over chunks goes through :func:`chunk_bounds`, it is also where
progress is reported: a listener set with :func:`listening` (``kerascope.core.progress``
sets one for a progress bar) hears when a loop starts, after each chunk, and when it ends,
so no method needs to know about progress bars.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Protocol

import numpy as np


class ChunkListener(Protocol):
    """What :func:`chunk_bounds` tells about its loops (see :func:`listening`)."""

    def start(self, total: int) -> Any:
        """A loop over ``total`` rows starts; returns a token passed to ``advance`` and ``stop``."""

    def advance(self, token: Any, done: int) -> None:
        """The rows ``[0, done)`` of the loop are done."""

    def stop(self, token: Any) -> None:
        """The loop ended (finished, left early or failed)."""


_LISTENER: ContextVar[ChunkListener | None] = ContextVar("kerascope_chunk_listener", default=None)


def active_listener() -> ChunkListener | None:
    """The listener that hears this context's chunk loops, if any.

    Example:
        >>> active_listener() is None
        True
    """
    return _LISTENER.get()


@contextlib.contextmanager
def listening(listener: ChunkListener) -> Iterator[ChunkListener]:
    """Let ``listener`` hear every chunk loop run in this context (and no other thread's).

    Example:
        >>> class Log:
        ...     def __init__(self): self.events = []
        ...     def start(self, total): self.events.append(("start", total)); return total
        ...     def advance(self, token, done): self.events.append(("done", done))
        ...     def stop(self, token): self.events.append(("stop", token))
        >>> with listening(Log()) as log:
        ...     _ = list(chunk_bounds(5, 2))
        >>> log.events
        [('start', 5), ('done', 2), ('done', 4), ('done', 5), ('stop', 5)]
    """
    token = _LISTENER.set(listener)
    try:
        yield listener
    finally:
        _LISTENER.reset(token)


def check_batch_size(batch_size: object) -> int:
    """``batch_size`` as an int; the standard error unless it is a positive int (numpy integers are ints).

    Example:
        >>> import numpy as np
        >>> check_batch_size(np.int64(8))
        8
        >>> check_batch_size(0)
        Traceback (most recent call last):
        ...
        ValueError: `batch_size` must be a positive int. Received: batch_size=0.
    """
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}.")
    return int(batch_size)


def chunk_bounds(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of at most ``size`` items.

    Example:
        >>> list(chunk_bounds(5, 2))
        [(0, 2), (2, 4), (4, 5)]
    """
    listener = _LISTENER.get()
    if listener is None:
        for start in range(0, n, size):
            yield start, min(start + size, n)
        return
    token = listener.start(n)
    try:
        for start in range(0, n, size):
            stop = min(start + size, n)
            yield start, stop
            listener.advance(token, stop)  # the caller asked for the next chunk: this one is done
    finally:
        listener.stop(token)


def chunk_ranges(total: int, batch_size: int) -> Iterator[np.ndarray]:
    """Flat row indices ``[start, stop)`` of each chunk of at most ``batch_size`` rows.

    Example:
        >>> [r.tolist() for r in chunk_ranges(5, 2)]
        [[0, 1], [2, 3], [4]]
    """
    check_batch_size(batch_size)
    for start, stop in chunk_bounds(total, batch_size):
        yield np.arange(start, stop)


def ahead(make: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
    """``make(item)`` for each item, in order, the next one computed in a worker thread while the caller
    uses the current one (host work such as building a chunk's rows overlapping the compiled pass; numpy and
    the backends release the GIL). At most two results are held at once; ``items`` is iterated by the caller.

    Example:
        >>> list(ahead(lambda v: v * v, range(4)))
        [0, 1, 4, 9]
    """
    iterator = iter(items)
    with ThreadPoolExecutor(1) as pool:
        first = next(iterator, _END)
        pending = None if first is _END else pool.submit(make, first)
        while pending is not None:
            item = next(iterator, _END)
            following = None if item is _END else pool.submit(make, item)
            yield pending.result()
            pending = following


_END = object()
