"""XRAI (Kapishnikov et al. 2019): region attribution by greedily growing the densest segments.

An attribution map (by default Integrated Gradients from a black and a white baseline, averaged,
the largest value over channels) is summarised over image segments (by default Felzenszwalb
segmentations at six scales, each segment dilated, as PAIR ``saliency`` 0.2.1). Starting from an
empty region, the segment whose *new* pixels have the highest mean attribution is added, until
the region covers ``area_threshold`` of the image; every pixel gets the gain of the step that
added it. Equal to PAIR's ``XRAI`` (algorithm ``"full"``) on the same segments and base attribution.

The segments are held as (pixel, segment) pairs, so each greedy step is two weighted bincounts over
all images of a chunk at once (PAIR loops over the segments in Python at every step).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.methods._folding import clean_scores
from kerascope.methods._input_choice import gradient_inputs
from kerascope.methods.base import Method, check_number, check_positive_int
from kerascope.methods.integrated import IntegratedGradients
from kerascope.methods.registry import register
from kerascope.numeric.chunking import chunk_ranges

#: PAIR's Felzenszwalb settings: scales, sigma, working size, value range, minimum segment size, dilation.
FELZENSZWALB_SCALES = (50, 100, 150, 250, 500, 1200)
FELZENSZWALB_SIGMA = 0.8
FELZENSZWALB_SIZE = (224, 224)
FELZENSZWALB_RANGE = (-1.0, 1.0)
FELZENSZWALB_MIN_SIZE = 150
DILATION_RADIUS = 5


def _skimage() -> Any:
    try:
        import skimage.segmentation
        import skimage.transform
    except ImportError:  # pragma: no cover - scikit-image is in the test extra
        raise ImportError(
            "XRAI's default segments need scikit-image (`pip install scikit-image`). Received: segments=None. "
            "Install it, or pass `segments=` (per image, a stack of boolean masks)."
        ) from None
    return skimage


def felzenszwalb_labels(image: np.ndarray) -> list[np.ndarray]:
    """PAIR's six Felzenszwalb label images of one ``(H, W, C)`` image, at the image's size.

    The image is rescaled to ``[-1, 1]``, resized to 224 x 224 (cubic, anti-aliased), segmented at
    the scales :data:`FELZENSZWALB_SCALES` and the labels resized back (nearest).

    Example:
        >>> import numpy as np
        >>> labels = felzenszwalb_labels(np.random.default_rng(0).uniform(size=(32, 32, 3)))
        >>> len(labels), labels[0].shape
        (6, (32, 32))
    """
    sk = _skimage()
    image = np.asarray(image, np.float64)
    low, high = image.min(), image.max()
    scaled = (image - low) / (high - low)  # (PAIR divides by zero on a constant image too: NaN, one segment)
    scaled = scaled * (FELZENSZWALB_RANGE[1] - FELZENSZWALB_RANGE[0]) + FELZENSZWALB_RANGE[0]
    scaled = sk.transform.resize(scaled, FELZENSZWALB_SIZE, order=3, mode="constant", preserve_range=True,
                                 anti_aliasing=True)
    labels = []
    for scale in FELZENSZWALB_SCALES:
        seg = sk.segmentation.felzenszwalb(scaled, scale=scale, sigma=FELZENSZWALB_SIGMA,
                                           min_size=FELZENSZWALB_MIN_SIZE)
        labels.append(sk.transform.resize(seg, image.shape[:2], order=0, preserve_range=True, mode="constant",
                                          anti_aliasing=False).astype(int))
    return labels


def _disk(radius: int) -> np.ndarray:
    """Offsets ``(dy, dx)`` of scikit-image's ``disk(radius)`` footprint."""
    r = np.arange(-radius, radius + 1)
    dy, dx = np.meshgrid(r, r, indexing="ij")
    inside = dy**2 + dx**2 <= radius**2
    return np.stack([dy[inside], dx[inside]], axis=1)


def label_pairs(labels: list[np.ndarray], radius: int = DILATION_RADIUS) -> tuple[np.ndarray, np.ndarray, int]:
    """``(pixels, segments, count)``: the pixels of every dilated segment of the label images.

    Segment ids follow PAIR's order (label image by label image, labels ``min..max``, empty ones
    included); a segment dilated by ``disk(radius)`` holds pixel ``p`` when a pixel within the
    disk around ``p`` has its label (scikit-image's binary dilation, computed for all labels at once).

    Example:
        >>> import numpy as np
        >>> pixels, segments, count = label_pairs([np.array([[0, 0, 1]])], radius=1)
        >>> count, sorted(zip(segments.tolist(), pixels.tolist()))
        (2, [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)])
    """
    offsets = _disk(radius) if radius else np.zeros((1, 2), int)
    pixels, segments, start = [], [], 0
    for seg in labels:
        h, w = seg.shape
        low, count = int(seg.min()), int(seg.max() - seg.min() + 1)
        table = np.zeros((h * w, count), bool)
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        for dy, dx in offsets:
            src_r, src_c = rows + dy, cols + dx
            ok = (src_r >= 0) & (src_r < h) & (src_c >= 0) & (src_c < w)
            table[(rows * w + cols)[ok], seg[src_r[ok], src_c[ok]] - low] = True
        p, s = np.nonzero(table)
        pixels.append(p)
        segments.append(s + start)
        start += count
    return np.concatenate(pixels), np.concatenate(segments), start


def mask_pairs(masks: Any, shape: tuple[int, int], index: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(pixels, segments, count)`` of one image's given boolean masks ``(K, H, W)`` (or a list of them)."""
    stack = np.asarray(masks)
    if stack.ndim != 3 or stack.shape[1:] != tuple(shape) or len(stack) == 0:
        raise ValueError(
            f"`segments` needs, per image, a non-empty list or stack of boolean masks of the image's size "
            f"{tuple(shape)}. Received: segments[{index}] with shape {stack.shape}."
        )
    if stack.dtype != bool:
        if not np.isin(stack, (0, 1)).all():
            raise ValueError(
                f"`segments` masks must be boolean (or 0 / 1). Received: segments[{index}] with values other "
                "than 0 and 1."
            )
        stack = stack.astype(bool)
    s, p = np.nonzero(stack.reshape(len(stack), -1))
    return p, s, len(stack)


def greedy_regions(
    attr: np.ndarray, pairs: list[tuple[np.ndarray, np.ndarray, int]], area_threshold: float = 1.0,
    min_pixel_diff: int = 50,
) -> tuple[np.ndarray, np.ndarray]:
    """XRAI's greedy region growth for images ``attr`` ``(G, H, W)``, all at once.

    ``pairs[g]``: image ``g``'s ``(pixels, segments, count)``. Returns the XRAI map (float64) and the
    rank of the region each pixel belongs to (1 = highest gain; PAIR's ``flatten_xrai_segments``).

    Example:
        >>> import numpy as np
        >>> attr = np.array([[[1.0, 2.0, 3.0, 4.0]]])
        >>> masks = np.array([[[1, 1, 0, 0]], [[0, 0, 1, 1]]], bool)
        >>> m, ranks = greedy_regions(attr, [mask_pairs(masks, (1, 4), 0)], min_pixel_diff=1)
        >>> m.tolist(), ranks.tolist()
        ([[[1.5, 1.5, 3.5, 3.5]]], [[[2, 2, 1, 1]]])
    """
    g, h, w = attr.shape
    size = h * w
    flat = attr.reshape(-1).astype(np.float64)
    counts = [c for _, _, c in pairs]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    total = int(sum(counts))
    pix = np.concatenate([p + k * size for k, (p, _, _) in enumerate(pairs)])
    ids = np.concatenate([s + starts[k] for k, (_, s, _) in enumerate(pairs)])
    owner = np.repeat(np.arange(g), counts)  # the image of each segment
    alive = np.ones(total, bool)
    covered_at = np.full(g * size, -1, np.int64)
    active = np.ones(g, bool)
    area = np.zeros(g)
    step_gain, step_image = [], []
    big = np.int64(total)
    while active.any():
        # only the pairs that can still count: uncovered pixels of live segments of active images (a covered
        # pixel adds 0 to both sums, so dropping its pairs leaves every sum as it was)
        keep = (covered_at[pix] < 0) & alive[ids] & active[owner[ids]]
        pix, ids = pix[keep], ids[keep]
        count = np.bincount(ids, minlength=total).astype(np.float64)
        sums = np.bincount(ids, weights=flat[pix], minlength=total)
        here = active[owner]
        alive &= ~(here & (count < min_pixel_diff))  # PAIR drops masks adding too few pixels, for good
        left = np.add.reduceat((alive & here).astype(np.int64), starts)
        active &= left > 0
        if not active.any():
            break
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(alive & active[owner], sums / count, -np.inf)
        best = np.maximum.reduceat(gain, starts)
        first = np.minimum.reduceat(np.where((gain == best[owner]) & (gain > -np.inf), np.arange(total), big), starts)
        chosen = np.flatnonzero(active & (first < big))
        if not len(chosen):
            break
        picked = first[chosen]
        step = len(step_gain)
        is_picked = np.zeros(total, bool)
        is_picked[picked] = True
        new = pix[is_picked[ids]]  # (pairs hold uncovered pixels only)
        # one step number per image's pick: steps are numbered globally, in image order
        step_of_image = np.full(g, -1, np.int64)
        step_of_image[chosen] = step + np.arange(len(chosen))
        covered_at[new] = step_of_image[new // size]
        step_gain.extend(gain[picked].tolist())
        step_image.extend(chosen.tolist())
        alive[picked] = False
        area = (covered_at.reshape(g, size) >= 0).mean(axis=1)
        active &= area <= area_threshold
    gains = np.asarray(step_gain, np.float64)
    images = np.asarray(step_image, np.int64)
    covered = covered_at.reshape(g, size)
    result = np.zeros((g, size))
    has = covered >= 0
    result[has] = gains[covered[has]]
    free_sum = np.where(has, 0.0, attr.reshape(g, size)).sum(axis=1)
    free_count = (~has).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest = free_sum / free_count  # PAIR: the mean attribution of the pixels no region reached
    result[~has] = np.broadcast_to(rest[:, None], (g, size))[~has]
    # ranks: per image, steps by decreasing gain (ties in step order, as Python's stable sort)
    order = np.lexsort((np.arange(len(gains)), -gains, images))
    rank = np.empty(len(gains), np.int64)
    first_of = np.searchsorted(images[order], np.arange(g))
    rank[order] = np.arange(len(gains)) - first_of[images[order]]
    steps_per_image = np.bincount(images, minlength=g)
    region_rank = rank[np.maximum(covered, 0)] if len(gains) else np.zeros_like(covered)
    ranks = np.where(has, region_rank + 1, steps_per_image[:, None] + 1)
    return result.reshape(g, h, w), ranks.reshape(g, h, w)


def _float_array(value: Any) -> np.ndarray:
    """A given base attribution as a finite float64 array, or kerascope's error naming it."""
    try:
        array = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        array = None
    problem = (
        f"base_attribution={value!r}" if array is None or array.ndim not in (3, 4)
        else f"base_attribution with {int(np.sum(~np.isfinite(array)))} NaN or infinite values"
        if not np.all(np.isfinite(array)) else None
    )
    if problem is not None:
        if array is not None and array.ndim > 0:
            problem = problem if array.ndim in (3, 4) else f"base_attribution of shape {array.shape}"
        raise ValueError(
            f"`base_attribution` must be a finite array (N, H, W, C) or (N, H, W). Received: {problem}."
        )
    return array


@register
class XRAI(Method):
    """XRAI (Kapishnikov et al. 2019): attribution by regions, grown greedily from the densest segment.

    Each pixel's value is the mean base attribution over the new pixels of the segment that added it
    to the region (segments added in decreasing order of that density, until ``area_threshold`` of the
    image is covered; pixels never reached get their own mean). ``extras["ranks"]`` holds each
    pixel's region rank (1 = the region of highest gain). As PAIR ``saliency`` 0.2.1's ``XRAI``
    (algorithm ``"full"``): equal to it for the same ``segments`` and ``base_attribution``.

    Args:
        segments: ``None`` (default): Felzenszwalb segments at PAIR's six scales (``scale`` 50 ... 1200,
            ``sigma`` 0.8, ``min_size`` 150, computed at 224 x 224 and dilated by a disk of radius 5;
            needs scikit-image), or per image a list / stack of boolean ``(H, W)`` masks (a list with one
            entry per image, or an array ``(N, K, H, W)``).
        base_attribution: ``None``: Integrated Gradients from a black and from a white baseline (the
            image's minimum and maximum), averaged, as PAIR; or an array ``(N, H, W, C)`` / ``(N, H, W)``.
            A channel axis is reduced by its maximum.
        steps: IG path points per baseline (PAIR's 100); ``method``: IG's quadrature (default
            ``"gausslegendre"``; PAIR sums equally weighted gradients at ``linspace(0, 1, steps)``).
        area_threshold: stop once the region covers this share of the image (PAIR's default 1.0).
        min_pixel_diff: a segment adding fewer new pixels is dropped (PAIR's default 50).
        input_index: the model input attributed (multi-input models).

    Cost: without ``base_attribution``, ``2 steps`` forward+backward passes per image (plus one
    forward pass for the scores); the segmentation (6 Felzenszwalb runs per image) and the greedy
    growth run on the host, the growth for ``batch_size`` images at once.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> left = np.zeros((4, 4), bool); left[:, :2] = True
        >>> segs = [np.stack([left, ~left])]
        >>> attr = np.zeros((1, 4, 4)); attr[0, :, 2:] = 1.0
        >>> e = ks.XRAI(m, segments=segs, base_attribution=attr, min_pixel_diff=1).explain(np.ones((1, 4, 4, 1)), 0)
        >>> e.attributions[0, 0].tolist(), e.extras["ranks"][0, 0].tolist()
        ([0.0, 0.0, 1.0, 1.0], [2, 2, 1, 1])
    """

    name = "xrai"
    description = "Regions grown greedily from the segments with the densest attribution (Kapishnikov et al. 2019)."

    def __init__(
        self,
        model: keras.Layer,
        *,
        segments: Any = None,
        base_attribution: Any = None,
        steps: int = 100,
        method: str = "gausslegendre",
        area_threshold: float = 1.0,
        min_pixel_diff: int = 50,
        input_index: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.steps = check_positive_int(steps, "steps")
        self.method = method
        self.area_threshold = check_number(area_threshold, "area_threshold", low=0.0)
        self.min_pixel_diff = check_positive_int(min_pixel_diff, "min_pixel_diff")
        self.input_index = input_index
        if segments is not None and not isinstance(segments, (list, tuple, np.ndarray)):
            raise ValueError(
                "`segments` must be None (Felzenszwalb segments) or, per image, a list / stack of boolean masks. "
                f"Received: segments={segments!r}."
            )
        self._segments = segments
        self._base_attribution = None if base_attribution is None else _float_array(base_attribution)
        if base_attribution is None:
            IntegratedGradients(model, steps=steps, method=method)  # the quadrature checked now

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (given segments / base attributions reported by their kind and shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> ks.XRAI(m).params()["segments"]
            'felzenszwalb'
        """
        params = super().params()
        params["segments"] = "felzenszwalb" if self._segments is None else "given"
        params["base_attribution"] = (
            "integrated_gradients" if self._base_attribution is None
            else f"<array shape={self._base_attribution.shape}>"
        )
        return params

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        wrt = gradient_inputs(self.model, inputs, self.input_index)
        if len(wrt) != 1 or inputs.arrays[wrt[0]].ndim != 4:
            raise ValueError(
                "XRAI attributes one image input (N, H, W, C). Received: input(s) "
                f"{[inputs.arrays[i].shape for i in wrt]}. Choose the image with `input_index=`."
            )
        at = wrt[0]
        x = inputs.arrays[at]
        n, h, w = x.shape[:3]
        segments = self._check_segments(n, (h, w))
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, True)
        attr = self._base(inputs, targets, resolved, at)
        result = np.zeros((n, h, w))
        ranks = np.zeros((n, h, w), np.int64)
        for rows in chunk_ranges(n, self.batch_size):
            pairs = [
                label_pairs(felzenszwalb_labels(x[i])) if segments is None else mask_pairs(segments[i], (h, w), i)
                for i in rows
            ]
            result[rows], ranks[rows] = greedy_regions(attr[rows], pairs, self.area_threshold, self.min_pixel_diff)
        return self._input_result(inputs, [at], [result.astype(np.float32)], scores, resolved, ranks=ranks)

    def _check_segments(self, n: int, shape: tuple[int, int]) -> Any:
        given = self._segments
        if given is None:
            return None
        if isinstance(given, np.ndarray) and given.ndim == 3 and n == 1:
            given = [given]
        if len(given) != n:
            raise ValueError(
                f"`segments` needs one list / stack of masks per image ({n} images). Received: segments with "
                f"{len(given)} entries."
            )
        for i, masks in enumerate(given):
            mask_pairs(masks, shape, i)  # checked before any pass runs
        return given

    def _base(self, inputs: Inputs, targets: Any, resolved: np.ndarray, at: int) -> np.ndarray:
        """The base attribution ``(N, H, W)``: given, or IG from black and white averaged; channels by max."""
        x = inputs.arrays[at]
        n, h, w = x.shape[:3]
        if self._base_attribution is not None:
            attr = self._base_attribution
            if attr.shape not in (x.shape, x.shape[:3]):
                raise ValueError(
                    f"`base_attribution` must have the inputs' shape {x.shape} or {x.shape[:3]}. "
                    f"Received: base_attribution with shape {attr.shape}."
                )
        else:
            low = x.reshape(n, -1).min(axis=1).reshape(n, 1, 1, 1)
            high = x.reshape(n, -1).max(axis=1).reshape(n, 1, 1, 1)
            doubled = Inputs(inputs.model_arg([np.concatenate([a, a]) for a in inputs.arrays]))
            baseline = np.concatenate([np.broadcast_to(low, x.shape), np.broadcast_to(high, x.shape)])
            ig = IntegratedGradients(
                self.model, steps=self.steps, method=self.method, baseline=baseline, input_index=at,
                batch_size=self.batch_size, output=self.output, output_index=self.output_index,
                output_layer=self.output_layer, precision=self.precision, call_index=self.call_index,
                jit_compile=self.jit_compile, fold_batchnorm=self.fold_batchnorm,
            )
            both = ig.explain(doubled.model_arg(doubled.arrays), targets if callable(targets) else np.concatenate(
                [resolved, resolved]))
            attr = np.asarray(both.attributions if not isinstance(both.attributions, list) else both.attributions[0])
            attr = (attr[:n].astype(np.float64) + attr[n:]) / 2
        return attr.max(axis=-1) if attr.ndim == 4 else attr
