"""Quantus's sampled faithfulness metrics and Captum's infidelity: random subsets or noise, many forwards.

Conventions as :mod:`kerascope.metrics.faithfulness_curves`. Random draws
come from one seeded stream consumed in order, chunk after chunk, so the
result does not depend on ``batch_size``; every perturbed input is built
lazily inside its chunk (memory bounded by ``batch_size``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from kerascope.metrics._common import MetricResult
from kerascope.metrics._features import Features, check_positive_int, pearson_rows, ranks
from kerascope.metrics.faithfulness import CurveResult


def _subset_drops(f: Features, sizes: np.ndarray | None, seed: int, subsets: Any) -> tuple[np.ndarray, np.ndarray]:
    """Attribution sums and score drops ``(N, R)`` over random feature subsets (run ``r`` has ``sizes[r]``)."""
    if subsets is not None:
        chosen = np.asarray(subsets, np.int64)
        if chosen.ndim != 3 or len(chosen) != f.n or chosen.min() < 0 or chosen.max() >= f.features:
            raise ValueError(f"Expected `subsets` of shape (N={f.n}, runs, size) with feature indices "
                             f"in [0, {f.features}). Received: subsets with shape {chosen.shape}.")
        runs = chosen.shape[1]
    else:
        runs = len(sizes)
    rng = np.random.default_rng(seed)
    sums = np.zeros((f.n * runs,))

    def make(flat: np.ndarray) -> np.ndarray:
        i, r = flat // runs, flat % runs
        if subsets is None:  # a uniformly random subset of sizes[r] features: the lowest random keys
            removed = ranks(rng.random((len(flat), f.features)), descending=False) < sizes[r][:, None]
        else:
            removed = np.zeros((len(flat), f.features), bool)
            np.put_along_axis(removed, chosen[i, r], True, axis=1)
        sums[flat] = (f.a[i] * removed).sum(1)
        return f.images(i, removed)

    scores = f.score(f.n * runs, make, runs).reshape(f.n, runs)
    return sums.reshape(f.n, runs), f.original()[:, None].astype(np.float64) - scores


def faithfulness_correlation(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    nr_runs: int = 100,
    subset_size: int = 224,
    subsets: Any = None,
    perturbation: str | float = "black",
    abs: bool = False,  # noqa: A002 - Quantus's name
    seed: int = 0,
    output: str = "logits",
    batch_size: int = 64,
) -> MetricResult:
    """Faithfulness correlation (Bhatt et al. 2020): Pearson correlation, over ``nr_runs`` random subsets of
    ``subset_size`` features, between the subset's attribution sum and the score drop when it is removed.

    Subsets are drawn uniformly without replacement (seeded) or passed as
    ``subsets`` ``(N, nr_runs, subset_size)`` feature indices (pixels in raster
    order, or elements of the ``(H, W, C)`` input in C order). **Higher is
    better.** Scores logits by default, as Quantus (``softmax=False``).

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
        ...                       keras.layers.Dense(1, use_bias=False)])
        >>> m.set_weights([np.array([[1.0], [2.0], [3.0], [4.0]])])
        >>> a = np.array([[[1.0, 2.0], [3.0, 4.0]]])
        >>> r = faithfulness_correlation(m, np.ones((1, 2, 2, 1)), a, 0, nr_runs=8, subset_size=2,
        ...                              perturbation=0.0, output="logits")
        >>> r.scores.round(6).tolist()
        [1.0]
    """
    f = Features(model, inputs, attributions, targets, perturbation, abs, output, batch_size)
    sizes = None if subsets is not None else np.full(
        (check_positive_int("nr_runs", nr_runs),), check_positive_int("subset_size", subset_size, f.features))
    sums, drops = _subset_drops(f, sizes, seed, subsets)
    return MetricResult("faithfulness_correlation", pearson_rows(sums, drops), True,
                        {"targets": f.classes, "seed": seed, "att_sums": sums, "pred_deltas": drops})


def sensitivity_n(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    n: int | Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    samples: int = 100,
    perturbation: str | float = "black",
    abs: bool = False,  # noqa: A002 - Quantus's name
    seed: int = 0,
    output: str = "logits",
    batch_size: int = 64,
) -> CurveResult:
    """Sensitivity-n (Ancona et al. 2018): for each subset size ``n``, the Pearson correlation over ``samples``
    random subsets of ``n`` features between their attribution sum and the score drop when they are removed.

    ``curves`` ``(N, len(n))`` holds one correlation per ``n``; ``scores``
    their mean. An attribution with completeness for every subset (gradient x
    input of a linear model, zero baseline) scores 1 for every ``n``.
    **Higher is better.** (Quantus's ``SensitivityN`` instead correlates,
    per step of a cumulative removal, across the samples of a batch.)

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3, 3, 1)), keras.layers.Flatten(),
        ...                       keras.layers.Dense(1, use_bias=False)])
        >>> w = np.arange(1.0, 10.0)[:, None]; m.set_weights([w])
        >>> x = np.ones((1, 3, 3, 1)); a = (w[:, 0] * x.ravel()).reshape(1, 3, 3)
        >>> sensitivity_n(m, x, a, 0, n=[1, 3], samples=20, perturbation=0.0).curves.round(6).tolist()
        [[1.0, 1.0]]
    """
    f = Features(model, inputs, attributions, targets, perturbation, abs, output, batch_size)
    ns = np.atleast_1d(np.asarray(n, np.int64))
    for value in ns:
        check_positive_int("n", int(value), f.features)
    runs = check_positive_int("samples", samples)
    sums, drops = _subset_drops(f, np.repeat(ns, runs), seed, None)
    curves = pearson_rows(sums.reshape(-1, runs), drops.reshape(-1, runs)).reshape(f.n, len(ns))
    return CurveResult("sensitivity_n", np.nanmean(curves, axis=1) if np.isfinite(curves).any() else curves[:, 0],
                       True, {"targets": f.classes, "n": ns.tolist(), "seed": seed},
                       curves=curves, fractions=ns / f.features)


def infidelity(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    noise: float = 0.003,
    samples: int = 10,
    perturbations: Any = None,
    seed: int = 0,
    output: str = "probabilities",
    batch_size: int = 64,
) -> MetricResult:
    """Infidelity (Yeh et al. 2019) with Gaussian perturbations, as Captum's example.

    Per sample ``mean_j (sum(I_j * a) - (f(x) - f(x - I_j)))^2`` over
    ``samples`` draws ``I_j ~ N(0, noise^2)`` of the input's shape (seeded), or
    over ``perturbations`` ``(N, samples, *input shape)`` passed in. A
    per-pixel map multiplies every channel of its pixel. Closed forms: the
    gradient of a linear model scores 0; a zero map ``noise^2 |w|^2``.
    **Lower is better.** Captum's ``normalize=False``.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
        ...                       keras.layers.Dense(1, use_bias=False)])
        >>> w = np.array([[1.0], [2.0], [3.0], [4.0]]); m.set_weights([w])
        >>> x = np.ones((1, 2, 2, 1))
        >>> round(float(infidelity(m, x, w.reshape(1, 2, 2), 0, noise=0.1, samples=8).scores[0]), 8)
        0.0
    """
    f = Features(model, inputs, attributions, targets, 0.0, False, output, batch_size)
    runs = check_positive_int("samples", samples)
    if perturbations is not None:
        given = np.asarray(perturbations, np.float32)
        if given.shape[:2] != (f.n, given.shape[1]) or given.shape[2:] != f.shape[1:]:
            raise ValueError(f"Expected `perturbations` of shape (N={f.n}, samples, *{f.shape[1:]}). "
                             f"Received: perturbations with shape {given.shape}.")
        runs = given.shape[1]
        given = given.reshape(f.n, runs, f.features, -1)
    rng = np.random.default_rng(seed)
    dots = np.zeros((f.n * runs,))

    def make(flat: np.ndarray) -> np.ndarray:
        i = flat // runs
        if perturbations is None:
            pert = (noise * rng.standard_normal((len(flat), *f.x.shape[1:]))).astype(np.float32)
        else:
            pert = given[i, flat % runs]
        dots[flat] = (pert.astype(np.float64) * f.a[i][..., None]).sum((1, 2))
        return (f.x[i] - pert).reshape(len(flat), *f.shape[1:])

    perturbed = f.score(f.n * runs, make, runs).reshape(f.n, runs)
    drops = f.original()[:, None].astype(np.float64) - perturbed
    loss = ((dots.reshape(f.n, runs) - drops) ** 2).mean(1)
    return MetricResult("infidelity", loss, False, {"targets": f.classes, "noise": noise, "seed": seed})
