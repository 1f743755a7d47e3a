"""ROAD (Rong et al. 2022, "A Consistent and Efficient Evaluation Strategy for Attribution Methods"):
Remove And Debias. Removed pixels are not set to a constant, which leaks their position to the model, but
filled by noisy linear imputation from their neighbours; the curve is the model's accuracy as a growing
percentage of the pixels the explanation ranks highest is imputed.

The imputation of every perturbed image of a chunk (``batch_size`` images) is one banded linear system
(block-diagonal over images, one right-hand side per channel), solved once; the images are then scored with
the model's compiled forward. No Python loop per sample or per percentage.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core.threads import single_threaded_blas
from kerascope.metrics._features import Features, ranks
from kerascope.metrics.faithfulness import CurveResult
from kerascope.numeric.chunking import chunk_bounds

# Neighbour offsets (row, column) and weights of the imputation stencil (the ROAD paper's, as in Quantus).
_STENCIL = (((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12),
            ((0, -1), 1 / 6), ((-1, -1), 1 / 12), ((1, 0), 1 / 6), ((-1, 0), 1 / 6))


@functools.lru_cache(maxsize=1)
def _lapack_threads() -> Any:
    """A thread-pool controller that sees SciPy's LAPACK (made once, after SciPy's linalg is loaded: finding
    the libraries takes ~10 ms, limiting them then microseconds)."""
    import scipy.linalg  # noqa: F401 - loads the library the controller must see
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _solve_stencil(diag: np.ndarray, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray,
                   rhs: np.ndarray) -> np.ndarray:
    """Solve ``A u = rhs`` where ``A`` has ``diag`` on its diagonal and ``vals`` at ``(rows, cols)``.

    The stencil's weights are symmetric, so ``A`` is symmetric, and ``-A`` is diagonally dominant with
    every group of unknowns touching a known pixel: positive definite. Unknowns are numbered image by
    image in raster order, so a neighbour is at most one image row plus one pixel away: ``A`` is banded,
    and LAPACK's banded Cholesky solves it in ``O(unknowns * band**2)``, far below a general sparse LU.
    """
    from scipy.linalg import LinAlgError, solveh_banded

    band = int(np.max(cols - rows, initial=0))
    upper = rows < cols
    ab = np.zeros((band + 1, len(diag)))
    ab[band] = -diag
    ab[band + rows[upper] - cols[upper], cols[upper]] = -vals[upper]
    try:
        # one BLAS thread (the libraries loaded now, SciPy's LAPACK included): a band this narrow gains
        # nothing from threads, and spinning ones cost 30x on a loaded machine (measured: 2.5-4 s against 80 ms)
        with _lapack_threads().limit(limits=1, user_api="blas"):
            return solveh_banded(ab, -rhs, check_finite=False)
    except LinAlgError:  # an image with no known pixel left: singular; SuperLU says so as it always did
        from scipy.sparse import coo_matrix
        from scipy.sparse.linalg import spsolve

        n = len(diag)
        system = coo_matrix((np.concatenate([vals, diag]), (np.concatenate([rows, np.arange(n)]),
                                                            np.concatenate([cols, np.arange(n)]))), shape=(n, n))
        return np.asarray(spsolve(system.tocsc(), rhs)).reshape(rhs.shape)


def linear_imputation(images: Any, removed: Any, noise: float = 0.0,
                      rng: np.random.Generator | None = None) -> np.ndarray:
    """Fill the ``removed`` pixels of ``(B, H, W, C)`` images by ROAD's noisy linear imputation.

    Every removed pixel equals the weighted mean of its in-image neighbours (weight 1/6 for the four
    direct ones, 1/12 for the diagonals; known neighbours fixed, removed ones unknowns), each channel
    solved as one banded linear system, plus ``noise * N(0, 1)``. ``removed`` is ``(B, H*W)`` or
    ``(B, H, W)`` booleans. ``noise=0`` is deterministic and equals Quantus's ``noisy_linear_imputation``.

    Example:
        >>> import numpy as np
        >>> x = np.arange(9, dtype="float32").reshape(1, 3, 3, 1)  # a linear ramp
        >>> hole = np.zeros((1, 3, 3), bool); hole[0, 1, 1] = True
        >>> float(linear_imputation(x, hole)[0, 1, 1, 0])
        4.0
    """
    x = np.asarray(images, np.float32)
    b, h, w, c = x.shape
    removed = np.asarray(removed, bool).reshape(b, h * w)
    flat = x.reshape(b, h * w, c)
    out = flat.copy()
    img, pix = np.nonzero(removed)
    unknowns = len(img)
    if unknowns == 0:
        return out.reshape(x.shape)
    ids = np.full((b, h * w), -1, np.int64)
    ids[img, pix] = np.arange(unknowns)
    row, col = pix // w, pix % w
    diag = np.zeros(unknowns)
    rhs = np.zeros((unknowns, c))
    rows, cols, vals = [], [], []
    for (dr, dc), weight in _STENCIL:
        r, q = row + dr, col + dc
        inside = np.nonzero((r >= 0) & (q >= 0) & (r < h) & (q < w))[0]
        diag[inside] -= weight
        neighbour = r[inside] * w + q[inside]
        other = ids[img[inside], neighbour]
        unknown = other >= 0
        rows.append(inside[unknown])
        cols.append(other[unknown])
        vals.append(np.full(int(unknown.sum()), weight))
        known = ~unknown
        rhs[inside[known]] -= weight * flat[img[inside[known]], neighbour[known]].astype(np.float64)
    solution = _solve_stencil(diag, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), rhs)
    if noise:
        solution = solution + noise * (rng or np.random.default_rng()).standard_normal((unknowns, c))
    out[img, pix] = solution
    return out.reshape(x.shape)


def road(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    percentages: Sequence[float] | None = None,
    noise: float = 0.01,
    order: str = "morf",
    abs: bool = False,  # noqa: A002 - Quantus's name
    seed: int = 0,
    batch_size: int = 64,
) -> CurveResult:
    """ROAD (Rong et al. 2022): accuracy as the top-ranked pixels are replaced by noisy linear imputation.

    For each percentage ``p`` (default ``1, 3, ..., 99``, as Quantus's ``ROAD``) the
    ``int(H * W * p / 100)`` pixels ranked highest (``order="morf"``, Quantus's only order) or lowest
    (``"lerf"``) are imputed from their neighbours with Gaussian ``noise`` (standard deviation, in input
    units; one stream from ``seed`` consumed chunk after chunk, so the result does not depend on
    ``batch_size``); the curve records whether the model still predicts the target (1.0) or not (0.0). Attributions are ``(N, H, W)`` maps or of the
    input's shape (summed over channels per pixel); all channels of a pixel are imputed together.
    ``curves`` is ``(N, len(percentages))``, ``scores`` the mean of each curve, ``details["probabilities"]``
    the model's output for the target on every imputed image. Quantus returns the curve averaged over
    samples, ``curves.mean(0)`` here. **Lower is better** for ``"morf"``, higher for ``"lerf"``.
    Cost: ``N * len(percentages)`` forward passes and one banded solve per chunk.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).random((2, 4, 4, 1)).astype("float32")
        >>> r = road(m, x, x[..., 0], percentages=[25, 50, 75], noise=0.0)
        >>> r.curves.shape, r.scores.shape
        ((2, 3), (2,))
    """
    f = Features(model, inputs, attributions, targets, "black", abs, "probabilities", batch_size)
    pct = np.asarray(list(range(1, 100, 2)) if percentages is None else list(percentages), np.float64)
    if pct.ndim != 1 or pct.size == 0 or np.any(pct < 0) or np.any(pct > 100):
        raise ValueError(f"`percentages` must be a non-empty list of numbers in [0, 100]. "
                         f"Received: percentages={percentages!r}.")
    if order not in ("morf", "lerf"):
        raise ValueError(f"Unknown order. Received: order={order!r}. Expected 'morf' or 'lerf'.")
    if not noise >= 0:
        raise ValueError(f"`noise` must be >= 0. Received: noise={noise!r}.")
    _, h, w, _ = f.shape
    counts = np.array([int(h * w * float(p) / 100) for p in pct])
    if counts.max() >= h * w:
        raise ValueError(f"Every percentage must keep at least one of the {h * w} pixels to impute from. "
                         f"Received: percentages up to {pct.max():g}. Use values below 100.")
    rank = ranks(f.pixel_sums(), descending=order == "morf")
    x = f.x.reshape(f.shape)
    points, total = len(pct), f.n * len(pct)
    kept = np.empty((total,), np.float64)
    probabilities = np.empty((total,), np.float64)
    rng = np.random.default_rng(seed)
    with single_threaded_blas():
        for start, stop in chunk_bounds(total, f.scorer.batch_size):
            flat = np.arange(start, stop)
            i, k = flat // points, flat % points
            imputed = linear_imputation(x[i], rank[i] < counts[k][:, None], float(noise), rng)
            out = f.scorer.outputs(imputed)
            kept[start:stop] = out.argmax(-1) == f.classes[i]
            probabilities[start:stop] = out[np.arange(len(flat)), f.classes[i]]
    curves = kept.reshape(f.n, points)
    return CurveResult("road", curves.mean(1), order == "lerf",
                       {"targets": f.classes, "percentages": pct, "noise": noise, "order": order, "seed": seed,
                        "probabilities": probabilities.reshape(f.n, points)},
                       curves=curves, fractions=pct / 100)
