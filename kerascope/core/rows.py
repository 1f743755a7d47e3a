"""Which of the user's samples the rows of an inner pass belong to, for error messages.

Many methods run passes whose rows are not the user's samples: SmoothGrad's noisy copies,
Integrated Gradients' path points, DeepLIFT's inputs followed by their reference row. A check on
such a pass (a NaN in the scores, attributions that do not sum) must name the user's sample, not
the row of the pass: "samples [8, 9, 10, 11]" for a batch of 3 images sends the user looking for
images that do not exist. A method that builds such rows says whose they are with
:func:`rows_of`; the checks name them with :func:`describe_rows`. Blocks nest: a base method's
rows (DeepLIFT inside SmoothGrad) map through the outer method's to the user's samples.

Example:
    >>> import numpy as np
    >>> with rows_of(np.array([0, 1, 2, 0, 1, 2])):   # two noisy copies of 3 samples
    ...     describe_rows(np.array([2, 5]), 6)
    'samples [2]'
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import numpy as np

REFERENCE = -1  #: the owner of a row that belongs to no sample: a reference / baseline row

_OWNERS: contextvars.ContextVar[np.ndarray | None] = contextvars.ContextVar("kerascope_row_owners", default=None)
_UNKNOWN = np.zeros(0, np.int64)  # a block whose rows cannot be mapped: every check names rows of an inner pass


@contextlib.contextmanager
def rows_of(owners: Sequence[int] | np.ndarray) -> Iterator[None]:
    """Within the block, row ``r`` of a checked pass belongs to row ``owners[r]`` of the caller's inputs.

    ``REFERENCE`` (-1) marks a reference / baseline row. Inside an outer block the owners are
    mapped through it, so the checks always name the samples the user passed.

    Example:
        >>> import numpy as np
        >>> with rows_of([1, 0]), rows_of([1, 1, REFERENCE]):  # an inner pass of row 1 (sample 0) twice
        ...     describe_rows(np.array([0, 2]), 3)
        'samples [0] and the reference (baseline) rows'
    """
    owners = np.asarray(owners, np.int64).reshape(-1)
    outer = _OWNERS.get()
    if outer is not None:
        if len(owners) and int(owners.max()) >= len(outer):  # not rows of the outer pass: name rows, never guess
            owners = None
        else:
            owners = np.where(owners >= 0, outer[np.maximum(owners, 0)] if len(outer) else REFERENCE, REFERENCE)
    token = _OWNERS.set(owners if owners is not None else _UNKNOWN)
    try:
        yield
    finally:
        _OWNERS.reset(token)


def sample_of(row: int, length: int) -> int | None:
    """The user's sample that row ``row`` of a ``length``-row checked array belongs to.

    ``None`` for a reference row, and where the block's rows are not this array's (as
    :func:`describe_rows`, it does not guess).

    Example:
        >>> with rows_of([REFERENCE, 4]):
        ...     sample_of(1, 2), sample_of(0, 2)
        (4, None)
        >>> sample_of(3, 5)  # outside any block the rows are the samples
        3
    """
    owners = _OWNERS.get()
    if owners is None:  # a pass no block describes: the rows are the samples
        return int(row)
    if len(owners) != length:  # not this block's rows
        return None
    owner = int(owners[row])
    return None if owner < 0 else owner


def describe_rows(rows: np.ndarray, length: int, limit: int = 10) -> str:
    """``"samples [...]"`` for rows ``rows`` of a ``length``-row checked array, in the user's sample indices.

    Outside any :func:`rows_of` block the rows are the samples (a method whose passes are the
    user's batch). Inside one whose rows are not this array's, they are named as rows of an inner
    pass rather than guessed.

    Example:
        >>> import numpy as np
        >>> describe_rows(np.array([0, 3]), 4)
        'samples [0, 3]'
        >>> with rows_of([0, 1, REFERENCE]):
        ...     describe_rows(np.array([2]), 3)
        'the reference (baseline) rows'
    """
    rows = np.asarray(rows, np.int64).reshape(-1)
    owners = _OWNERS.get()
    if owners is None:
        samples, reference = rows, False
    elif len(owners) != length:
        return f"rows {rows.tolist()[:limit]}{' ...' if len(rows) > limit else ''} of an inner pass of {length} rows"
    else:
        mapped = owners[rows]
        samples = np.unique(mapped[mapped >= 0])
        reference = bool(np.any(mapped < 0))
    listed = f"samples {samples.tolist()[:limit]}{' ...' if len(samples) > limit else ''}" if len(samples) else ""
    if not reference:
        return listed
    return f"{listed} and the reference (baseline) rows" if listed else "the reference (baseline) rows"
