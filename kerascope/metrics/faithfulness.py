"""Faithfulness metrics: does removing what the explanation calls important change the prediction?

Every metric builds all its perturbed images lazily, folded into the batch
axis (sample x step, or sample x random subset), and scores them with the
model's compiled forward in chunks of ``batch_size``: memory is bounded by
``batch_size`` and there is no Python loop per step or per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope.metrics._common import (
    MetricResult,
    Scorer,
    baseline_images,
    image_batch,
    public_metric,
    to_maps,
    unpack,
)
from kerascope.metrics._features import pearson_rows


@dataclass(repr=False)
class CurveResult(MetricResult):
    """A Deletion / Insertion result: per-sample AUCs plus the curves themselves.

    ``curves`` is ``(N, steps + 1)`` target scores; ``fractions`` the share of
    pixels removed (deletion) or inserted (insertion) at each point.

    Example:
        >>> import numpy as np
        >>> r = CurveResult("deletion_auc", np.array([0.25]), False,
        ...                 curves=np.array([[1.0, 0.0]]), fractions=np.array([0.0, 1.0]))
        >>> r.mean_curve.tolist()
        [1.0, 0.0]
    """

    curves: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    fractions: np.ndarray = field(default_factory=lambda: np.zeros((0,)))

    @property
    def mean_curve(self) -> np.ndarray:
        """The curve averaged over samples.

        Example:
            >>> import numpy as np
            >>> CurveResult("c", np.zeros(2), True, curves=np.array([[0.0, 2.0], [2.0, 4.0]]),
            ...             fractions=np.array([0.0, 1.0])).mean_curve.tolist()
            [1.0, 3.0]
        """
        return np.asarray(self.curves, np.float64).mean(axis=0)


def _pixel_ranks(maps: np.ndarray) -> np.ndarray:
    """``ranks[i, p]`` = position of pixel ``p`` when sample ``i``'s map is sorted descending (ties: raster order)."""
    n, hw = maps.shape[0], int(np.prod(maps.shape[1:]))
    order = np.argsort(-maps.reshape(n, hw), axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(hw)[None, :].repeat(n, axis=0), axis=1)
    return ranks


def _step_counts(hw: int, steps: int | None, step_size: int | None) -> np.ndarray:
    if step_size is not None:
        if not isinstance(step_size, (int, np.integer)) or step_size < 1:
            raise ValueError(f"`step_size` must be a positive number of pixels. Received: step_size={step_size!r}.")
        steps = int(np.ceil(hw / step_size))
    else:
        if not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(f"`steps` must be a positive int. Received: steps={steps!r}.")
        step_size = int(np.ceil(hw / steps))
    return np.minimum(np.arange(steps + 1) * step_size, hw)


def _curve(
    kind: str,
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    perturbation: str | float = "zero",
    steps: int | None = 32,
    step_size: int | None = None,
    reduce: str = "abs_sum",
    output: str = "probabilities",
    batch_size: int = 64,
    blur_sigma: float | None = None,
) -> CurveResult:
    """Deletion or insertion: the target's score as pixels leave (or join) the image, most important first."""
    attributions, targets = unpack(attributions, targets)
    x = image_batch(inputs)
    n, h, w, c = x.shape
    maps = to_maps(attributions, (h, w), reduce)
    if len(maps) != n:
        raise ValueError(f"Expected one attribution per input ({n}). Received: {len(maps)} attributions.")
    scorer = Scorer(model, output, batch_size)
    classes = scorer.targets(x, targets)
    ranks = _pixel_ranks(maps)
    counts = _step_counts(h * w, steps, step_size)
    points = len(counts)
    base = baseline_images(x, perturbation, blur_sigma)
    start, end = (base, x) if kind == "insertion" else (x, base)

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // points, flat % points
        changed = (ranks[i] < counts[k][:, None]).reshape(len(flat), h, w, 1)
        return np.where(changed, end[i], start[i])

    curves = scorer.score_chunks(n * points, make, lambda flat: classes[flat // points]).reshape(n, points)
    fractions = counts / float(h * w)
    auc = np.trapezoid(curves, fractions, axis=1) if hasattr(np, "trapezoid") else np.trapz(curves, fractions, axis=1)
    return CurveResult(
        f"{kind}_auc", auc.astype(np.float64), kind == "insertion",
        details={"targets": classes, "perturbation": perturbation, "output": output},
        curves=curves, fractions=fractions,
    )


deletion = public_metric(_curve, "deletion", """\
Deletion curve and AUC (Petsiuk et al. 2018): remove the most important pixels first.

Pixels are ranked by the attribution map (channels reduced with
``reduce``); step ``k`` replaces the top ``k * step_size`` pixels (all
channels) by the ``perturbation`` (``"zero"``, ``"blur"``, ``"mean"`` or a
float) and records the target's score. **Lower AUC is better** (the score
should collapse quickly). ``steps`` sets the number of steps, or
``step_size`` the pixels per step (overrides ``steps``).

Args:
    model: the Keras model (never modified).
    inputs: images ``(N, H, W, C)``.
    attributions: raw attributions ``(N, H, W[, C])`` or an :class:`Explanation`.
    targets: class indices; None = the explanation's targets, else the predicted class.
    output: ``"probabilities"`` (the model's own output) or ``"logits"``.
    batch_size: perturbed images per forward call.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> x = np.ones((1, 2, 2, 1)); a = np.array([[[4.0, 3.0], [2.0, 1.0]]])
    >>> r = deletion(m, x, a, 0, steps=4, output="logits")
    >>> r.curves.tolist(), r.aggregate
    ([[4.0, 3.0, 2.0, 1.0, 0.0]], 2.0)
""")


insertion = public_metric(_curve, "insertion", """\
Insertion curve and AUC (Petsiuk et al. 2018): start from the perturbed image, add pixels back.

Starts from the ``perturbation`` baseline (default a blurred copy, as in
the paper) and restores the most important pixels first. **Higher AUC is
better.** Arguments as in :func:`deletion`.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> r = insertion(m, np.ones((1, 2, 2, 1)), np.ones((1, 2, 2)), 0, perturbation="zero",
    ...               steps=2, output="logits")
    >>> r.curves.tolist(), r.aggregate
    ([[0.0, 2.0, 4.0]], 2.0)
""", perturbation="blur")


def _average_change(
    kind: str,
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    reduce: str = "abs_sum",
    output: str = "probabilities",
    batch_size: int = 64,
) -> MetricResult:
    """Average drop or increase: the target's score on the image and on ``image * map`` (map scaled to [0, 1])."""
    attributions, targets = unpack(attributions, targets)
    x = image_batch(inputs)
    n, h, w, _ = x.shape
    maps = to_maps(attributions, (h, w), reduce)
    lo = maps.reshape(n, -1).min(1)[:, None, None]
    hi = maps.reshape(n, -1).max(1)[:, None, None]
    unit = np.where(hi > lo, (maps - lo) / np.where(hi > lo, hi - lo, 1.0), 1.0).astype(np.float32)
    scorer = Scorer(model, output, batch_size)
    classes = scorer.targets(x, targets)
    both = np.concatenate([x, x * unit[..., None]])
    scores = scorer.score_chunks(2 * n, lambda j: both[j], lambda j: classes[j % n])
    y, o = scores[:n], scores[n:]
    if kind == "average_drop":
        drop = 100.0 * np.maximum(0.0, y - o) / np.where(np.abs(y) > 0, y, np.nan)
        return MetricResult(kind, drop.astype(np.float64), False, {"targets": classes, "y": y, "o": o})
    return MetricResult(kind, 100.0 * (o > y).astype(np.float64), True, {"targets": classes, "y": y, "o": o})


average_drop = public_metric(_average_change, "average_drop", """\
Average Drop % (Chattopadhyay et al. 2018): confidence lost when only the explained region is kept.

The map is min-max scaled to [0, 1] per sample and multiplied into the
image; per sample ``100 * max(0, Y - O) / Y`` with ``Y`` the target's
probability on the image and ``O`` on the masked image. **Lower is
better.** Meaningful for probabilities (``Y > 0``).

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.ones((4, 1))])
    >>> a = np.array([[[1.0, 1.0], [0.0, 0.0]]])
    >>> average_drop(m, np.ones((1, 2, 2, 1)), a, 0, output="logits").aggregate
    50.0
""")


average_increase = public_metric(_average_change, "average_increase", """\
Average Increase in confidence % (Chattopadhyay et al. 2018): how often the masked image scores higher.

Per sample 100 if the target's score on ``image * map`` (map scaled to
[0, 1]) exceeds the score on the image, else 0. **Higher is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([-np.ones((4, 1))])
    >>> a = np.array([[[1.0, 1.0], [0.0, 0.0]]])
    >>> average_increase(m, np.ones((1, 2, 2, 1)), a, 0, output="logits").aggregate
    100.0
""")


def mu_fidelity(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    samples: int = 128,
    grid_size: int = 8,
    subset_fraction: float = 0.2,
    perturbation: str | float = "zero",
    seed: int = 0,
    reduce: str = "sum",
    output: str = "probabilities",
    batch_size: int = 64,
    blur_sigma: float | None = None,
) -> MetricResult:
    """MuFidelity (Bhatt et al. 2020): correlation between attribution mass and score drop over random subsets.

    For ``samples`` random subsets ``S`` (cells of a ``grid_size`` grid, each
    kept with probability ``subset_fraction``, seeded), correlate
    ``sum_{p in S} a_p`` with ``f(x) - f(x with S perturbed)`` (Pearson, per
    sample). **Higher is better** (1 = attributions add up like the model).
    ``reduce="sum"`` keeps the sign of signed attributions.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
        ...                       keras.layers.Dense(1, use_bias=False)])
        >>> m.set_weights([np.array([[1.0], [2.0], [3.0], [4.0]])])
        >>> x = np.ones((1, 2, 2, 1)); a = np.array([[[1.0, 2.0], [3.0, 4.0]]])
        >>> round(mu_fidelity(m, x, a, 0, samples=16, grid_size=2, subset_fraction=0.5, output="logits").aggregate, 4)
        1.0
    """
    if not 0 < subset_fraction < 1:
        raise ValueError(f"`subset_fraction` must be in (0, 1). Received: subset_fraction={subset_fraction!r}.")
    if not isinstance(samples, int) or samples < 2:
        raise ValueError(f"`samples` must be an int >= 2. Received: samples={samples!r}.")
    attributions, targets = unpack(attributions, targets)
    x = image_batch(inputs)
    n, h, w, _ = x.shape
    maps = to_maps(attributions, (h, w), reduce)
    g = min(int(grid_size), h, w)
    rows, cols = (np.arange(h) * g) // h, (np.arange(w) * g) // w
    cell = (rows[:, None] * g + cols[None, :]).ravel()
    cell_sums = np.zeros((n, g * g), np.float64)
    np.add.at(cell_sums, (slice(None), cell), maps.reshape(n, -1).astype(np.float64))
    subsets = np.random.default_rng(seed).random((n * samples, g * g)) < subset_fraction
    attr_sums = (subsets.reshape(n, samples, g * g) * cell_sums[:, None, :]).sum(-1)
    scorer = Scorer(model, output, batch_size)
    classes = scorer.targets(x, targets)
    base = baseline_images(x, perturbation, blur_sigma)

    def make(flat: np.ndarray) -> np.ndarray:
        i = flat // samples
        removed = subsets[flat][:, cell].reshape(len(flat), h, w, 1)
        return np.where(removed, base[i], x[i])

    original = scorer.score_chunks(n, lambda j: x[j], lambda j: classes[j])
    perturbed = scorer.score_chunks(n * samples, make, lambda flat: classes[flat // samples]).reshape(n, samples)
    drops = original[:, None].astype(np.float64) - perturbed
    corr = pearson_rows(attr_sums, drops)
    return MetricResult("mu_fidelity", corr, True, {"targets": classes, "seed": seed})
