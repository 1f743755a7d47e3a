"""Perturbation methods: Occlusion and RISE (forward passes only, no gradients).

Perturbed copies of each input are folded into the batch axis, built
``batch_size`` rows at a time, scored with the engine's compiled forward
pass, and reduced with one weighted matrix product per chunk. Targets are
resolved once, on the clean inputs.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.spatial import choose_input
from kerascope.methods._folding import Stream, clean_scores, forward_scores, reduce_rows, row_targets
from kerascope.methods.base import Method, check_number, check_positive_int, check_seed
from kerascope.methods.registry import register
from kerascope.numeric.chunking import chunk_ranges
from kerascope.numeric.resize import interpolation_matrix


def _chosen_input(
    model: keras.Layer, inputs: Inputs, method: str, input_index: int | str | None
) -> tuple[int, np.ndarray]:
    """The perturbed input: ``input_index`` (a position or a name), by default the only input or the
    only image-like one (:func:`kerascope.core.spatial.choose_input`); the others are kept fixed."""
    index = choose_input(model, inputs, input_index)
    array = inputs.arrays[index]
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"{method} perturbs numeric inputs. Received: inputs of dtype {array.dtype}. "
            "Token ids cannot be occluded with a constant; explain at the embedding layer instead, or use "
            "FeatureAblation, which replaces tokens by a pad id."
        )
    return int(index), array


def _with_input(inputs: Inputs, index: int, array: np.ndarray, owners: np.ndarray) -> Inputs:
    """The rows ``owners`` of ``inputs`` with input ``index`` replaced by ``array``."""
    arrays = [array if i == index else a[owners] for i, a in enumerate(inputs.arrays)]
    return Inputs(inputs.rebuild(arrays))


def _per_axis(value: Any, count: int, name: str) -> tuple[int, ...]:
    values = (value,) * count if np.isscalar(value) or value is None else tuple(value) if isinstance(
        value, (tuple, list, np.ndarray)) else (value,)
    if len(values) != count or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in values
    ):
        raise ValueError(
            f"`{name}` must be a positive int or one positive int per spatial axis ({count}). "
            f"Received: {name}={value!r}."
        )
    return tuple(int(v) for v in values)


def window_starts(length: int, window: int, stride: int) -> np.ndarray:
    """Start offsets of the windows along one axis: every ``stride``, plus one flush with the end.

    Example:
        >>> window_starts(10, 4, 3).tolist(), window_starts(8, 4, 4).tolist()
        ([0, 3, 6], [0, 4])
    """
    window = min(window, length)
    starts = np.arange(0, length - window + 1, stride)
    if starts[-1] + window < length:
        starts = np.append(starts, length - window)
    return starts


@register
class Occlusion(Method):
    """Occlusion (Zeiler & Fergus, 2014), as in Captum's ``Occlusion``.

    A window (all channels) slides over the spatial axes of the input; each
    occluded copy, with the window set to ``baseline``, is scored, and every
    element gets the average of ``f(x) - f(x_occluded)`` over the windows that
    cover it. Windows start every ``stride`` elements; where the last one
    does not reach the end an extra window flush with the end is added, so
    every element is covered (Captum leaves such elements at 0).

    Axes: for ``(N, F)`` inputs the features; for ``(N, ..., C)`` inputs the
    axes between batch and channels (channels last). Attributions have the
    inputs' shape (equal across channels). Multi-input models: ``input_index``
    chooses the input to occlude (the others are kept); attributions are that
    input's.

    Args:
        window: window size, an int (every spatial axis) or one per axis.
        stride: step between windows, likewise; default: the window (no overlap).
        baseline: value written into the window: a number or an array of one
            sample's shape.
        input_index: which input of a multi-input model to occlude (a position or an input name;
            default: the only image-like input, else an error asking to choose).

    Cost: one forward pass per window position per input, plus one.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[1.0], [2.0], [3.0], [4.0]])])
        >>> ks.Occlusion(m, window=2, stride=2).explain(np.ones((1, 4)), 0).attributions.tolist()
        [[3.0, 3.0, 7.0, 7.0]]
    """

    name = "occlusion"
    description = "Score drop when sliding windows are replaced by a baseline (Zeiler & Fergus 2014)."
    aliases = ("occlusion_sensitivity",)

    def __init__(
        self,
        model: keras.Layer,
        *,
        window: int | tuple[int, ...] = 8,
        stride: int | tuple[int, ...] | None = None,
        baseline: float | np.ndarray = 0.0,
        input_index: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.window = window
        self.stride = window if stride is None else stride
        if isinstance(baseline, str) or baseline is None:
            raise ValueError(
                f"Occlusion replaces windows by a constant. Received: baseline={baseline!r}. Expected a number "
                "or an array of one sample's shape (FeatureAblation accepts 'blur' and 'mean')."
            )
        try:
            finite = bool(np.all(np.isfinite(np.asarray(baseline, np.float64))))
        except (TypeError, ValueError):
            finite = False
        if not finite:
            raise ValueError(
                f"`baseline` must be finite numbers. Received: baseline={baseline!r}."
            )
        self.baseline = baseline
        self.input_index = input_index

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline is reported by its shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            >>> ks.Occlusion(m, window=2).params()["stride"]
            2
        """
        params = super().params()
        if not np.isscalar(self.baseline):
            params["baseline"] = f"<array shape={np.shape(self.baseline)}>"
        return params

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        which, x = _chosen_input(self.model, inputs, "Occlusion", self.input_index)
        n = len(x)
        channels = x.ndim >= 3
        spatial = x.shape[1:-1] if channels else x.shape[1:]
        window = _per_axis(self.window, len(spatial), "window")
        stride = _per_axis(self.stride, len(spatial), "stride")
        window = tuple(min(w, length) for w, length in zip(window, spatial, strict=True))
        starts = [window_starts(length, w, s) for length, w, s in zip(spatial, window, stride, strict=True)]
        grid = tuple(len(s) for s in starts)
        positions = int(np.prod(grid))
        try:
            baseline = np.broadcast_to(np.asarray(self.baseline, np.float32), x.shape[1:])
        except ValueError:
            raise ValueError(
                f"The baseline does not fit the input. Received: baseline of shape {np.shape(self.baseline)} for "
                f"inputs of shape {x.shape}. Expected a number or one sample's shape {x.shape[1:]}."
            ) from None
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        total = np.zeros((n, *spatial), np.float64)
        coords = [np.arange(length) for length in spatial]
        for rows in chunk_ranges(n * positions, self.batch_size):
            owners, pos = rows // positions, rows % positions
            index = np.unravel_index(pos, grid)
            mask = np.ones((len(rows), *spatial), bool)
            for axis, (start, size, coord) in enumerate(zip(starts, window, coords, strict=True)):
                first = start[index[axis]][:, None]
                inside = (coord[None, :] >= first) & (coord[None, :] < first + size)
                shape = [len(rows)] + [1] * len(spatial)
                shape[axis + 1] = len(coord)
                mask &= inside.reshape(shape)
            full = mask[..., None] if channels else mask
            occluded = np.where(full, baseline[None], x[owners]).astype(np.float32, copy=False)
            variant_scores, _ = forward_scores(
                self.engine, _with_input(inputs, which, occluded, owners), row_targets(targets, resolved, owners),
                self.batch_size,
            )
            reduce_rows(total, owners, scores[owners].astype(np.float64) - variant_scores, mask)
        counts = np.ones(spatial, np.float64)
        for axis, (start, size, coord) in enumerate(zip(starts, window, coords, strict=True)):
            along = ((coord[None, :] >= start[:, None]) & (coord[None, :] < start[:, None] + size)).sum(0)
            shape = [1] * len(spatial)
            shape[axis] = len(coord)
            counts = counts * along.reshape(shape)
        attribution = total / counts[None]
        if channels:
            attribution = np.broadcast_to(attribution[..., None], x.shape)
        return self._result(
            inputs, [np.ascontiguousarray(attribution, np.float32)], scores, resolved, windows=positions
        )


def rise_masks(
    count: int,
    size: tuple[int, int],
    cell: int | tuple[int, int] = 7,
    p: float = 0.5,
    seed: int | None = 0,
    start: int = 0,
    stream: Stream | None = None,
) -> np.ndarray:
    """RISE masks ``start .. start + count - 1`` of shape ``(count, H, W)`` with values in [0, 1].

    Petsiuk et al. (2018): a random binary grid of ``cell`` x ``cell`` cells
    (each 1 with probability ``p``), upsampled bilinearly (half-pixel centres, numpy) to ``(cell + 1) *
    ceil(H / cell)`` pixels per side, and cropped to ``H x W`` at a random
    shift in ``[0, ceil(H / cell))``. Mask ``m`` depends only on ``seed`` and
    ``m``. Pass the same ``stream`` (from :func:`rise_stream`) to draw
    consecutive chunks without regenerating earlier masks.

    Example:
        >>> m = rise_masks(3, (16, 16), cell=4, p=0.5, seed=0)
        >>> m.shape, bool(m.min() >= 0.0 and m.max() <= 1.0)
        ((3, 16, 16), True)
    """
    cells = _per_axis(cell, 2, "cell")
    stream = stream or rise_stream(cells, size, p, seed)
    packed = stream.take(start, start + count)
    step = tuple(int(np.ceil(s / c)) for s, c in zip(size, cells, strict=True))
    grids = packed[:, : cells[0] * cells[1]].reshape(count, cells[0], cells[1])
    shifts = packed[:, cells[0] * cells[1]:].astype(np.int64)
    up = ((cells[0] + 1) * step[0], (cells[1] + 1) * step[1])
    # Only the cropped window of each upsampled grid is needed: take the rows of the interpolation
    # matrices that the crop keeps, then two batched matrix products (no full-size map, no gather).
    rows = interpolation_matrix(up[0], cells[0])[shifts[:, 0, None] + np.arange(size[0])[None, :]]
    cols = interpolation_matrix(up[1], cells[1])[shifts[:, 1, None] + np.arange(size[1])[None, :]]
    cropped = rows @ grids @ np.swapaxes(cols, 1, 2)
    return np.clip(cropped, 0.0, 1.0).astype(np.float32)


def rise_stream(cells: tuple[int, int], size: tuple[int, int], p: float, seed: int | None) -> Stream:
    """The seeded stream of packed RISE draws (grid cells, then the two shifts) used by :func:`rise_masks`.

    Example:
        >>> rise_stream((2, 2), (8, 8), 0.5, 0).take(0, 3).shape
        (3, 6)
    """
    step = tuple(int(np.ceil(s / c)) for s, c in zip(size, cells, strict=True))

    def make(rng: np.random.Generator, n: int) -> np.ndarray:
        # One row of uniforms per mask, drawn row after row, so mask m never depends on the chunking.
        u = rng.random((n, cells[0] * cells[1] + 2))
        grid = (u[:, :-2] < p).astype(np.float64)
        shifts = np.floor(u[:, -2:] * np.array(step)).clip(0, np.array(step) - 1)
        return np.concatenate([grid, shifts], axis=1)

    return Stream(seed, make)


@register
class RISE(Method):
    """Randomized Input Sampling for Explanation (Petsiuk et al., 2018).

    ``S = 1 / (masks * p) * sum_m f(x * M_m) * M_m`` over random smooth masks
    (see :func:`rise_masks`). The masks depend only on ``seed`` and are shared
    by all images of a batch, as in the paper. Images ``(N, H, W, C)``
    (channels last); returns ``(N, H, W)`` maps. Multi-input models:
    ``input_index`` chooses the image input to mask (the others are kept).

    The paper scores with class probabilities, so ``output`` defaults to
    ``"probabilities"`` here (a model without a softmax gives its raw
    outputs); pass ``output="logits"`` to weight masks by logits.

    Args:
        masks: number of masks (the paper uses 4000 to 8000 for ImageNet).
        cell: grid cells per side (the paper's ``s``; an int or ``(h, w)``).
        p: probability that a grid cell is kept.
        seed: seed of the numpy mask generator (``None``: fresh masks each call).
        input_index: which input of a multi-input model to mask (a position or an input name;
            default: the only image-like input, else an error asking to choose).

    Cost: ``masks`` forward passes per image, plus one (none with ``scores=False`` and given targets).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.RISE(m, masks=16, cell=2).explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 8, 8)
    """

    name = "rise"
    description = "Score-weighted average of random smooth masks (Petsiuk et al. 2018)."
    aliases = ()

    def __init__(
        self,
        model: keras.Layer,
        *,
        masks: int = 2000,
        cell: int | tuple[int, int] = 7,
        p: float = 0.5,
        seed: int | None = 0,
        output: str = "probabilities",
        input_index: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, output=output, **kwargs)
        check_positive_int(masks, "masks")
        if not 0.0 < check_number(p, "p") <= 1.0:
            raise ValueError(f"`p` must be in (0, 1]. Received: p={p!r}.")
        _per_axis(cell, 2, "cell")
        self.masks = masks
        self.cell = cell
        self.p = float(p)
        self.seed = check_seed(seed)
        self.input_index = input_index

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        index, x = _chosen_input(self.model, inputs, "RISE", self.input_index)
        if x.ndim != 4:
            raise ValueError(
                f"RISE explains images (batch, height, width, channels). Received: inputs with shape {x.shape}."
            )
        n, size = len(x), x.shape[1:3]
        cells = _per_axis(self.cell, 2, "cell")
        stream = rise_stream(cells, size, self.p, self.seed)
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)
        total = np.zeros((n, *size), np.float64)
        # Rows are mask-major: row r applies mask r // n to image r % n.
        for rows in chunk_ranges(n * self.masks, self.batch_size):
            owners, which = rows % n, rows // n
            first = int(which[0])
            masks = rise_masks(int(which[-1]) - first + 1, size, cells, self.p, start=first, stream=stream)
            mask = masks[which - first]
            masked = (x[owners] * mask[..., None]).astype(np.float32, copy=False)
            masked_scores, _ = forward_scores(
                self.engine, _with_input(inputs, index, masked, owners), row_targets(targets, resolved, owners),
                self.batch_size,
            )
            reduce_rows(total, owners, masked_scores.astype(np.float64), mask)
        maps = (total / (self.masks * self.p)).astype(np.float32)
        return self._result(inputs, [maps], scores, resolved)
