"""Heatmaps and overlays: display-only post-processing of raw attributions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.numeric.reduce import REDUCTIONS, reduce_channels
from kerascope.numeric.resize import upsample
from kerascope.viz.colours import DIMMED, ColourScale, colour_scale, reduce_for_display, signed_opacity


def heatmap(attribution: np.ndarray, *, reduce: str = "abs_sum", percentile: float = 99.5) -> np.ndarray:
    """Turn one raw attribution (``(H, W)`` or ``(H, W, C)``) into a 2-D map in [0, 1] for display.

    Channels are reduced with ``reduce`` (``"abs_sum"``, ``"sum"``, ``"max_abs"``, ``"positive"``);
    values are clipped at the given percentile then divided by it.

    Example:
        >>> import numpy as np
        >>> h = heatmap(np.array([[0.0, 1.0], [2.0, 4.0]]), percentile=100)
        >>> h.tolist()
        [[0.0, 0.25], [0.5, 1.0]]
    """
    a = np.asarray(attribution, np.float32)
    if a.ndim == 3:
        a = reduce_channels(a, reduce)
    elif reduce not in REDUCTIONS:
        raise ValueError(f"Unknown channel reduction. Received: reduce={reduce!r}. Expected one of {REDUCTIONS}.")
    if a.ndim != 2:
        raise ValueError(f"Expected a (H, W) or (H, W, C) attribution. Received: shape={a.shape}.")
    a = np.maximum(a, 0) if reduce == "positive" else np.abs(a)
    top = np.percentile(a, percentile) if a.size else 0.0
    if not np.isfinite(top) or top <= 0:
        return np.zeros_like(a)
    return np.clip(a / top, 0.0, 1.0)


def to_display(image: np.ndarray) -> np.ndarray:
    """Scale an image (uint8, [0, 1], [0, 255] or any float range) to float RGB in [0, 1].

    Example:
        >>> import numpy as np
        >>> to_display(np.full((1, 1, 3), 255, np.uint8)).tolist()
        [[[1.0, 1.0, 1.0]]]
    """
    x = np.asarray(image)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    else:
        x = x.astype(np.float32)
        lo, hi = float(x.min()), float(x.max())
        if lo < 0.0 or hi > 1.0:
            x = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    if x.ndim == 2:
        x = x[..., None]
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    return x[..., :3]


def _resize(map2d: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """One 2-D map resized bilinearly for display (the numpy resizer every package uses)."""
    if map2d.shape == shape:
        return map2d
    return upsample(np.asarray(map2d, np.float32)[None], shape)[0]


def _blend(base: np.ndarray, colours: np.ndarray, opacity: Any) -> np.ndarray:
    """``colours`` laid over ``base`` (values in [0, 1]) with ``opacity`` (a number or per pixel), as RGB uint8."""
    return np.round(np.clip((1 - opacity) * base + opacity * colours, 0, 1) * 255).astype(np.uint8)


def check_overlay_options(cmap: str | None, alpha: float) -> None:
    """Raise ``ValueError`` for an unknown matplotlib colormap or an opacity outside [0, 1] (checked before any work).

    ``cmap=None`` means the automatic choice (:mod:`kerascope.viz.colours`).

    Example:
        >>> check_overlay_options("viridis", 0.5)
        >>> check_overlay_options(None, 0.5)
        >>> check_overlay_options("nosuchcmap", 0.5)
        Traceback (most recent call last):
        ValueError: Unknown colormap. Received: cmap='nosuchcmap'. ...
    """
    import matplotlib

    if cmap is not None and (not isinstance(cmap, str) or cmap not in matplotlib.colormaps):
        close = [n for n in sorted(matplotlib.colormaps) if not n.endswith("_r")][:12]
        raise ValueError(
            f"Unknown colormap. Received: cmap={cmap!r}. Expected a matplotlib colormap name, e.g. "
            f"{', '.join(close)} (all: `matplotlib.colormaps`)."
        )
    if not (isinstance(alpha, (int, float)) and 0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"The overlay opacity must lie in [0, 1]. Received: alpha={alpha!r}.")


def overlay(
    image: np.ndarray, attribution: np.ndarray, *, cmap: str = "jet", alpha: float = 0.5, reduce: str = "abs_sum"
) -> np.ndarray:
    """Blend a colour-mapped heatmap of ``attribution`` over ``image``; returns RGB uint8.

    Example:
        >>> import numpy as np
        >>> overlay(np.zeros((4, 4, 3)), np.ones((4, 4))).shape
        (4, 4, 3)
    """
    import matplotlib

    base = to_display(image)
    h = heatmap(attribution, reduce=reduce)
    h = _resize(h, base.shape[:2])
    colours = matplotlib.colormaps[cmap](h)[..., :3]
    return _blend(base, colours, alpha)


def save_overlay(
    path: str | Path,
    image: np.ndarray,
    attribution: np.ndarray,
    *,
    cmap: str = "jet",
    alpha: float = 0.5,
    reduce: str = "abs_sum",
    scale: int = 1,
) -> Path:
    """Write :func:`overlay` as a PNG (optionally enlarged ``scale`` times); returns the path.

    Example:
        >>> import numpy as np, tempfile, os
        >>> p = save_overlay(os.path.join(tempfile.mkdtemp(), "o.png"), np.zeros((4, 4, 3)), np.ones((4, 4)))
        >>> p.suffix
        '.png'
    """
    return save_png(overlay(image, attribution, cmap=cmap, alpha=alpha, reduce=reduce), path, scale=scale)


def save_png(picture: Any, path: str | Path, *, scale: int = 1) -> Path:
    """Save a Pillow image or a uint8 array as PNG (enlarged ``scale`` times, nearest neighbour), creating
    the folder; through a temporary file renamed into place: a failed write (a full disk) leaves no partial
    or empty file at ``path``.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from PIL import Image
        >>> save_png(Image.fromarray(np.zeros((2, 2), np.uint8)), os.path.join(tempfile.mkdtemp(), "a.png")).name
        'a.png'
        >>> Image.open(save_png(np.zeros((2, 3, 3), np.uint8), os.path.join(tempfile.mkdtemp(), "new", "b.png"),
        ...                     scale=2)).size
        (6, 4)
    """
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(picture, np.ndarray):
        picture = Image.fromarray(picture)
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        picture.save(tmp, format="PNG")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def scaled_overlay(image: np.ndarray, attribution: np.ndarray, scale: ColourScale, *, alpha: float = 0.6) -> np.ndarray:
    """The attribution on ``scale`` blended over a grey copy of ``image`` (RGB uint8, the image's size).

    The map is resized bilinearly to the image (which may be larger than the model input);
    the image is shown in grey so that the only colours are the map's, as on the colour bar.
    A signed map's colour is laid over the image dimmed into :data:`~kerascope.viz.colours.DIMMED`
    with an opacity growing with its magnitude
    (:func:`~kerascope.viz.colours.signed_opacity`): where the map is zero the dim grey image shows
    uncoloured, so "no effect" is never a light part of the picture.

    Example:
        >>> from kerascope.viz.colours import colour_scale
        >>> s = colour_scale(np.array([[-1.0, 1.0]]), "saliency")
        >>> o = scaled_overlay(np.zeros((2, 4, 3)), np.array([[-1.0, 1.0]]), s, alpha=1.0)
        >>> o.shape, o[0, 0].tolist(), o[0, -1].tolist()
        ((2, 4, 3), [5, 48, 97], [103, 0, 31])
    """
    import matplotlib

    base = to_display(image)
    grey = base @ np.array([0.299, 0.587, 0.114])
    values = reduce_for_display(attribution, scale.signed).astype(np.float32)
    values = _resize(values, grey.shape[:2])
    position = scale.normalise(values)
    colours = matplotlib.colormaps[scale.cmap](position)[..., :3]
    if scale.signed:
        grey = DIMMED[0] + (DIMMED[1] - DIMMED[0]) * grey
        opacity = signed_opacity(position, alpha)[..., None]
    else:
        opacity = alpha
    return _blend(grey[..., None], colours, opacity)


def save_scaled_overlay(
    path: str | Path,
    image: np.ndarray,
    attribution: np.ndarray,
    *,
    method: str = "",
    params: dict | None = None,
    cmap: str | None = None,
    alpha: float = 0.6,
    limit: float | None = None,
    kind: str = "image",
) -> ColourScale:
    """Write the overlay of :func:`scaled_overlay` as a PNG at the image's size.

    The colour scale follows the method's sign convention (diverging and centred at zero for
    signed methods, sequential for unsigned ones); it is returned so that the report can draw
    its colour bar. ``limit`` fixes the scale's limit (a scale shared by all maps of a method,
    :func:`kerascope.viz.colours.shared_limit`); ``kind`` words the quantity (``"layer"`` for maps
    of an inner layer).

    Example:
        >>> import numpy as np, tempfile, os
        >>> s = save_scaled_overlay(os.path.join(tempfile.mkdtemp(), "o.png"), np.zeros((8, 8, 3)),
        ...                         np.random.randn(4, 4, 3), method="saliency")
        >>> s.cmap, s.low == -s.high, s.quantity
        ('RdBu_r', True, 'd score / d pixel')
    """
    scale = colour_scale(attribution, method, params, cmap=cmap, limit=limit, alpha=alpha, kind=kind)
    save_png(scaled_overlay(image, attribution, scale, alpha=alpha), path)
    return scale
