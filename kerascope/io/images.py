"""Reading images from files into model-ready arrays, with clear per-file errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.numeric.memory import available_memory

PREPROCESS = {
    "unit": "pixels / 255 -> [0, 1]",
    "raw": "pixels as floats in [0, 255]",
    "symmetric": "pixels / 127.5 - 1 -> [-1, 1] (MobileNet / Inception style)",
    "caffe": "BGR, ImageNet means subtracted (VGG / ResNet50 'caffe' style)",
    "torch": "[0, 1], then ImageNet mean / std per channel",
}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)
_CAFFE_MEAN_BGR = np.array([103.939, 116.779, 123.68], np.float32)


#: The largest image (pixels) kerascope decodes or resizes to: Pillow's decompression-bomb guard.
MAX_PIXELS = 89_478_485


class ImageReadError(ValueError):
    """An image file could not be read or decoded.

    Example:
        >>> str(ImageReadError("x.png: not an image"))
        'x.png: not an image'
    """


def read_image(path: str | Path, size: tuple[int, int] | None = None, channels: int = 3) -> np.ndarray:
    """Read an image as uint8 ``(H, W, channels)``, resized (bilinear) to ``size=(H, W)`` if given.

    Images with more than 8 bits per value are scaled into the 8-bit range models trained on ordinary
    images expect (see :func:`to_8bit`): 16-bit values (PNG, TIFF) by ``255 / 65535``, float images
    (TIFF) by 255 when their values lie in ``[0, 1]`` and as they are in ``(1, 255]``; a float image with
    other values (negative, above 255, NaN) is refused, since its scale cannot be told.

    Example:
        >>> from kerascope.data import demo_images
        >>> read_image(demo_images()[0], size=(32, 32)).shape
        (32, 32, 3)
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if channels not in (1, 3, 4):
        raise ValueError(f"`channels` must be 1, 3 or 4. Received: channels={channels}.")
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise ImageReadError(
                    f"{path}: image too large ({width}x{height} = {width * height} pixels; the limit is "
                    f"{MAX_PIXELS} pixels, a guard against decompression bombs); skipped."
                )
            image = to_8bit(image, path).convert({1: "L", 3: "RGB", 4: "RGBA"}[channels])
            if size is not None:
                image = image.resize((int(size[1]), int(size[0])), Image.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
    except ImageReadError:
        raise
    except FileNotFoundError as error:
        raise ImageReadError(f"{path}: file not found.") from error
    except Image.DecompressionBombError as error:
        raise ImageReadError(f"{path}: image too large, refused as a possible decompression bomb ({error}).") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ImageReadError(f"{path}: not a readable image ({type(error).__name__}: {error}).") from error
    if array.ndim == 2:
        array = array[..., None]
    return array


#: Single-channel Pillow modes holding more than 8 bits per value, and the largest value of their range.
_WIDE_MODES = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": None, "F": None}


def to_8bit(image: Any, path: object = "image") -> Any:
    """A Pillow image with more than 8 bits per value as an 8-bit grayscale ("L") image, scaled (not clipped).

    - 16-bit (``I;16*``): ``round(value * 255 / 65535)``.
    - 32-bit integers (``I``): as 16-bit when the values exceed 255, else as they are.
    - float (``F``): ``round(value * 255)`` when every value lies in ``[0, 1]``; as they are in ``[0, 255]``;
      anything else (negative values, values above 255, NaN) raises :class:`ImageReadError`.

    Other images are returned unchanged.

    Example:
        >>> import numpy as np
        >>> from PIL import Image
        >>> wide = Image.fromarray(np.array([[0, 32768, 65535]], np.uint16))
        >>> np.asarray(to_8bit(wide)).tolist()
        [[0, 128, 255]]
        >>> np.asarray(to_8bit(Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32)))).tolist()
        [[0, 128, 255]]
    """
    from PIL import Image

    if image.mode not in _WIDE_MODES:
        return image
    values = np.asarray(image, np.float64)
    if not np.all(np.isfinite(values)):
        raise ImageReadError(f"{path}: a float image with NaN or infinite values; cannot be read as an image.")
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if image.mode.startswith("I;16") or (image.mode == "I" and 255 < high <= 65535 and low >= 0):
        scale = 255.0 / 65535.0
    elif low >= 0 and high <= 1.0 and image.mode == "F":
        scale = 255.0
    elif low >= 0 and high <= 255.0:
        scale = 1.0
    else:
        kind = "float" if image.mode == "F" else "32-bit integer"
        raise ImageReadError(
            f"{path}: a {kind} image with values in [{low:g}, {high:g}]; kerascope reads float images in [0, 1] "
            "or [0, 255] and integer images of 8 or 16 bits, and cannot tell this one's scale. Convert it "
            "(e.g. to 8- or 16-bit), or pass the preprocessed array to the Python API."
        )
    return Image.fromarray(np.clip(np.rint(values * scale), 0, 255).astype(np.uint8), mode="L")


def preprocess(pixels: np.ndarray, mode: str = "unit") -> np.ndarray:
    """Turn uint8 pixels ``(..., H, W, C)`` into model inputs; see ``PREPROCESS`` for the modes.

    Example:
        >>> import numpy as np
        >>> preprocess(np.full((1, 1, 3), 255, np.uint8), "symmetric").tolist()
        [[[1.0, 1.0, 1.0]]]
    """
    x = np.asarray(pixels, np.float32)
    if mode == "unit":
        return x / 255.0
    if mode == "raw":
        return x
    if mode == "symmetric":
        return x / 127.5 - 1.0
    if mode == "torch":
        return (x / 255.0 - _MEAN[: x.shape[-1]]) / _STD[: x.shape[-1]]
    if mode == "caffe":
        return x[..., ::-1] - _CAFFE_MEAN_BGR[: x.shape[-1]]
    raise ValueError(f"Unknown preprocessing. Received: preprocess={mode!r}. Expected one of {list(PREPROCESS)}.")


@dataclass
class ImageBatch:
    """Images loaded for a model: inputs, the displayable pixels, and per-file errors.

    Example:
        >>> b = ImageBatch(np.zeros((0, 2, 2, 3)), np.zeros((0, 2, 2, 3), np.uint8), [])
        >>> len(b)
        0
    """

    inputs: np.ndarray
    pixels: np.ndarray
    paths: list[Path]
    errors: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.paths)


def model_image_size(model: object) -> tuple[int | None, int | None, int]:
    """``(H, W, C)`` expected by an image model (``None`` where any size is accepted).

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((32, 24, 3)), keras.layers.Flatten()])
        >>> model_image_size(m)
        (32, 24, 3)
    """
    try:
        shape = tuple(model.inputs[0].shape)  # type: ignore[attr-defined]
    except Exception as error:
        raise ValueError(
            "Cannot tell the model's image size (subclassed model without a known input). "
            "Pass `size=(H, W)` explicitly (CLI: --size H W)."
        ) from error
    if len(shape) != 4:
        raise ValueError(
            f"The model's first input is not an image batch (N, H, W, C). Received input shape: {shape}."
        )
    return shape[1], shape[2], int(shape[3] or 3)


def load_images(
    paths: Sequence[str | Path],
    size: tuple[int, int],
    channels: int = 3,
    mode: str = "unit",
) -> ImageBatch:
    """Load images for a model; unreadable files are reported in ``errors`` and skipped.

    Example:
        >>> from kerascope.data import demo_images
        >>> batch = load_images(demo_images()[:2] + ["missing.png"], size=(64, 64))
        >>> batch.inputs.shape, list(batch.errors)
        ((2, 64, 64, 3), ['missing.png'])
    """
    pixels, ok, errors = [], [], {}
    for path in paths:  # file I/O per file; the explanation itself is batched
        try:
            pixels.append(read_image(path, size, channels))
            ok.append(Path(path))
        except ImageReadError as error:
            errors[str(path)] = str(error)
        except Exception as error:  # one bad file never stops the others
            if isinstance(error, MemoryError):
                errors[str(path)] = f"{path}: not enough memory to decode this image; skipped."
            else:
                errors[str(path)] = f"{path}: {type(error).__name__}: {error}"
    h, w = size
    stacked = np.stack(pixels) if pixels else np.zeros((0, h, w, channels), np.uint8)
    return ImageBatch(preprocess(stacked, mode), stacked, ok, errors)


def check_image_size(
    size: object, count: int = 1, channels: int = 3, copies: int = 4, available: int | None = None
) -> tuple[int, int]:
    """Validate ``size=(H, W)`` before anything is allocated; returns it as two ints.

    Refuses non-positive sizes, sizes over :data:`MAX_PIXELS`, and sizes whose arrays for
    ``count`` images (uint8 pixels plus ``copies`` float32 arrays: inputs, attributions, ...)
    cannot fit in ``available`` bytes (default: the memory available now).

    Example:
        >>> check_image_size([32, 48])
        (32, 48)
        >>> check_image_size((0, 0))
        Traceback (most recent call last):
        ValueError: `size` must be two positive integers (H, W). Received: size=(0, 0).
        >>> check_image_size((4000, 4000), count=100, available=10**9)
        Traceback (most recent call last):
        ValueError: size=(4000, 4000) needs about 81.6 GB for 100 image(s) ...
    """
    try:
        h, w = (int(v) for v in size)  # type: ignore[union-attr]
        valid = [int(v) for v in size] == [float(v) for v in size]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        h = w = 0
        valid = False
    if not valid or h < 1 or w < 1:
        shown = tuple(size) if isinstance(size, (list, tuple)) else size
        raise ValueError(f"`size` must be two positive integers (H, W). Received: size={shown}.")
    if h * w > MAX_PIXELS:
        raise ValueError(
            f"`size` is too large. Received: size=({h}, {w}) = {h * w} pixels per image; the limit is "
            f"{MAX_PIXELS} pixels. Use a size close to the model's input size (CLI: --size H W)."
        )
    needed = count * h * w * channels * (1 + 4 * copies)
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        raise ValueError(
            f"size=({h}, {w}) needs about {needed / 1e9:.1f} GB for {count} image(s) but only "
            f"{available / 1e9:.1f} GB of memory is available. Use a smaller size or fewer images per run "
            "(`kerascope batch` streams any number of images in fixed memory)."
        )
    return h, w


def find_images(root: str | Path) -> list[Path]:
    """All image files under ``root`` (recursively), sorted; a file path returns itself.

    Example:
        >>> from kerascope.data import demo_images
        >>> len(find_images(demo_images()[0].parent)) == len(demo_images())
        True
    """
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
