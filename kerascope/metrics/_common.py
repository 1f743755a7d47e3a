"""Shared pieces of the metrics: result types, attribution -> 2-D maps, target scoring, chunking."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope.core.engine import engine_for
from kerascope.core.explanation import Explanation
from kerascope.core.threads import single_threaded_blas
from kerascope.numeric.blur import gaussian_blur
from kerascope.numeric.chunking import check_batch_size, chunk_bounds
from kerascope.numeric.reduce import REDUCTIONS, reduce_channels
from kerascope.numeric.resize import upsample


@dataclass
class MetricResult:
    """Per-sample scores of one metric and their aggregate.

    ``higher_is_better`` says how to read the numbers; ``details`` holds
    metric-specific extras (e.g. the resolved targets).

    Example:
        >>> import numpy as np
        >>> r = MetricResult("pointing_game", np.array([1.0, 0.0, 1.0]), True)
        >>> round(r.aggregate, 3)
        0.667
    """

    name: str
    scores: np.ndarray
    higher_is_better: bool
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def aggregate(self) -> float:
        """Mean of the per-sample scores, ignoring NaN (undefined) samples.

        Example:
            >>> import numpy as np
            >>> MetricResult("m", np.array([1.0, np.nan, 3.0]), True).aggregate
            2.0
        """
        values = np.asarray(self.scores, np.float64)
        finite = values[np.isfinite(values)]
        return float(finite.mean()) if finite.size else float("nan")

    def __repr__(self) -> str:
        arrow = "higher is better" if self.higher_is_better else "lower is better"
        return f"{type(self).__name__}({self.name}={self.aggregate:.4g} over {len(self.scores)} samples, {arrow})"


def unpack(attributions: Any, targets: Any) -> tuple[Any, Any]:
    """Accept an :class:`Explanation` in place of raw attributions (its targets become the default).

    Example:
        >>> import numpy as np
        >>> e = Explanation(np.ones((1, 2, 2)), "x", {}, np.array([3]), np.array([1.0]))
        >>> unpack(e, None)[1].tolist()
        [3]
    """
    if isinstance(attributions, Explanation):
        return attributions.attributions, attributions.targets if targets is None else targets
    return attributions, targets


def raw_attributions(attributions: Any) -> Any:
    """The attributions of an :class:`Explanation`; anything else as it is.

    Example:
        >>> import numpy as np
        >>> raw_attributions(Explanation(np.ones((1, 2, 2)), "x", {}, np.array([3]), np.array([1.0]))).shape
        (1, 2, 2)
    """
    return unpack(attributions, None)[0]


def to_maps(attributions: Any, size: tuple[int, int] | None = None, reduce: str = "abs_sum") -> np.ndarray:
    """Turn attributions (an array or an :class:`Explanation`) into ``(N, H, W)`` float32 maps (channels
    reduced, resized to ``size``).

    ``(N, H, W, C)`` attributions are reduced over channels with ``reduce``
    (``"abs_sum"``, ``"sum"``, ``"max_abs"``, ``"positive"``); ``(N, h, w)``
    maps (CAMs) are only resized, bilinearly, when their size differs.

    Example:
        >>> import numpy as np
        >>> to_maps(np.array([[[[1.0, -2.0]]]]), reduce="sum").tolist()
        [[[-1.0]]]
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"Unknown channel reduction. Received: reduce={reduce!r}. Expected one of {REDUCTIONS}.")
    a = np.asarray(raw_attributions(attributions), np.float32)
    if a.ndim == 4:
        a = reduce_channels(a, reduce)
    if a.ndim != 3:
        raise ValueError(
            "Expected attributions of shape (N, H, W) or (N, H, W, C). "
            f"Received: attributions with shape {a.shape}."
        )
    if size is not None and tuple(a.shape[1:]) != tuple(size):
        a = upsample(a, tuple(size))
    return a.astype(np.float32)


def image_batch(inputs: Any) -> np.ndarray:
    """The inputs as a float32 ``(N, H, W, C)`` array (metrics that perturb pixels need one image input).

    Example:
        >>> import numpy as np
        >>> image_batch(np.zeros((2, 4, 4))).shape
        (2, 4, 4, 1)
    """
    if isinstance(inputs, (list, tuple, dict)):
        raise ValueError(
            "Pixel-perturbation metrics support models with one image input. Received: inputs of type "
            f"{type(inputs).__name__}. Wrap multi-input models in a callable model of one input."
        )
    x = np.asarray(inputs, np.float32)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise ValueError(f"Expected images of shape (N, H, W, C). Received: inputs with shape {x.shape}.")
    return x


class Scorer:
    """Scores of fixed target classes for batches of perturbed inputs, via the compiled forward.

    ``output="probabilities"`` scores the model's own output (probabilities for a
    softmax model); ``"logits"`` bypasses a final softmax.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, use_bias=False)])
        >>> m.set_weights([np.eye(2)])
        >>> s = Scorer(m, output="logits")
        >>> s.targets(np.array([[1.0, 3.0]]), None).tolist()
        [1]
    """

    def __init__(self, model: keras.Layer, output: str = "probabilities", batch_size: int = 32) -> None:
        batch_size = check_batch_size(batch_size)
        self.engine = engine_for(model, output)
        self.batch_size = batch_size

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """Model outputs ``(N, K)`` for a batch (chunked by ``batch_size``).

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
            >>> Scorer(m).outputs(np.zeros((5, 2))).shape
            (5, 3)
        """
        out = np.asarray(self.engine.forward(x, batch_size=self.batch_size), np.float32)
        return out.reshape(len(out), -1)

    def targets(self, x: np.ndarray, targets: Any) -> np.ndarray:
        """Resolve targets (int, list of ints, None = predicted class) to ``(N,)`` class indices.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
            >>> Scorer(m).targets(np.zeros((2, 2)), 1).tolist()
            [1, 1]
        """
        from kerascope.core.inputs import Inputs

        n = Inputs(x).num_samples
        if targets is None:
            return self.outputs(x).argmax(-1).astype(np.int64)
        if callable(targets):
            raise ValueError("Metrics need class-index targets. Received: a callable target.")
        t = np.asarray(targets, np.int64).reshape(-1)
        if t.size == 1:
            t = np.full((n,), int(t[0]), np.int64)
        if t.shape != (n,):
            raise ValueError(f"Expected one target per sample ({n}). Received: targets with shape {t.shape}.")
        return t

    def score_chunks(self, n_total: int, make: Callable[[np.ndarray], np.ndarray],
                     classes: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Score ``n_total`` lazily generated inputs: ``make(flat_indices)`` builds one chunk.

        Memory is bounded by ``batch_size``: each chunk is generated, scored and dropped.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
            >>> m.set_weights([np.array([[2.0]])])
            >>> s = Scorer(m, "logits", batch_size=2)
            >>> s.score_chunks(3, lambda j: j[:, None].astype("float32"), lambda j: 0 * j).tolist()
            [0.0, 2.0, 4.0]
        """
        scores = np.empty((n_total,), np.float32)
        score, dtype = None, None
        with single_threaded_blas():  # numpy between passes must not leave BLAS threads spinning
            for start, stop in chunk_bounds(n_total, self.batch_size):
                flat = np.arange(start, stop)
                if score is None:  # inputs checked once, on the first chunk: the others have its shape and dtype
                    prepared = self.engine.check_inputs(make(flat))
                    with self.engine.check_on_error(prepared):
                        score = self.engine.scorer(prepared)  # the target pick runs inside the compiled forward
                        scores[start:stop] = score(prepared.arrays, classes(flat))[0]
                    dtype = prepared.arrays[0].dtype
                    continue
                scores[start:stop] = score([np.asarray(make(flat), dtype)], classes(flat))[0]
        return scores


def baseline_images(x: np.ndarray, perturbation: str | float, blur_sigma: float | None = None) -> np.ndarray:
    """The replacement values for removed pixels: ``"zero"``, ``"mean"`` (per image and channel),
    ``"blur"`` (Gaussian-blurred image) or a constant float.

    Example:
        >>> import numpy as np
        >>> baseline_images(np.array([[[[1.0], [3.0]]]]), "mean").ravel().tolist()
        [2.0, 2.0]
    """
    if isinstance(perturbation, (int, float)) and not isinstance(perturbation, bool):
        return np.full_like(x, float(perturbation))
    if perturbation == "zero":
        return np.zeros_like(x)
    if perturbation == "mean":
        return np.broadcast_to(x.mean(axis=(1, 2), keepdims=True), x.shape).astype(np.float32)
    if perturbation == "blur":
        sigma = blur_sigma if blur_sigma is not None else max(1.0, x.shape[1] / 32)
        return gaussian_blur(x, sigma)
    raise ValueError(
        "Unknown perturbation. Received: perturbation="
        f"{perturbation!r}. Expected 'zero', 'blur', 'mean' or a float."
    )


def publish(call: Callable[[inspect.BoundArguments], Any], name: str, doc: str, signature: inspect.Signature,
            module: str) -> Callable:
    """A public function ``name`` of ``module`` with ``signature`` and ``doc`` that runs ``call(bound arguments)``.

    Example:
        >>> sig = inspect.signature(lambda x, *, scale=2.0: None)
        >>> twice = publish(lambda b: b.arguments["x"] * b.arguments["scale"], "twice", "Twice x.", sig, __name__)
        >>> twice(3.0), twice.__name__
        (6.0, 'twice')
    """

    def metric(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return call(bound)

    metric.__name__ = metric.__qualname__ = name
    metric.__doc__ = doc
    metric.__module__ = module
    metric.__signature__ = signature  # type: ignore[attr-defined]
    metric.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    metric.__annotations__["return"] = signature.return_annotation
    return metric


def with_defaults(params: list[inspect.Parameter], defaults: dict[str, Any], owner: str) -> list[inspect.Parameter]:
    """``params`` with the defaults in ``defaults`` changed (an unknown name is an error)."""
    unknown = set(defaults) - {p.name for p in params}
    if unknown:
        raise TypeError(f"Unknown keywords of {owner}. Received: {sorted(unknown)}.")
    return [p.replace(default=defaults[p.name]) if p.name in defaults else p for p in params]


def public_metric(impl: Callable, name: str, doc: str, *, hide: tuple[str, ...] = (), **defaults: Any) -> Callable:
    """One public metric from a shared implementation ``impl(name, ...)``: its signature less the name.

    Twin metrics (one implementation, a different reduction or default) keep
    their own name, docstring and Quantus-style keyword signature: ``hide``
    drops keywords the metric does not take (their defaults are passed),
    ``defaults`` changes a keyword's default.

    Example:
        >>> def _impl(kind: str, x: float, *, scale: float = 1.0, shift: float = 0.0) -> str:
        ...     return f"{kind}={x * scale + shift}"
        >>> doubled = public_metric(_impl, "doubled", "Twice x.", hide=("shift",), scale=2.0)
        >>> doubled(3.0), str(inspect.signature(doubled))
        ('doubled=6.0', "(x: 'float', *, scale: 'float' = 2.0) -> 'str'")
    """
    full = inspect.signature(impl)
    params = with_defaults(list(full.parameters.values())[1:], defaults, impl.__name__)
    if set(hide) - {p.name for p in params}:
        raise TypeError(f"Unknown keywords of {impl.__name__}. Received: hide={hide}.")
    hidden = {p.name: p.default for p in params if p.name in hide}
    signature = full.replace(parameters=[p for p in params if p.name not in hide])
    return publish(lambda bound: impl(name, *bound.args, **bound.kwargs, **hidden), name, doc, signature,
                   impl.__module__)
