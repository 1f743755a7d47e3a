"""CRAFT: concept recursive activation factorisation (Fel et al. 2023), the extraction and importance steps.

The layer's (non-negative) activations of many image crops are factorised, ``A ~ U W``: the rows
of ``W`` are the concepts (directions in the layer's channel space), ``U`` how much of each concept
each crop holds. A concept's importance for a class is its total Sobol index: the concept
coefficients of each image are multiplied by random masks, the activation rebuilt as
``(U * mask) W`` replaces the layer's output (the model is never changed: a scoped patch of the
layer's call) and the variance of the class score explained by each concept's mask is estimated
(Jansen's estimator), averaged over the images, as Xplique's ``Craft.estimate_importance``.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerascope.concepts.nmf import nmf, nnls
from kerascope.core.engine import engine_for
from kerascope.core.inputs import Inputs
from kerascope.numeric.chunking import chunk_ranges
from kerascope.numeric.resize import resize_maps


def _replace_output(output: Any, rebuilt: Any) -> Any:
    """The layer's output replaced by the rebuilt activation rows (module level: the scorer cache reuses it)."""
    return keras.ops.cast(rebuilt, output.dtype)


def crop_boxes(image_size: tuple[int, int], patch_size: int) -> np.ndarray:
    """``(boxes, 2)`` top-left corners of the square crops of one image (stride 80% of ``patch_size``, as Xplique).

    Example:
        >>> crop_boxes((8, 8), 4).tolist()
        [[0, 0], [0, 3], [3, 0], [3, 3]]
    """
    h, w = image_size
    if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)) or not 1 <= patch_size <= min(h, w):
        raise ValueError(
            f"`patch_size` must be between 1 and the image size {min(h, w)}. Received: patch_size={patch_size!r}."
        )
    stride = max(1, int(patch_size * 0.8))
    return np.array([(t, left) for t in range(0, h - patch_size + 1, stride)
                     for left in range(0, w - patch_size + 1, stride)], np.int64)


def crop_rows(images: Any, patch_size: int, rows: np.ndarray) -> np.ndarray:
    """The crops of flat indices ``rows`` (``image * boxes + box``) resized to the image size, float32.

    Only the images those rows come from are read, so a chunk of rows costs a chunk of memory.

    Example:
        >>> x = np.arange(2 * 8 * 8 * 1, dtype="float32").reshape(2, 8, 8, 1)
        >>> bool(np.array_equal(crop_rows(x, 8, np.array([1]))[0], x[1]))
        True
    """
    n, h, w, c = images.shape
    boxes = crop_boxes((h, w), patch_size)
    image, box = np.divmod(np.asarray(rows, np.int64), len(boxes))
    out = np.empty((len(image), patch_size, patch_size, c), np.float32)
    for i, (picture, (top, left)) in enumerate(zip(image, boxes[box])):  # gather: one slice per crop of the chunk
        out[i] = images[picture, top:top + patch_size, left:left + patch_size]
    return resize_maps(out, (h, w)).astype(np.float32)


def crops(images: np.ndarray, patch_size: int) -> np.ndarray:
    """Every square crop of ``patch_size`` (stride 80% of it, as Xplique) resized back to the image size.

    All at once: :class:`CRAFT` itself reads them ``batch_size`` at a time with :func:`crop_rows`.

    Example:
        >>> crops(np.zeros((2, 8, 8, 3)), 4).shape
        (8, 8, 8, 3)
    """
    images = np.asarray(images)
    boxes = crop_boxes(images.shape[1:3], patch_size)
    return crop_rows(images, patch_size, np.arange(len(images) * len(boxes)))


def jansen_total_indices(masks_a: np.ndarray, f_a: np.ndarray, f_b: np.ndarray, f_c: np.ndarray) -> np.ndarray:
    """Total Sobol indices ``mean((f(A) - f(A_B^i))^2) / (2 Var)`` from the three designs (Jansen 1999).

    ``f_a``, ``f_b`` are ``(designs,)``, ``f_c`` ``(k, designs)`` (column ``i`` of ``A`` taken from ``B``).

    Example:
        >>> rng = np.random.default_rng(0); a, b = rng.uniform(size=(2, 4000, 2))
        >>> f = lambda m: 3 * m[:, 0] + m[:, 1]
        >>> c = np.stack([np.where(np.arange(2) == i, b, a) for i in range(2)])
        >>> jansen_total_indices(a, f(a), f(b), np.stack([f(ci) for ci in c])).round(1).tolist()
        [0.9, 0.1]
    """
    variance = np.var(np.concatenate([f_a, f_b]), ddof=1)
    if variance <= 0:
        return np.zeros(len(f_c))
    return np.mean((f_a[None] - f_c) ** 2, axis=1) / (2 * variance)


class CRAFT:
    """Concepts of a layer as a non-negative factorisation of its activations (Fel et al. 2023).

    Args:
        model: a Keras 3 model.
        layer: path of a layer with non-negative activations (after a ReLU).
        n_concepts: number of concepts ``k``.
        patch_size: factorise the activations of square crops of this size (resized to the input
            size, 80% stride) instead of whole inputs; ``None``: one row per input.
        seed: seeds the factorisation and the Sobol designs.
        designs: Monte-Carlo designs of the Sobol estimate per image (Xplique's ``nb_design``, 32).
        batch_size: rows per compiled call.

    After :meth:`fit`: ``concepts`` ``(k, channels)`` (unit rows), ``importances`` ``(k,)`` and
    ``crop_coefficients`` ``(crops, k)`` (each concept's best crops: :meth:`best_crops`).

    Cost: one forward pass per crop, a factorisation, and ``designs x (k + 2)`` forward passes per image.
    Memory is bounded by ``batch_size``: crops, activations and Sobol designs are made ``batch_size``
    rows at a time; kept are the ``(crops, channels)`` matrix that is factorised and a reference
    to the inputs (the crops are cut again when shown).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(6, 3, activation="relu", name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).uniform(size=(4, 8, 8, 3))
        >>> c = ks.CRAFT(m, layer="c", n_concepts=2, patch_size=4).fit(x, targets=0)
        >>> c.concepts.shape, c.importances.shape, c.transform(x).shape
        ((2, 6), (2,), (4, 6, 6, 2))
    """

    def __init__(self, model: keras.Layer, layer: str | keras.Layer, n_concepts: int = 10,
                 patch_size: int | None = None, seed: int = 0, *, designs: int = 32, batch_size: int = 64) -> None:
        if isinstance(n_concepts, bool) or not isinstance(n_concepts, int) or n_concepts < 1:
            raise ValueError(f"`n_concepts` must be a positive int. Received: n_concepts={n_concepts!r}.")
        if isinstance(designs, bool) or not isinstance(designs, int) or designs < 2:
            raise ValueError(f"`designs` must be an int >= 2. Received: designs={designs!r}.")
        self.model = model
        self.engine = engine_for(model)
        self.layer = self.engine.resolve_layers([layer])[0]
        self.layer_path = self.engine.path_of(self.layer)
        self.n_concepts, self.patch_size, self.seed = n_concepts, patch_size, seed
        self.designs, self.batch_size = designs, batch_size
        self.concepts: np.ndarray | None = None
        self.importances: np.ndarray | None = None

    def activations(self, inputs: Any) -> np.ndarray:
        """The layer's activations ``(N, ..., channels)``, checked non-negative.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu", name="h")])
            >>> CRAFT(m, "h", 2).activations(np.ones((2, 3))).shape
            (2, 4)
        """
        out = np.asarray(engine_for(self.model, output_layer=self.layer_path).forward(inputs, self.batch_size))
        if out.ndim < 2:
            raise ValueError(
                f"Layer {self.layer_path!r} has no channel axis (output shape {out.shape}). Received: "
                f"layer={self.layer_path!r}. Pick a layer whose output is (batch, ..., channels)."
            )
        if out.min() < -1e-6:
            raise ValueError(
                f"Layer {self.layer_path!r} has negative activations (down to {out.min():.3g}), and the non-negative "
                f"factorisation needs non-negative ones. Received: layer={self.layer_path!r}. Pick a layer after a "
                "ReLU (e.g. the activation layer or a Conv2D with activation='relu')."
            )
        return np.maximum(out, 0.0)

    def _row_count(self) -> int:
        """Rows of the factorisation: crops of every input (``patch_size``) or the inputs."""
        if self.patch_size is None:
            return len(self._inputs)
        return len(self._inputs) * len(crop_boxes(self._inputs.shape[1:3], self.patch_size))

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """The factorised rows of ``indices``: crops (``patch_size``, resized) or inputs, float32.

        Rebuilt on demand from the inputs given to :meth:`fit` (a reference to them is kept, no copy).

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="c"),
            ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
            >>> c = CRAFT(m, "c", 2, patch_size=4).fit(np.random.default_rng(0).uniform(size=(3, 8, 8, 3)), 0)
            >>> c.rows(np.array([0, 5])).shape
            (2, 8, 8, 3)
        """
        if self.patch_size is None:
            return np.asarray(self._inputs[np.asarray(indices)], np.float32)
        return crop_rows(self._inputs, self.patch_size, indices)

    def fit(self, inputs: Any, targets: Any = None) -> CRAFT:
        """Extract the concepts from ``inputs`` and estimate their importance for ``targets``.

        Memory: the crops and activations are made ``batch_size`` rows at a time; what is kept is
        the ``(rows, channels)`` matrix of position-averaged activations that is factorised.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu", name="h"),
            ...                       keras.layers.Dense(2)])
            >>> CRAFT(m, "h", 2).fit(np.random.default_rng(0).uniform(size=(6, 4)), 1).importances.shape
            (2,)
        """
        x = np.asarray(inputs)
        if self.patch_size is not None:
            if x.ndim != 4:
                raise ValueError(f"`patch_size` crops images (N, H, W, C). Received: inputs of shape {x.shape}.")
            crop_boxes(x.shape[1:3], self.patch_size)  # checks the patch size before any work
        self._inputs = x
        total = self._row_count()
        if total < self.n_concepts:
            raise ValueError(
                f"Too few examples to extract {self.n_concepts} concepts: {total} rows of activations. Received: "
                f"{len(x)} inputs, patch_size={self.patch_size!r}. Pass more inputs, a patch_size, or fewer n_concepts."
            )
        parts = []
        for chunk in chunk_ranges(total, self.batch_size):
            acts = self.activations(self.rows(chunk))
            parts.append(acts.reshape(len(acts), -1, acts.shape[-1]).mean(axis=1))  # positions averaged (Xplique)
        self.crop_coefficients, self.concepts = nmf(np.concatenate(parts), self.n_concepts, self.seed)
        self.importances = self.estimate_importance(x, targets)
        return self

    def _check_fitted(self) -> np.ndarray:
        if self.concepts is None:
            raise ValueError("This CRAFT has no concepts yet. Call `fit(inputs, targets)` first.")
        return self.concepts

    def transform(self, inputs: Any, activations: np.ndarray | None = None) -> np.ndarray:
        """Concept coefficients ``(N, ..., k)`` at every position of the layer (non-negative least squares).

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu", name="h"),
            ...                       keras.layers.Dense(2)])
            >>> x = np.random.default_rng(0).uniform(size=(6, 4))
            >>> CRAFT(m, "h", 2).fit(x, 0).transform(x).shape
            (6, 2)
        """
        concepts = self._check_fitted()
        if activations is not None:
            flat = nnls(activations.reshape(-1, activations.shape[-1]), concepts)
            return flat.reshape(*activations.shape[:-1], len(concepts)).astype(np.float32)
        x = np.asarray(inputs)
        return np.concatenate([self.transform(None, self.activations(x[chunk]))  # batch_size inputs at a time
                               for chunk in chunk_ranges(len(x), self.batch_size)])

    def concept_maps(self, inputs: Any) -> np.ndarray:
        """Per-image concept maps ``(N, H, W, k)`` at the input size (an image layer's coefficients, resized).

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="c"),
            ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
            >>> x = np.random.default_rng(0).uniform(size=(3, 8, 8, 3))
            >>> CRAFT(m, "c", 2).fit(x, 0).concept_maps(x).shape
            (3, 8, 8, 2)
        """
        coefficients = self.transform(inputs)
        x = np.asarray(inputs)
        if coefficients.ndim != 4 or x.ndim != 4:
            raise ValueError(
                f"Concept maps need an image layer (N, h, w, channels). Received: layer {self.layer_path!r} with "
                f"coefficients of shape {coefficients.shape}; use `transform` for other layers."
            )
        return resize_maps(coefficients, x.shape[1:3]).astype(np.float32)

    def best_crops(self, count: int = 5) -> np.ndarray:
        """The ``count`` crops (or inputs) holding most of each concept: ``(k, count, H, W, C)``.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu", name="h"),
            ...                       keras.layers.Dense(2)])
            >>> CRAFT(m, "h", 2).fit(np.random.default_rng(0).uniform(size=(6, 4)), 0).best_crops(3).shape
            (2, 3, 4)
        """
        self._check_fitted()
        order = np.argsort(-self.crop_coefficients, axis=0)[:count]  # (count, k)
        return np.stack([self.rows(order[:, j]) for j in range(self.n_concepts)])

    def save(self, directory: str | Path, count: int = 5) -> Path:
        """Write each concept's best crops as PNGs and an ``index.html`` page (concepts by importance).

        Example:
            >>> import keras, numpy as np, tempfile
            >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="c"),
            ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
            >>> c = CRAFT(m, "c", 2, patch_size=4).fit(np.random.default_rng(0).uniform(size=(3, 8, 8, 3)), 0)
            >>> c.save(tempfile.mkdtemp()).name
            'index.html'
        """
        from PIL import Image

        self._check_fitted()
        best = self.best_crops(count)
        if best.ndim != 5:
            raise ValueError(f"Crops can be saved for image inputs only. Received: inputs of shape {best.shape[2:]}.")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        low, high = float(best.min()), float(best.max())
        rows = []
        for j in np.argsort(-np.asarray(self.importances)):
            cells = []
            for i, crop in enumerate(best[j]):
                pixels = (np.clip((crop - low) / max(high - low, 1e-12), 0, 1) * 255 + 0.5).astype(np.uint8)
                name = f"concept_{j:02d}_{i}.png"
                Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels[..., :3]).save(out / name)
                cells.append(f'<img src="{name}" alt="concept {j}">')
            rows.append(f"<h2>concept {j}: importance {float(self.importances[j]):.3f}</h2><p>{''.join(cells)}</p>")
        page = out / "index.html"
        page.write_text(
            "<!doctype html><html><head><meta charset='utf-8'><title>CRAFT concepts</title><style>"
            "body{font-family:sans-serif}img{width:96px;margin:2px;image-rendering:pixelated}</style></head><body>"
            f"<h1>CRAFT concepts of {html.escape(self.layer_path)}</h1>" + "".join(rows) + "</body></html>\n"
        )
        return page

    def estimate_importance(self, inputs: Any, targets: Any = None) -> np.ndarray:
        """Mean total Sobol index of each concept's coefficients for the target score ``(k,)``.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu", name="h"),
            ...                       keras.layers.Dense(2)])
            >>> x = np.random.default_rng(0).uniform(size=(6, 4))
            >>> bool(np.all(CRAFT(m, "h", 2).fit(x, 0).estimate_importance(x, 0) >= 0))
            True
        """
        concepts = self._check_fitted()
        prepared = Inputs(np.asarray(inputs, np.float32))
        _, resolved = self.engine.scores(prepared, targets, self.batch_size)
        k, designs = len(concepts), self.designs
        rng = np.random.default_rng(self.seed)
        a, b = rng.uniform(size=(2, designs, k))
        c = np.stack([np.where(np.arange(k) == i, b, a) for i in range(k)])  # column i of A from B
        masks = np.concatenate([a, b, c.reshape(-1, k)]).astype(np.float32)  # (designs (k + 2), k)
        per_image = len(masks)
        count = len(prepared.arrays[0])
        scores = np.empty(count * per_image, np.float32)
        scorer = None
        for images in chunk_ranges(count, self.batch_size):  # batch_size images' activations at a time
            acts = self.activations(prepared.arrays[0][images])
            coefficients = self.transform(None, activations=acts)  # (chunk, ..., k)
            if scorer is None:
                scorer = self.engine.scorer(prepared, layer=self.layer, transform=_replace_output,
                                            extra_spec=((None, *acts.shape[1:]), "float32"))
            spatial = (1,) * (acts.ndim - 2)
            for rows in chunk_ranges(len(images) * per_image, self.batch_size):  # (image, design) pairs as a batch
                local, design = rows // per_image, rows % per_image
                image = images[local]
                scaled = coefficients[local] * masks[design].reshape(len(rows), *spatial, k)
                rebuilt = (scaled @ concepts).astype(np.float32)
                scores[images[0] * per_image + rows] = scorer([a_[image] for a_ in prepared.arrays],
                                                              resolved[image].astype(np.int32), rebuilt)[0]
        scores = scores.reshape(count, per_image)
        indices = [jansen_total_indices(a, s[:designs], s[designs:2 * designs], s[2 * designs:].reshape(k, designs))
                   for s in scores]
        return np.mean(indices, axis=0)
