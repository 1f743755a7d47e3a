"""Images as ``N x F`` features for Quantus's perturbation metrics: pixels (all channels move together) for
``(N, H, W)`` maps, single elements for attributions of the input's shape."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascope.metrics._common import Scorer, image_batch, publish, unpack, with_defaults

BASELINES = ("black", "white", "mean", "zero")


def pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Pearson correlation of ``(N, K)`` arrays (NaN where a row is constant), as ``scipy.stats.pearsonr``.

    Example:
        >>> import numpy as np
        >>> pearson_rows(np.array([[1.0, 2.0, 3.0]]), np.array([[2.0, 4.0, 7.0]])).round(4).tolist()
        [0.9934]
    """
    a = np.asarray(a, np.float64) - np.mean(a, axis=1, keepdims=True)
    b = np.asarray(b, np.float64) - np.mean(b, axis=1, keepdims=True)
    denom = np.sqrt((a * a).sum(1) * (b * b).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (a * b).sum(1) / np.where(denom > 0, denom, 1.0), np.nan)


def baseline_values(x: np.ndarray, perturbation: str | float) -> np.ndarray:
    """Per-sample replacement value ``(N,)``: ``"black"`` the image's minimum (Quantus), ``"white"`` its maximum,
    ``"mean"`` its mean over all elements, ``"zero"`` or a float.

    Example:
        >>> import numpy as np
        >>> baseline_values(np.array([[[[0.2, 0.5]]], [[[0.1, 0.9]]]]), "black").tolist()
        [0.2, 0.1]
    """
    flat = np.asarray(x, np.float64).reshape(len(x), -1)
    if isinstance(perturbation, (int, float, np.floating)) and not isinstance(perturbation, bool):
        return np.full((len(x),), float(perturbation))
    table = {"black": lambda: flat.min(1), "white": lambda: flat.max(1), "mean": lambda: flat.mean(1),
             "zero": lambda: np.zeros(len(x))}
    if perturbation not in table:
        raise ValueError(f"Unknown perturbation. Received: perturbation={perturbation!r}. "
                         f"Expected one of {BASELINES} or a float.")
    return table[perturbation]()


class Features:
    """The inputs, attributions and model scores of one perturbation metric.

    ``x`` is ``(N, F, G)`` (``F`` features of ``G`` values), ``a`` ``(N, F)``;
    ``images(rows, removed)`` builds perturbed images for sample indices
    ``rows`` where ``removed`` ``(len(rows), F)`` is replaced by the baseline
    (or by ``fill`` when given); ``score`` scores them in chunks of ``batch_size``.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])
        >>> f = Features(m, np.ones((1, 2, 2, 1)), np.ones((1, 2, 2)), 0, "black", False, "logits", 8)
        >>> f.x.shape, f.a.shape
        ((1, 4, 1), (1, 4))
    """

    def __init__(self, model: keras.Layer, inputs: Any, attributions: Any, targets: Any,
                 perturbation: str | float, absolute: bool, output: str, batch_size: int) -> None:
        attributions, targets = unpack(attributions, targets)
        x = image_batch(inputs)
        n, h, w, c = x.shape
        a = np.asarray(attributions, np.float64)
        if a.ndim == 4 and a.shape[-1] == 1 and c > 1:
            a = a[..., 0]
        if a.shape == x.shape:
            self.per_pixel, g = False, 1
        elif a.shape == x.shape[:3]:
            self.per_pixel, g = True, c
        else:
            raise ValueError(
                f"Expected attributions of shape (N, H, W) = {x.shape[:3]} (per pixel) or of the inputs' shape "
                f"{x.shape} (per element). Received: attributions with shape {a.shape}."
            )
        self.shape = x.shape
        self.perturbation = perturbation
        self.x = x.reshape(n, -1, g)
        self.a = np.abs(a.reshape(n, -1)) if absolute else a.reshape(n, -1)
        self.base = baseline_values(x, perturbation).astype(np.float32)
        self.scorer = Scorer(model, output, batch_size)
        self.classes = self.scorer.targets(x, targets)

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def features(self) -> int:
        return self.x.shape[1]

    def images(self, rows: np.ndarray, removed: np.ndarray, fill: np.ndarray | None = None) -> np.ndarray:
        """Images of samples ``rows`` with the ``removed`` features replaced (baseline or ``fill[rows]``)."""
        out = self.x[rows]  # a fresh float32 copy, filled in place
        source = self.base[rows][:, None, None] if fill is None else fill
        np.copyto(out, np.broadcast_to(source, out.shape), where=removed[..., None], casting="same_kind")
        return out.reshape(len(rows), *self.shape[1:])

    def score(self, total: int, make: Callable[[np.ndarray], np.ndarray], per_sample: int) -> np.ndarray:
        """Target scores of ``total`` generated images (``make(flat)``), ``per_sample`` consecutive per sample."""
        return self.scorer.score_chunks(total, make, lambda flat: self.classes[flat // per_sample])

    def original(self) -> np.ndarray:
        x = self.x.reshape(self.shape)
        return self.scorer.score_chunks(self.n, lambda j: x[j], lambda j: self.classes[j])

    def original_and_score(self, total: int, make: Callable[[np.ndarray], np.ndarray],
                           per_sample: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`original` and :meth:`score` in one chunked pass: the ``N`` inputs first, then the
        ``total`` generated images (no chunk of its own for the inputs)."""
        x, n = self.x.reshape(self.shape), self.n

        def both(flat: np.ndarray) -> np.ndarray:
            head, tail = flat[flat < n], flat[flat >= n] - n
            if not len(tail):
                return x[head]
            return make(tail) if not len(head) else np.concatenate([x[head], make(tail)])

        def classes(flat: np.ndarray) -> np.ndarray:
            return self.classes[np.where(flat < n, flat, (flat - n) // per_sample)]

        out = self.scorer.score_chunks(n + total, both, classes)
        return out[:n], out[n:]

    def pixels(self, per_feature: np.ndarray) -> np.ndarray:
        """A per-pixel ``(N, H*W)`` quantity as per-feature ``(N, F)`` (repeated over channels for elements)."""
        return per_feature if self.per_pixel else np.repeat(per_feature, self.shape[3], axis=1)

    def pixel_sums(self) -> np.ndarray:
        """Attributions summed over channels per pixel, ``(N, H*W)``."""
        return self.a if self.per_pixel else self.a.reshape(self.n, -1, self.shape[3]).sum(-1)


def ranks(values: np.ndarray, descending: bool = True) -> np.ndarray:
    """``ranks[i, f]`` = position of feature ``f`` when row ``i`` is sorted (ties: index order).

    Example:
        >>> ranks(np.array([[0.1, 0.9, 0.5]])).tolist()
        [[2, 0, 1]]
    """
    keys = -values if descending else values
    order = np.argsort(keys, axis=1)  # introsort: where no row holds equal values, the one order there is
    kept = np.take_along_axis(keys, order, axis=1)
    if np.isnan(kept).any() or (kept[:, 1:] == kept[:, :-1]).any():
        order = np.argsort(keys, axis=1, kind="stable")  # equal values keep their index order
    out = np.empty_like(order)
    np.put_along_axis(out, order, np.broadcast_to(np.arange(values.shape[1]), values.shape), axis=1)
    return out


def check_positive_int(name: str, value: Any, upper: int | None = None) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1 or (
            upper is not None and value > upper):
        bound = f" in [1, {upper}]" if upper is not None else ""
        raise ValueError(f"`{name}` must be a positive int{bound}. Received: {name}={value!r}.")
    return int(value)


def _shared_keywords(
    model: keras.Layer,
    inputs: Any,
    attributions: Any,
    targets: Any = None,
    *,
    perturbation: str | float = "black",
    abs: bool = False,  # noqa: A002 - Quantus's name
    output: str = "probabilities",
    batch_size: int = 64,
) -> None:
    """The arguments every feature-removal metric takes (Quantus's names); they make its :class:`Features`."""


_SHARED = list(inspect.signature(_shared_keywords).parameters.values())


def features_metric(body: Callable, name: str, doc: str, **defaults: Any) -> Callable:
    """The public feature-removal metric ``name``: ``body(features, **own keywords)`` behind the shared arguments.

    The public signature is ``(model, inputs, attributions, targets=None, *,
    <body's keywords>, perturbation, abs, output, batch_size)``; ``defaults``
    changes a default (e.g. ``output="logits"`` where Quantus scores logits).

    Example:
        >>> import keras, numpy as np
        >>> def _size(f: Features, *, scale: int = 1) -> int:
        ...     return scale * f.features
        >>> size = features_metric(_size, "size", "Features per sample.", abs=True)
        >>> m = keras.Sequential([keras.Input((2, 2, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])
        >>> size(m, np.ones((1, 2, 2, 1)), np.ones((1, 2, 2)), 0, scale=3)
        12
    """
    own = list(inspect.signature(body).parameters.values())[1:]
    params = with_defaults(_SHARED[:4] + own + _SHARED[4:], defaults, name)
    signature = inspect.Signature(params, return_annotation=inspect.signature(body).return_annotation)

    def call(bound: inspect.BoundArguments) -> Any:
        given = dict(bound.arguments)
        f = Features(*(given.pop(p.name) for p in _SHARED))
        return body(f, **given)

    return publish(call, name, doc, signature, body.__module__)
