"""Quantus's robustness family: does the explanation stay put when the input moves a little?

Each metric re-explains ``samples`` perturbed copies of every input with the
given method (a registered name, a ``Method`` class, or a callable
``(model, inputs, targets) -> attributions``). All ``N x samples`` perturbed
inputs are built chunk by chunk (``batch_size`` at a time), explained with one
batched call per chunk and reduced to one number each: memory is bounded by
``batch_size`` and there is no Python loop per sample or per draw. Targets are
fixed to the clean inputs' (None = the predicted classes). Noise comes from
one seeded stream consumed in order, so results do not depend on
``batch_size``; ``perturbations=`` ``(N, samples, *input shape)`` passes the
draws in instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascope.metrics._common import MetricResult, Scorer, image_batch, public_metric, raw_attributions
from kerascope.metrics._features import check_positive_int
from kerascope.numeric.chunking import check_batch_size, chunk_bounds


def _flat(a: Any, n: int) -> np.ndarray:
    return np.asarray(raw_attributions(a), np.float64).reshape(n, -1)


def _perturbed_stats(
    model: keras.Layer, inputs: Any, method: Any, targets: Any, *, samples: int, draw: Callable, perturbations: Any,
    stat: Callable, attributions: Any, abs_: bool, batch_size: int, method_kwargs: dict | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``stat(a, a_perturbed, x, x_perturbed, rows)`` ``(N, samples)`` over perturbed re-explanations."""
    from kerascope.metrics.sanity import _explainer

    check_batch_size(batch_size)
    runs = check_positive_int("samples", samples)
    x = image_batch(inputs) if np.asarray(inputs).ndim in (3, 4) else np.asarray(inputs, np.float32)
    n = len(x)
    _, explain = _explainer(method, batch_size, method_kwargs)
    classes = Scorer(model, "logits", batch_size).targets(x, targets)
    base = explain(model, x, classes) if attributions is None else attributions
    a = _flat(base, n)
    a = np.abs(a) if abs_ else a
    if perturbations is not None:
        given = np.asarray(perturbations, np.float64)
        if given.shape[0] != n or given.shape[2:] != x.shape[1:]:
            raise ValueError(f"Expected `perturbations` of shape (N={n}, samples, *{x.shape[1:]}). "
                             f"Received: perturbations with shape {given.shape}.")
        runs = given.shape[1]
    out = np.empty((n * runs,))
    for start, stop in chunk_bounds(n * runs, batch_size):
        flat = np.arange(start, stop)
        i = flat // runs
        noise = draw((len(flat), *x.shape[1:])) if perturbations is None else given[i, flat % runs]
        xp = (x[i] + noise).astype(np.float32)
        ap = _flat(explain(model, xp, classes[i]), len(flat))
        ap = np.abs(ap) if abs_ else ap
        out[start:stop] = stat(a[i], ap, x[i].reshape(len(flat), -1).astype(np.float64),
                               xp.reshape(len(flat), -1).astype(np.float64), i)
    return out.reshape(n, runs), classes


def _norm(v: np.ndarray) -> np.ndarray:
    return np.sqrt((v * v).sum(-1))


def _relative_stat(kind: str, scorer: Scorer, x0: np.ndarray, eps_min: float, nan_on_change: bool) -> Callable:
    """Agarwal et al.'s ratio ``||(a - a') / a|| / ||(x - x') / x||`` (input) or ``/ ||h(x) - h(x')||`` (output)."""
    clean = scorer.outputs(x0).astype(np.float64)

    def stat(a, ap, x, xp, rows):
        numerator = _norm((a - ap) / (a + (a == 0) * eps_min))
        out = scorer.outputs(xp.reshape(len(xp), *x0.shape[1:]).astype(np.float32)).astype(np.float64)
        if kind == "relative_input_stability":
            denominator = _norm((x - xp) / (x + (x == 0) * eps_min))
        else:
            denominator = _norm(clean[rows] - out)
        value = numerator / (denominator + (denominator == 0) * eps_min)
        if nan_on_change:
            value = np.where(out.argmax(-1) == clean[rows].argmax(-1), value, np.nan)
        return value

    return stat


def _reexplained(
    kind: str,
    model: keras.Layer,
    inputs: Any,
    method: Any,
    targets: Any = None,
    *,
    radius: float = 0.2,
    samples: int = 200,
    mean: float = 0.0,
    eps_min: float = 1e-6,
    return_nan_when_prediction_changes: bool = True,
    attributions: Any = None,
    perturbations: Any = None,
    seed: int = 0,
    abs: bool = False,  # noqa: A002 - Quantus's name
    output: str = "logits",
    batch_size: int = 64,
    method_kwargs: dict | None = None,
) -> MetricResult:
    """The robustness metrics: one statistic per perturbed re-explanation, reduced over the draws."""
    rng = np.random.default_rng(seed)
    draw = lambda shape: rng.uniform(-radius, radius, shape)  # noqa: E731
    reduce = np.nanmax
    if kind in ("max_sensitivity", "avg_sensitivity"):
        def stat(a, ap, x, xp, rows):
            with np.errstate(invalid="ignore", divide="ignore"):
                return _norm(a - ap) / _norm(a)

        reduce = np.nanmax if kind == "max_sensitivity" else np.nanmean
    elif kind == "local_lipschitz_estimate":
        def stat(a, ap, x, xp, rows):
            return _norm(a - ap) / (_norm(x - xp) + 1e-10)

        draw = lambda shape: rng.normal(mean, radius, shape)  # noqa: E731
    else:
        x0 = image_batch(inputs) if np.asarray(inputs).ndim in (3, 4) else np.asarray(inputs, np.float32)
        stat = _relative_stat(kind, Scorer(model, output, batch_size), x0, eps_min,
                              return_nan_when_prediction_changes)
        reduce = np.max
    values, classes = _perturbed_stats(
        model, inputs, method, targets, samples=samples, perturbations=perturbations, stat=stat, draw=draw,
        attributions=attributions, abs_=abs, batch_size=batch_size, method_kwargs=method_kwargs)
    return MetricResult(kind, reduce(values, axis=1), False, {"targets": classes, "radius": radius, "seed": seed})


_SENSITIVITY_ONLY = ("mean", "eps_min", "return_nan_when_prediction_changes", "output")

max_sensitivity = public_metric(_reexplained, "max_sensitivity", """Max-sensitivity (Yeh et al. 2019): the largest
relative change of the explanation under uniform noise.

Per sample ``max_j ||a(x) - a(x + u_j)|| / ||a(x)||`` over ``samples``
draws ``u_j ~ U(-radius, radius)`` per element (Quantus's
``lower_bound``, Frobenius norms). ``attributions`` of the clean inputs
default to the method's own. Saliency of a linear model scores 0.
**Lower is better.** One explanation per draw.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    >>> float(max_sensitivity(m, np.ones((1, 2, 2, 1)), "saliency", 0, samples=4).scores[0])
    0.0
""", hide=_SENSITIVITY_ONLY)

avg_sensitivity = public_metric(_reexplained, "avg_sensitivity", """Avg-sensitivity (Yeh et al. 2019): the mean
relative change of the explanation under uniform noise.

As :func:`max_sensitivity` with the mean over draws. **Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    >>> x = np.random.default_rng(0).random((2, 2, 2, 1))
    >>> avg = avg_sensitivity(m, x, "gradient_x_input", 0, samples=4).scores
    >>> bool((avg <= max_sensitivity(m, x, "gradient_x_input", 0, samples=4).scores).all())
    True
""", hide=_SENSITIVITY_ONLY)

local_lipschitz_estimate = public_metric(_reexplained, "local_lipschitz_estimate", """Local Lipschitz estimate
(Alvarez-Melis & Jaakkola 2018): ``max_j ||a(x) - a(x')|| / (||x - x'|| + 1e-10)``.

``x' = x + g_j`` with Gaussian ``g_j ~ N(mean, radius^2)`` per element
(Quantus's ``perturb_std`` is ``radius``); Euclidean norms. Saliency of a
linear model scores 0. **Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    >>> float(local_lipschitz_estimate(m, np.ones((1, 2, 2, 1)), "saliency", 0, samples=4).scores[0])
    0.0
""", hide=_SENSITIVITY_ONLY[1:], radius=0.1)

relative_input_stability = public_metric(_reexplained, "relative_input_stability", """Relative input stability
(Agarwal et al. 2022): ``max_j ||(a - a') / a|| / ||(x - x') / x||``.

``x' = x + u_j``, ``u_j ~ U(-radius, radius)`` per element (Quantus draws
``U(0.02, 0.2)``: pass its draws as ``perturbations`` to compare); zeros
in a denominator become ``eps_min``. With
``return_nan_when_prediction_changes`` a sample is NaN as soon as one draw
changes its predicted class (as Quantus's maximum). **Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    >>> float(relative_input_stability(m, np.ones((1, 2, 2, 1)), "saliency", 0, samples=4,
    ...                                return_nan_when_prediction_changes=False).scores[0])
    0.0
""", hide=("mean",))

relative_output_stability = public_metric(_reexplained, "relative_output_stability", """Relative output stability
(Agarwal et al. 2022): ``max_j ||(a - a') / a|| / ||h(x) - h(x')||``.

``h`` is the model's output (``output="logits"`` by default, as Quantus);
otherwise as :func:`relative_input_stability`. **Lower is better.**
One explanation and one forward per draw.

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
    >>> r = relative_output_stability(m, np.ones((2, 2, 2, 1)), "saliency", [0, 1], samples=4,
    ...                               return_nan_when_prediction_changes=False)
    >>> r.scores.tolist()
    [0.0, 0.0]
""", hide=("mean",))


def consistency(
    model: keras.Layer,
    inputs: Any,
    method: Any = None,
    targets: Any = None,
    *,
    attributions: Any = None,
    n: int = 5,
    discretise: Callable[[np.ndarray], np.ndarray] | None = None,
    abs: bool = True,  # noqa: A002 - Quantus's name
    batch_size: int = 64,
    method_kwargs: dict | None = None,
) -> MetricResult:
    """Consistency (Dasgupta et al. 2022): do inputs with the same discretised explanation get the same prediction?

    Each explanation is discretised to a label — by default Quantus's
    ``top_n_sign``: the signs of its first ``n`` flattened values (``(H, W)`` or
    ``(H, W, C)`` order) — or by ``discretise(flat (N, D)) -> (N,)``. Per
    sample, the share of the *other* inputs with the same label that also
    share its predicted class (0 when no other input has its label). Scores
    depend on the batch, as in Quantus. **Higher is better.** ``method`` (or
    ``attributions``) gives the explanations; ``targets`` are what it explains.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> a = np.ones((3, 2, 2))
        >>> r = consistency(m, np.random.default_rng(0).random((3, 2, 2, 1)), attributions=a)
        >>> bool(np.isin(r.scores.round(6), [0.0, 0.5, 1.0]).all())
        True
    """
    x = image_batch(inputs) if np.asarray(inputs).ndim in (3, 4) else np.asarray(inputs, np.float32)
    count = len(x)
    scorer = Scorer(model, "logits", batch_size)
    predicted = scorer.outputs(x).argmax(-1)
    if attributions is None:
        if method is None:
            raise ValueError("Pass `method=` (to explain the inputs) or `attributions=`. Received: neither.")
        from kerascope.metrics.sanity import _explainer

        _, explain = _explainer(method, batch_size, method_kwargs)
        attributions = explain(model, x, scorer.targets(x, targets))
    a = _flat(attributions, count)
    a = np.abs(a) if abs else a
    if discretise is None:
        signs = np.sign(a[:, :check_positive_int("n", n)])
        labels = np.unique(signs, axis=0, return_inverse=True)[1].reshape(-1)
    else:
        labels = np.asarray(discretise(a)).reshape(-1)
    others = ~np.eye(count, dtype=bool)
    same_label = (labels[None] == labels[:, None]) & others
    same_class = (predicted[None] == predicted[:, None]) & others
    score = (same_class & same_label).sum(-1) / (same_label.sum(-1) + 1e-9)
    return MetricResult("consistency", score.astype(np.float64), True, {"labels": labels, "predicted": predicted})
