"""Backend-neutral pieces of the backends, written once on ``keras.ops`` and each backend's ``custom_backward``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from kerascope import _backend

RELU_RULES = ("guided", "deconvnet", "deeplift")


def differentiable_positions(input_specs: Sequence[tuple[Any, Any]], wrt_inputs: bool | Sequence[int]) -> list[int]:
    """The input positions to differentiate (all if ``wrt_inputs`` is True); refuses integer inputs.

    Example:
        >>> differentiable_positions([((None, 2), "float32"), ((None, 3), "float32")], True)
        [0, 1]
    """
    wrt = list(range(len(input_specs))) if wrt_inputs is True else [] if wrt_inputs is False else list(wrt_inputs)
    if any(not np.issubdtype(np.dtype(input_specs[i][1]), np.floating) for i in wrt):
        raise ValueError(
            "The target score is not differentiable w.r.t. the model inputs (integer "
            "inputs such as token ids, or a non-differentiable op). For token inputs, "
            "attribute at the embedding layer with `layer=`."
        )
    return wrt


def modified_relu(fn: Callable[[Any], Any], rule: str) -> Callable[[Any], Any]:
    """Wrap a ReLU-like ``fn``: same forward value, backward rule ``rule``, on the active backend.

    ``"guided"``: ``relu'(x) * relu(dy)``; ``"deconvnet"``: ``relu(dy)``;
    ``"deeplift"``: the rescale rule (see :func:`rescale_relu`).

    Example:
        >>> import numpy as np
        >>> g = modified_relu(keras.ops.relu, "guided")
        >>> g.__name__, keras.ops.convert_to_numpy(g(np.array([-1.0, 2.0], "float32"))).tolist()
        ('guided_relu', [0.0, 2.0])
    """
    if rule == "deeplift":
        return rescale_relu(fn)
    if rule not in RELU_RULES:
        raise ValueError(
            f"Unknown ReLU rule. Received: rule={rule!r}. Expected 'guided', 'deconvnet' or 'deeplift'."
        )

    def backward(xs: list[Any], y: Any, dy: Any, vjp: Callable[[Any], list[Any]]) -> list[Any]:
        positive = keras.ops.relu(dy)
        return [positive] if rule == "deconvnet" else vjp(positive)

    return _backend.get().custom_backward(fn, backward, f"{rule}_{getattr(fn, '__name__', 'relu')}")


def rescale_relu(fn: Callable[[Any], Any], eps: float = 1e-10) -> Callable[[Any], Any]:
    """Wrap an element-wise ``fn``: same forward value, DeepLIFT rescale-rule backward, on the active backend.

    The batch holds the inputs in its first half and their references
    (baselines) in its second half, row for row. The backward pass multiplies
    the incoming gradient by ``(fn(x) - fn(x_ref)) / (x - x_ref)`` (the same
    multiplier for both halves), or by the ordinary derivative where
    ``|x - x_ref| < eps`` (Shrikumar et al. 2017; Captum uses the same ``eps``).

    Example:
        >>> import numpy as np
        >>> g = rescale_relu(keras.ops.relu)
        >>> g.__name__, keras.ops.convert_to_numpy(g(np.array([[-1.0, 3.0]], "float32"))).tolist()
        ('deeplift_relu', [[0.0, 3.0]])
    """

    def backward(xs: list[Any], y: Any, dy: Any, vjp: Callable[[Any], list[Any]]) -> list[Any]:
        (x,) = xs
        plain = vjp(dy)[0]
        half = keras.ops.shape(x)[0] // 2
        delta_x = x[:half] - x[half:]
        delta_y = y[:half] - y[half:]
        delta_x = keras.ops.concatenate([delta_x, delta_x], axis=0)
        delta_y = keras.ops.concatenate([delta_y, delta_y], axis=0)
        small = keras.ops.abs(delta_x) < eps
        ratio = delta_y / keras.ops.where(small, keras.ops.ones_like(delta_x), delta_x)
        return [keras.ops.where(small, plain, dy * ratio)]

    return _backend.get().custom_backward(fn, backward, f"deeplift_{getattr(fn, '__name__', 'relu')}")
