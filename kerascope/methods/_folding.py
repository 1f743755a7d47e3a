"""Shared machinery for methods that fold samples / steps / masks into the batch axis.

A method that evaluates ``R`` variants of each of ``N`` inputs (noise samples,
IG steps, occluded copies, masks) sees them as ``N * R`` rows. Rows are built
lazily, ``batch_size`` at a time, by the method (from flat row indices), and
the per-row results are reduced to per-input results with one weighted
matrix product per chunk: no Python loop per sample, step or mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kerascope.core import targets as targets_lib
from kerascope.core.engine import Engine
from kerascope.core.inputs import Inputs
from kerascope.numeric.chunking import chunk_ranges  # noqa: F401 - re-exported (moved to core.chunking)


def forward_scores(
    engine: Engine, inputs: Inputs, targets: Any, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Target scores and resolved targets from forward passes only (``engine.scores``).

    ``targets`` as everywhere (int, list, None = predicted class, callable).
    Returns ``(scores (N,), targets (N,))``.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[1.0, 0.0], [0.0, 2.0]])])
        >>> s, t = forward_scores(engine_for(m), Inputs(np.ones((1, 2))), None, 8)
        >>> s.tolist(), t.tolist()
        ([2.0], [1])
    """
    return engine.scores(inputs, targets, batch_size)


def clean_scores(
    engine: Engine, inputs: Inputs, targets: Any, batch_size: int, keep: bool = True
) -> tuple[np.ndarray | None, np.ndarray]:
    """The clean pass's ``(scores, resolved targets)``, or ``(None, targets)`` when it can be skipped.

    For methods that use the inputs' own scores only for ``Explanation.scores`` (the
    ``scores=`` parameter of :class:`~kerascope.methods.base.Method`): with ``keep=False``
    and targets that name the classes (an int, a list, a callable) no forward pass is run;
    ``targets=None`` still needs it to pick the predicted classes. The targets are checked
    by the method's own passes (the same checks, the same errors).

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
        >>> e = engine_for(m)  # the engine holds the model weakly: keep a reference
        >>> s, t = clean_scores(e, Inputs(np.ones((2, 2))), 2, 8, keep=False)
        >>> s, t.tolist()
        (None, [2, 2])
        >>> clean_scores(e, Inputs(np.ones((2, 2))), None, 8, keep=False)[0].shape
        (2,)
    """
    if keep or targets is None:
        return forward_scores(engine, inputs, targets, batch_size)
    return None, targets_lib.encode(targets, inputs.num_samples)[0].astype(np.int64)


def row_targets(targets: Any, resolved: np.ndarray, owners: np.ndarray) -> Any:
    """Targets for folded rows: the callable itself, or each row's owner's resolved class.

    Example:
        >>> import numpy as np
        >>> row_targets(None, np.array([3, 5]), np.array([0, 0, 1])).tolist()
        [3, 3, 5]
    """
    if callable(targets):
        return targets
    return resolved[owners]


def reduce_rows(
    accumulator: np.ndarray, owners: np.ndarray, weights: np.ndarray, values: np.ndarray
) -> None:
    """``accumulator[owner] += weight * value`` for every row, as one matrix product (float64).

    Example:
        >>> import numpy as np
        >>> acc = np.zeros((2, 3))
        >>> reduce_rows(acc, np.array([0, 0, 1]), np.array([1.0, 2.0, 1.0]), np.ones((3, 3)))
        >>> acc.tolist()
        [[3.0, 3.0, 3.0], [1.0, 1.0, 1.0]]
    """
    # One float64 weighted sum per owner, read straight from the (usually float32) rows: converting
    # the whole chunk to float64 first cost a copy of twice its size (~4x the reduction's own time on
    # a 64-row 160 px chunk).
    target = accumulator.reshape(accumulator.shape[0], -1)
    flat = np.asarray(values).reshape(len(owners), -1)
    weights = np.asarray(weights, np.float64)
    owners = np.asarray(owners)
    if len(owners) and np.all(owners[1:] == owners[:1]):  # one owner (e.g. one image's steps)
        groups = [(int(owners[0]), slice(None))]
    else:
        groups = [(int(o), np.flatnonzero(owners == o)) for o in np.unique(owners)]
    for owner, rows in groups:
        target[owner] += np.einsum("i,ij->j", weights[rows], flat[rows], dtype=np.float64)


class Stream:
    """Items ``0, 1, 2, ...`` generated in order from a seeded numpy generator, on demand.

    ``make(rng, count)`` returns ``count`` consecutive items (an array with a
    leading axis). Asking for a range ``[a, b)`` generates what is missing
    and forgets items before ``a``, so memory stays bounded by a chunk while
    the items depend only on the seed and their index, never on the chunking.

    Example:
        >>> import numpy as np
        >>> s = Stream(0, lambda rng, n: rng.standard_normal((n, 2)))
        >>> a = s.take(0, 3); b = s.take(2, 5)
        >>> t = Stream(0, lambda rng, n: rng.standard_normal((n, 2))).take(0, 5)
        >>> bool(np.array_equal(np.concatenate([a, b[1:]]), t))
        True
    """

    def __init__(self, seed: int | None, make: Callable[[np.random.Generator, int], np.ndarray]) -> None:
        self._rng = np.random.default_rng(seed)
        self._make = make
        self._start = 0
        self._items: np.ndarray | None = None

    def take(self, start: int, stop: int) -> np.ndarray:
        """Items ``start .. stop - 1`` (``start`` never decreases between calls).

        Example:
            >>> import numpy as np
            >>> Stream(1, lambda rng, n: np.arange(n)).take(0, 3).tolist()
            [0, 1, 2]
        """
        if start < self._start:
            raise ValueError(f"Stream items are generated in order. Received: start={start} < {self._start}.")
        have = 0 if self._items is None else len(self._items)
        if self._items is not None:
            drop = min(start - self._start, have)
            self._items = self._items[drop:]
            self._start += drop
        if self._start < start:  # skip items never asked for
            self._make(self._rng, start - self._start)
            self._start = start
            self._items = None
        have = 0 if self._items is None else len(self._items)
        missing = stop - self._start - have
        if missing > 0:
            new = self._make(self._rng, missing)
            self._items = new if self._items is None or have == 0 else np.concatenate([self._items, new])
        return self._items[: stop - self._start]


def as_list(attributions: Any) -> list[np.ndarray]:
    """Explanation attributions (an array or a list / dict of arrays) as a list of arrays.

    Example:
        >>> import numpy as np
        >>> len(as_list(np.zeros((1, 2)))), len(as_list([np.zeros(1), np.zeros(1)]))
        (1, 2)
    """
    if isinstance(attributions, dict):
        return [np.asarray(a) for a in attributions.values()]
    if isinstance(attributions, (list, tuple)):
        return [np.asarray(a) for a in attributions]
    return [np.asarray(attributions)]
