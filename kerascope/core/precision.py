"""Reduced-precision passes (``precision="bfloat16"`` / ``"float16"``), opt-in, the model never changed.

Inside a compiled function the engine runs the model under :func:`reduced_precision`:
every layer whose dtype policy is plain ``float32`` gets the mixed policy
(``"mixed_bfloat16"`` or ``"mixed_float16"``) for the duration of the trace, so Keras
casts the layer's inputs and its float32 variables to the reduced type and computes in
it; the variables themselves stay float32 and are never written. The previous policies
are put back in ``finally``, also after an exception. Inputs, scores, gradients and
attributions cross the compiled function's boundary as float32 (the backends cast
them), and every sum over steps, samples or masks is taken in float32 (numpy).

Layers with another policy (a float64 layer, quantized layers, a ``DTypePolicyMap``)
are left as they are. Normalisation layers compute their statistics in float32 under a
mixed policy (Keras' own rule). ``float16`` has a narrow range (max 65504) and no loss
scaling here: gradients can underflow to zero or overflow; it is meant for GPUs, where
it is fast. See docs/performance.md ("Reduced precision") for the measured errors.

Like every interception in :mod:`kerascope.core.probe`, the swap holds for the duration of a
trace (TensorFlow, JAX) or of each call (PyTorch) on the model's own layers: do not explain one
model in two threads at once with different precisions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras

from kerascope.core.layers import iter_layers

__all__ = ["PRECISIONS", "UNIT_ROUNDOFF", "check_precision", "model_reduced_dtype", "reduced_precision", "to_float32"]

PRECISIONS = (None, "float32", "bfloat16", "float16")
"""Accepted values of ``precision=``: ``None`` / ``"float32"`` (full precision) or a reduced type."""

UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
"""The unit roundoff of each reduced compute dtype (half the distance from 1 to the next number)."""


def check_precision(precision: Any) -> str | None:
    """The reduced compute type asked for (``"bfloat16"``, ``"float16"``), or ``None`` for float32.

    Example:
        >>> check_precision(None), check_precision("float32"), check_precision("bfloat16")
        (None, None, 'bfloat16')
        >>> check_precision("half")
        Traceback (most recent call last):
        ...
        ValueError: Unknown `precision`. Received: precision='half'. Expected one of None, 'float32', 'bfloat16' or 'float16' (float16 is meant for GPUs).
    """
    if precision is None or (isinstance(precision, str) and precision == "float32"):
        return None
    if isinstance(precision, str) and precision in ("bfloat16", "float16"):
        return precision
    raise ValueError(
        f"Unknown `precision`. Received: precision={precision!r}. Expected one of None, 'float32', "
        "'bfloat16' or 'float16' (float16 is meant for GPUs)."
    )


def model_reduced_dtype(model: keras.Layer) -> str | None:
    """The lowest floating compute dtype among ``model``'s layers: ``"float16"``, ``"bfloat16"`` or ``None``.

    A model built under a ``mixed_float16`` / ``mixed_bfloat16`` dtype policy (or with such layers)
    runs its passes in that precision whatever ``precision=`` says.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype="mixed_bfloat16")])
        >>> model_reduced_dtype(m), model_reduced_dtype(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
        ('bfloat16', None)
    """
    found = {getattr(layer, "compute_dtype", None) for _, layer in iter_layers(model)}
    found.add(getattr(model, "compute_dtype", None))
    for dtype in ("float16", "bfloat16"):
        if dtype in found:
            return dtype
    return None


def _swappable(layer: keras.Layer) -> bool:
    """A layer computing in plain float32 (not quantized, not a per-path policy map)."""
    policy = getattr(layer, "dtype_policy", None)
    return (
        type(policy) is keras.DTypePolicy
        and policy.quantization_mode is None
        and policy.compute_dtype == "float32"
        and policy.variable_dtype == "float32"
    )


@contextlib.contextmanager
def reduced_precision(model: keras.Layer, precision: str | None) -> Iterator[None]:
    """Run ``model`` (and every layer below it) with the mixed policy of ``precision`` inside the block.

    ``None`` changes nothing. Each swapped layer's own policy object is put back on exit,
    also when the block raises.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
        >>> with reduced_precision(m, "bfloat16"):
        ...     keras.backend.standardize_dtype(m(np.ones((1, 2))).dtype)
        'bfloat16'
        >>> m.get_layer("d").dtype_policy.name, m.get_layer("d").kernel.dtype
        ('float32', 'float32')
    """
    if precision is None:
        yield
        return
    mixed = keras.DTypePolicy(f"mixed_{precision}")
    swapped: list[tuple[keras.Layer, Any]] = []
    try:
        for layer in [model, *(layer for _, layer in iter_layers(model))]:
            if _swappable(layer):
                swapped.append((layer, layer.dtype_policy))
                layer.dtype_policy = mixed
        yield
    finally:
        for layer, policy in reversed(swapped):
            layer.dtype_policy = policy


def to_float32(values: Any) -> Any:
    """Cast every floating tensor of a structure to float32 (inside a compiled function); others unchanged.

    Example:
        >>> import keras, numpy as np
        >>> out = to_float32({"a": keras.ops.ones((1,), "bfloat16"), "b": keras.ops.ones((1,), "int32")})
        >>> keras.backend.standardize_dtype(out["a"].dtype), keras.backend.standardize_dtype(out["b"].dtype)
        ('float32', 'int32')
    """

    def cast(value: Any) -> Any:
        dtype = keras.backend.standardize_dtype(value.dtype)
        return keras.ops.cast(value, "float32") if dtype in ("bfloat16", "float16") else value

    return keras.tree.map_structure(cast, values)
