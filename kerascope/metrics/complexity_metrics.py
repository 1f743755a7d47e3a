"""Complexity metrics: how concentrated is an explanation? (Quantus's complexity family.)

They need no model: each reads the attributions of every sample as one flat
vector (any shape ``(N, ...)``: ``(N, H, W)`` maps or attributions of the
input's shape), takes ``abs`` of it by default (as Quantus does) and reduces
it, vectorised over the samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kerascope.metrics._common import MetricResult, unpack


def flat_attributions(attributions: Any, absolute: bool) -> np.ndarray:
    """Attributions (array or :class:`~kerascope.Explanation`) as a float64 ``(N, D)`` array, ``abs`` if asked.

    Example:
        >>> import numpy as np
        >>> flat_attributions(np.array([[[-1.0, 2.0]]]), True).tolist()
        [[1.0, 2.0]]
    """
    a, _ = unpack(attributions, None)
    a = np.asarray(a, np.float64)
    if a.ndim < 2:
        raise ValueError(
            f"Expected attributions with a leading sample axis, (N, ...). Received: attributions with shape {a.shape}."
        )
    a = a.reshape(len(a), -1)
    return np.abs(a) if absolute else a


def sparseness(attributions: Any, *, abs: bool = True) -> MetricResult:  # noqa: A002 - Quantus's name
    """Sparseness (Chalasani et al. 2020): the Gini index of the attributions, per sample.

    ``G = sum_i (2 i - d - 1) a_(i) / (d sum_i a_(i))`` over the ``d`` values
    sorted ascending, after adding ``1e-7`` to every value as Quantus does (so a
    zero map is defined: 0). In [0, 1]: 0 for a uniform map, close to 1 when
    one feature holds all the mass. **Higher is better** (a sparser,
    easier-to-read explanation). ``abs=True`` takes absolute values first.

    Example:
        >>> import numpy as np
        >>> a = np.zeros((2, 4, 4)); a[0] = 1.0; a[1, 0, 0] = 1.0
        >>> np.round(sparseness(a).scores, 3).tolist()
        [0.0, 0.937]
    """
    a = flat_attributions(attributions, abs) + 1e-7
    d = a.shape[1]
    a = np.sort(a, axis=1)
    weights = 2 * np.arange(1, d + 1) - d - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        gini = (weights * a).sum(1) / (d * a.sum(1))
    return MetricResult("sparseness", gini, True, {"abs": abs})


def complexity(attributions: Any, *, abs: bool = True) -> MetricResult:  # noqa: A002 - Quantus's name
    """Complexity (Bhatt et al. 2020): the entropy of the attributions' share of the total, per sample.

    ``H = -sum_i p_i log(p_i + 1e-12)`` with ``p_i = a_i / sum_j |a_j|``
    (natural log; Quantus's formula). In [0, log d]: 0 when one feature holds
    all the mass, ``log d`` for a uniform map. **Lower is better.** A zero map
    is undefined (NaN).

    Example:
        >>> import numpy as np
        >>> a = np.zeros((2, 2, 2)); a[0] = 1.0; a[1, 0, 0] = 3.0
        >>> np.round(complexity(a).scores, 4).tolist()  # one feature: -1e-12, rounds to -0.0
        [1.3863, -0.0]
    """
    a = flat_attributions(attributions, abs)
    total = np.abs(a).sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = a / total
        entropy = -(p * np.log(p + 1e-12)).sum(1)
    return MetricResult("complexity", entropy, False, {"abs": abs})


def effective_complexity(attributions: Any, *, eps: float = 1e-5, abs: bool = True) -> MetricResult:  # noqa: A002
    """Effective complexity (Nguyen & Martinez 2020): the number of attributions above ``eps``, per sample.

    Counts ``a_i > eps`` (after ``abs`` when ``abs=True``), as Quantus does.
    **Lower is better** (fewer features carry the explanation). Scale the
    attributions first (e.g. divide by their maximum) to make ``eps`` relative.

    Example:
        >>> import numpy as np
        >>> effective_complexity(np.array([[[0.5, 0.0], [-2.0, 1e-6]]])).scores.tolist()
        [2.0]
    """
    a = flat_attributions(attributions, abs)
    return MetricResult("effective_complexity", (a > eps).sum(1).astype(np.float64), False,
                        {"eps": eps, "abs": abs})
