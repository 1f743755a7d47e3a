"""Performance Information Curves (Kapishnikov et al. 2019, XRAI): SIC and AIC, as PAIR ``saliency.metrics.pic``.

Starting from a "fully blurred" image (every pixel interpolated from a small random set of kept pixels),
the most salient pixels are revealed threshold by threshold; the curve plots the model's normalised
prediction (softmax of the target: SIC; correct or not: AIC) against the normalised information content of
the image (its lossless WebP size). The interpolation (a Delaunay triangulation) and the WebP size are
per-image operations, done inside each chunk; the model scores the chunk's images with its compiled forward,
``batch_size`` at a time.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core.threads import single_threaded_blas
from kerascope.metrics._common import Scorer, unpack
from kerascope.metrics.faithfulness import CurveResult
from kerascope.numeric.chunking import chunk_bounds

THRESHOLDS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.07, 0.10, 0.13, 0.21, 0.34, 0.5, 0.75)


def _blurred(img: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """PAIR's ``create_blurred_image`` (linear): unkept pixels interpolated from the kept ones, corners kept."""
    from scipy.interpolate import LinearNDInterpolator

    h, w, c = img.shape
    keep = keep.copy()
    keep[[0, 0, h - 1, h - 1], [0, w - 1, 0, w - 1]] = True
    if keep.all():
        return img.copy()
    out = img * keep[..., None].astype(np.float32)
    known, unknown = np.argwhere(keep), np.argwhere(~keep)
    values = LinearNDInterpolator(known, img[tuple(known.T)].astype(np.float64), fill_value=np.nan)(unknown)
    values = np.where(np.isnan(values), img.mean(axis=(0, 1))[None], values)  # outside the hull: mean colour
    out[tuple(unknown.T)] = values
    return np.round(out).astype(np.uint8)


def _webp_size(img: np.ndarray) -> int:
    """PAIR's ``estimate_image_entropy``: the byte length of the lossless WebP encoding."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img).save(buffer, format="webp", lossless=True,
                                                                      quality=100)
    return buffer.tell()


def pic(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    kind: str = "sic",
    preprocess: Callable[[np.ndarray], Any] | None = None,
    saliency_thresholds: Sequence[float] = THRESHOLDS,
    random_mask: Any = None,
    fraction: float = 0.01,
    seed: int = 0,
    min_pred_value: float = 0.8,
    keep_monotonous: bool = True,
    num_data_points: int = 1000,
    batch_size: int = 64,
) -> CurveResult:
    """Softmax / Accuracy Information Curve (Kapishnikov et al. 2019), per image, as PAIR's ``compute_pic_metric``.

    ``inputs`` are ``uint8`` images ``(N, H, W, C)`` (the information estimate needs them);
    ``preprocess`` turns a batch of them into model inputs (default: float32 as is). ``attributions``
    are ``(N, H, W)`` maps (or of the input's shape, summed over channels); higher is more important.
    The fully blurred image keeps ``random_mask`` (``(N, H, W)`` booleans; default a seeded draw of
    ``fraction`` of the pixels); each threshold ``t`` also keeps the pixels at or above the map's
    ``1 - t`` quantile. ``kind="sic"`` scores the model's output for the target (a softmax model's
    probability), ``"aic"`` 1.0 when the target is predicted. ``curves`` ``(N, num_data_points + 1)`` is the
    normalised prediction at normalised information ``fractions``, ``scores`` its area. An image is
    skipped (NaN score and curve, reason in ``details["skipped"]``) where PAIR raises
    ``ComputePicMetricError``: original prediction under ``min_pred_value``, or the fully blurred image not
    less informative or not scored lower than the original. **Higher is better.**
    Cost: ``N * (len(saliency_thresholds) + 2)`` forwards, one interpolation and WebP encoding per image.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
        ...                       keras.layers.Dense(2, activation="softmax")])
        >>> x = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 1)).astype("uint8")
        >>> r = pic(m, x, x[..., 0].astype("float32"), 0, min_pred_value=0.0, num_data_points=10)
        >>> r.curves.shape
        (2, 11)
    """
    attributions, targets = unpack(attributions, targets)
    img = np.asarray(inputs)
    if img.dtype != np.uint8 or img.ndim not in (3, 4):
        raise ValueError("PIC needs uint8 images (N, H, W, C) to estimate their information (pass `preprocess=` "
                         f"to feed the model). Received: inputs of dtype {img.dtype} and shape {img.shape}.")
    img = img[..., None] if img.ndim == 3 else img
    n, h, w, c = img.shape
    sal = np.asarray(attributions, np.float64)
    if sal.shape == img.shape:
        sal = sal.sum(-1)
    if sal.shape != (n, h, w):
        raise ValueError(f"Expected attributions of shape (N, H, W) = {(n, h, w)} or of the inputs' shape. "
                         f"Received: attributions with shape {sal.shape}.")
    if kind not in ("sic", "aic"):
        raise ValueError(f"Unknown curve kind. Received: kind={kind!r}. Expected 'sic' or 'aic'.")
    thresholds = np.asarray(list(saliency_thresholds), np.float64)
    if thresholds.ndim != 1 or thresholds.size == 0 or np.any((thresholds < 0) | (thresholds > 1)):
        raise ValueError(f"`saliency_thresholds` must be a non-empty list of fractions in [0, 1]. "
                         f"Received: saliency_thresholds={saliency_thresholds!r}.")
    if random_mask is None:
        draw = np.random.default_rng(seed)
        order = np.argsort(draw.random((n, h * w)), axis=1)[:, :int(h * w * fraction)]
        random_mask = np.zeros((n, h * w), bool)
        np.put_along_axis(random_mask, order, True, axis=1)
    random_mask = np.asarray(random_mask, bool).reshape(n, h, w)
    prep = preprocess or (lambda batch: batch.astype(np.float32))
    scorer = Scorer(model, "probabilities", batch_size)
    classes = scorer.targets(prep(img), targets)
    quantiles = np.quantile(sal.reshape(n, -1), 1 - thresholds, axis=1).T  # (N, T), as np.quantile per map
    points = len(thresholds) + 2  # the fully blurred image, one per threshold, the original

    def keep(i: int, k: int) -> np.ndarray:
        return random_mask[i] if k == 0 else (sal[i] >= quantiles[i, k - 1]) | random_mask[i]

    preds = np.empty((n * points,))
    info = np.empty((n * points,))
    with single_threaded_blas():
        for start, stop in chunk_bounds(n * points, scorer.batch_size):
            flat = np.arange(start, stop)
            rows, steps = flat // points, flat % points
            chunk = np.stack([img[i] if k == points - 1 else _blurred(img[i], keep(i, k))
                              for i, k in zip(rows.tolist(), steps.tolist(), strict=True)])
            info[start:stop] = [_webp_size(im) for im in chunk]
            out = scorer.outputs(prep(chunk))
            preds[start:stop] = (out[np.arange(len(flat)), classes[rows]] if kind == "sic"
                                 else out.argmax(-1) == classes[rows])
    preds, info = preds.reshape(n, points), info.reshape(n, points)
    original, blurred = preds[:, -1], preds[:, 0]
    skipped = np.where(original < min_pred_value, "prediction under min_pred_value",
                       np.where(info[:, 0] >= info[:, -1], "blurred image not less informative",
                                np.where(blurred >= original, "blurred image not scored lower", "")))
    ok = skipped == ""
    with np.errstate(divide="ignore", invalid="ignore"):
        x_norm = np.clip((info[:, 1:-1] - info[:, :1]) / (info[:, -1:] - info[:, :1]), 0.0, 1.0)
        y_norm = np.clip((preds[:, 1:-1] - blurred[:, None]) / (original - blurred)[:, None], 0.0, 1.0)
    if keep_monotonous:
        y_norm = np.maximum.accumulate(np.maximum(y_norm, 0.0), axis=1)
    grid = np.append(np.linspace(0.0, 1.0, num_data_points, endpoint=False), 1.0)
    curves = np.full((n, len(grid)), np.nan)
    for i in np.nonzero(ok)[0]:  # piecewise-linear curve through the (information, prediction) points
        curves[i] = _interpolate(np.concatenate([x_norm[i], [0.0, 1.0]]), np.concatenate([y_norm[i], [0.0, 1.0]]),
                                 grid)
    area = ((curves[:, 1:] + curves[:, :-1]) * np.diff(grid)[None]).sum(1) / 2
    return CurveResult(kind, area, True,
                       {"targets": classes, "skipped": skipped, "predictions": preds, "information": info,
                        "random_mask": random_mask, "thresholds": thresholds},
                       curves=curves, fractions=grid)


def _interpolate(xs: np.ndarray, ys: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """``scipy.interpolate.interp1d(xs, ys)(grid)``, PAIR's interpolation (points sorted, ties kept)."""
    from scipy.interpolate import interp1d

    return np.asarray(interp1d(x=xs, y=ys)(grid), np.float64)
