"""The public gradient primitives, returning numpy.

All of them differentiate the target score in the chosen output space
(logits by default: a final softmax is bypassed without changing the model).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import keras
import numpy as np

from kerascope.core.engine import engine_for
from kerascope.core.inputs import Inputs, fit_structure
from kerascope.core.layers import find_layer, iter_layers, path_of


class LayerGradient(NamedTuple):
    """Activations of a layer and the gradients of the target score w.r.t. them.

    Example:
        >>> import numpy as np
        >>> LayerGradient(np.zeros(1), np.ones(1)).gradients.tolist()
        [1.0]
    """

    activations: Any
    gradients: Any


def input_gradients(
    model: keras.Layer,
    inputs: Any,
    targets: Any = None,
    *,
    output: str = "logits",
    output_index: int | str | None = None,
    batch_size: int = 32,
) -> Any:
    """Gradients of the target score w.r.t. the inputs, shaped like the inputs.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
        >>> ks.input_gradients(m, np.ones((3, 2)), targets=1).shape
        (3, 2)
    """
    prepared = Inputs(inputs)
    result = engine_for(model, output, output_index).gradients(prepared, targets, batch_size=batch_size)
    return prepared.rebuild(result.input_grads)


def layer_gradients(
    model: keras.Layer,
    inputs: Any,
    layer: str | keras.Layer,
    targets: Any = None,
    *,
    output: str = "logits",
    output_index: int | str | None = None,
    batch_size: int = 32,
    call_index: int | None = None,
) -> LayerGradient:
    """Activations of ``layer`` and the gradients of the target score w.r.t. them.

    ``layer`` may sit inside a nested model (``"inception_v3/mixed10"``) or be
    a sub-layer of a subclassed model: the layer's output is probed during
    the forward pass, nothing is rebuilt and the model is not changed. A layer
    called more than once (shared) needs ``call_index`` (see :mod:`kerascope.core.calls`).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="h")], name="inner")
        >>> m = keras.Sequential([keras.Input((3,)), inner, keras.layers.Dense(2)])
        >>> acts, grads = ks.layer_gradients(m, np.ones((1, 3)), "inner/h", targets=0)
        >>> acts.shape == grads.shape == (1, 4)
        True
    """
    found = find_layer(model, layer)
    result = engine_for(model, output, output_index, call_index=call_index).gradients(
        inputs, targets, layers=[found], wrt_inputs=False, batch_size=batch_size
    )
    return LayerGradient(result.activations[0], result.layer_grads[0])


def layers_gradients(
    model: keras.Layer,
    inputs: Any,
    layers: Sequence[str | keras.Layer] | None = None,
    targets: Any = None,
    *,
    output: str = "logits",
    output_index: int | str | None = None,
    batch_size: int = 32,
    call_index: int | None = None,
) -> dict[str, LayerGradient]:
    """Activations and gradients at several layers in ONE forward+backward pass.

    ``layers=None`` means every layer of the model (nested models and their
    layers included) that lies on the path from the inputs to the score, except
    layers called more than once (shared; a warning names them): list those in
    ``layers`` with a ``call_index`` (which then applies to every listed layer).
    Returns ``{path: LayerGradient}`` in forward order.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="h"), keras.layers.Dense(2, name="o")])
        >>> sorted(ks.layers_gradients(m, np.ones((1, 3)), targets=0))
        ['h', 'o']
    """
    engine = engine_for(model, output, output_index, call_index=call_index)
    prepared = Inputs(inputs)
    if layers is None:
        chosen = _differentiable_layers(model, prepared)
    else:
        chosen = [find_layer(model, layer) for layer in layers]
    result = engine.gradients(
        prepared, targets, layers=chosen, wrt_inputs=False, batch_size=batch_size
    )
    return {
        path_of(model, layer): LayerGradient(act, grad)
        for layer, act, grad in zip(chosen, result.activations, result.layer_grads)
    }


def _differentiable_layers(model: keras.Layer, inputs: Inputs) -> list[keras.Layer]:
    """Layers that are called in the forward pass and output one float tensor."""
    from kerascope.core.probe import probe

    candidates = [layer for _, layer in iter_layers(model)]
    first = [a[:1] for a in inputs.arrays]
    with probe(candidates) as rec:
        model(fit_structure(model, inputs.model_arg(first)), training=False)
    chosen, shared = [], []
    for layer in candidates:
        calls = rec.outputs.get(id(layer))
        if not calls:
            continue
        out = calls[-1]
        dtype = str(getattr(out, "dtype", ""))
        if hasattr(out, "shape") and "float" in dtype:
            (shared if len(calls) > 1 else chosen).append(layer)
    if shared:
        names = [path_of(model, layer) for layer in shared]
        warnings.warn(
            f"layers_gradients(layers=None) leaves out the layers called more than once in a forward pass "
            f"(shared): {names}. Received: layers=None. Pass layers={names[:1]!r} with `call_index=` to choose a call.",
            UserWarning,
            stacklevel=3,
        )
    return chosen


def weight_gradients(
    model: keras.Layer,
    inputs: Any,
    layer: str | keras.Layer | None = None,
    targets: Any = None,
    *,
    output: str = "logits",
    output_index: int | str | None = None,
    batch_size: int = 32,
) -> dict[str, np.ndarray]:
    """Gradients of the summed target score w.r.t. a layer's trainable weights.

    ``layer=None`` means all trainable weights of the model. Keys are the
    variables' paths (e.g. ``"sequential/fc1/kernel"``).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc1")])
        >>> sorted(path.split("/")[-1] for path in ks.weight_gradients(m, np.ones((1, 3)), "fc1", targets=0))
        ['bias', 'kernel']
    """
    owner = model if layer is None else find_layer(model, layer)
    variables = list(owner.trainable_variables)
    if not variables:
        raise ValueError(
            f"Layer {owner.name!r} has no trainable weights. Received: layer={layer!r}. "
            "Pick a layer with weights (Dense, Conv2D, ...), or check that it is not frozen "
            "(`trainable=False`)."
        )
    result = engine_for(model, output, output_index).gradients(
        inputs, targets, wrt_inputs=False, weights=variables, batch_size=batch_size
    )
    return {getattr(v, "path", v.name): g for v, g in zip(variables, result.weight_grads)}
