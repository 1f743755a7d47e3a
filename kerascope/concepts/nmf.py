"""Non-negative matrix factorisation and non-negative least squares in numpy (for CRAFT)."""

from __future__ import annotations

import numpy as np

_EPS = 1e-12


def nmf(a: np.ndarray, k: int, seed: int = 0, iterations: int = 1000, tol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """``(U (n, k), W (k, features))``, both non-negative, minimising ``|A - U W|_F`` (HALS updates).

    Initialised from the seed like scikit-learn's ``init="random"`` (uniform, scaled to the mean of
    ``A``); the rows of ``W`` are returned with unit norm (``U`` absorbs the scale).

    Example:
        >>> w = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
        >>> u = np.random.default_rng(0).uniform(size=(30, 2))
        >>> U, W = nmf(u @ w, 2)
        >>> bool(np.abs(U @ W - u @ w).max() < 1e-3)
        True
    """
    a = np.asarray(a, np.float64)
    rng = np.random.default_rng(seed)
    scale = np.sqrt(max(a.mean(), _EPS) / k)
    u = scale * rng.uniform(size=(len(a), k))
    w = scale * rng.uniform(size=(k, a.shape[1]))
    previous = np.inf
    for _ in range(iterations):  # hierarchical alternating least squares (Cichocki and Phan 2009)
        uta, utu = u.T @ a, u.T @ u
        for j in range(k):
            w[j] = np.maximum(w[j] + (uta[j] - utu[j] @ w) / max(utu[j, j], _EPS), _EPS)
        awt, wwt = a @ w.T, w @ w.T
        for j in range(k):
            u[:, j] = np.maximum(u[:, j] + (awt[:, j] - u @ wwt[:, j]) / max(wwt[j, j], _EPS), 0.0)
        error = float(np.linalg.norm(a - u @ w))
        if previous - error < tol * max(previous, 1.0) and np.isfinite(previous):
            break
        previous = error
    norms = np.linalg.norm(w, axis=1, keepdims=True) + _EPS
    return u * norms.T, w / norms


def nnls(a: np.ndarray, w: np.ndarray, iterations: int = 300) -> np.ndarray:
    """Non-negative ``U`` minimising ``|A - U W|_F`` for a fixed ``W`` (rows of ``A`` independently).

    Example:
        >>> w = np.array([[1.0, 0.0], [0.0, 2.0]])
        >>> nnls(np.array([[3.0, 4.0]]), w).round(4).tolist()
        [[3.0, 2.0]]
    """
    a = np.asarray(a, np.float64)
    gram = w @ w.T
    u = np.maximum(a @ np.linalg.pinv(w), 0.0) + 1e-3  # a positive start near the unconstrained solution
    numerator = a @ w.T
    for _ in range(iterations):
        u *= numerator / (u @ gram + _EPS)
    return u
