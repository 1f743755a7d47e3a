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
from kerascope.metrics._features import Features, check_positive_int


def completeness(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    perturbation: str | float = "black",
    abs: bool = False,  # noqa: A002 - Quantus's name
    atol: float = 1e-5,
    rtol: float = 1e-4,
    output: str = "logits",
    batch_size: int = 64,
) -> MetricResult:
    """Completeness (Sundararajan et al. 2017): do the attributions sum to ``f(x) - f(baseline)``?

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
    """
    f = Features(model, inputs, attributions, targets, perturbation, abs, output, batch_size)
    base = np.broadcast_to(f.base[:, None, None, None], f.shape).astype(np.float32)
    y = f.original().astype(np.float64)
    y0 = f.scorer.score_chunks(f.n, lambda j: base[j], lambda j: f.classes[j]).astype(np.float64)
    expected = y - y0
    gap = f.a.sum(1) - expected
    ok = np.abs(gap) <= atol + rtol * np.abs(expected)
    return MetricResult("completeness", ok.astype(np.float64), True, {"targets": f.classes, "gap": gap})


def non_sensitivity(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    eps: float = 1e-5,
    features_in_step: int = 1,
    perturbation: str | float = "black",
    abs: bool = True,  # noqa: A002 - Quantus's name
    output: str = "probabilities",
    batch_size: int = 64,
) -> MetricResult:
    """Non-sensitivity (Nguyen & Martinez 2020): features the model ignores should get zero attribution.

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
    """
    f = Features(model, inputs, attributions, targets, perturbation, abs, output, batch_size)
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
