"""Localisation metrics: does the explanation point at the object, given its ground-truth mask or box?

These need no model: they compare attribution maps with known object
locations (e.g. the bundled shapes data set, :func:`kerascope.data.generate_shapes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kerascope.metrics._common import MetricResult, to_maps, unpack


def boxes_to_masks(boxes: Any, size: tuple[int, int]) -> np.ndarray:
    """Boolean ``(N, H, W)`` masks from ``(N, 4)`` boxes ``(y0, x0, y1, x1)`` in pixels (end exclusive).

    Several boxes per image: pass ``(N, B, 4)``; the masks are their union.

    Example:
        >>> boxes_to_masks([[0, 1, 2, 3]], (3, 4)).astype(int).tolist()
        [[[0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]]]
    """
    b = np.asarray(boxes, np.float64)
    if b.ndim == 2:
        b = b[:, None, :]
    if b.ndim != 3 or b.shape[-1] != 4:
        raise ValueError(f"Expected boxes of shape (N, 4) or (N, B, 4) as (y0, x0, y1, x1). Received: {b.shape}.")
    yy = np.arange(size[0])[None, None, :, None]
    xx = np.arange(size[1])[None, None, None, :]
    y0, x0, y1, x1 = (b[..., i][..., None, None] for i in range(4))
    return ((yy >= y0) & (yy < y1) & (xx >= x0) & (xx < x1)).any(axis=1)


def _dilate(masks: np.ndarray, tolerance: int) -> np.ndarray:
    if tolerance <= 0:
        return masks
    out = masks
    for axis in (1, 2):
        pad = [(0, 0)] * 3
        pad[axis] = (tolerance, tolerance)
        padded = np.pad(out, pad, constant_values=False)
        out = np.lib.stride_tricks.sliding_window_view(padded, 2 * tolerance + 1, axis=axis).any(-1)
    return out


def _ground_truth(masks: Any, boxes: Any, n: int, size: tuple[int, int]) -> np.ndarray:
    if (masks is None) == (boxes is None):
        raise ValueError("Pass exactly one of `masks=` or `boxes=`. Received: "
                         f"masks={'given' if masks is not None else None}, boxes={'given' if boxes is not None else None}.")
    truth = boxes_to_masks(boxes, size) if boxes is not None else np.asarray(masks).astype(bool)
    if truth.ndim == 4 and truth.shape[-1] == 1:
        truth = truth[..., 0]
    if truth.shape != (n, *size):
        raise ValueError(f"Expected ground truth of shape {(n, *size)}. Received: shape {truth.shape}.")
    return truth


def _maps_for(attributions: Any, masks: Any, boxes: Any, reduce: str) -> tuple[np.ndarray, np.ndarray]:
    attributions, _ = unpack(attributions, None)
    raw = to_maps(attributions, None, reduce)
    size = tuple(np.asarray(masks).shape[1:3]) if masks is not None else raw.shape[1:]
    maps = to_maps(raw, size, reduce)
    return maps, _ground_truth(masks, boxes, len(maps), size)


def pointing_game(
    attributions: Any,
    masks: Any = None,
    *,
    boxes: Any = None,
    tolerance: int = 0,
    reduce: str = "abs_sum",
) -> MetricResult:
    """Pointing game (Zhang et al. 2016): is the map's maximum inside the object?

    Per sample 1 (hit) or 0 (miss); with ties (several pixels share the
    maximum, e.g. a constant map) the score is the share of tied maxima
    inside the object, which is the chance rate for a constant map.
    ``tolerance`` dilates the ground truth by that many pixels (square).
    Maps are resized to the masks' size. **Higher is better.**

    Args:
        attributions: ``(N, H, W[, C])`` attributions or an :class:`Explanation`.
        masks: boolean ``(N, H, W)`` object masks, or
        boxes: ``(N, 4)`` / ``(N, B, 4)`` boxes ``(y0, x0, y1, x1)``.

    Example:
        >>> import numpy as np
        >>> a = np.zeros((2, 4, 4)); a[0, 1, 1] = 1; a[1, 3, 3] = 1
        >>> m = np.zeros((2, 4, 4), bool); m[:, :2, :2] = True
        >>> pointing_game(a, m).scores.tolist()
        [1.0, 0.0]
    """
    maps, truth = _maps_for(attributions, masks, boxes, reduce)
    truth = _dilate(truth, int(tolerance))
    n = len(maps)
    flat = maps.reshape(n, -1)
    is_max = flat >= flat.max(axis=1, keepdims=True)
    hits = (is_max & truth.reshape(n, -1)).sum(1) / is_max.sum(1)
    return MetricResult("pointing_game", hits.astype(np.float64), True, {"tolerance": tolerance})


def energy_pointing_game(
    attributions: Any,
    masks: Any = None,
    *,
    boxes: Any = None,
    reduce: str = "abs_sum",
) -> MetricResult:
    """Energy-based pointing game (Wang et al. 2020, Score-CAM): share of positive map mass inside the object.

    Per sample ``sum(max(a, 0) inside) / sum(max(a, 0))`` in [0, 1] (NaN for an
    all-non-positive map). A uniform map scores the object's area fraction.
    **Higher is better.**

    Example:
        >>> import numpy as np
        >>> a = np.array([[[3.0, 1.0], [0.0, 0.0]]])
        >>> m = np.array([[[True, False], [False, False]]])
        >>> energy_pointing_game(a, m).scores.tolist()
        [0.75]
    """
    maps, truth = _maps_for(attributions, masks, boxes, reduce)
    n = len(maps)
    positive = np.maximum(maps, 0).reshape(n, -1).astype(np.float64)
    total = positive.sum(1)
    inside = (positive * truth.reshape(n, -1)).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        energy = np.where(total > 0, inside / np.where(total > 0, total, 1.0), np.nan)
    return MetricResult("energy_pointing_game", energy, True, {})


# ----------------------------------------------------------------------------- Quantus's localisation family
def _elements(attributions: Any, masks: Any, absolute: bool) -> tuple[np.ndarray, np.ndarray]:
    """Attributions and masks as ``(N, D)`` float64 / bool arrays over the same elements.

    A ``(N, H, W)`` mask applies to every channel of ``(N, H, W, C)`` attributions.
    """
    a, _ = unpack(attributions, None)
    a = np.asarray(a, np.float64)
    s = np.asarray(masks).astype(bool)
    if s.ndim == a.ndim + 1 and s.shape[-1] == 1:
        s = s[..., 0]
    if a.ndim == s.ndim + 1 and s.shape == a.shape[:-1]:
        s = np.broadcast_to(s[..., None], a.shape)
    elif s.ndim == a.ndim and s.shape[-1] == 1 and s.shape[:-1] == a.shape[:-1]:
        s = np.broadcast_to(s, a.shape)
    if s.shape != a.shape or a.ndim < 2:
        raise ValueError(
            "Expected masks of the attributions' shape, or of (N, H, W) for (N, H, W, C) attributions. "
            f"Received: attributions with shape {a.shape} and masks with shape {np.asarray(masks).shape}."
        )
    n = len(a)
    a = a.reshape(n, -1)
    return (np.abs(a) if absolute else a), s.reshape(n, -1)


def _descending(a: np.ndarray) -> np.ndarray:
    return np.argsort(-a, axis=1, kind="stable")


def relevance_mass_accuracy(attributions: Any, masks: Any, *, abs: bool = False) -> MetricResult:  # noqa: A002
    """Relevance mass accuracy (Arras et al. 2022): the share of the attribution sum inside the mask.

    Per sample ``sum(a inside) / sum(a)`` (NaN for an empty mask), signed
    unless ``abs=True``, as Quantus. **Higher is better.** Attributions are
    ``(N, H, W)`` maps or of the input's shape; masks ``(N, H, W)`` (applied to
    every channel) or of the attributions' shape.

    Example:
        >>> import numpy as np
        >>> a = np.array([[[3.0, 1.0], [0.0, 0.0]]]); m = np.array([[[True, False], [False, False]]])
        >>> relevance_mass_accuracy(a, m).scores.tolist()
        [0.75]
    """
    a, s = _elements(attributions, masks, abs)
    with np.errstate(invalid="ignore", divide="ignore"):
        mass = (a * s).sum(1) / a.sum(1)
    return MetricResult("relevance_mass_accuracy", np.where(s.any(1), mass, np.nan), True, {"abs": abs})


def relevance_rank_accuracy(attributions: Any, masks: Any, *, abs: bool = False) -> MetricResult:  # noqa: A002
    """Relevance rank accuracy (Arras et al. 2022): the share of the top-``K`` attributions inside the mask.

    ``K`` is the mask's size; per sample the fraction of the ``K`` highest
    attributions that fall inside it (NaN for an empty mask). Ties rank in
    raster order. **Higher is better.**

    Example:
        >>> import numpy as np
        >>> a = np.array([[[3.0, 1.0], [2.0, 0.0]]]); m = np.array([[[True, True], [False, False]]])
        >>> relevance_rank_accuracy(a, m).scores.tolist()
        [0.5]
    """
    a, s = _elements(attributions, masks, abs)
    sizes = s.sum(1)
    ranked = np.take_along_axis(s, _descending(a), axis=1)
    top = np.arange(a.shape[1])[None, :] < sizes[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = (ranked & top).sum(1) / sizes
    return MetricResult("relevance_rank_accuracy", np.where(sizes > 0, accuracy, np.nan), True, {"abs": abs})


def attribution_localisation(
    attributions: Any,
    masks: Any,
    *,
    weighted: bool = False,
    positive_attributions: bool = False,
    abs: bool = True,  # noqa: A002 - Quantus's name
) -> MetricResult:
    """Attribution localisation (Kohlbrenner et al. 2020): the attribution share inside the mask.

    Per sample ``sum(a inside) / (sum(a) + 1e-9)`` after ``abs`` (default) or
    clipping negatives (``positive_attributions=True``); NaN for an empty mask
    or a ratio above 1. ``weighted=True`` multiplies by the mask's area
    fraction (Quantus weighs by the mask size over the size of the batch
    without its first two samples; here the fraction of the map is used).
    **Higher is better.**

    Example:
        >>> import numpy as np
        >>> a = np.array([[[3.0, -1.0], [0.0, 0.0]]]); m = np.array([[[True, False], [False, False]]])
        >>> np.round(attribution_localisation(a, m).scores, 6).tolist()
        [0.75]
    """
    a, s = _elements(attributions, masks, abs)
    if positive_attributions:
        a = np.clip(a, 0, None)
    ratio = (a * s).sum(1) / (a.sum(1) + 1e-9)
    ratio = np.where(s.any(1) & ~(ratio > 1), ratio, np.nan)
    if weighted:
        ratio = ratio * s.mean(1)
    return MetricResult("attribution_localisation", ratio, True,
                        {"weighted": weighted, "positive_attributions": positive_attributions, "abs": abs})


def top_k_intersection(
    attributions: Any,
    masks: Any,
    *,
    k: int = 1000,
    concept_influence: bool = False,
    abs: bool = False,  # noqa: A002 - Quantus's name
) -> MetricResult:
    """Top-k intersection (Theiner et al. 2021): the share of the ``k`` highest attributions inside the mask.

    ``concept_influence=True`` divides by the mask's area fraction. NaN for
    an empty mask; ties rank in raster order. **Higher is better.**

    Example:
        >>> import numpy as np
        >>> a = np.array([[[3.0, 1.0], [2.0, 0.0]]]); m = np.array([[[True, False], [True, False]]])
        >>> top_k_intersection(a, m, k=2).scores.tolist()
        [1.0]
    """
    a, s = _elements(attributions, masks, abs)
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= a.shape[1]:
        raise ValueError(f"`k` must be an int in [1, {a.shape[1]}] (the number of attributions). Received: k={k!r}.")
    hits = np.take_along_axis(s, _descending(a)[:, :k], axis=1).mean(1)
    sizes = s.sum(1)
    if concept_influence:
        with np.errstate(invalid="ignore", divide="ignore"):
            hits = hits * a.shape[1] / sizes
    return MetricResult("top_k_intersection", np.where(sizes > 0, hits, np.nan), True,
                        {"k": k, "concept_influence": concept_influence, "abs": abs})


def auc(attributions: Any, masks: Any, *, abs: bool = False) -> MetricResult:  # noqa: A002 - Quantus's name
    """ROC AUC of the attributions as a detector of the mask's elements (Fawcett 2006), per sample.

    The probability that an element inside the mask outranks one outside
    (ties count half), which equals the area under the ROC curve as
    ``sklearn.metrics.roc_curve`` + ``auc`` compute it, from average ranks
    (vectorised over samples). NaN for an empty mask. **Higher is better.**

    Example:
        >>> import numpy as np
        >>> a = np.array([[[3.0, 1.0], [2.0, 0.0]]]); m = np.array([[[True, False], [True, False]]])
        >>> auc(a, m).scores.tolist()
        [1.0]
    """
    from kerascope.metrics.sanity import _average_ranks

    a, s = _elements(attributions, masks, abs)
    ranks = _average_ranks(a)
    pos = s.sum(1).astype(np.float64)
    neg = s.shape[1] - pos
    u = (ranks * s).sum(1) - pos * (pos + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        area = u / (pos * neg)
    return MetricResult("auc", np.where(pos > 0, area, np.nan), True, {"abs": abs})


def focus(attributions: Any, masks: Any, *, abs: bool = False) -> MetricResult:  # noqa: A002 - Quantus's name
    """Focus (Arias-Duart et al. 2022): the share of positive relevance on the target class's mosaic tiles.

    ``masks`` is either the mosaic's ``(N, 4)`` flags (1 where the quadrant
    top-left, top-right, bottom-left, bottom-right shows the target class, as
    Quantus's ``custom_batch``) or any ``(N, H, W)`` mask. Per sample
    ``sum(max(a, 0) on the tiles) / (sum(max(a, 0)) + 1e-9)``. **Higher is better.**

    Example:
        >>> import numpy as np
        >>> a = np.zeros((1, 4, 4)); a[0, :2, :2] = 1.0; a[0, 2:, 2:] = 3.0
        >>> focus(a, np.array([[1, 0, 0, 1]])).scores.round(6).tolist(), focus(a, [[1, 0, 0, 0]]).scores.round(6).tolist()
        ([1.0], [0.25])
    """
    raw, _ = unpack(attributions, None)
    raw = np.asarray(raw)
    flags = np.asarray(masks)
    if flags.ndim == 2 and flags.shape == (len(raw), 4) and raw.ndim >= 3:
        h, w = raw.shape[1], raw.shape[2]
        top = np.arange(h)[:, None] >= h // 2
        left = np.arange(w)[None, :] >= w // 2
        quadrant = (top * 2 + left).astype(np.int64)  # 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right
        masks = flags.astype(bool)[:, quadrant]
    a, s = _elements(raw, masks, abs)
    a = np.clip(a, 0, None)
    return MetricResult("focus", (a * s).sum(1) / (a.sum(1) + 1e-9), True, {"abs": abs})
