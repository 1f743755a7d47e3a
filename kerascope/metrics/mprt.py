"""Quantus's model-parameter randomisation tests under Quantus's names: ``mprt`` (Adebayo et al. 2018),
``smooth_mprt`` and ``efficient_mprt`` (Hedström et al. 2023, "Sanity Checks Revisited").

All three build on :func:`kerascope.metrics.model_randomisation`'s machinery: the layers of an in-memory copy
of the model are re-initialised (the user's model is never touched), the explained method is re-run on the
copy once per state, for all samples at once (the method batches internally, ``batch_size`` at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core.layers import find_layer
from kerascope.metrics._common import MetricResult, Scorer, public_metric
from kerascope.metrics.faithfulness import CurveResult
from kerascope.metrics.sanity import (
    _explainer,
    copy_model,
    model_randomisation,
    randomise_layer,
    weighted_layers,
)

LAYER_ORDERS = {"top_down": "cascading", "independent": "independent"}


def _mode(layer_order: str) -> str:
    if layer_order not in LAYER_ORDERS:
        raise ValueError(f"Unknown layer order. Received: layer_order={layer_order!r}. Expected one of "
                         f"{tuple(LAYER_ORDERS)} (cascading from the output down, or one layer at a time).")
    return LAYER_ORDERS[layer_order]


def _similarities(name: str, result: Any, return_average_correlation: bool) -> CurveResult:
    curves = np.asarray(result.spearman, np.float64).T  # (N, steps)
    scores = curves.mean(1) if return_average_correlation else curves[:, -1]
    steps = curves.shape[1]
    return CurveResult(name, scores, False,
                       {"targets": result.targets, "layers": result.steps, "ssim": np.asarray(result.ssim).T,
                        "sanity": result},
                       curves=curves, fractions=(np.arange(steps) + 1) / steps)


def _mprt(
    kind: str,
    model: keras.Layer,
    inputs: Any,
    method: Any,
    targets: Any = None,
    *,
    nr_samples: int = 50,
    noise_magnitude: float = 0.1,
    layer_order: str = "top_down",
    seed: int = 42,
    return_average_correlation: bool = False,
    layers: Sequence[str] | None = None,
    reduce: str = "abs_sum",
    batch_size: int = 32,
    method_kwargs: dict | None = None,
) -> CurveResult:
    """MPRT and Smooth MPRT: rank correlations of the explanations as the layers are randomised."""
    if kind == "mprt":
        explainer, kwargs = method, {"method_kwargs": method_kwargs}
    else:
        if not isinstance(nr_samples, (int, np.integer)) or nr_samples < 1:
            raise ValueError(f"`nr_samples` must be a positive int. Received: nr_samples={nr_samples!r}.")
        if not noise_magnitude >= 0:
            raise ValueError(f"`noise_magnitude` must be >= 0. Received: noise_magnitude={noise_magnitude!r}.")
        _, explain = _explainer(method, batch_size, method_kwargs)

        def explainer(copy: keras.Layer, x: Any, classes: np.ndarray) -> np.ndarray:
            x = np.asarray(x, np.float32)
            axes = tuple(range(1, x.ndim))
            std = noise_magnitude * (x.max(axis=axes, keepdims=True) - x.min(axis=axes, keepdims=True))
            draws = np.random.default_rng(seed).standard_normal((nr_samples, *x.shape)).astype(np.float32)
            noisy = (x[None] + draws * std[None]).reshape(-1, *x.shape[1:])
            a = explain(copy, noisy, np.tile(np.asarray(classes), nr_samples))
            a = np.asarray(getattr(a, "attributions", a), np.float32)
            return a.reshape(nr_samples, len(x), *a.shape[1:]).mean(0)

        kwargs = {}
    result = model_randomisation(model, explainer, inputs, targets, mode=_mode(layer_order), layers=layers,
                                 seed=seed, reduce=reduce, batch_size=batch_size, keep_maps=False, **kwargs)
    return _similarities(kind, result, return_average_correlation)


mprt = public_metric(_mprt, "mprt", """\
Model Parameter Randomisation Test (Adebayo et al. 2018) with Quantus's ``MPRT`` parameter names.

``layer_order="top_down"`` randomises the weighted layers from the output down, cumulatively;
``"independent"`` one at a time (Quantus's orders; its ``"bottom_up"`` is not offered). ``curves``
``(N, layers)`` holds the Spearman rank correlation between the original and the randomised
explanation after each step (``details["ssim"]`` the SSIM), ``scores`` the last one (Quantus's
``return_last_correlation``) or their mean (``return_average_correlation=True``). Maps are reduced over
channels with ``reduce`` (``"abs_sum"``: Quantus's default ``abs=True``). Same as
:func:`model_randomisation`, which this calls. **Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
    ...                       keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
    >>> r = mprt(m, np.random.default_rng(0).random((2, 4, 4, 1)), "saliency", 0)
    >>> r.details["layers"], r.curves.shape
    (['d', 'c'], (2, 2))
""", hide=("nr_samples", "noise_magnitude"))


smooth_mprt = public_metric(_mprt, "smooth_mprt", """\
Smooth MPRT (Hedström et al. 2023): :func:`mprt` on explanations denoised by averaging.

Each explanation is the mean over ``nr_samples`` explanations of the input plus Gaussian noise of
standard deviation ``noise_magnitude * (max(x) - min(x))`` per sample (Quantus's ``SmoothMPRT``). The
same noise draws (from ``seed``) serve every model state, so the comparison sees only the change of
weights. Each state explains ``N * nr_samples`` inputs in one call (the method batches them). Quantus's
default order is ``"bottom_up"``, not offered here. **Lower is better.**

Example:
    >>> import keras, numpy as np
    >>> from keras import layers
    >>> m = keras.Sequential([keras.Input((4, 4, 1)), layers.Conv2D(2, 3), layers.Flatten(), layers.Dense(2)])
    >>> r = smooth_mprt(m, np.random.default_rng(0).random((2, 4, 4, 1)), "saliency", 0, nr_samples=4)
    >>> r.scores.shape
    (2,)
""")


def discrete_entropy(values: Any, n_bins: int = 100) -> np.ndarray:
    """Per-row entropy (nats) of the histogram of ``(N, ...)`` values in ``n_bins`` equal bins over each row's
    range, as Quantus's ``discrete_entropy`` (``np.histogram`` then ``scipy.stats.entropy``), vectorised.

    Example:
        >>> import numpy as np
        >>> discrete_entropy(np.array([[0.0, 1.0, 2.0, 3.0]]), n_bins=4).round(4).tolist()  # log(4)
        [1.3863]
    """
    v = np.asarray(values, np.float64).reshape(len(values), -1)
    lo, hi = v.min(1, keepdims=True), v.max(1, keepdims=True)
    flat = hi == lo
    lo, hi = np.where(flat, lo - 0.5, lo), np.where(flat, hi + 0.5, hi)  # np.histogram's range for constants
    edges = lo + (hi - lo) * np.linspace(0.0, 1.0, n_bins + 1)[None]
    edges[:, -1:] = hi
    index = np.clip(((v - lo) * (n_bins / (hi - lo))).astype(np.int64), 0, n_bins - 1)
    rows = np.arange(len(v))[:, None]
    index -= v < edges[rows, index]  # np.histogram's corrections at the edges
    index += (v >= edges[rows, index + 1]) & (index != n_bins - 1)
    counts = np.zeros((len(v), n_bins))
    np.add.at(counts, (np.broadcast_to(rows, index.shape), index), 1.0)
    p = counts / counts.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(1)


def efficient_mprt(
    model: keras.Layer,
    inputs: Any,
    method: Any,
    targets: Any = None,
    *,
    n_bins: int = 100,
    seed: int = 42,
    abs: bool = False,  # noqa: A002 - Quantus's name
    layers: Sequence[str] | None = None,
    batch_size: int = 32,
    method_kwargs: dict | None = None,
) -> MetricResult:
    """Efficient MPRT (Hedström et al. 2023): the relative rise in explanation complexity once every layer is
    randomised, ``(H(a_random) - H(a)) / H(a)``, ``H`` the :func:`discrete_entropy` of the raw attributions
    in ``n_bins`` bins (Quantus's ``EfficientMPRT`` with ``complexity_func_kwargs={"n_bins": n_bins}``).

    Only two explanations per sample: of the model and of its copy with every weighted layer (or
    ``layers``) randomised, cascading from the output down as :func:`mprt` (same seeds: the final state
    equals ``mprt``'s last). ``details`` holds both entropies and those of the model's outputs
    (``model_original`` / ``model_randomised``: entropy of each output vector, as Quantus's model scores).
    **Higher is better** (explaining noise should look noisier).

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
        >>> efficient_mprt(m, np.random.default_rng(0).random((2, 4, 4, 1)), "saliency", 0).scores.shape
        (2,)
    """
    if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"`n_bins` must be a positive int. Received: n_bins={n_bins!r}.")
    _, explain = _explainer(method, batch_size, method_kwargs)
    copy = copy_model(model, inputs)
    available = weighted_layers(copy)
    chosen = available if layers is None else list(layers)
    unknown = [p for p in chosen if p not in available]
    if unknown or not chosen:
        raise ValueError(f"Expected layers with weights to randomise. Received: layers={layers!r}. "
                         f"Available layers with weights: {available}.")
    order = [p for p in reversed(available) if p in chosen]
    scorer = Scorer(copy, "probabilities", batch_size)
    classes = scorer.targets(inputs, targets)

    def state() -> tuple[np.ndarray, np.ndarray]:
        a = explain(copy, inputs, classes)
        a = np.asarray(getattr(a, "attributions", a), np.float64)
        out = np.clip(scorer.outputs(inputs).astype(np.float64), 0, None)
        out = out / np.where(out.sum(1, keepdims=True) > 0, out.sum(1, keepdims=True), 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            model_entropy = -np.where(out > 0, out * np.log(np.where(out > 0, out, 1.0)), 0.0).sum(1)
        return discrete_entropy(np.abs(a) if abs else a, n_bins), model_entropy

    before, model_before = state()
    for step, path in enumerate(order):  # the seeds of model_randomisation's cascading steps
        randomise_layer(find_layer(copy, path), seed * 7919 + step)
    after, model_after = state()
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (after - before) / before
    return MetricResult("efficient_mprt", scores, True,
                        {"targets": classes, "layers": order, "complexity_original": before,
                         "complexity_randomised": after, "model_original": model_before,
                         "model_randomised": model_after, "n_bins": n_bins, "seed": seed})
