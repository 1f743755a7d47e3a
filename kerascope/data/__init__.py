"""Bundled data: a synthetic shapes data set with known object locations, and the demo model.

The images are generated (nothing is downloaded): a textured, noisy
background with one coloured shape (circle, square, triangle or cross) at a
random place. The mask of the shape is known exactly, which is what the
localisation metrics and the demo need.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CLASS_NAMES = ("circle", "square", "triangle", "cross")
_HERE = Path(__file__).parent


def _shape_mask(kind: int, size: int, cy: float, cx: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    dy, dx = yy - cy, xx - cx
    if kind == 0:
        return dy**2 + dx**2 <= r**2
    if kind == 1:
        return (np.abs(dy) <= r * 0.85) & (np.abs(dx) <= r * 0.85)
    if kind == 2:
        # upward triangle: inside if below the two slanted edges and above the base
        top = cy - r
        return (dy <= r * 0.8) & (yy >= top) & (np.abs(dx) <= (yy - top) * 0.62)
    arm = r * 0.32
    return ((np.abs(dy) <= arm) & (np.abs(dx) <= r)) | ((np.abs(dx) <= arm) & (np.abs(dy) <= r))


def generate_shapes(
    n: int, size: int = 64, seed: int = 0, classes: tuple[int, ...] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Generate ``n`` RGB images in [0, 1] with one shape each, their labels and masks.

    Returns ``(images (n, size, size, 3) float32, labels (n,) int64, masks (n, size, size) bool)``.

    Example:
        >>> x, y, m = generate_shapes(2, size=32, seed=1)
        >>> x.shape, y.shape, m.shape, bool(m[0].any())
        ((2, 32, 32, 3), (2,), (2, 32, 32), True)
    """
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), np.float32)
    labels = np.empty((n,), np.int64)
    masks = np.empty((n, size, size), bool)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for i in range(n):  # data generation, not explanation: one image at a time is fine
        kind = int(rng.integers(len(CLASS_NAMES))) if classes is None else int(classes[i % len(classes)])
        r = rng.uniform(0.12, 0.2) * size
        cy, cx = rng.uniform(r + 1, size - r - 1, size=2)
        mask = _shape_mask(kind, size, cy, cx, r)
        freq = rng.uniform(2, 6, size=2)
        phase = rng.uniform(0, 2 * np.pi, size=2)
        texture = 0.5 + 0.25 * np.sin(2 * np.pi * (freq[0] * yy + phase[0])) * np.cos(2 * np.pi * (freq[1] * xx + phase[1]))
        background = texture[..., None] * rng.uniform(0.3, 0.8, size=3) + rng.normal(0, 0.06, (size, size, 3))
        colour = rng.uniform(0.0, 1.0, size=3)
        colour[rng.integers(3)] = rng.uniform(0.85, 1.0)
        image = np.where(mask[..., None], colour + rng.normal(0, 0.03, (size, size, 3)), background)
        images[i] = np.clip(image, 0.0, 1.0)
        labels[i] = kind
        masks[i] = mask
    return images, labels, masks


def demo_model_path() -> Path:
    """Path of the bundled demo model (a small CNN trained on :func:`generate_shapes`).

    Example:
        >>> demo_model_path().name
        'shapes_cnn.keras'
    """
    return _HERE / "shapes_cnn.keras"


def demo_images() -> list[Path]:
    """Paths of the bundled demo images (PNG, 64x64).

    Example:
        >>> len(demo_images()) >= 4
        True
    """
    return sorted((_HERE / "images").glob("*.png"))


def demo_metadata() -> dict:
    """Class names, and per bundled image its label and object mask bounding box.

    Example:
        >>> demo_metadata()["class_names"][0]
        'circle'
    """
    return json.loads((_HERE / "demo.json").read_text())


def demo_masks() -> dict[str, np.ndarray]:
    """Ground-truth object masks of the bundled images, keyed by file name.

    Example:
        >>> m = demo_masks()
        >>> next(iter(m.values())).dtype
        dtype('bool')
    """
    with np.load(_HERE / "demo_masks.npz") as data:
        return {key: data[key].astype(bool) for key in data.files}
