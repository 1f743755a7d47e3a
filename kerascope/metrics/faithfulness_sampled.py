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
from kerascope.metrics._features import Features, check_positive_int, features_metric, pearson_rows, ranks
from kerascope.metrics.faithfulness import CurveResult


def _lowest(keys: np.ndarray, size: int) -> np.ndarray:
    """Where each row of ``keys`` holds one of its ``size`` lowest values."""
    return keys <= np.partition(keys, size - 1, axis=1)[:, size - 1:size]


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
            keys = rng.random((len(flat), f.features))
            distinct = np.unique(sizes[r])
            if len(distinct) == 1:  # one subset size in the chunk (always, for faithfulness correlation)
                removed = _lowest(keys, int(distinct[0]))
            else:
                removed = np.zeros(keys.shape, bool)
                for size in distinct:  # the few distinct subset sizes, not the samples
                    rows = sizes[r] == size
                    removed[rows] = _lowest(keys[rows], int(size))
        else:
            removed = np.zeros((len(flat), f.features), bool)
            np.put_along_axis(removed, chosen[i, r], True, axis=1)
        sums[flat] = (f.a[i] * removed).sum(1)
        return f.images(i, removed)

    original, scores = f.original_and_score(f.n * runs, make, runs)
    return sums.reshape(f.n, runs), original[:, None].astype(np.float64) - scores.reshape(f.n, runs)


def _faithfulness_correlation(
    f: Features,
    *,
    nr_runs: int = 100,
    subset_size: int = 224,
    subsets: Any = None,
    seed: int = 0,
) -> MetricResult:
    sizes = None if subsets is not None else np.full(
        (check_positive_int("nr_runs", nr_runs),), check_positive_int("subset_size", subset_size, f.features))
    sums, drops = _subset_drops(f, sizes, seed, subsets)
    return MetricResult("faithfulness_correlation", pearson_rows(sums, drops), True,
                        {"targets": f.classes, "seed": seed, "att_sums": sums, "pred_deltas": drops})


faithfulness_correlation = features_metric(_faithfulness_correlation, "faithfulness_correlation", """\
Faithfulness correlation (Bhatt et al. 2020): Pearson correlation, over ``nr_runs`` random subsets of
``subset_size`` features, between the subset's attribution sum and the score drop when it is removed.

Subsets are drawn uniformly without replacement (seeded) or passed as
``subsets`` ``(N, nr_runs, subset_size)`` feature indices (pixels in raster
order, or elements of the ``(H, W, C)`` input in C order). **Higher is
better.** Scores logits by default, as Quantus (``softmax=False``).

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> w = np.array([[1.0], [2.0], [3.0], [4.0]]); m.set_weights([w])
    >>> r = faithfulness_correlation(m, np.ones((1, 2, 2, 1)), w.reshape(1, 2, 2), 0, nr_runs=8, subset_size=2,
    ...                              perturbation=0.0, output="logits")
    >>> r.scores.round(6).tolist()
    [1.0]
""", output="logits")


def _sensitivity_n(
    f: Features,
    *,
    n: int | Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    samples: int = 100,
    seed: int = 0,
) -> CurveResult:
    ns = np.atleast_1d(np.asarray(n, np.int64))
    for value in ns:
        check_positive_int("n", int(value), f.features)
    runs = check_positive_int("samples", samples)
    sums, drops = _subset_drops(f, np.repeat(ns, runs), seed, None)
    curves = pearson_rows(sums.reshape(-1, runs), drops.reshape(-1, runs)).reshape(f.n, len(ns))
    return CurveResult("sensitivity_n", np.nanmean(curves, axis=1) if np.isfinite(curves).any() else curves[:, 0],
                       True, {"targets": f.classes, "n": ns.tolist(), "seed": seed},
                       curves=curves, fractions=ns / f.features)


sensitivity_n = features_metric(_sensitivity_n, "sensitivity_n", """\
Sensitivity-n (Ancona et al. 2018): for each subset size ``n``, the Pearson correlation over ``samples``
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
""", output="logits")


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


def _segments(x: np.ndarray, segments: Any) -> np.ndarray:
    """``(N, H*W)`` segment labels relabelled 0..K-1 per image (SLIC superpixels when ``segments`` is None)."""
    n, h, w, _ = x.shape
    if segments is None:
        from skimage.segmentation import slic  # an optional dependency: the `segmentation` extra

        labels = np.stack([slic(image.astype(np.float64), start_label=0) for image in x])
    else:
        labels = np.asarray(segments)
        if labels.shape != (n, h, w):
            raise ValueError(f"Expected `segments` of shape (N, H, W) = {(n, h, w)} with integer labels. "
                             f"Received: segments with shape {labels.shape}.")
    flat = labels.reshape(n, -1)
    return np.stack([np.unique(row, return_inverse=True)[1].reshape(-1) for row in flat])


def _irof(f: Features, *, segments: Any = None) -> CurveResult:
    perturbation = f.perturbation  # each step writes the perturbation of the image as it stands
    x = f.x.reshape(f.shape)
    labels = _segments(x, segments)
    counts_per = labels.max(1) + 1
    k_max = int(counts_per.max())
    rows = np.arange(f.n)[:, None]
    size = np.zeros((f.n, k_max))
    np.add.at(size, (rows, labels), 1.0)
    mass = np.zeros((f.n, k_max))
    np.add.at(mass, (rows, labels), f.pixel_sums())
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_attr = np.where(size > 0, mass / np.where(size > 0, size, 1.0), -np.inf)
    seg_rank = ranks(mean_attr)  # absent segments (-inf) rank last and are never removed
    pixel_rank = np.take_along_axis(seg_rank, labels, axis=1)
    # the value each step writes: the perturbation of the image as it stands (a scalar recurrence per sample)
    pixel_values = x.reshape(f.n, labels.shape[1], -1).astype(np.float64)
    seg_sum = np.zeros((f.n, k_max))
    np.add.at(seg_sum, (rows, labels), pixel_values.sum(-1))
    order = np.argsort(seg_rank, axis=1)
    channels = pixel_values.shape[-1]
    total = pixel_values.reshape(f.n, -1).sum(1)
    elements = pixel_values[0].size
    low, high = pixel_values.reshape(f.n, -1).min(1), pixel_values.reshape(f.n, -1).max(1)
    values = np.zeros((f.n, k_max))
    for k in range(k_max):  # k_max scalar updates over all samples at once: no model call in here
        if perturbation == "mean":
            values[:, k] = total / elements
        elif perturbation == "black":
            values[:, k] = low
        elif perturbation == "white":
            values[:, k] = high
        else:
            values[:, k] = float(perturbation) if perturbation != "zero" else 0.0
        seg = order[:, k]
        total = total - seg_sum[np.arange(f.n), seg] + values[:, k] * size[np.arange(f.n), seg] * channels
        low, high = np.minimum(low, values[:, k]), np.maximum(high, values[:, k])
    pixel_fill = np.take_along_axis(values, pixel_rank, axis=1).astype(np.float32)
    feature_rank, feature_fill = f.pixels(pixel_rank), f.pixels(pixel_fill)

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // k_max, flat % k_max
        return f.images(i, feature_rank[i] <= k[:, None], feature_fill[i][..., None])

    scores = f.score(f.n * k_max, make, k_max).reshape(f.n, k_max).astype(np.float64)
    present = np.arange(k_max)[None, :] < counts_per[:, None]
    curves = np.where(present, scores / f.original()[:, None], 0.0)
    aoc = counts_per - ((curves[:, 1:] + curves[:, :-1]) * present[:, 1:]).sum(1) / 2.0  # own segments only
    return CurveResult("irof", aoc.astype(np.float64), True, {"targets": f.classes, "segments": counts_per},
                       curves=curves, fractions=np.arange(1, k_max + 1) / k_max)


irof = features_metric(_irof, "irof", """\
Iterative removal of features, IROF (Rieger & Hansen 2020): remove superpixels by mean attribution.

Segments are SLIC superpixels (``skimage.segmentation.slic(image,
start_label=0)`` per image, as Quantus) or ``segments`` ``(N, H, W)``
labels. Segments are removed cumulatively, highest mean attribution first;
each removed segment takes the ``perturbation`` value of the image as it
stands before that step (``"mean"``: the current image's mean, as Quantus).
``curves`` ``(N, K)`` holds the target's score over its clean score,
padded with zeros to the largest segment count ``K``; ``scores`` is
``K_i`` minus the area of the image's own ``K_i`` points with unit
spacing (the area over the curve; Quantus integrates the zero padding
too, so its score of an image depends on the others in its batch).
**Higher is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> seg = np.array([[[0, 0], [1, 1]]]); a = np.array([[[2.0, 2.0], [1.0, 1.0]]])
    >>> r = irof(m, np.ones((1, 2, 2, 1)), a, 0, segments=seg, perturbation=0.0, output="logits")
    >>> r.curves.tolist(), r.scores.tolist()
    ([[0.5, 0.0]], [1.75])
""", perturbation="mean")
