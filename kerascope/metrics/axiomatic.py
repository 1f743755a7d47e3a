"""Quantus's axiomatic family: properties an attribution should have by construction.

Conventions as :mod:`kerascope.metrics.faithfulness_curves` (features are
pixels for ``(N, H, W)`` maps, elements for attributions of the input's shape;
``perturbation="black"`` is the image's minimum).
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

from kerascope.metrics._common import MetricResult
from kerascope.metrics._features import Features, check_positive_int, features_metric


def _completeness(f: Features, *, atol: float = 1e-5, rtol: float = 1e-4) -> MetricResult:
    base = np.broadcast_to(f.base[:, None, None, None], f.shape).astype(np.float32)
    y = f.original().astype(np.float64)
    y0 = f.scorer.score_chunks(f.n, lambda j: base[j], lambda j: f.classes[j]).astype(np.float64)
    expected = y - y0
    gap = f.a.sum(1) - expected
    ok = np.abs(gap) <= atol + rtol * np.abs(expected)
    return MetricResult("completeness", ok.astype(np.float64), True, {"targets": f.classes, "gap": gap})


completeness = features_metric(_completeness, "completeness", """\
Completeness (Sundararajan et al. 2017): do the attributions sum to ``f(x) - f(baseline)``?

Per sample 1 when ``|sum(a) - (f(x) - f(x_0))| <= atol + rtol |f(x) - f(x_0)|``
with ``x_0`` the all-``perturbation`` image, else 0 (Quantus tests exact
float equality, which almost no float32 computation passes);
``details["gap"]`` holds ``sum(a) - (f(x) - f(x_0))``. **Higher is better.**
Integrated Gradients with that baseline (and enough steps) passes.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])
    >>> w = m.get_weights()[0].reshape(1, 2, 2); x = np.ones((1, 2, 2, 1))
    >>> completeness(m, x, w, 0, perturbation=0.0).scores.tolist()
    [1.0]
""", output="logits")


def _non_sensitivity(f: Features, *, eps: float = 1e-5, features_in_step: int = 1) -> MetricResult:
    step = check_positive_int("features_in_step", features_in_step, f.features)
    points = math.ceil(f.features / step)
    group = np.arange(f.features) // step

    def make(flat: np.ndarray) -> np.ndarray:
        i, k = flat // points, flat % points
        return f.images(i, group[None, :] == k[:, None])

    scores = f.score(f.n * points, make, points).reshape(f.n, points).astype(np.float64)
    insensitive = (np.abs(scores - f.original()[:, None]) < eps)[:, group]
    unattributed = f.a < eps
    return MetricResult("non_sensitivity", (insensitive ^ unattributed).sum(1).astype(np.float64), False,
                        {"targets": f.classes, "eps": eps})


non_sensitivity = features_metric(_non_sensitivity, "non_sensitivity", """\
Non-sensitivity (Nguyen & Martinez 2020): features the model ignores should get zero attribution.

Each group of ``features_in_step`` consecutive features (index order) is
replaced alone by the ``perturbation``; a feature is *insensitive* when its
group changes the target's score by less than ``eps``, and *unattributed*
when its attribution is below ``eps``. The score counts the features where
the two disagree. **Lower is better** (0: zero attribution exactly where the
model does not react). Quantus's count, for ``features_in_step=1``.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(),
    ...                       keras.layers.Dense(1, use_bias=False)])
    >>> m.set_weights([np.array([[1.0], [0.0], [2.0], [0.0]])])
    >>> a = np.array([[[1.0, 0.0], [2.0, 0.0]]])
    >>> non_sensitivity(m, np.ones((1, 2, 2, 1)), a, 0, perturbation=0.0, output="logits").scores.tolist()
    [0.0]
""", abs=True)


def shifted_copy(model: keras.Layer, inputs: Any, shift: float) -> keras.Layer:
    """A copy of ``model`` whose first weighted layer absorbs an input shift: ``copy(x + shift) == model(x)``.

    The first layer (``Dense`` or a convolution without padding effects) gets
    ``bias - shift * sum(kernel over its input axes)``; the user's model is not touched.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).random((2, 3)).astype("float32")
        >>> c = shifted_copy(m, x, -1.0)
        >>> bool(np.allclose(m.predict(x, verbose=0), c.predict(x - 1.0, verbose=0), atol=1e-5))
        True
    """
    from kerascope.core.layers import find_layer
    from kerascope.metrics.sanity import copy_model, weighted_layers

    copy = copy_model(model, inputs)
    paths = weighted_layers(copy)
    layer = find_layer(copy, paths[0]) if paths else None
    kernel, bias = getattr(layer, "kernel", None), getattr(layer, "bias", None)
    if kernel is None or bias is None:
        raise ValueError(
            "Input invariance shifts the first layer's bias, so the first weighted layer must be a Dense or "
            f"convolution layer with a bias. Received: first weighted layer {paths[0] if paths else None!r} "
            f"({type(layer).__name__}). Build the model with `use_bias=True` on its first layer."
        )
    k = np.asarray(keras.ops.convert_to_numpy(kernel))
    b = np.asarray(keras.ops.convert_to_numpy(bias))
    bias.assign((b - shift * k.sum(axis=tuple(range(k.ndim - 1)))).astype(b.dtype))
    return copy


def input_invariance(
    model: keras.Layer,
    inputs: Any,
    method: Any,
    targets: Any = None,
    *,
    input_shift: float = -1.0,
    attributions: Any = None,
    abs: bool = False,  # noqa: A002 - Quantus's name
    atol: float = 1e-4,
    batch_size: int = 64,
    method_kwargs: dict | None = None,
) -> MetricResult:
    """Input invariance (Kindermans et al. 2017): is the explanation unchanged by a constant input shift the
    model absorbs?

    The shifted model is a copy whose first layer's bias cancels
    ``input_shift`` (:func:`shifted_copy`); per sample 1 when the method's
    explanation of the shifted model on ``x + input_shift`` equals the
    original one (``np.isclose(..., atol=atol)``, as Quantus), else 0.
    Saliency passes; Gradient x Input does not. **Higher is better.** (Quantus
    0.6.0's ``InputInvariance`` shifts only part of the input's elements.)

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3), keras.layers.Flatten(),
        ...                       keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).random((2, 4, 4, 1))
        >>> input_invariance(m, x, "saliency", 0).scores.tolist()
        [1.0, 1.0]
    """
    from kerascope.metrics._common import Scorer
    from kerascope.metrics.sanity import _explainer

    x = np.asarray(inputs, np.float32)
    _, explain = _explainer(method, batch_size, method_kwargs)
    classes = Scorer(model, "logits", batch_size).targets(x, targets)
    base = explain(model, x, classes) if attributions is None else attributions
    base = np.asarray(getattr(base, "attributions", base), np.float64).reshape(len(x), -1)
    moved = np.asarray(explain(shifted_copy(model, x, input_shift), x + np.float32(input_shift), classes),
                       np.float64).reshape(len(x), -1)
    if abs:
        base, moved = np.abs(base), np.abs(moved)
    same = np.isclose(base, moved, atol=atol).all(axis=1)
    return MetricResult("input_invariance", same.astype(np.float64), True,
                        {"targets": classes, "max_change": np.abs(base - moved).max(1)})
