"""Backend-neutral pieces of the backends, written once on ``keras.ops`` and each backend's ``custom_backward``."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from kerascope import _backend

RELU_RULES = ("guided", "deconvnet", "deeplift")

# The backend interface's types, one definition for the three backends.
# ``forward(inputs, targets, transform) -> (scores, targets, acts)``; probes call ``transform(i, layer, output)``.
Forward = Callable[[list[Any], Any, Callable[[int, Any, Any], Any]], tuple[Any, Any, list[Any]]]
# One ``(shape, dtype)`` per model input; the batch dimension may be ``None``.
Specs = Sequence[tuple[tuple[int | None, ...], str]]
# ``backward(xs, y, dy, vjp)`` of ``custom_backward``: one gradient per input of ``fn``; ``vjp(d)`` is
# ``fn``'s own vector-Jacobian product at ``xs`` (a list, one per input) and may be called several times.
Backward = Callable[[list[Any], Any, Any, Callable[[Any], list[Any]]], list[Any]]
# ``custom_backward``'s ``fuse``: ``(key, f, exact)``, the TensorFlow backend's one-kernel rules.
Fuse = tuple[Hashable, Callable[..., Any], bool] | None
# What ``compile_gradients`` returns: ``(inputs, targets) -> result dictionary`` (see :func:`gradient_result`).
GradientFunction = Callable[[list[np.ndarray], np.ndarray], dict[str, Any]]
# ``compile_forward``'s ``forward(inputs) -> outputs`` and what it returns: ``(inputs) -> outputs`` as numpy.
ForwardOnly = Callable[[list[Any]], Any]
ForwardFunction = Callable[[list[np.ndarray]], Any]


@dataclass(frozen=True)
class GradientRequest:
    """The keyword arguments of every backend's ``compile_gradients(forward, **request)``, declared once.

    ``forward(inputs, targets, transform)`` returns ``(scores, targets, acts)``; ``transform`` is
    applied by probes to each probed layer output. The gradient of ``sum(scores)`` is taken
    w.r.t. the inputs (all if ``wrt_inputs`` is True, or the input positions it lists; refused
    for integer inputs), the probed activations (``layer_names``: one per activation, for the
    error of a layer the score does not depend on) and ``weights``; because samples are
    independent, the gradient of the sum gives each sample's own gradient. ``jit_compile``:
    XLA where the backend offers the choice; ``on_trace()`` is called when the function is
    traced; ``post(out) -> out``, when given, is applied to the result dictionary inside the
    compiled function (e.g. to reduce activations and gradients before they leave it).

    Example:
        >>> r = GradientRequest(input_specs=[((None, 2), "float32")], wrt_inputs=True, layer_names=[], weights=[])
        >>> r.wrt, r.jit_compile
        ([0], False)
        >>> GradientRequest(input_specs=[], wrt_inputs=True, layer_names=[], weights=[], jit=True)
        Traceback (most recent call last):
        TypeError: GradientRequest.__init__() got an unexpected keyword argument 'jit'
    """

    input_specs: Specs
    wrt_inputs: bool | Sequence[int]
    layer_names: Sequence[str]
    weights: Sequence[Any]
    jit_compile: bool = False
    on_trace: Callable[[], None] | None = None
    post: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @property
    def wrt(self) -> list[int]:
        """The input positions differentiated (:func:`differentiable_positions`)."""
        return differentiable_positions(self.input_specs, self.wrt_inputs)


def no_path_error(layer: str) -> ValueError:
    """The error of a probed layer whose output the target score does not depend on.

    Example:
        >>> str(no_path_error("dense")).startswith("The target score does not depend on the output of layer 'dense'")
        True
    """
    return ValueError(
        f"The target score does not depend on the output of layer {layer!r}: there "
        "is no differentiable path from this layer to the score. Received: "
        f"layer={layer!r}. Pick a layer between the inputs and the output."
    )


def not_differentiable_error() -> ValueError:
    """The error of a score that has no gradient w.r.t. the model inputs (token ids, a non-differentiable op).

    Example:
        >>> "embedding layer" in str(not_differentiable_error())
        True
    """
    return ValueError(
        "The target score is not differentiable w.r.t. the model inputs (integer "
        "inputs such as token ids, or a non-differentiable op). For token inputs, "
        "attribute at the embedding layer with `layer=`."
    )


def gradient_result(
    scores: Any,
    targets: Any,
    acts: Sequence[Any],
    layer_grads: Sequence[Any],
    weight_grads: Sequence[Any],
    weights: Sequence[Any],
    input_grads: Sequence[Any] | None,
    *,
    cast: Callable[[Any], Any],
    post: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> dict[str, Any]:
    """The dictionary a compiled gradient function returns, built inside it on the backend's arrays.

    ``cast`` makes one array float32 (each leaf of a nested activation or its gradient); a weight
    gradient that is ``None`` (the score does not read that weight) is zeros of the weight's shape;
    ``input_grads`` is ``None`` when nothing is differentiated w.r.t. the inputs (no ``"input_grads"``
    key); ``post(out)``, when given, is applied last.

    Example:
        >>> import numpy as np
        >>> out = gradient_result(np.ones(2), np.zeros(2, "int32"), [], [], [None], [np.ones((3, 1))], None,
        ...                       cast=lambda t: keras.ops.cast(t, "float32"), post=None)
        >>> sorted(out), keras.ops.convert_to_numpy(out["weight_grads"][0]).shape
        (['acts', 'layer_grads', 'scores', 'targets', 'weight_grads'], (3, 1))
    """

    def f32(tree: Any) -> Any:
        return keras.tree.map_structure(lambda t: t if t is None else cast(t), tree)

    out = {
        "scores": cast(scores),
        "targets": targets,
        "acts": [f32(a) for a in acts],
        "layer_grads": [f32(g) for g in layer_grads],
        "weight_grads": [
            keras.ops.zeros(tuple(np.shape(w)), "float32") if g is None else cast(g)
            for w, g in zip(weights, weight_grads)
        ],
    }
    if input_grads is not None:
        out["input_grads"] = [cast(g) for g in input_grads]
    return out if post is None else post(out)


def fuses_rules() -> bool:
    """Whether ``custom_backward(fuse=...)`` compiles rules into one kernel: not on JAX (under ``jax.jit``
    XLA fuses the whole pass already) nor on PyTorch (it runs op by op); the TensorFlow backend has its own.

    Example:
        >>> fuses_rules()
        False
    """
    return False


def named_call(fn: Callable[..., Any], convert: Callable[[Any], Any], name: str) -> Callable[..., Any]:
    """``fn`` called on its arguments converted by ``convert`` (to the backend's arrays), named ``name``.

    Example:
        >>> named_call(lambda *xs: sum(xs), float, "total")("1", "2"), named_call(max, int, "top").__name__
        (3.0, 'top')
    """

    def call(*xs: Any) -> Any:
        return fn(*[convert(x) for x in xs])

    call.__name__ = name
    return call


def differentiable_positions(input_specs: Sequence[tuple[Any, Any]], wrt_inputs: bool | Sequence[int]) -> list[int]:
    """The input positions to differentiate (all if ``wrt_inputs`` is True); refuses integer inputs.

    Example:
        >>> differentiable_positions([((None, 2), "float32"), ((None, 3), "float32")], True)
        [0, 1]
    """
    wrt = list(range(len(input_specs))) if wrt_inputs is True else [] if wrt_inputs is False else list(wrt_inputs)
    if any(not np.issubdtype(np.dtype(input_specs[i][1]), np.floating) for i in wrt):
        raise not_differentiable_error()
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
