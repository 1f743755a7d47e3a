"""Building the benchmark's ``.npz`` (images, masks, labels) from a folder of images and a folder of masks.

Each image ``IMAGES/a/cat.jpg`` is paired with the mask of the same relative path and stem in
``MASKS`` (any image suffix: ``MASKS/a/cat.png``); a mask pixel is part of the object when its grey
level is above ``threshold``. Labels come from a CSV of ``name,class`` rows (the name is the image's
relative path, its file name or its stem) or, without a file, are left out (the benchmark then
explains the predicted classes).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.io.images import find_images, preprocess, read_image


def _key(path: Path, root: Path) -> str:
    return str(path.relative_to(root).with_suffix("")).replace("\\", "/")


def read_labels(path: str | Path, class_names: list[str] | None = None) -> dict[str, int]:
    """``name -> class index`` from a CSV of ``name,class`` rows (a header row is skipped).

    A class is an index, or a name from ``class_names``.

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "labels.csv")
        >>> _ = open(f, "w").write("image,class\\ncat.png,1\\ndog,0\\n")
        >>> read_labels(f)
        {'cat.png': 1, 'dog': 0}
    """
    labels: dict[str, int] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle), 1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 2:
                raise ValueError(f"{path}, line {number}: expected 'name,class'. Received: {','.join(row)!r}.")
            name, value = row[0].strip(), row[1].strip()
            if value.lstrip("-").isdigit():
                labels[name] = int(value)
            elif class_names and value in class_names:
                labels[name] = class_names.index(value)
            elif number == 1:
                continue  # a header row
            else:
                known = f" Known class names: {class_names}." if class_names else " Use class indices (0, 1, ...)."
                raise ValueError(f"{path}, line {number}: unknown class. Received: {value!r}.{known}")
    return labels


def build_evaluation_data(
    images_dir: str | Path,
    masks_dir: str | Path,
    *,
    size: tuple[int, int] | None = None,
    channels: int = 3,
    mode: str = "unit",
    labels: str | Path | None = None,
    class_names: list[str] | None = None,
    threshold: int = 127,
) -> dict[str, Any]:
    """Arrays for ``kerascope evaluate``: ``images`` (N, H, W, C) float32, ``masks`` (N, H, W) bool, ``labels``.

    Images are resized (bilinear) and masks (nearest) to ``size`` (default: the first image's size),
    and the images preprocessed with ``mode`` (see :data:`kerascope.io.images.PREPROCESS`).
    Returns the arrays and ``names`` (the images' relative paths). Every problem (an image without
    a mask, an empty mask, an unreadable file, an image without a label) is listed in one error.

    Example:
        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> from PIL import Image
        >>> root = Path(tempfile.mkdtemp())
        >>> for folder in ("images", "masks"):
        ...     (root / folder).mkdir()
        >>> Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(root / "images" / "a.jpg")
        >>> mask = np.zeros((8, 8), np.uint8); mask[2:6, 2:6] = 255
        >>> Image.fromarray(mask).save(root / "masks" / "a.png")
        >>> data = build_evaluation_data(root / "images", root / "masks", size=(4, 4))
        >>> data["images"].shape, data["masks"].shape, int(data["masks"].sum())
        ((1, 4, 4, 3), (1, 4, 4), 4)
    """
    from PIL import Image

    images_root, masks_root = Path(images_dir), Path(masks_dir)
    for name, folder in (("IMAGES_DIR", images_root), ("MASKS_DIR", masks_root)):
        if not folder.is_dir():
            raise FileNotFoundError(f"No such folder. Received: {name}={str(folder)!r}.")
    image_files = find_images(images_root)
    if not image_files:
        raise ValueError(f"No images found. Received: IMAGES_DIR={str(images_root)!r} (searched recursively).")
    masks_by_key: dict[str, Path] = {}
    for mask in find_images(masks_root):
        masks_by_key.setdefault(_key(mask, masks_root), mask)
    table = read_labels(labels, class_names) if labels is not None else None
    problems: list[str] = []
    pixels, masks, classes, names = [], [], [], []
    for image_file in image_files:
        key = _key(image_file, images_root)
        mask_file = masks_by_key.get(key)
        if mask_file is None:
            problems.append(f"{key}: no mask named {key}.* in {masks_root}")
            continue
        if table is not None:
            rel = str(image_file.relative_to(images_root)).replace("\\", "/")
            found = next((table[k] for k in (rel, image_file.name, key, image_file.stem) if k in table), None)
            if found is None:
                problems.append(f"{rel}: no label in {labels}")
                continue
            classes.append(found)
        try:
            if size is None:
                with Image.open(image_file) as first:
                    size = (first.height, first.width)
            picture = read_image(image_file, size, channels)
            with Image.open(mask_file) as opened:
                grey = opened.convert("L").resize((size[1], size[0]), Image.NEAREST)
            mask = np.asarray(grey) > threshold
        except (ValueError, OSError) as error:
            problems.append(str(error))
            continue
        if not mask.any():
            problems.append(f"{key}: the mask {mask_file.name} marks no pixel above grey level {threshold}")
            continue
        pixels.append(picture)
        masks.append(mask)
        names.append(str(image_file.relative_to(images_root)))
    if problems:
        shown = "; ".join(problems[:10]) + (f"; ... ({len(problems) - 10} more)" if len(problems) > 10 else "")
        raise ValueError(f"Cannot build the evaluation data: {len(problems)} problem(s): {shown}.")
    data: dict[str, Any] = {
        "images": preprocess(np.stack(pixels), mode).astype(np.float32),
        "masks": np.stack(masks),
        "names": np.array(names),
    }
    if table is not None:
        data["labels"] = np.asarray(classes, np.int64)
    return data
