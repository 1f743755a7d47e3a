"""Layer attribution for gradient methods: ``layer=`` attributes at a layer's output.

A gradient method with ``layer="embedding"`` explains the target in terms of the
layer's *activation* instead of the model inputs: attributions have the layer's
output shape (``(N, T, E)`` for an Embedding, ``(N, H, W, C)`` for a conv layer).
The activation is reached with a scoped probe (nothing rebuilt, the model never
changed); methods that move the activation (IG's path, SmoothGrad's noise)
*replace* the layer's output with the interpolated / noisy value during the
forward pass (``Engine.gradients(..., replace=...)``), so the layers after it see
that value while the layers before it run on the real inputs.

Per-position maps (one value per token or pixel) are
:meth:`~kerascope.core.explanation.Explanation.per_position`: the attributions
summed over the last (embedding / channel) axis, which keeps IG's completeness.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.engine import Engine
from kerascope.core.inputs import Inputs, fit_structure
from kerascope.core.probe import probe


class LayerAttributionError(ValueError):
    """``layer=`` names a layer whose output cannot be attributed (not one float tensor).

    Example:
        >>> issubclass(LayerAttributionError, ValueError)
        True
    """


def resolve(engine: Engine, layer: Any) -> tuple[keras.Layer, str]:
    """The layer object and its path, with kerascope's usual error for unknown names.

    Example:
        >>> import keras
        >>> from kerascope.core.engine import engine_for
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
        >>> resolve(engine_for(m), "d")[1]
        'd'
    """
    found = engine.resolve_layers([layer])[0]
    return found, engine.path_of(found)


def activations(engine: Engine, inputs: Inputs, layer: keras.Layer, batch_size: int) -> np.ndarray:
    """The layer's output for every sample, float32, from compiled probed forward passes.

    Of a shared layer, the call chosen by the engine's ``call_index``. One compiled
    function per engine, layer, call and input signature (cached with the engine's
    other compiled functions), which returns only the layer's output: what follows the
    layer is not run where the backend prunes it (TensorFlow's graph, XLA, JAX).
    With a reduced ``precision`` engine the pass runs eagerly as the model is.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> d = keras.layers.Dense(2, kernel_initializer="ones", name="d")
        >>> m = keras.Sequential([keras.Input((3,)), d, keras.layers.Dense(1)])
        >>> activations(engine_for(m), Inputs(np.ones((2, 3))), d, 8).tolist()
        [[3.0, 3.0], [3.0, 3.0]]
    """
    model = engine.model
    path = engine.path_of(layer)
    prepared = engine.check_inputs(inputs)  # the model's own error about the inputs, in kerascope's words
    position = engine.call_positions(prepared, [layer])[0]
    if engine.precision is not None:  # the eager model, not the engine's reduced-precision pass
        parts = []
        for _, arrays in prepared.chunks(batch_size):
            with probe([layer]) as rec:
                model(fit_structure(model, prepared.model_arg(arrays)), training=False)
            parts.append(check_output(rec.call(layer, position), path))
        return np.concatenate(parts, axis=0)
    def refuse_several(value: Any) -> None:
        if isinstance(value, (list, tuple, dict)):
            check_output(value, path)  # refuses several tensors

    with engine.check_on_error(prepared):  # (JAX traces when compiling, TensorFlow on the first call)
        fn = engine.layer_output_function(prepared, layer, position, refuse_several)
        parts = [check_output(fn(arrays), path) for _, arrays in prepared.chunks(batch_size)]
    return np.concatenate(parts, axis=0)


def check_output(value: Any, path: str) -> np.ndarray:
    """The layer output as float32 numpy, or a clear refusal (several tensors, integers).

    Example:
        >>> check_output(np.zeros((1, 2)), "d").dtype
        dtype('float32')
    """
    if isinstance(value, (list, tuple, dict)):
        raise LayerAttributionError(
            f"Layer {path!r} returns several tensors; `layer=` attributes at a layer with one "
            f"output tensor. Received: layer={path!r}. Pick the layer that produces the tensor."
        )
    array = keras.ops.convert_to_numpy(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise LayerAttributionError(
            f"Layer {path!r} outputs {array.dtype} values, which have no gradient. Received: "
            f"layer={path!r}. Pick a layer with a float output, e.g. the Embedding after token ids."
        )
    return np.asarray(array, np.float32)


def baseline_values(
    baseline: Any, engine: Engine, inputs: Inputs, layer: keras.Layer, acts: np.ndarray, batch_size: int,
    background: bool = False,
) -> np.ndarray:
    """A baseline at the layer, batch-shaped like ``acts`` (or ``(M, ...)`` when ``background``).

    ``None`` / ``"zeros"``: zero activation; a number: that constant; a float
    array of the layer's sample shape (or batch shape): used as the activation.
    Anything else shaped like the model input (e.g. token ids of padding,
    ``np.zeros_like(tokens)``, always for integer arrays) is run through the
    model and the layer's activation for it is used (Captum's
    ``LayerIntegratedGradients`` convention): e.g. the pad-token embedding.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> emb = keras.layers.Embedding(5, 2, name="emb")
        >>> m = keras.Sequential([keras.Input((3,), dtype="int32"), emb, keras.layers.Flatten(), keras.layers.Dense(1)])
        >>> x = Inputs(np.array([[1, 2, 3]])); e = engine_for(m)
        >>> acts = activations(e, x, emb, 8)
        >>> b = baseline_values(np.zeros((1, 3), "int32"), e, x, emb, acts, 8)
        >>> bool(np.allclose(b[0, 0], emb.get_weights()[0][0]))
        True
    """
    sample = acts.shape[1:]
    n = len(acts)
    if baseline is None or (isinstance(baseline, str) and baseline == "zeros"):
        return np.zeros(((1 if background else n), *sample), np.float32)
    if isinstance(baseline, str):
        raise ValueError(
            f"Unknown baseline at a layer. Received: baseline={baseline!r}. Expected None, 'zeros', a number, "
            "an array of the layer's output shape, or inputs (e.g. padding token ids) to run through the model."
        )
    if np.isscalar(baseline):
        return np.full(((1 if background else n), *sample), float(baseline), np.float32)
    structured = isinstance(baseline, (list, tuple, dict)) and len(inputs.arrays) > 1
    array = None if structured else np.asarray(baseline)
    if array is not None and np.issubdtype(array.dtype, np.floating):
        if array.shape == sample and not background:
            return np.broadcast_to(array.astype(np.float32), acts.shape).copy()
        if array.shape[1:] == sample and (background or len(array) == n):
            return array.astype(np.float32)
    # inputs: run them through the model to the layer
    given = Inputs(baseline)
    for k, (b, x) in enumerate(zip(given.arrays, inputs.arrays, strict=False)):
        if b.shape[1:] != x.shape[1:]:
            if b.shape == x.shape[1:]:  # one sample's inputs
                given.arrays[k] = b[None]
                continue
            raise ValueError(
                f"A baseline at layer {engine.path_of(layer)!r} must be None, a number, an array of the "
                f"layer's output shape {sample} (one sample, or batch-first), or model inputs shaped like "
                f"{x.shape[1:]}. Received: baseline with shape {np.shape(b)}."
            )
    given.num_samples = len(given.arrays[0])
    values = activations(engine, given, layer, batch_size)
    if background:
        return values
    if len(values) == 1:
        return np.broadcast_to(values, acts.shape).copy()
    if len(values) != n:
        raise ValueError(
            f"Expected baseline inputs for one sample or for each of the {n} samples. Received: "
            f"{len(values)} baseline samples."
        )
    return values


def rows(inputs: Inputs, owners: np.ndarray) -> Inputs:
    """The model inputs of the given owner rows (a folded chunk).

    Example:
        >>> import numpy as np
        >>> rows(Inputs(np.arange(4.0)[:, None]), np.array([1, 1, 3])).arrays[0][:, 0].tolist()
        [1.0, 1.0, 3.0]
    """
    return Inputs(inputs.model_arg([a[owners] for a in inputs.arrays]))
