"""Forward passes with an intervention on one layer's output, driven per row.

Perturbation methods that act *inside* the network (AblationCAM zeroing one
channel of a feature map, ...) need many forward passes that differ only in
what happens at one layer. :func:`compile_scorer` compiles that once: a
forward pass in the engine's output space (a final softmax bypassed in
``"logits"`` mode) where ``transform(output, extra)`` replaces the layer's
output, ``extra`` being an extra input with one row per sample (e.g. the
index of the channel to ablate). Each row can so carry a different variant,
and variants are folded into the batch axis. The layer is intercepted with a
scoped :func:`~kerascope.core.probe.probe`, so the model is never modified
(and is restored even when the forward pass raises).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascope import _backend
from kerascope.core import targets as targets_lib
from kerascope.core.engine import Engine
from kerascope.core.inputs import Inputs
from kerascope.core.probe import probe

Transform = Callable[[Any, Any], Any]
Scorer = Callable[[list[np.ndarray], np.ndarray, "np.ndarray | None"], tuple[np.ndarray, np.ndarray]]


def compile_scorer(
    engine: Engine,
    inputs: Inputs,
    *,
    target_fn: Callable[[Any], Any] | None = None,
    layer: keras.Layer | None = None,
    transform: Transform | None = None,
    extra_spec: tuple[tuple[int | None, ...], str] | None = None,
) -> Scorer:
    """Compiled ``(arrays, indices, extra) -> (scores, resolved_targets)`` for ``engine``'s model.

    ``arrays`` are the model inputs of one chunk (rows = variants), ``indices``
    the class index per row (``-1``: predicted class) and ``extra`` the rows of
    the extra input described by ``extra_spec`` (``(shape, dtype)``, batch axis
    first) that ``transform(layer_output, extra)`` reads. With ``target_fn``
    (a callable target ``outputs -> (batch,)``) ``indices`` are passed through.
    One compiled function per (layer, transform, target, shapes) is cached on
    the engine, with a ``None`` batch dimension (no retracing per chunk size).
    ``transform`` should be a module-level function so the cache can reuse it.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> d = keras.layers.Dense(2, use_bias=False, kernel_initializer="ones", name="d")
        >>> m = keras.Sequential([keras.Input((2,)), d, keras.layers.Dense(1, kernel_initializer="ones")])
        >>> def scale(output, factor):
        ...     return output * keras.ops.expand_dims(factor, -1)
        >>> x = Inputs(np.ones((2, 2)))
        >>> fn = compile_scorer(engine_for(m), x, layer=d, transform=scale, extra_spec=((None,), "float32"))
        >>> fn(x.arrays, np.zeros(2, "int32"), np.array([1.0, 0.0], "float32"))[0].tolist()
        [4.0, 0.0]
    """
    if (layer is None) != (transform is None):
        raise ValueError(
            "`layer` and `transform` go together. Received: "
            f"layer={getattr(layer, 'name', layer)!r}, transform={transform!r}."
        )
    engine._detect_softmax(inputs)
    specs = tuple((tuple(s[1:]), d) for s, d in inputs.specs)
    extra_key = None if extra_spec is None else (tuple(extra_spec[0][1:]), extra_spec[1])
    key = ("intervene", layer, transform, target_fn, specs, extra_key)
    cached = engine._compiled.get(key)
    if cached is not None:
        return cached

    bypass = list(engine._bypassed or []) if engine.output == "logits" else []
    owner = weakref.ref(engine)
    model_arg = inputs.structurer()
    count = len(inputs.arrays)

    def run(flat: list[Any]) -> dict[str, Any]:
        eng = owner()
        arrays, indices = flat[:count], flat[count]
        extra = flat[count + 1] if extra_spec is not None else None
        with contextlib.ExitStack() as stack:
            if layer is not None:
                stack.enter_context(probe([layer], lambda _i, _l, out: transform(out, extra)))
            outputs = eng.call_model(model_arg(arrays), stack, bypass)
        if target_fn is not None:
            scores, resolved = keras.ops.reshape(target_fn(outputs), (-1,)), indices
        else:
            scores, resolved = targets_lib.class_scores(eng._select(outputs), indices)
        return {"scores": keras.ops.cast(scores, "float32"), "targets": resolved}

    all_specs = list(inputs.specs) + [((None,), "int32")] + ([extra_spec] if extra_spec is not None else [])
    compiled = _backend.get().compile_forward(run, input_specs=all_specs, jit_compile=engine.jit_compile)

    def scorer(arrays: list[np.ndarray], indices: np.ndarray, extra: np.ndarray | None = None) -> tuple[
        np.ndarray, np.ndarray
    ]:
        flat = list(arrays) + [np.asarray(indices, np.int32)]
        if extra_spec is not None:
            if extra is None:
                raise ValueError("This scorer was compiled with `extra_spec`; pass `extra` rows. Received: extra=None.")
            flat.append(np.asarray(extra, dtype=extra_spec[1]))
        out = compiled(flat)
        return np.asarray(out["scores"], np.float32), np.asarray(out["targets"]).astype(np.int64)

    engine._compiled[key] = scorer
    return scorer
