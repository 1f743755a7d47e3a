"""Quantus's faithfulness family: perturb the features an explanation ranks, watch the target's score.

Attributions are ``(N, H, W)`` maps (features are pixels, all channels move
together) or of the input's shape (features are single elements).
``perturbation="black"`` replaces by the image's minimum, as Quantus does.
Every perturbed image (sample x step, or sample x random subset) is folded
into the batch axis, built lazily chunk by chunk and scored with the model's
compiled forward in chunks of ``batch_size``: no Python loop per step or sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kerascope.metrics._common import MetricResult
from kerascope.metrics._features import Features, check_positive_int, features_metric, pearson_rows, ranks
from kerascope.metrics.faithfulness import CurveResult


def _trapezoid(curves: np.ndarray) -> np.ndarray:
    """Quantus's ``calculate_auc``: the trapezoid rule with unit spacing along each curve."""
    c = np.asarray(curves, np.float64)
    return (c[:, 1:] + c[:, :-1]).sum(1) / 2.0


def _pixel_flipping(f: Features, *, features_in_step: int = 1) -> CurveResult:
    step = check_positive_int("features_in_step", features_in_step, f.features)
    points = math.ceil(f.features / step)
    rank = ranks(f.a)

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // points, flat % points
        return f.images(i, rank[i] < ((k + 1) * step)[:, None])

    curves = f.score(f.n * points, make, points).reshape(f.n, points)
    return CurveResult("pixel_flipping", _trapezoid(curves), False,
                       {"targets": f.classes, "features_in_step": step, "perturbation": f.perturbation},
                       curves=curves, fractions=np.minimum((np.arange(points) + 1) * step, f.features) / f.features)


pixel_flipping = features_metric(_pixel_flipping, "pixel_flipping", """\
Pixel-flipping (Bach et al. 2015): remove features from the most relevant down, cumulatively.

Step ``k`` replaces the ``(k + 1) * features_in_step`` highest-ranked
features by the ``perturbation`` and records the target's score;
``curves`` is ``(N, ceil(F / features_in_step))`` as Quantus returns it,
``scores`` its area with unit spacing (Quantus's ``return_auc_per_sample``).
**Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> r = pixel_flipping(m, np.ones((1, 2, 2, 1)), np.array([[[4.0, 3.0], [2.0, 1.0]]]), 0,
    ...                    perturbation=0.0, output="logits")
    >>> r.curves.tolist(), r.scores.tolist()
    ([[3.0, 2.0, 1.0, 0.0]], [4.5])
""")


def _patch_ranks(f: Features, patch_size: int, order: str, seed: int) -> tuple[np.ndarray, int]:
    """Per-pixel rank of its patch ``(N, H*W)`` and the number of patches (Quantus's centred padding)."""
    _, h, w, _ = f.shape
    p = check_positive_int("patch_size", patch_size, max(h, w))
    pads = [(-size) % p // 2 for size in (h, w)]
    cols = math.ceil(w / p) if (w % p == 0) else (w + (-w) % p) // p
    rows_ = (h + (-h) % p) // p
    patch = (((np.arange(h) + pads[0]) // p)[:, None] * cols + ((np.arange(w) + pads[1]) // p)[None, :]).ravel()
    count = rows_ * cols
    sums = np.zeros((f.n, count))
    np.add.at(sums, (slice(None), patch), f.pixel_sums())
    if order == "morf":
        patch_rank = ranks(sums)
    elif order == "lerf":
        patch_rank = ranks(sums, descending=False)
    elif order == "random":
        patch_rank = np.argsort(np.random.default_rng(seed).random((f.n, count)), axis=1)
    else:
        raise ValueError(f"Unknown order. Received: order={order!r}. Expected 'morf', 'lerf' or 'random'.")
    return patch_rank[:, patch], count


def _patch_images(f: Features, pixel_rank: np.ndarray, points: int) -> Callable[[np.ndarray], np.ndarray]:
    """``make(flat)`` of the patch curves: image ``flat`` is sample ``flat // points`` after removing its
    ``flat % points + 1`` highest-ranked patches."""
    feature_rank = f.pixels(pixel_rank)

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // points, flat % points
        return f.images(i, feature_rank[i] <= k[:, None])

    return make


def _region_perturbation(
    f: Features,
    *,
    patch_size: int = 8,
    order: str = "morf",
    regions: int = 100,
    seed: int = 0,
) -> CurveResult:
    pixel_rank, count = _patch_ranks(f, patch_size, order, seed)
    points = min(check_positive_int("regions", regions), count)
    original, scores = f.original_and_score(f.n * points, _patch_images(f, pixel_rank, points), points)
    curves = original[:, None].astype(np.float64) - scores.reshape(f.n, points)
    return CurveResult("region_perturbation", curves.mean(1), order != "lerf",
                       {"targets": f.classes, "patch_size": patch_size, "order": order},
                       curves=curves, fractions=(np.arange(points) + 1) / count)


region_perturbation = features_metric(_region_perturbation, "region_perturbation", """\
Region perturbation (Samek et al. 2015): remove ``patch_size`` squares by attribution sum, cumulatively.

Patches tile the image after Quantus's centred padding; ``order`` is
``"morf"`` (most relevant first), ``"lerf"`` (least first) or ``"random"``
(seeded). ``curves`` ``(N, min(regions, patches))`` holds
``f(x) - f(x_k)`` after each removal, as Quantus's ``regions_evaluation``
steps; ``scores`` their mean (the AOPC without its zero first point).
**Higher is better** for ``"morf"``.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> a = np.array([[[4.0, 3.0], [2.0, 1.0]]])
    >>> region_perturbation(m, np.ones((1, 2, 2, 1)), a, 0, patch_size=1, perturbation=0.0,
    ...                     output="logits").curves.tolist()
    [[1.0, 2.0, 3.0, 4.0]]
""")


def _selectivity(f: Features, *, patch_size: int = 8) -> CurveResult:
    pixel_rank, count = _patch_ranks(f, patch_size, "morf", 0)
    curves = f.score(f.n * count, _patch_images(f, pixel_rank, count), count).reshape(f.n, count)
    return CurveResult("selectivity", _trapezoid(curves), False, {"targets": f.classes, "patch_size": patch_size},
                       curves=curves, fractions=(np.arange(count) + 1) / count)


selectivity = features_metric(_selectivity, "selectivity", """\
Selectivity (Montavon et al. 2018): remove every patch, most relevant first, and record the score.

``curves`` ``(N, patches)`` is the target's score after each removal (as
Quantus), ``scores`` its area with unit spacing. **Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> selectivity(m, np.ones((1, 2, 2, 1)), np.array([[[4.0, 3.0], [2.0, 1.0]]]), 0, patch_size=1,
    ...             perturbation=0.0, output="logits").scores.tolist()
    [4.5]
""")


def _monotonicity(f: Features, *, features_in_step: int = 1) -> CurveResult:
    step = check_positive_int("features_in_step", features_in_step, f.features)
    points = math.ceil(f.features / step)
    rank = ranks(f.a, descending=False)

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // points, flat % points
        return f.images(i, rank[i] >= ((k + 1) * step)[:, None])

    curves = f.score(f.n * points, make, points).reshape(f.n, points)
    monotone = np.all(np.diff(curves, axis=1) >= 0, axis=1).astype(np.float64)
    return CurveResult("monotonicity", monotone, True, {"targets": f.classes, "features_in_step": step},
                       curves=curves, fractions=np.minimum((np.arange(points) + 1) * step, f.features) / f.features)


monotonicity = features_metric(_monotonicity, "monotonicity", """\
Monotonicity (Arya et al. 2019): add features back to the baseline, least relevant first.

Starting from the all-``perturbation`` image, step ``k`` restores the
``(k + 1) * features_in_step`` lowest-ranked features; the score is 1 where
the target's score never decreases along the way, else 0. **Higher is
better.** (Quantus 0.6.0 writes the baseline, not the input, into its
baseline image at every step, so its curve is flat and every sample
passes; this follows the paper.)

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.array([[1.0], [-1.0], [2.0], [3.0]])])
    >>> r = monotonicity(m, np.ones((1, 2, 2, 1)), np.array([[[0.5, 1.0], [2.0, 3.0]]]), 0,
    ...                  perturbation=0.0, output="logits")
    >>> r.curves.tolist(), r.scores.tolist()
    ([[1.0, 0.0, 2.0, 5.0]], [0.0])
""", abs=True)


def _faithfulness_estimate(f: Features, *, features_in_step: int = 1) -> MetricResult:
    step = check_positive_int("features_in_step", features_in_step, f.features)
    points = math.ceil(f.features / step)
    group = ranks(f.a) // step
    sums = np.zeros((f.n, points))
    np.add.at(sums, (np.arange(f.n)[:, None], group), f.a)

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // points, flat % points
        return f.images(i, group[i] == k[:, None])

    original, scores = f.original_and_score(f.n * points, make, points)
    drops = original[:, None].astype(np.float64) - scores.reshape(f.n, points)
    return MetricResult("faithfulness_estimate", pearson_rows(sums, drops), True,
                        {"targets": f.classes, "att_sums": sums, "pred_deltas": drops})


faithfulness_estimate = features_metric(_faithfulness_estimate, "faithfulness_estimate", """\
Faithfulness estimate (Alvarez-Melis & Jaakkola 2018): Pearson correlation, over ranked groups of
``features_in_step`` features each removed alone, between their attribution sum and the score drop.

**Higher is better.** One forward per group per sample. Scores logits by default, as Quantus
(``softmax=False``).

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.array([[1.0], [2.0], [3.0], [4.0]])])
    >>> a = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    >>> faithfulness_estimate(m, np.ones((1, 2, 2, 1)), a, 0, perturbation=0.0, output="logits").scores.round(6)
    array([1.])
""", output="logits")
