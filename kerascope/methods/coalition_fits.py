"""The arithmetic of the coalition methods: Shapley weights, KernelSHAP designs, the weighted regressions.

Pure numpy, no model: the methods in :mod:`kerascope.methods.coalitions` score the
coalitions and call these on the scores. Boolean coalition matrices are converted to
float64 a chunk of rows at a time (:mod:`kerascope.methods._coalition_rows`).
"""

from __future__ import annotations

import math

import numpy as np

from kerascope.methods import _coalition_rows as streamed


def _bits(k: int) -> np.ndarray:
    """All 2^k coalitions as rows (bit j of the row index = feature j present)."""
    codes = np.arange(2**k, dtype=np.int64)
    return ((codes[:, None] >> np.arange(k)) & 1).astype(bool)


def exact_shapley(values: np.ndarray, k: int) -> np.ndarray:
    """Shapley values from ``v`` on all ``2^k`` coalitions in :func:`_bits` order.

    ``phi_j = sum_{S not containing j} |S|! (k-|S|-1)! / k! (v(S + j) - v(S))``.

    Example:
        >>> import numpy as np
        >>> z = _bits(3); v = z @ np.array([1.0, 2.0, 3.0])   # additive game
        >>> exact_shapley(v, 3).round(12).tolist()
        [1.0, 2.0, 3.0]
    """
    z = _bits(k)
    size = z.sum(axis=1)
    weight = np.array([math.factorial(s) * math.factorial(k - s - 1) / math.factorial(k) for s in range(k)])
    with_j = weight[np.clip(size - 1, 0, k - 1)] * values  # v(S + j) counted with |S| = size - 1
    without_j = weight[np.clip(size, 0, k - 1)] * values
    return z.T.astype(np.float64) @ with_j - (~z).T.astype(np.float64) @ without_j


def _kernel_design(k: int, samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Coalitions (sizes 1..k-1) and their weights for KernelSHAP.

    All ``2^k - 2`` coalitions with the exact Shapley kernel weights when
    ``samples`` allows; otherwise sizes drawn with probability proportional to
    the kernel's total weight per size, ``(k-1) / (s (k-s))``, uniform subsets
    of that size, each paired with its complement (shap's paired sampling),
    all with weight 1.
    """
    if k < 2:
        return np.zeros((0, k), bool), np.zeros(0)
    if k < 63 and samples >= 2**k - 2:
        z = _bits(k)[1:-1]
        size = z.sum(axis=1)
        comb = np.array([math.comb(k, int(s)) for s in size], np.float64)
        return z, (k - 1) / (comb * size * (k - size))
    sizes = np.arange(1, k)
    p = (k - 1) / (sizes * (k - sizes))
    p /= p.sum()
    half = max(1, samples // 2)
    drawn = rng.choice(sizes, size=half, p=p)
    ranks = np.argsort(rng.random((half, k)), axis=1)
    z = ranks < drawn[:, None]
    z = np.concatenate([z, ~z])[:samples] if samples >= 2 else z
    return z, np.ones(len(z))


def _design_size(k: int, samples: int) -> int:
    """The number of coalitions :func:`_kernel_design` returns."""
    if k < 2:
        return 0
    if k < 63 and samples >= 2**k - 2:
        return 2**k - 2
    half = max(1, samples // 2)
    return min(2 * half, samples) if samples >= 2 else half


def constrained_wls(z: np.ndarray, y: np.ndarray, w: np.ndarray, total: float) -> np.ndarray:
    """``argmin_phi sum_i w_i (y_i - z_i . phi)^2`` subject to ``sum(phi) = total`` (KKT system, closed form).

    ``z`` may be boolean: it is converted to float64 a chunk of rows at a time.

    Example:
        >>> import numpy as np
        >>> z = np.array([[1, 0], [0, 1], [1, 1]], float)
        >>> constrained_wls(z, z @ np.array([2.0, 3.0]), np.ones(3), 5.0).round(6).tolist()
        [2.0, 3.0]
    """
    k = z.shape[1]
    gram, zwy = streamed.weighted_moments(z, y, w)
    system = np.zeros((k + 1, k + 1))
    system[:k, :k] = gram
    del gram
    system[:k, k] = system[k, :k] = 1.0
    rhs = np.concatenate([zwy, [total]])
    solution = np.linalg.lstsq(system, rhs, rcond=None)[0]
    return solution[:k]


def weighted_r2(y: np.ndarray, prediction: np.ndarray, w: np.ndarray) -> float:
    """``1 - sum w (y - prediction)^2 / sum w (y - mean_w(y))^2`` (sklearn's ``score`` with sample weights).

    NaN where the scores ``y`` do not vary (one coalition, or a model that ignores the features): R^2
    is 0/0 there (sklearn, and so lime, report 1.0 for a perfect fit of a constant).

    Example:
        >>> import numpy as np
        >>> weighted_r2(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]), np.ones(3))
        1.0
        >>> weighted_r2(np.array([2.0]), np.array([2.0]), np.ones(1))
        nan
    """
    mean = np.sum(w * y) / np.sum(w)
    total = np.sum(w * (y - mean) ** 2)
    residual = np.sum(w * (y - prediction) ** 2)
    if total <= 1e-24 * max(1.0, float(np.sum(w * y * y))):
        return float("nan")
    return float(1.0 - residual / total)


def ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Weighted ridge regression with an unpenalised intercept (sklearn ``Ridge`` with ``sample_weight``).

    ``x`` may be boolean: it is converted to float64 a chunk of rows at a time.

    Example:
        >>> import numpy as np
        >>> x = np.array([[0.0], [1.0], [2.0]])
        >>> coef, b = ridge(x, 2 * x[:, 0] + 1, np.ones(3), 0.0)
        >>> coef.round(6).tolist(), round(b, 6)
        ([2.0], 1.0)
    """
    w = np.asarray(w, np.float64)
    total = w.sum()
    x_mean = streamed.weighted_column_means(x, w)
    y_mean = float(w @ y) / total
    gram, rhs = streamed.weighted_moments(x, y - y_mean, w, center=x_mean)
    gram[np.diag_indices_from(gram)] += alpha
    coef = np.linalg.lstsq(gram, rhs, rcond=None)[0]
    return coef, float(y_mean - x_mean @ coef)
