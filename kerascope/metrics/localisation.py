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
