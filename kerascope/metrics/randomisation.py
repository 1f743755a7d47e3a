"""Quantus's randomisation family (the parts beyond :mod:`kerascope.metrics.sanity`): Random Logit.

The explained method is a registered name, a ``Method`` class, or a callable
``(model, inputs, targets) -> attributions``; it is called once for all
samples (the method batches internally, ``batch_size`` at a time).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.metrics._common import MetricResult, Scorer, image_batch


def ssim_1d(a: np.ndarray, b: np.ndarray, win_size: int = 7) -> np.ndarray:
    """Per-row SSIM of flattened ``(N, D)`` arrays as Quantus computes it (``skimage.metrics.structural_similarity``
    on the 1-D vectors: a uniform ``win_size`` window, sample covariance, ``K1=0.01``, ``K2=0.03``, the data range of
    both rows together), vectorised over rows.

    Example:
        >>> import numpy as np
        >>> v = np.random.default_rng(0).random((2, 20))
        >>> np.round(ssim_1d(v, v), 6).tolist()
        [1.0, 1.0]
    """
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    if a.shape[1] < win_size:
        raise ValueError(f"SSIM needs at least win_size={win_size} values per sample. Received: {a.shape[1]}.")
    view = lambda v: np.lib.stride_tricks.sliding_window_view(v, win_size, axis=1).mean(-1)  # noqa: E731
    ux, uy, uxx, uyy, uxy = view(a), view(b), view(a * a), view(b * b), view(a * b)
    norm = win_size / (win_size - 1)
    vx, vy, vxy = norm * (uxx - ux * ux), norm * (uyy - uy * uy), norm * (uxy - ux * uy)
    both = np.concatenate([a, b], axis=1)
    r = np.abs(both.max(1) - both.min(1))[:, None]
    c1, c2 = (0.01 * r) ** 2, (0.03 * r) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.mean(1)


def random_logit(
    model: keras.Layer,
    inputs: Any,
    method: Any,
    targets: Any = None,
    *,
    num_classes: int | None = None,
    seed: int = 42,
    attributions: Any = None,
    abs: bool = False,  # noqa: A002 - Quantus's name
    batch_size: int = 64,
    method_kwargs: dict | None = None,
) -> MetricResult:
    """Random Logit (Sixt et al. 2020): similarity between the explanation of the target and of a random other class.

    The other class is drawn per sample uniformly among the ``num_classes - 1``
    non-target classes with Quantus's draw (``np.random.seed(seed)``, then
    ``randint(0, num_classes - 1, N)``; here from a private ``RandomState``,
    the global one is left alone). Similarity is :func:`ssim_1d` of the
    flattened attributions (Quantus's ``ssim``; flattened in ``(H, W, C)``
    order). **Lower is better** (the explanation depends on the class).

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(3)])
        >>> r = random_logit(m, np.random.default_rng(0).random((2, 4, 4, 1)), "saliency", 0)
        >>> r.details["other"].shape, bool((r.details["other"] != 0).all())
        ((2,), True)
    """
    from kerascope.metrics.sanity import _explainer

    x = image_batch(inputs)
    n = len(x)
    _, explain = _explainer(method, batch_size, method_kwargs)
    scorer = Scorer(model, "logits", batch_size)
    classes = scorer.targets(x, targets)
    k = int(num_classes) if num_classes is not None else scorer.outputs(x[:1]).shape[-1]
    if k < 2 or classes.max() >= k:
        raise ValueError(f"`num_classes` must be >= 2 and above every target. Received: num_classes={k}, "
                         f"targets up to {int(classes.max())}.")
    offsets = np.random.RandomState(seed).randint(0, k - 1, n)
    other = offsets + (offsets >= classes)  # the offsets-th class among those != target, in index order
    base = explain(model, x, classes) if attributions is None else attributions
    base = np.asarray(getattr(base, "attributions", base), np.float64).reshape(n, -1)
    moved = np.asarray(explain(model, x, other), np.float64).reshape(n, -1)
    if abs:
        base, moved = np.abs(base), np.abs(moved)
    return MetricResult("random_logit", ssim_1d(base, moved), False,
                        {"targets": classes, "other": other, "seed": seed})
