"""Coalition rows generated on demand, and regressions over them in bounded memory.

The feature-mask methods evaluate many coalitions per sample (a per-pixel
mask of a 64 x 64 image: 4,097 coalitions of 4,096 features for feature
ablation). The functions here return the rows a chunk asks for
(``rows(indices) -> (len(indices), width)`` booleans) instead of the whole
matrix, and fit the KernelSHAP / LIME regressions chunk by chunk, so memory
does not grow with the number of coalitions. Methods whose regression
cannot fit (a ``k x k`` system for ``k`` features) are refused up front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kerascope.numeric.memory import available_memory, human_bytes

RowsFn = Callable[[np.ndarray], np.ndarray]
#: Bytes of coalition designs (KernelSHAP, LIME) held at once, over the samples of one group.
DESIGN_BUDGET = 64 * 2**20
#: Bytes of float64 rows a regression converts at once.
_REGRESSION_CHUNK = 16 * 2**20


def layout(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(owners, local)``: each row's sample and its index among that sample's ``counts[i]`` rows.

    Example:
        >>> import numpy as np
        >>> [a.tolist() for a in layout(np.array([2, 3]))]
        [[0, 0, 1, 1, 1], [0, 1, 0, 1, 2]]
    """
    counts = np.asarray(counts, np.int64)
    owners = np.repeat(np.arange(len(counts)), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return owners, np.arange(len(owners), dtype=np.int64) - starts[owners]


def ablation_rows(local: np.ndarray, width: int) -> RowsFn:
    """Feature ablation's rows: local row 0 keeps everything, row ``j >= 1`` removes feature ``j - 1``.

    Example:
        >>> import numpy as np
        >>> ablation_rows(np.array([0, 1, 2]), 2)(np.arange(3)).astype(int).tolist()
        [[1, 1], [0, 1], [1, 0]]
    """

    def rows(index: np.ndarray) -> np.ndarray:
        at = local[index]
        z = np.ones((len(index), width), bool)
        hit = np.nonzero(at > 0)[0]
        z[hit, at[hit] - 1] = False
        return z

    return rows


def all_subsets_rows(local: np.ndarray, width: int) -> RowsFn:
    """Exact Shapley's rows: local row ``c`` holds the coalition whose bit ``j`` is feature ``j``.

    Example:
        >>> import numpy as np
        >>> all_subsets_rows(np.arange(4), 2)(np.arange(4)).astype(int).tolist()
        [[0, 0], [1, 0], [0, 1], [1, 1]]
    """

    def rows(index: np.ndarray) -> np.ndarray:
        return ((local[index][:, None] >> np.arange(width)) & 1).astype(bool)

    return rows


def permutation_rows(owners: np.ndarray, local: np.ndarray, ranks: np.ndarray, features: np.ndarray) -> RowsFn:
    """Shapley sampling's rows: local 0 is the empty coalition, 1 the full one, then for order ``m`` the
    prefixes of length ``1 .. k-1`` (feature ``j`` is in prefix ``t`` when ``ranks[owner, m, j] < t``).

    ``ranks`` is ``(N, samples, width)``: each feature's position in each order.

    Example:
        >>> import numpy as np
        >>> ranks = np.array([[[1, 0, 2]]])   # one order: feature 1, then 0, then 2
        >>> o, l = layout(np.array([4]))
        >>> permutation_rows(o, l, ranks, np.array([3]))(np.arange(4)).astype(int).tolist()
        [[0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 1, 0]]
    """

    def rows(index: np.ndarray) -> np.ndarray:
        who, at = owners[index], local[index]
        k = features[who]
        prefix = np.maximum(at - 2, 0)
        order, length = prefix // np.maximum(k - 1, 1), prefix % np.maximum(k - 1, 1) + 1
        z = ranks[who, order] < length[:, None]
        z[at == 0] = False
        z[at == 1] = True
        return z

    return rows


def design_rows(owners: np.ndarray, local: np.ndarray, designs: Sequence[np.ndarray], head: int, width: int) -> RowsFn:
    """Rows of per-sample designs (``designs[i]`` (rows_i, k_i)) after ``head`` fixed rows per sample:
    the empty coalition, then (``head == 2``) the full one. ``owners`` index ``designs``.

    Example:
        >>> import numpy as np
        >>> o, l = layout(np.array([3]))
        >>> design_rows(o, l, [np.array([[True, False]])], 2, 2)(np.arange(3)).astype(int).tolist()
        [[0, 0], [1, 1], [1, 0]]
    """

    def rows(index: np.ndarray) -> np.ndarray:
        who, at = owners[index], local[index]
        z = np.ones((len(index), width), bool)
        if head:
            z[at == 0] = False
        for sample in np.unique(who):  # the few samples one chunk of rows spans
            pick = np.nonzero((who == sample) & (at >= head))[0]
            design = designs[sample]
            z[pick, : design.shape[1]] = design[at[pick] - head]
        return z

    return rows


def sample_groups(cost: np.ndarray, budget: int = DESIGN_BUDGET) -> list[np.ndarray]:
    """Consecutive sample indices in groups whose summed ``cost`` (bytes) stays within ``budget``
    (a sample over the budget is a group of its own).

    Example:
        >>> import numpy as np
        >>> [g.tolist() for g in sample_groups(np.array([3, 3, 5, 1]), budget=6)]
        [[0, 1], [2, 3]]
    """
    groups, start, total = [], 0, 0
    for i, c in enumerate(np.asarray(cost, np.int64)):
        if i > start and total + c > budget:
            groups.append(np.arange(start, i))
            start, total = i, 0
        total += int(c)
    if len(cost):
        groups.append(np.arange(start, len(cost)))
    return groups


def check_fits(method: str, features: int, rows: int, solve: bool, hint: str, available: int | None = None) -> None:
    """Refuse before any work when one sample's coalitions (``rows`` x ``features`` booleans) and, with
    ``solve``, its ``features x features`` float64 regression cannot fit in the memory available.

    Example:
        >>> check_fits("LIME", 100_000, 1000, True, "Use a coarser mask.", available=8 * 10**9)
        Traceback (most recent call last):
        ValueError: LIME over k=100,000 features needs about 400.1 GB ...
    """
    needed = rows * features + (5 * 8 * (features + 1) ** 2 if solve else 0)
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        what = f"{rows:,} coalitions of {features:,} features" + (
            f" and a {features:,} x {features:,} regression" if solve else "")
        raise ValueError(
            f"{method} over k={features:,} features needs about {human_bytes(needed)} ({what}) per sample, "
            f"but only {human_bytes(available)} of memory is available. {hint}"
        )


def weighted_moments(
    z: np.ndarray, y: np.ndarray, w: np.ndarray, center: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``((z - c)^T W (z - c), (z - c)^T W y)`` for boolean rows ``z``, converted to float64 a chunk at a time.

    Example:
        >>> import numpy as np
        >>> z = np.array([[1, 0], [1, 1]], bool)
        >>> [a.tolist() for a in weighted_moments(z, np.array([1.0, 2.0]), np.ones(2))]
        [[[2.0, 1.0], [1.0, 1.0]], [3.0, 2.0]]
    """
    k = z.shape[1]
    gram, rhs = np.zeros((k, k)), np.zeros(k)
    step = max(1, _REGRESSION_CHUNK // max(8 * k, 1))
    for start in range(0, len(z), step):
        part = z[start: start + step].astype(np.float64)
        if center is not None:
            part -= center
        weighted = part.T * w[start: start + step]
        gram += weighted @ part
        rhs += weighted @ y[start: start + step]
    return gram, rhs


def weighted_column_means(z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``w @ z / sum(w)`` for boolean rows, a chunk at a time.

    Example:
        >>> import numpy as np
        >>> weighted_column_means(np.array([[1, 0], [1, 1]], bool), np.array([1.0, 3.0])).tolist()
        [1.0, 0.75]
    """
    total = np.zeros(z.shape[1])
    step = max(1, _REGRESSION_CHUNK // max(8 * z.shape[1], 1))
    for start in range(0, len(z), step):
        total += w[start: start + step] @ z[start: start + step].astype(np.float64)
    return total / w.sum()


def predict(z: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``z @ coef`` for boolean rows, a chunk at a time.

    Example:
        >>> import numpy as np
        >>> predict(np.array([[1, 0], [1, 1]], bool), np.array([2.0, 3.0])).tolist()
        [2.0, 5.0]
    """
    out = np.empty(len(z))
    step = max(1, _REGRESSION_CHUNK // max(8 * z.shape[1], 1))
    for start in range(0, len(z), step):
        out[start: start + step] = z[start: start + step].astype(np.float64) @ coef
    return out
