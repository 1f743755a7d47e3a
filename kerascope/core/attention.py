"""Attention probabilities per layer and head, read during one forward pass.

``keras.layers.MultiHeadAttention`` (and KerasHub's attention layers built on
it: BERT, GPT-2, ViT) computes its probabilities in ``_compute_attention``;
with flash attention or the fused ``dot_product_attention`` path they are never
materialised. While :func:`capture` is active *in the calling thread*, each
layer's ``_compute_attention`` takes the explicit path (flash switched off for
that call only) and its probabilities are recorded; other threads calling the
same model meanwhile run the layer exactly as before. The instance attribute is
removed when the last capture on the layer ends, so the model is unchanged.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core.inputs import Inputs, fit_structure
from kerascope.core.layers import find_layer, iter_layers

_LOCK = threading.Lock()
_ACTIVE: dict[int, int] = {}  # layer id -> number of captures (any thread) relying on the patch
_LOCAL = threading.local()


class _NoFlash:
    """The layer seen through ``_compute_attention`` with flash attention off (attributes read through)."""

    def __init__(self, layer: keras.Layer) -> None:
        object.__setattr__(self, "_layer", layer)

    def __getattr__(self, name: str) -> Any:
        if name == "_flash_attention":
            return False
        return getattr(object.__getattribute__(self, "_layer"), name)


def _patched(layer: keras.Layer) -> Any:
    original = type(layer)._compute_attention

    def compute(*args: Any, **kwargs: Any) -> Any:
        records = getattr(_LOCAL, "records", None)
        if records is None or id(layer) not in records:  # another thread, or no capture here
            return original(layer, *args, **kwargs)
        if len(args) >= 6:
            args = (*args[:5], True, *args[6:])
        else:
            kwargs["return_attention_scores"] = True
        output, scores = original(_NoFlash(layer), *args, **kwargs)
        records[id(layer)].append(scores)
        _LOCAL.order.append(id(layer))
        return output, scores

    return compute


@contextlib.contextmanager
def capture(layers: Sequence[keras.Layer]) -> Iterator[dict[int, list[Any]]]:
    """Record the attention probabilities ``(N, heads, T, S)`` of ``layers`` in this thread: ``{id: [calls]}``.

    Example:
        >>> import keras, numpy as np
        >>> x = keras.Input((4, 6))
        >>> mha = keras.layers.MultiHeadAttention(2, 3)
        >>> m = keras.Model(x, mha(x, x))
        >>> with capture([mha]) as seen:
        ...     _ = m(np.ones((1, 4, 6)))
        >>> tuple(seen[id(mha)][0].shape), "_compute_attention" in vars(mha)
        ((1, 2, 4, 4), False)
    """
    records: dict[int, list[Any]] = {id(layer): [] for layer in layers}
    previous, previous_order = getattr(_LOCAL, "records", None), getattr(_LOCAL, "order", None)
    with _LOCK:
        for layer in layers:
            if _ACTIVE.get(id(layer), 0) == 0:
                object.__setattr__(layer, "_compute_attention", _patched(layer))
            _ACTIVE[id(layer)] = _ACTIVE.get(id(layer), 0) + 1
    _LOCAL.records = {**(previous or {}), **records}
    _LOCAL.order = previous_order if previous_order is not None else []
    try:
        yield records
    finally:
        _LOCAL.records = previous
        if previous_order is None:
            del _LOCAL.order
        with _LOCK:
            for layer in layers:
                _ACTIVE[id(layer)] -= 1
                if _ACTIVE[id(layer)] == 0:
                    del _ACTIVE[id(layer)]
                    layer.__dict__.pop("_compute_attention", None)


def attention_layers(model: keras.Model, layers: Any = None) -> list[tuple[str, keras.Layer]]:
    """``(path, layer)`` of the attention layers read: ``layers`` (names / paths / layers) or every one.

    Example:
        >>> import keras
        >>> x = keras.Input((4, 6))
        >>> m = keras.Model(x, keras.layers.MultiHeadAttention(2, 3, name="att")(x, x))
        >>> [p for p, _ in attention_layers(m)]
        ['att']
    """
    found = [(p, layer) for p, layer in iter_layers(model) if isinstance(layer, keras.layers.MultiHeadAttention)]
    if layers is None:
        if not found:
            raise ValueError(
                f"Model {model.name!r} has no attention layer kerascope can read (`keras.layers.MultiHeadAttention` "
                "or a KerasHub layer built on it). Received: layers=None. Models with their own attention "
                "(e.g. Gemma's) are not supported yet."
            )
        return found
    paths = {id(layer): p for p, layer in found}
    chosen = []
    for item in [layers] if isinstance(layers, (str, keras.Layer)) else list(layers):
        layer = item if isinstance(item, keras.Layer) else find_layer(model, item)
        if id(layer) not in paths:
            raise ValueError(
                f"Layer {getattr(layer, 'name', layer)!r} is not an attention layer kerascope can read. Received: "
                f"layers={layers!r}. Available: {[p for p, _ in found][:12]}."
            )
        chosen.append((paths[id(layer)], layer))
    return chosen


def attention_maps(model: keras.Model, inputs: Any, layers: Any = None, batch_size: int = 32) -> dict[str, np.ndarray]:
    """The attention probabilities of every (or the given) attention layer: ``{path: (N, heads, T, S)}``.

    In forward order (the order the layers run). Rows sum to 1; a masked
    (padded or causal) position gets 0. A layer called more than once gets
    ``path#0``, ``path#1``, ... Cost: one forward pass, ``batch_size`` samples
    at a time, with the explicit (non-fused) attention path.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> x = keras.Input((4, 6))
        >>> m = keras.Model(x, keras.layers.MultiHeadAttention(2, 3, name="att")(x, x))
        >>> maps = ks.attention_maps(m, np.ones((1, 4, 6)))
        >>> maps["att"].shape, bool(np.allclose(maps["att"].sum(-1), 1.0))
        ((1, 2, 4, 4), True)
    """
    chosen = attention_layers(model, layers)
    prepared = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
    parts: dict[str, list[np.ndarray]] = {}
    paths = {id(layer): path for path, layer in chosen}
    for _, arrays in prepared.chunks(int(batch_size)):
        with capture([layer for _, layer in chosen]) as seen:
            model(fit_structure(model, prepared.model_arg(arrays)), training=False)
            order = list(_LOCAL.order)  # forward order of the calls
        counts = {key: len(calls) for key, calls in seen.items()}
        taken: dict[int, int] = {}
        for key in order:
            i = taken.get(key, 0)
            taken[key] = i + 1
            name = paths[key] if counts[key] == 1 else f"{paths[key]}#{i}"
            parts.setdefault(name, []).append(np.asarray(keras.ops.convert_to_numpy(seen[key][i]), np.float32))
    return {name: np.concatenate(chunks, axis=0) for name, chunks in parts.items()}


def rollout(maps: Sequence[np.ndarray], residual: float = 0.5) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) from per-layer maps ``(N, heads, T, T)``, first layer first.

    Each layer: the mean over heads, ``residual * I + (1 - residual) * A``, rows
    renormalised to sum to 1; the product runs from the first layer to the last
    (``R = A_L ... A_1``). Returns ``R`` of shape ``(N, T, T)``.

    Example:
        >>> a = np.full((1, 1, 2, 2), 0.5)
        >>> rollout([a, a]).round(3).tolist()
        [[[0.625, 0.375], [0.375, 0.625]]]
    """
    result = None
    for a in maps:
        a = np.asarray(a, np.float64).mean(axis=1)
        a = (1.0 - residual) * a + residual * np.eye(a.shape[-1])[None]
        a = a / a.sum(axis=-1, keepdims=True)
        result = a if result is None else a @ result
    if result is None:
        raise ValueError("Attention rollout needs at least one attention map. Received: none.")
    return result.astype(np.float32)


def gradient_rollout(weighted: Sequence[np.ndarray]) -> np.ndarray:
    """Gradient-weighted rollout (Chefer et al. 2021) from per-layer ``(N, T, T)`` maps, first layer first.

    ``weighted`` are the head means of ``(grad(A) * A)^+`` per layer. Starting
    from ``R = I``, each layer adds its propagated relevance: ``R <- R + A_bar R``.
    Returns ``R`` of shape ``(N, T, T)``.

    Example:
        >>> a = np.full((1, 2, 2), 0.5)
        >>> gradient_rollout([a, a]).round(3).tolist()
        [[[2.5, 1.5], [1.5, 2.5]]]
    """
    result = None
    for a in weighted:
        a = np.asarray(a, np.float64)
        if result is None:
            result = np.broadcast_to(np.eye(a.shape[-1]), a.shape).copy()
        result = result + a @ result
    if result is None:
        raise ValueError("Gradient-weighted rollout needs at least one attention layer. Received: none.")
    return result.astype(np.float32)
