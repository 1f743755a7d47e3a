"""The size at which a report shows an image: its natural size, at most 512 px, never below the model input."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The longest side of a picture in the report (pixels).
DISPLAY_LIMIT = 512


def display_size(natural: tuple[int, int], model: tuple[int, int], limit: int = DISPLAY_LIMIT) -> tuple[int, int]:
    """``(H, W)`` to show an image of ``natural`` size explained at ``model`` size.

    The natural aspect ratio is kept; the longest side is scaled down to ``limit``; an image
    smaller than the model input is scaled up until it covers the model input (the floor
    wins over the limit when the model input itself is larger).

    Example:
        >>> display_size((200, 300), (16, 16)), display_size((2000, 1000), (224, 224))
        ((200, 300), (512, 256))
        >>> display_size((8, 8), (32, 32))
        (32, 32)
    """
    h, w = (max(1, int(v)) for v in natural)
    mh, mw = (max(1, int(v)) for v in model)
    scale = min(1.0, limit / max(h, w))
    scale = max(scale, mh / h, mw / w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def read_display_image(path: str | Path, model: tuple[int, int], channels: int = 3,
                       limit: int = DISPLAY_LIMIT) -> np.ndarray:
    """The image at :func:`display_size` as uint8 ``(H, W, channels)`` (read with kerascope's checks).

    Example:
        >>> from kerascope.data import demo_images
        >>> read_display_image(demo_images()[0], (16, 16)).shape[2]
        3
    """
    from PIL import Image

    from kerascope.io.images import read_image

    with Image.open(path) as picture:
        width, height = picture.size
    return read_image(path, size=display_size((height, width), model, limit), channels=channels)


def format_rate(count: float, seconds: float, unit: str = "image") -> str:
    """A throughput people can read: ``"26.8 images/s"`` when fast, ``"63.0 s/image"`` when slower than one per second.

    Example:
        >>> format_rate(134, 5.0), format_rate(3, 189.0), format_rate(0, 0.0)
        ('26.8 images/s', '63.0 s/image', 'no images computed')
    """
    if count <= 0 or seconds <= 0:
        return f"no {unit}s computed"
    per_second = count / seconds
    if per_second >= 1:
        return f"{per_second:.1f} {unit}s/s"
    return f"{seconds / count:.1f} s/{unit}"
