"""Random transforms and regularisers that make feature visualisations readable.

Transforms (Lucid's ``standard_transforms``: jitter, scale, rotate, with grey padding) are drawn
per image and step on the host from the seed, and applied as one bilinear affine resampling per
image inside the compiled step (``keras.ops.image.affine_transform``). Regularisers are penalties
on the image, averaged per image so their weights do not depend on the image size.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

REGULARIZERS = ("l1", "tv", "blur")


def resolve_transforms(transforms: Any, shape: tuple[int, int, int]) -> dict[str, Any] | None:
    """The transform settings: ``"default"``, ``None`` (off) or a dict with ``jitter``, ``scale``, ``rotate``.

    ``jitter`` is the largest shift in pixels (default 1/16 of the shorter side, at least 1),
    ``scale`` the ``(low, high)`` zoom range (default ``(0.9, 1.1)``) and ``rotate`` the largest
    rotation in degrees (default 10).

    Example:
        >>> resolve_transforms("default", (64, 64, 3))
        {'jitter': 4, 'scale': (0.9, 1.1), 'rotate': 10.0}
        >>> resolve_transforms(None, (64, 64, 3)) is None
        True
    """
    if transforms is None:
        return None
    default = {"jitter": max(1, round(min(shape[:2]) / 16)), "scale": (0.9, 1.1), "rotate": 10.0}
    if isinstance(transforms, str) and transforms == "default":
        return default
    if isinstance(transforms, dict) and set(transforms) <= set(default):
        settings = {**default, **transforms}
        low, high = settings["scale"]
        if not 0 < low <= high or settings["jitter"] < 0 or settings["rotate"] < 0:
            raise ValueError(
                "Transform settings must have 0 < scale low <= high, jitter >= 0 and rotate >= 0. "
                f"Received: transforms={transforms!r}."
            )
        return {"jitter": settings["jitter"], "scale": (float(low), float(high)), "rotate": float(settings["rotate"])}
    raise ValueError(
        f"`transforms` must be 'default', None or a dict with keys {sorted(default)}. "
        f"Received: transforms={transforms!r}."
    )


def affine_matrices(settings: dict[str, Any], shape: tuple[int, int, int], steps: int,
                    rng: np.random.Generator) -> np.ndarray:
    """``(steps, 8)`` projective matrices (output pixel -> input pixel) of random jitter, zoom and rotation.

    Each matrix is ``input = R(-angle) / zoom (output - centre) + centre - shift``.

    Example:
        >>> m = affine_matrices({"jitter": 0, "scale": (1.0, 1.0), "rotate": 0.0}, (8, 8, 3), 2,
        ...                     np.random.default_rng(0))
        >>> (m[0] + 0.0).tolist()
        [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    """
    h, w = shape[:2]
    jitter = settings["jitter"]
    shift = rng.integers(-jitter, jitter + 1, size=(steps, 2)).astype(np.float64)
    low, high = settings["scale"]
    zoom = rng.uniform(low, high, size=steps)
    angle = np.deg2rad(rng.uniform(-settings["rotate"], settings["rotate"], size=steps))
    cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
    a0, a1 = np.cos(angle) / zoom, np.sin(angle) / zoom
    b0, b1 = -np.sin(angle) / zoom, np.cos(angle) / zoom
    a2 = cx - a0 * cx - a1 * cy - shift[:, 0]
    b2 = cy - b0 * cx - b1 * cy - shift[:, 1]
    zeros = np.zeros(steps)
    return np.stack([a0, a1, a2, b0, b1, b2, zeros, zeros], axis=1).astype(np.float32)


def apply_transforms(images: Any, matrices: Any) -> Any:
    """Resample ``images`` (rows, h, w, c) with one matrix per row; outside pixels are grey (0.5).

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).random((1, 4, 4, 1)).astype("float32")
        >>> identity = np.array([[1, 0, 0, 0, 1, 0, 0, 0]], "float32")
        >>> bool(np.allclose(keras.ops.convert_to_numpy(apply_transforms(x, identity)), x, atol=1e-6))
        True
    """
    return keras.ops.image.affine_transform(images, matrices, interpolation="bilinear", fill_mode="constant",
                                            fill_value=0.5)


def resolve_regularizers(regularizers: Any) -> dict[str, float]:
    """``None`` or a dict ``{"l1": weight, "tv": weight, "blur": weight}`` (any subset).

    Example:
        >>> resolve_regularizers({"tv": 0.5})
        {'tv': 0.5}
    """
    if regularizers is None:
        return {}
    if not isinstance(regularizers, dict) or not set(regularizers) <= set(REGULARIZERS):
        raise ValueError(
            f"`regularizers` must be None or a dict with keys among {list(REGULARIZERS)} (the weight of each "
            f"penalty). Received: regularizers={regularizers!r}."
        )
    out = {}
    for name, weight in regularizers.items():
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not math.isfinite(weight):
            raise ValueError(f"Regulariser weights must be finite numbers. Received: {name}={weight!r}.")
        out[name] = float(weight)
    return out


def penalty(images: Any, weights: dict[str, float]) -> Any:
    """Weighted sum of the regularisers of each image ``(rows,)`` (0 without any).

    * ``l1``: mean ``|x - 0.5|`` (distance from grey, Lucid's ``L1`` with a grey constant);
    * ``tv``: mean absolute difference of neighbouring pixels (total variation);
    * ``blur``: ``0.5`` mean ``(x - blur(x))**2`` with the blurred image held constant (Lucid's
      ``blur_input_each_step``: its gradient step equals blurring the image a little each step).

    Example:
        >>> import numpy as np
        >>> x = np.zeros((1, 2, 2, 1), "float32"); x[0, 0, 0, 0] = 1.0
        >>> float(keras.ops.convert_to_numpy(penalty(x, {"tv": 1.0}))[0])
        1.0
    """
    total: Any = 0.0
    axes = (1, 2, 3)
    if "l1" in weights:
        total = total + weights["l1"] * keras.ops.mean(keras.ops.abs(images - 0.5), axis=axes)
    if "tv" in weights:
        dy = keras.ops.mean(keras.ops.abs(images[:, 1:] - images[:, :-1]), axis=axes)
        dx = keras.ops.mean(keras.ops.abs(images[:, :, 1:] - images[:, :, :-1]), axis=axes)
        total = total + weights["tv"] * (dx + dy)
    if "blur" in weights:
        blurred = keras.ops.stop_gradient(keras.ops.average_pool(images, 3, strides=1, padding="same"))
        total = total + weights["blur"] * 0.5 * keras.ops.mean((images - blurred) ** 2, axis=axes)
    return total
