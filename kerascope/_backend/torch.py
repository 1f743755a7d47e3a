"""PyTorch implementation of kerascope's differentiation primitives.

Keras-on-torch runs eagerly: ``forward`` is run under autograd and
``torch.autograd.grad`` is taken w.r.t. the inputs (``requires_grad``), the
probed layer outputs (retained by the probe's ``transform``) and the
variables' torch tensors (Keras torch variables *are* ``nn.Parameter``).
Forward-only passes run under ``torch.no_grad``. ``torch.compile`` is not
used: on CPU it was measured to be slower for these small eager graphs with
scoped layer patches (see ``docs/backends.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import torch

from kerascope._backend import neutral
from kerascope._backend.neutral import fuses_rules, modified_relu, rescale_relu  # noqa: F401  (the backend interface)

NAME = "torch"


def _to_numpy(value: Any) -> Any:
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return t.detach().cpu().numpy()
        return np.asarray(t)

    return keras.tree.map_structure(one, value)


def _tensor(x: np.ndarray) -> torch.Tensor:
    return keras.ops.convert_to_tensor(x)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32)


@contextlib.contextmanager
def _requiring_grad(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Temporarily set ``requires_grad`` on leaf tensors that lack it (frozen weights)."""
    changed = [t for t in tensors if t.is_leaf and not t.requires_grad]
    for t in changed:
        t.requires_grad_(True)
    try:
        yield
    finally:
        for t in changed:
            t.requires_grad_(False)


def compile_gradients(forward: neutral.Forward, **request: Any) -> neutral.GradientFunction:
    """Return a function running ``forward`` under autograd and differentiating ``sum(scores)``
    (``request``: :class:`~kerascope._backend.neutral.GradientRequest`).

    The gradients w.r.t. the last output of each probed layer are kept by ``transform``, and
    ``weights`` are torch tensors. Nothing is traced, so ``on_trace`` is called once, on the
    first call; ``jit_compile`` is ignored.

    Example (the gradient w.r.t. a weight: the sum of the inputs over the batch):
        >>> import numpy as np
        >>> w = keras.Variable(np.array([1.0, 2.0], "float32"))
        >>> def forward(inputs, targets, transform):
        ...     return keras.ops.sum(inputs[0] * w, axis=1), targets, []
        >>> fn = compile_gradients(forward, input_specs=[((None, 2), "float32")], wrt_inputs=False,
        ...                        layer_names=[], weights=[w.value])
        >>> fn([np.array([[1.0, 2.0], [3.0, 4.0]], "float32")], np.array([0, 0]))["weight_grads"][0].tolist()
        [4.0, 6.0]
    """
    r = neutral.GradientRequest(**request)
    wrt, layer_names, on_trace, post = r.wrt, r.layer_names, r.on_trace, r.post
    weights = list(r.weights)
    traced = [False]

    def run(inputs: list[np.ndarray], targets: np.ndarray) -> dict[str, Any]:
        if not traced[0]:
            traced[0] = True
            if on_trace is not None:
                on_trace()
        xs = [_tensor(x) for x in inputs]
        for i in wrt:
            xs[i] = xs[i].requires_grad_(True)

        def transform(_: int, __: Any, output: Any) -> Any:
            def keep(t: Any) -> Any:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.requires_grad:
                    return t.detach().requires_grad_(True)
                return t

            return keras.tree.map_structure(keep, output)

        with torch.enable_grad(), _requiring_grad(weights):
            scores, resolved, acts = forward(xs, _tensor(np.asarray(targets, np.int32)), transform)
            total = scores.to(torch.float32).sum()
            flat_acts = [keras.tree.flatten(a) for a in acts]
            sources = [xs[i] for i in wrt] + [t for leaves in flat_acts for t in leaves] + weights
            grads = list(torch.autograd.grad(total, sources, allow_unused=True)) if sources else []
        input_grads = grads[: len(wrt)]
        rest = grads[len(input_grads):]
        layer_grads = []
        for name, act, leaves in zip(layer_names, acts, flat_acts):
            got, rest = rest[: len(leaves)], rest[len(leaves):]
            if all(g is None for g in got):
                raise neutral.no_path_error(name)
            got = [torch.zeros_like(t) if g is None else g for g, t in zip(got, leaves)]
            layer_grads.append(keras.tree.pack_sequence_as(act, got))
        if any(g is None for g in input_grads):
            raise neutral.not_differentiable_error()
        return _to_numpy(neutral.gradient_result(
            scores, resolved.detach() if isinstance(resolved, torch.Tensor) else resolved, acts, layer_grads,
            rest, weights, input_grads if wrt else None, cast=_f32, post=post,
        ))

    return run


def compile_forward(
    forward: neutral.ForwardOnly, *, input_specs: neutral.Specs, jit_compile: bool = False
) -> neutral.ForwardFunction:
    """Return a gradient-free forward function (``torch.no_grad``) of a list of inputs; outputs as numpy.

    Example (two inputs; the output comes back as numpy):
        >>> import numpy as np
        >>> fn = compile_forward(lambda xs: xs[0] - xs[1], input_specs=[((None, 1), "float32")] * 2)
        >>> out = fn([np.ones((1, 1), "float32"), np.full((1, 1), 3.0, "float32")])
        >>> type(out).__name__, out.tolist()
        ('ndarray', [[-2.0]])
    """

    def run(inputs: list[np.ndarray]) -> Any:
        with torch.no_grad():
            return _to_numpy(forward([_tensor(x) for x in inputs]))

    return run


def custom_backward(
    fn: Callable[..., Any], backward: neutral.Backward, name: str, fuse: neutral.Fuse = None
) -> Callable[..., Any]:
    """``fn(*xs)`` (tensors in, one tensor out) with the backward pass ``backward`` (a ``torch.autograd.Function``).

    ``backward`` is described at :data:`kerascope._backend.neutral.Backward`; here its ``vjp`` is
    recomputed from ``xs``. ``fuse`` (the TensorFlow backend's one-kernel rules) is accepted and
    ignored: PyTorch runs eagerly, op by op.

    Example:
        >>> twice = custom_backward(lambda x: x * 3.0, lambda xs, y, dy, vjp: [2.0 * vjp(dy)[0]], "twice")
        >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
        >>> twice(x).sum().backward()
        >>> x.grad.tolist()
        [6.0, 6.0]
    """

    def vjp_of(xs: Sequence[torch.Tensor]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
        def vjp(d: torch.Tensor) -> list[torch.Tensor]:
            with torch.enable_grad():
                leaves = [x.detach().requires_grad_(True) for x in xs]
                grads = torch.autograd.grad(fn(*leaves), leaves, d, allow_unused=True)
            return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs)]

        return vjp

    class Rule(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *xs: torch.Tensor) -> torch.Tensor:
            y = fn(*xs)
            ctx.save_for_backward(*xs, y)
            return y

        @staticmethod
        def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
            *xs, y = ctx.saved_tensors
            with torch.no_grad():
                return tuple(backward(list(xs), y, dy, vjp_of(xs)))

    Rule.__name__ = name
    return neutral.named_call(Rule.apply, _tensor, name)
