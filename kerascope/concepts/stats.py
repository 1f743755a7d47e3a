"""Numpy statistics for concept explanations: a regularised logistic regression and Student's t-test.

Kept free of scipy / scikit-learn (not dependencies of kerascope); the tests compare both with
scikit-learn's ``LogisticRegression`` and scipy's ``ttest_ind``.
"""

from __future__ import annotations

import math

import numpy as np


def logistic_regression(x: np.ndarray, y: np.ndarray, alpha: float = 0.01, iterations: int = 100,
                        tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """``(w, b)`` minimising ``mean(log(1 + exp(-s (x w + b)))) + alpha / 2 |w|^2``, ``s = 2 y - 1``.

    The same penalty as scikit-learn's ``SGDClassifier(alpha=alpha)`` (Captum's TCAV default,
    there with a hinge loss) and ``LogisticRegression(C=1 / (alpha n))``, solved exactly: Newton's
    method in the span of the examples (``w = x.T a``), so each step is an ``(n + 1)``-sized
    system whatever the number of features.

    Example:
        >>> x = np.array([[0.0], [1.0], [3.0], [4.0]]); y = np.array([0, 0, 1, 1])
        >>> w, b = logistic_regression(x, y)
        >>> bool(w[0] > 0 and -b / w[0] > 1 and -b / w[0] < 3)
        True
    """
    x = np.asarray(x, np.float64)
    s = 2.0 * np.asarray(y, np.float64) - 1.0
    n = len(x)
    lam = alpha * n  # sum of the losses + lam / 2 |w|^2
    kernel = x @ x.T
    a, b = np.zeros(n), 0.0

    def objective(a: np.ndarray, b: float) -> float:
        f = kernel @ a + b
        return float(np.sum(np.logaddexp(0.0, -s * f)) + 0.5 * lam * a @ kernel @ a)

    current = objective(a, b)
    for _ in range(iterations):
        f = kernel @ a + b
        p = 1.0 / (1.0 + np.exp(s * f))  # sigma(-s f)
        g = -s * p  # d loss / d f
        weights = p * (1.0 - p)
        # Newton system with the a-rows multiplied by K^-1 (valid in the span of the examples)
        system = np.zeros((n + 1, n + 1))
        system[:n, :n] = weights[:, None] * kernel + lam * np.eye(n)
        system[:n, n] = weights
        system[n, :n] = weights @ kernel
        system[n, n] = weights.sum() + 1e-12
        rhs = np.concatenate([g + lam * a, [g.sum()]])
        step = np.linalg.lstsq(system, rhs, rcond=None)[0]
        size = 1.0
        while size > 1e-8:  # backtracking keeps every step a descent
            trial_a, trial_b = a - size * step[:n], b - size * step[n]
            value = objective(trial_a, trial_b)
            if value <= current:
                break
            size /= 2
        a, b = trial_a, trial_b
        done = current - value < tol * max(1.0, abs(current))
        current = value
        if done:
            break
    return (x.T @ a).astype(np.float64), float(b)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes ``betacf``)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)``.

    Example:
        >>> round(incomplete_beta(2.0, 3.0, 0.4), 6)  # 1 - (1 - x)^3 (1 + 3x)... closed form 0.5248
        0.5248
    """
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def ttest_ind(first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """Two-sided Student's t-test for equal means with pooled variance: ``(t, p)`` (scipy's ``ttest_ind``).

    Two constant, equal samples give ``p = 1``; constant, different ones ``p = 0``.

    Example:
        >>> t, p = ttest_ind(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0]))
        >>> round(t, 4), round(p, 4)
        (-3.6742, 0.0213)
    """
    first, second = np.asarray(first, np.float64), np.asarray(second, np.float64)
    n1, n2 = len(first), len(second)
    dof = n1 + n2 - 2
    diff = first.mean() - second.mean()
    pooled = ((n1 - 1) * first.var(ddof=1) + (n2 - 1) * second.var(ddof=1)) / dof
    scale = math.sqrt(pooled * (1.0 / n1 + 1.0 / n2))
    if scale == 0.0:
        return (0.0, 1.0) if diff == 0.0 else (math.copysign(math.inf, diff), 0.0)
    t = diff / scale
    return float(t), float(incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t)))
