"""Feature masks, baselines and the batched coalition evaluator shared by the feature-mask methods.

A *feature mask* groups the elements of an input into features (superpixels,
tokens, tabular columns, grid cells): an integer label per element. Every
feature-mask method (:class:`~kerascope.methods.coalitions.FeatureAblation`,
Shapley values, KernelSHAP, LIME) evaluates the model on *coalitions*: binary
vectors ``z`` over the features where ``z_j = 1`` keeps feature ``j`` as in
the input and ``z_j = 0`` replaces it with the baseline. Coalitions are rows
generated ``batch_size`` at a time (never the whole coalition matrix: a
per-pixel mask of a 224 x 224 image has 50,176 coalitions as wide); the
perturbed inputs are built from them and scored by the engine's compiled
forward pass, so memory is bounded by ``batch_size`` whatever the number of
coalitions.

Masks (``mask=``), per perturbed input:

- ``None``: a default -- one feature per column of ``(N, F)`` inputs (tabular
  features, token ids), one per step of ``(N, T, D)`` sequences, a 4 x 4 grid
  of cells over the spatial axes of images ``(N, H, W, C)``.
- an integer array: one label per element of a sample, or of its leading axes
  (an ``(H, W)`` mask is broadcast over channels, a ``(T,)`` mask over the
  embedding axis), shared by all samples; or with a leading batch axis, one
  mask per sample (``(N, H, W)``). Labels can be any integers; they are
  renumbered ``0 .. k-1`` in increasing order.
- ``"grid"``, ``"slic"``, ``"quickshift"``: computed per image (the last two
  with scikit-image, lime's defaults); :func:`segmentation` sets parameters.
- a callable ``inputs (N, ...) -> mask`` returning any of the arrays above.

Baselines (``baseline=``): a number, an array of one sample's shape (or
broadcastable to it) or of the batch's shape, ``"blur"`` (a Gaussian-blurred
copy), ``"mean"`` (each feature replaced by its mean value, per channel: lime's
``hide_color=None``), or a :class:`Background` set (the model's output on a
coalition is then averaged over the set, as in shap's KernelExplainer).
Integer inputs (token ids) are *replaced* by an integer baseline (default 0,
the usual pad id), never interpolated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kerascope.core.engine import Engine
from kerascope.core.inputs import Inputs
from kerascope.core.progress import progress_scope
from kerascope.core.targets import encode as encode_targets
from kerascope.methods._folding import chunk_ranges, row_targets
from kerascope.numeric.chunking import ahead

DEFAULT_GRID = 4
SEGMENTATIONS = ("grid", "slic", "quickshift")


@dataclass(frozen=True)
class Background:
    """A background set ``(B, ...)`` of one input: absent features take each row's values in turn.

    The model's output on a coalition is the mean over the ``B`` rows (shap's
    KernelExplainer convention), so each coalition costs ``B`` forward rows.

    Example:
        >>> import numpy as np
        >>> Background(np.zeros((5, 3))).data.shape
        (5, 3)
    """

    data: Any

    def __post_init__(self) -> None:
        array = np.asarray(self.data)
        if array.ndim < 1 or len(array) == 0:
            raise ValueError(
                f"A background set needs at least one row (B, ...). Received: shape={array.shape}."
            )


def grid_mask(shape: Sequence[int], cells: int | Sequence[int] = DEFAULT_GRID) -> np.ndarray:
    """Labels of a regular grid of ``cells`` cells per axis over ``shape`` (equal splits, row-major).

    Example:
        >>> grid_mask((4, 4), 2).tolist()
        [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]
    """
    cells_per_axis = (cells,) * len(shape) if np.isscalar(cells) else tuple(cells)
    if len(cells_per_axis) != len(shape) or any(int(c) < 1 for c in cells_per_axis):
        raise ValueError(
            f"`cells` must be a positive int or one per axis ({len(shape)}). Received: cells={cells!r}."
        )
    cells_per_axis = tuple(min(int(c), int(n)) for c, n in zip(cells_per_axis, shape, strict=True))
    index = [np.arange(n) * c // n for n, c in zip(shape, cells_per_axis, strict=True)]
    grids = np.meshgrid(*index, indexing="ij")
    return np.ravel_multi_index(tuple(grids), cells_per_axis).astype(np.int64)


def segmentation(method: str = "slic", **params: Any) -> Callable[[np.ndarray], np.ndarray]:
    """A mask callable segmenting each image ``(N, H, W, C)`` with ``method`` (``grid``/``slic``/``quickshift``).

    ``slic`` and ``quickshift`` use scikit-image (``pip install scikit-image``)
    with lime's defaults unless ``params`` say otherwise (``slic``:
    ``n_segments=50, compactness=10``; ``quickshift``: ``kernel_size=4,
    max_dist=200, ratio=0.2``); ``grid`` takes ``cells`` (default 4).

    Example:
        >>> import numpy as np
        >>> segmentation("grid", cells=2)(np.zeros((3, 4, 4, 1))).shape
        (3, 4, 4)
    """
    if method not in SEGMENTATIONS:
        raise ValueError(f"Unknown segmentation. Received: mask={method!r}. Available: {list(SEGMENTATIONS)}.")

    def segment(x: np.ndarray) -> np.ndarray:
        if x.ndim != 4 or not np.issubdtype(x.dtype, np.floating):
            raise ValueError(
                f"mask={method!r} segments images (batch, height, width, channels). Received: input of "
                f"shape {x.shape} and dtype {x.dtype}. Pass an integer mask array or mask=None instead."
            )
        if method == "grid":
            return np.broadcast_to(grid_mask(x.shape[1:3], params.get("cells", DEFAULT_GRID)), x.shape[:3])
        try:
            from skimage import segmentation as skseg
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError(
                f"mask={method!r} needs scikit-image: pip install scikit-image. "
                "Or pass mask='grid' or an integer mask array."
            ) from error
        images = x.astype(np.float64)
        out = np.empty(x.shape[:3], np.int64)
        for i, image in enumerate(images):
            if method == "slic":
                kw = {"n_segments": 50, "compactness": 10.0, "start_label": 0, "channel_axis": -1, **params}
                out[i] = skseg.slic(image, **kw)
            else:
                rgb = np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image[..., :3]
                kw = {"kernel_size": 4, "max_dist": 200, "ratio": 0.2, "rng": 42, **params}
                out[i] = skseg.quickshift(rgb, **kw)
        return out

    segment.__name__ = f"segmentation_{method}"
    return segment


def default_mask(x: np.ndarray) -> np.ndarray:
    """The default mask of one input: per column / per step / a 4 x 4 grid (see the module notes).

    Example:
        >>> import numpy as np
        >>> default_mask(np.zeros((2, 5))).tolist(), int(default_mask(np.zeros((1, 8, 8, 3))).max())
        ([0, 1, 2, 3, 4], 15)
    """
    if x.ndim <= 3 or not np.issubdtype(x.dtype, np.floating):
        return np.arange(x.shape[1], dtype=np.int64)
    return grid_mask(x.shape[1:-1], DEFAULT_GRID)


def _prefix_of(mask_shape: tuple[int, ...], sample: tuple[int, ...]) -> bool:
    return 0 < len(mask_shape) <= len(sample) and sample[: len(mask_shape)] == mask_shape


def resolve_mask(spec: Any, x: np.ndarray, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels ``(N, *P)`` renumbered ``0 .. k_i - 1`` per sample, and the counts ``k`` (N,).

    ``P`` is a prefix of the sample shape; the labels broadcast over the
    remaining (trailing) axes.

    Example:
        >>> import numpy as np
        >>> labels, k = resolve_mask(np.array([[5, 5], [9, 2]]), np.zeros((3, 2, 2, 3)))
        >>> labels[0].tolist(), k.tolist()
        ([[1, 1], [2, 0]], [3, 3, 3])
    """
    n, sample = len(x), tuple(x.shape[1:])
    if spec is None:
        spec = default_mask(x)
    elif isinstance(spec, str):
        spec = segmentation(spec)(x)
    elif callable(spec):
        spec = spec(x)
    mask = np.asarray(spec)
    if not (np.issubdtype(mask.dtype, np.integer) or np.issubdtype(mask.dtype, np.bool_)):
        raise TypeError(
            f"A feature mask holds integer labels. Received: mask of dtype {mask.dtype} for input {index}."
        )
    if _prefix_of(mask.shape, sample):
        _, inverse = np.unique(mask, return_inverse=True)
        labels = inverse.reshape(mask.shape).astype(np.int64)
        return np.broadcast_to(labels, (n, *mask.shape)), np.full(n, int(labels.max()) + 1, np.int64)
    if mask.ndim >= 2 and mask.shape[0] == n and _prefix_of(mask.shape[1:], sample):
        labels = np.empty(mask.shape, np.int64)
        counts = np.empty(n, np.int64)
        for i in range(n):
            _, inverse = np.unique(mask[i], return_inverse=True)
            labels[i] = inverse.reshape(mask.shape[1:])
            counts[i] = labels[i].max() + 1
        return labels, counts
    raise ValueError(
        f"The feature mask of input {index} does not fit it. Received: mask of shape {mask.shape} for inputs "
        f"of shape {x.shape}. Expected one sample's shape or its leading axes (e.g. {sample[:2]}), "
        f"optionally with the batch axis first (e.g. {(n, *sample[:2])})."
    )


def resolve_baseline(spec: Any, x: np.ndarray, labels: np.ndarray, index: int = 0, blur_sigma: float = 4.0) -> tuple[
    np.ndarray, str
]:
    """The baseline of one input and how its rows are picked: ``"shared"`` (1, ...), ``"sample"`` (N, ...),
    ``"background"`` (B, ...).

    Example:
        >>> import numpy as np
        >>> x = np.arange(8, dtype="float32").reshape(2, 4)
        >>> b, how = resolve_baseline("mean", x, np.broadcast_to(np.array([0, 0, 1, 1]), (2, 4)))
        >>> b.tolist(), how
        ([[0.5, 0.5, 2.5, 2.5], [4.5, 4.5, 6.5, 6.5]], 'sample')
    """
    n, sample = len(x), x.shape[1:]
    integer = not np.issubdtype(x.dtype, np.floating)
    if isinstance(spec, Background):
        data = np.asarray(spec.data)
        if tuple(data.shape[1:]) == tuple(sample) and not np.all(np.isfinite(data.astype(np.float64))):
            raise ValueError(f"The background set (`baseline`) of input {index} contains NaN or infinite values.")
        if tuple(data.shape[1:]) != tuple(sample):
            raise ValueError(
                f"The background set of input {index} must have shape (B, *{tuple(sample)}). "
                f"Received: shape={data.shape}."
            )
        return _cast_baseline(data, x, index), "background"
    if isinstance(spec, str):
        if integer:
            raise ValueError(
                f"Input {index} holds integer ids (dtype {x.dtype}); they are replaced, not blurred or "
                f"averaged. Received: baseline={spec!r}. Pass an integer id (e.g. the pad token, 0)."
            )
        if spec == "blur":
            from kerascope.methods.integrated import gaussian_blur

            return gaussian_blur(x, blur_sigma).astype(np.float32), "sample"
        if spec == "mean":
            return _feature_means(x, labels), "sample"
        raise ValueError(
            f"Unknown baseline. Received: baseline={spec!r}. Expected a number, an array, 'blur', 'mean' "
            "or a Background set."
        )
    try:
        value = np.asarray(0.0 if spec is None else spec, np.float64 if integer else np.float32)
    except (TypeError, ValueError):
        raise ValueError(
            f"Unknown baseline. Received: baseline={spec!r}. Expected a number, an array, 'blur', 'mean' "
            "or a Background set."
        ) from None
    if not np.all(np.isfinite(value)):
        raise ValueError(
            f"The baseline of input {index} contains NaN or infinite values. Received: baseline of shape "
            f"{value.shape}."
        )
    if value.ndim == x.ndim and value.shape[0] == n and value.shape[0] != 1:
        return _cast_baseline(np.broadcast_to(value, x.shape), x, index), "sample"
    try:
        shared = np.broadcast_to(value, sample)
    except ValueError:
        raise ValueError(
            f"The baseline of input {index} does not fit it. Received: baseline of shape {value.shape} for "
            f"inputs of shape {x.shape}. Expected a number, one sample's shape {tuple(sample)} or the "
            "batch's shape."
        ) from None
    return _cast_baseline(shared[None], x, index), "shared"


def _cast_baseline(value: np.ndarray, x: np.ndarray, index: int) -> np.ndarray:
    if np.issubdtype(x.dtype, np.floating):
        return np.asarray(value, np.float32)
    if not np.all(np.equal(np.mod(value, 1), 0)):
        raise ValueError(
            f"Input {index} holds integer ids (dtype {x.dtype}): its baseline must be integer ids too "
            "(e.g. the pad token). Received: a non-integer baseline."
        )
    return np.asarray(value).astype(x.dtype)


def _feature_means(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    n = len(x)
    trailing = x.shape[labels.ndim:]
    flat_x = x.reshape(n, -1, int(np.prod(trailing, dtype=np.int64)))
    flat_l = np.ascontiguousarray(labels).reshape(n, -1)
    out = np.empty_like(flat_x)
    for i in range(n):
        k = int(flat_l[i].max()) + 1
        sums = np.zeros((k, flat_x.shape[2]))
        np.add.at(sums, flat_l[i], flat_x[i])
        counts = np.bincount(flat_l[i], minlength=k)[:, None]
        out[i] = (sums / counts)[flat_l[i]]
    return out.reshape(x.shape).astype(np.float32)


@dataclass
class Plan:
    """Which inputs are perturbed, their labels (global feature ids per sample) and baselines.

    ``features[i]`` is sample ``i``'s number of features over all perturbed
    inputs; input ``j``'s labels are offset by ``offsets[:, j]``.

    Example:
        >>> import numpy as np
        >>> p = make_plan(Inputs(np.zeros((2, 3))), None, None, 0.0)
        >>> p.features.tolist(), p.index
        ([3, 3], [0])
    """

    inputs: Inputs
    index: list[int]
    labels: list[np.ndarray]
    offsets: np.ndarray
    counts: np.ndarray
    baselines: list[np.ndarray]
    modes: list[str]
    background: int

    @property
    def features(self) -> np.ndarray:
        return self.counts.sum(axis=1)

    def rows(self, owners: np.ndarray, keep: np.ndarray, which: np.ndarray) -> Inputs:
        """Perturbed inputs for rows: sample ``owners``, coalition ``keep`` (rows, K), background row ``which``.

        ``keep`` is boolean (a feature is kept or set to the baseline) or float, a weight
        ``m`` in [0, 1] per feature (the feature becomes ``baseline + m (x - baseline)``).

        Example:
            >>> import numpy as np
            >>> p = make_plan(Inputs(np.ones((1, 3))), None, None, 0.0)
            >>> p.rows(np.array([0]), np.array([[True, False, True]]), np.array([0])).arrays[0].tolist()
            [[1.0, 0.0, 1.0]]
        """
        return Inputs(self.inputs.rebuild(self.row_arrays(owners, keep, which)))

    def row_arrays(self, owners: np.ndarray, keep: np.ndarray, which: np.ndarray) -> list[np.ndarray]:
        """:meth:`rows` as the list of arrays, in the order of ``inputs.arrays`` (already checked inputs).

        Example:
            >>> import numpy as np
            >>> p = make_plan(Inputs(np.ones((1, 2))), None, None, 0.0)
            >>> p.row_arrays(np.array([0, 0]), np.array([[0.5, 1.0], [0.0, 0.25]]), np.zeros(2, int))[0].tolist()
            [[0.5, 1.0], [0.0, 0.25]]
        """
        rows = np.arange(len(owners))
        one_owner = len(owners) > 0 and bool(np.all(owners == owners[0]))
        continuous = keep.dtype != np.bool_
        arrays = [None if continuous and one_owner and i in self.index else a[owners]
                  for i, a in enumerate(self.inputs.arrays)]
        for j, position in enumerate(self.index):
            x = arrays[position]
            base = self.baselines[j]
            if keep.dtype == np.bool_:
                labels = self.labels[j][owners] + self.offsets[owners, j].reshape(
                    (-1,) + (1,) * (self.labels[j].ndim - 1))
                kept = keep[rows.reshape((-1,) + (1,) * (labels.ndim - 1)), labels]
                kept = kept.reshape(kept.shape + (1,) * (x.ndim - kept.ndim))
                pick = {"shared": np.zeros_like(owners), "sample": owners, "background": which}[self.modes[j]]
                arrays[position] = np.where(kept, x, base[pick])
                continue
            # continuous masks in [0, 1] (Sobol): baseline + m (x - baseline)
            b = base[0] if self.modes[j] == "shared" else base[{"sample": owners, "background": which}[self.modes[j]]]
            if one_owner:  # one sample's rows (the usual chunk): one gather along the feature axis and each row
                # written once, m (x - b) (+ b), from the sample's x - b (the same float32 operations, no copy of x)
                owner = owners[0]
                sample = self.inputs.arrays[position][owner]
                if self.modes[j] == "sample":
                    b = b[0]
                kept = np.take(keep.astype(sample.dtype, copy=False),
                               self.labels[j][owner] + self.offsets[owner, j], axis=1)
                kept = kept.reshape(kept.shape + (1,) * (sample.ndim + 1 - kept.ndim))
                out = np.multiply(kept, sample - b)
                if np.any(b):  # a zero baseline adds nothing
                    out += b
                arrays[position] = out
                continue
            labels = self.labels[j][owners] + self.offsets[owners, j].reshape((-1,) + (1,) * (self.labels[j].ndim - 1))
            kept = keep.astype(x.dtype, copy=False)[rows.reshape((-1,) + (1,) * (labels.ndim - 1)), labels]
            kept = kept.reshape(kept.shape + (1,) * (x.ndim - kept.ndim))
            x -= b
            x *= kept
            x += b
        return arrays


def make_plan(
    inputs: Inputs, input_index: Any, mask: Any, baseline: Any, blur_sigma: float = 4.0
) -> Plan:
    """Resolve ``input_index``, ``mask`` and ``baseline`` against ``inputs`` (see the module notes).

    ``input_index``: ``None`` (every input), an int, or a list of ints; with
    several inputs, ``mask`` and ``baseline`` may be lists (one per perturbed
    input; a list is read that way only when several inputs are perturbed) or apply to each.

    Example:
        >>> import numpy as np
        >>> p = make_plan(Inputs([np.zeros((1, 4, 4, 1)), np.zeros((1, 2))]), [0, 1], ["grid", None], 0.0)
        >>> p.counts.tolist(), p.offsets.tolist()
        ([[16, 2]], [[0, 16]])
    """
    count = len(inputs.arrays)
    if input_index is None:
        index = list(range(count))
    elif isinstance(input_index, (list, tuple)):
        index = list(input_index)
    else:
        index = [input_index]
    if not index or len(set(index)) != len(index) or not all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < count for i in index
    ):
        raise ValueError(
            f"`input_index` must be an input position (or a list of distinct positions) in [0, {count}). "
            f"Received: input_index={input_index!r}."
        )
    index = [int(i) for i in index]
    masks = _per_input(mask, len(index), "mask")
    baselines = _per_input(baseline, len(index), "baseline")
    labels, counts, values, modes, backgrounds = [], [], [], [], set()
    for j, position in enumerate(index):
        x = inputs.arrays[position]
        lab, k = resolve_mask(masks[j], x, position)
        value, how = resolve_baseline(baselines[j], x, lab, position, blur_sigma)
        if how == "background":
            backgrounds.add(len(value))
        labels.append(lab)
        counts.append(k)
        values.append(value)
        modes.append(how)
    if len(backgrounds) > 1:
        raise ValueError(
            f"Background sets of the perturbed inputs must have the same number of rows. Received: {sorted(backgrounds)}."
        )
    count_matrix = np.stack(counts, axis=1)
    offsets = np.concatenate([np.zeros((len(count_matrix), 1), np.int64), np.cumsum(count_matrix, 1)[:, :-1]], 1)
    return Plan(inputs, index, labels, offsets, count_matrix, values, modes, backgrounds.pop() if backgrounds else 1)


def _per_input(value: Any, count: int, name: str) -> list[Any]:
    if isinstance(value, list) and count > 1:
        if len(value) != count:
            raise ValueError(
                f"`{name}` as a list needs one entry per perturbed input ({count}). Received: {len(value)} entries."
            )
        return value
    return [value] * count


def evaluate(
    engine: Engine,
    plan: Plan,
    coalitions: np.ndarray | Callable[[np.ndarray], np.ndarray],
    owners: np.ndarray,
    targets: Any,
    resolved: np.ndarray,
    batch_size: int,
    progress: bool = False,
    description: str = "",
) -> np.ndarray:
    """Scores ``v(z)`` (float64) of every coalition row (``coalitions`` (R, K) bool, ``owners`` (R,)).

    ``coalitions`` is the (R, K) boolean matrix, or a function of row indices
    returning those rows: the rows are then generated ``batch_size`` at a time
    and never held all at once (a per-pixel mask has as many coalitions as
    pixels, each as wide). Physical rows are (coalition, background row) pairs,
    built and scored ``batch_size`` at a time; a coalition's score is the mean
    over the background rows.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
        >>> p = make_plan(Inputs(np.ones((1, 2))), None, None, 0.0)
        >>> z = np.array([[True, True], [True, False], [False, False]])
        >>> evaluate(engine_for(m), p, z, np.zeros(3, int), 0, np.array([0]), 8).tolist()
        [2.0, 1.0, 0.0]
        >>> evaluate(engine_for(m), p, lambda rows: z[rows], np.zeros(3, int), 0, np.array([0]), 2).tolist()
        [2.0, 1.0, 0.0]
    """
    per = plan.background
    rows_of = coalitions if callable(coalitions) else coalitions.__getitem__
    scores = np.empty(len(owners) * per, np.float64)
    scorer = prepared = None

    def build(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        who = owners[rows // per]
        return rows, who, plan.row_arrays(who, rows_of(rows // per), rows % per)

    with progress_scope(len(owners), description, progress, unit="coalition"):  # no-op in a method's scope
        # the next chunk's rows are built on the host while the current one is scored
        for rows, who, arrays in ahead(build, chunk_ranges(len(scores), batch_size)):
            chunk_targets = row_targets(targets, resolved, who)
            if scorer is None:  # the first chunk is checked as any input (model, targets); the others are alike
                prepared, _, target_fn = engine.prepare(plan.inputs.rebuild(arrays), chunk_targets)
                arrays = prepared.arrays
                scorer = engine.scorer(prepared, target_fn=target_fn)
            with engine.check_on_error(prepared):
                scores[rows] = scorer(arrays, encode_targets(chunk_targets, len(rows))[0])[0]
    return scores.reshape(-1, per).mean(axis=1)


def spread(plan: Plan, values: np.ndarray) -> list[np.ndarray]:
    """Per-feature values ``(N, K)`` written onto the elements of each perturbed input (Captum's convention).

    Example:
        >>> import numpy as np
        >>> p = make_plan(Inputs(np.ones((1, 2, 2, 1))), None, np.array([[0, 1], [1, 1]]), 0.0)
        >>> spread(p, np.array([[2.0, 5.0]]))[0][0, ..., 0].tolist()
        [[2.0, 5.0], [5.0, 5.0]]
    """
    out = []
    n = len(values)
    for j, position in enumerate(plan.index):
        x = plan.inputs.arrays[position]
        labels = plan.labels[j] + plan.offsets[:, j].reshape((-1,) + (1,) * (plan.labels[j].ndim - 1))
        per_element = values[np.arange(n).reshape((-1,) + (1,) * (labels.ndim - 1)), labels]
        per_element = per_element.reshape(per_element.shape + (1,) * (x.ndim - per_element.ndim))
        out.append(np.ascontiguousarray(np.broadcast_to(per_element, x.shape), np.float32))
    return out
