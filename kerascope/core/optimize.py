"""Compiled objectives of a layer's output w.r.t. parameters that generate the model's input.

Feature visualisation optimises an image (through a parametrisation and random transforms, all
written with ``keras.ops``) so that a layer's output scores high. :func:`compile_objective` builds
that step once per backend from the same primitive the engine uses
(``_backend.<name>.compile_gradients``): the layer is read with a scoped probe (nested and
subclassed models work, nothing is rebuilt or changed) and the final softmax is bypassed as in
the engine's ``"logits"`` space.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from kerascope import _backend
from kerascope.core.engine import Engine
from kerascope.core.inputs import Inputs
from kerascope.core.probe import patched_attribute, probe

Specs = Sequence[tuple[tuple[int | None, ...], str]]


def fused_relu(layer: keras.Layer | None) -> bool:
    """Whether ``layer`` ends in a fused ReLU (``Conv2D(activation="relu")``, ``Dense(..., "relu")``).

    Example:
        >>> import keras
        >>> fused_relu(keras.layers.Dense(2, activation="relu")), fused_relu(keras.layers.Dense(2))
        (True, False)
    """
    return getattr(getattr(layer, "activation", None), "__name__", "") == "relu"


def read_layer(engine: Engine, layer: keras.Layer | None, model_input: Any, position: int | None,
               bypass: Sequence[keras.Layer], pre_activation: bool = False) -> Any:
    """The output of ``layer`` (``None``: the explained model output) for ``model_input``; traceable.

    ``pre_activation``: the layer's fused activation is made linear for the call (restored on exit),
    so the value read is the one before it.

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(4, name="h")
        >>> m = keras.Sequential([keras.Input((3,)), d, keras.layers.Dense(2)])
        >>> tuple(read_layer(Engine(m), d, np.ones((2, 3), "float32"), 0, []).shape)
        (2, 4)
    """
    with contextlib.ExitStack() as stack:
        if pre_activation and layer is not None:
            stack.enter_context(patched_attribute(layer, "activation", keras.activations.linear))
        recorder = stack.enter_context(probe([layer] if layer is not None else []))
        outputs = engine.call_model(model_input, stack, bypass)
    if layer is None:
        return engine.select(outputs)
    return recorder.call(layer, position)


def layer_setup(engine: Engine, layer: keras.Layer | None, sample: np.ndarray) -> tuple[int | None, tuple[int, ...]]:
    """``(call position, output shape without the batch axis)`` of ``layer`` on one eager ``sample``.

    The sample is checked against the model first (the engine's messages), the softmax to bypass
    settled, and a layer whose output is not one tensor refused.

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(4, name="h")
        >>> m = keras.Sequential([keras.Input((3,)), d, keras.layers.Dense(2)])
        >>> layer_setup(Engine(m), d, np.ones((1, 3), "float32"))
        (0, (4,))
    """
    inputs = Inputs(sample)
    engine.forward(inputs, batch_size=1)  # input check and softmax detection, eagerly
    position = engine.call_positions(inputs, [layer])[0] if layer is not None else None
    out = read_layer(engine, layer, inputs.model_arg(inputs.arrays), position, engine.space.bypass())
    if not hasattr(out, "shape") or isinstance(out, (list, tuple, dict)):
        name = getattr(layer, "name", "the model output")
        raise ValueError(
            f"Layer {name!r} returns {type(out).__name__}, not one tensor, so it has no channels to visualise. "
            f"Received: layer={name!r}. Pick a layer with one output (see `kerascope.layers(model)`)."
        )
    return position, tuple(int(d) for d in out.shape[1:])


def compile_objective(
    engine: Engine,
    layer: keras.Layer | None,
    position: int | None,
    make_input: Callable[[list[Any]], Any],
    score: Callable[[Any, list[Any]], tuple[Any, Any]],
    input_specs: Specs,
    pre_activation: bool = False,
) -> Callable[[list[np.ndarray]], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Compile ``arrays -> (total, objective, d sum(total) / d arrays[0])``, one row per optimised image.

    ``make_input(arrays)`` builds the model input from the parameters (``keras.ops``, traced);
    ``score(activation, arrays)`` returns ``(objective, penalty)`` per row; ``total = objective - penalty``
    is differentiated (a penalty holds regularisers), the ``objective`` is reported.
    Rows are independent, so the gradient of the sum is each row's own gradient. ``pre_activation``:
    read the layer before its fused activation (see :func:`read_layer`).

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(1, use_bias=False, name="d")
        >>> m = keras.Sequential([keras.Input((2,)), d])
        >>> d.set_weights([np.array([[2.0], [-1.0]], "float32")])
        >>> run = compile_objective(Engine(m), d, 0, lambda a: a[0] * 3.0,
        ...                         lambda act, a: (act[:, 0], 0.0), [((None, 2), "float32")])
        >>> total, objective, grad = run([np.ones((1, 2), "float32")])
        >>> total.tolist(), grad.tolist()
        ([3.0], [[6.0, -3.0]])
    """
    bypass = engine.space.bypass()

    def forward(arrays: list[Any], indices: Any, transform: Callable) -> tuple[Any, Any, list[Any]]:
        activation = read_layer(engine, layer, make_input(arrays), position, bypass, pre_activation)
        objective, penalty = score(keras.ops.cast(activation, "float32"), arrays)
        return objective - penalty, indices, [objective]

    fn = _backend.get().compile_gradients(forward, input_specs=input_specs, wrt_inputs=[0], layer_names=[],
                                          weights=[], jit_compile=engine.jit_compile)

    def run(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = fn(arrays, np.zeros(len(arrays[0]), np.int32))
        return np.asarray(out["scores"]), np.asarray(out["acts"][0]), np.asarray(out["input_grads"][0])

    return run
