"""JAX implementation of kerascope's differentiation primitives.

``jax.grad`` only differentiates w.r.t. function arguments, so a probed layer
output ``a`` is replaced by ``a + delta`` with ``delta = 0`` passed as a
differentiable argument: the gradient w.r.t. ``delta`` is the gradient w.r.t.
``a``. Keras variables are mapped to jit arguments with a
:class:`keras.StatelessScope` (the machinery behind ``stateless_call``), so
the compiled function never bakes the weights in as constants (a later
``set_weights`` is seen) and weight gradients work.

One ``jax.jit`` function per request; JAX compiles it once per distinct
chunk shape (typically two: full chunks and the remainder) and reuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from kerascope._backend import neutral
from kerascope._backend.neutral import fuses_rules, modified_relu, rescale_relu  # noqa: F401  (the backend interface)

NAME = "jax"


class _RecordingScope(keras.StatelessScope):
    """A stateless scope that records every Keras variable read inside it (in first-read order)."""

    def __init__(self) -> None:
        super().__init__(initialize_variables=False)
        self.seen: dict[int, Any] = {}

    def get_current_value(self, variable: Any) -> Any:
        self.seen.setdefault(id(variable), variable)
        return None


def _abstract(input_specs: neutral.Specs, extra_int_rows: bool = False) -> list[jax.ShapeDtypeStruct]:
    """Abstract arguments for a recording trace: every spec with the same (leading) batch size."""
    batch = next((shape[0] for shape, _ in input_specs if shape and shape[0] is not None), 2)
    specs = [((batch, *shape[1:]), np.dtype(dtype)) for shape, dtype in input_specs]
    if extra_int_rows:
        specs.append(((batch,), np.dtype(np.int32)))
    return [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]


def _to_numpy(value: Any) -> Any:
    return jax.tree.map(np.asarray, value)


def _depends(jaxpr: Any, out_index: int, candidates: list[Any]) -> list[bool]:
    """Whether output ``out_index`` of ``jaxpr`` depends on each var in ``candidates``.

    Walks the equations backwards; an equation with a sub-jaxpr counts as
    depending on all its inputs (conservative: never reports a false "no path").
    """
    from jax.extend import core as jcore

    target = jaxpr.outvars[out_index]
    if not isinstance(target, jcore.Var):
        return [False] * len(candidates)
    needed = {target}
    for eqn in reversed(jaxpr.eqns):
        if any(isinstance(v, jcore.Var) and v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if isinstance(v, jcore.Var))
    return [isinstance(c, jcore.Var) and c in needed for c in candidates]


def _record(forward: Callable[..., Any], args: list[Any], n_layers: int) -> dict[str, Any]:
    """Trace ``forward`` abstractly once: variables it reads, calls per probed layer, dependence."""
    scope = _RecordingScope()
    calls = [0] * n_layers

    def traced(*flat: Any) -> Any:
        def transform(i: int, _: Any, output: Any) -> Any:
            calls[i] += 1
            return output

        with scope:
            return forward(list(flat), transform)

    closed, shapes = jax.make_jaxpr(traced, return_shape=True)(*args)
    return {"variables": list(scope.seen.values()), "calls": calls, "jaxpr": closed.jaxpr, "shapes": shapes}


def _match_weights(weights: Sequence[Any], variables: list[Any]) -> list[int | None]:
    """Position of each requested weight among the variables read (``None``: not read, zero gradient)."""
    positions: list[int | None] = []
    for w in weights:
        found = None
        for index, variable in enumerate(variables):
            if w is variable or w is getattr(variable, "_value", None):
                found = index
                break
        positions.append(found)
    return positions


def compile_gradients(forward: neutral.Forward, **request: Any) -> neutral.GradientFunction:
    """Compile ``forward`` (``request``: :class:`~kerascope._backend.neutral.GradientRequest`) into one
    ``jax.jit(jax.value_and_grad(...))`` function.

    Zero deltas are added to the probed layer outputs (the last call of each layer, as recorded)
    and differentiated with the inputs and ``weights``. ``jit_compile`` is ignored: JAX always
    compiles with XLA.

    Example (the gradient w.r.t. a probed layer output, none w.r.t. the inputs):
        >>> import numpy as np
        >>> def forward(inputs, targets, transform):
        ...     hidden = transform(0, None, jnp.tanh(inputs[0]))
        ...     return jnp.sum(hidden ** 2, axis=1), targets, [hidden]
        >>> fn = compile_gradients(forward, input_specs=[((None, 2), "float32")], wrt_inputs=False,
        ...                        layer_names=["hidden"], weights=[])
        >>> out = fn([np.array([[0.0, 1.0]], "float32")], np.array([0]))
        >>> bool(np.allclose(out["layer_grads"][0], 2 * np.tanh([[0.0, 1.0]]))), "input_grads" in out
        (True, False)
    """
    r = neutral.GradientRequest(**request)
    layer_names, weights, on_trace, post = r.layer_names, r.weights, r.on_trace, r.post
    n_layers = len(layer_names)
    wrt = r.wrt

    def record_fn(flat: list[Any], transform: Callable) -> Any:
        scores, _, acts = forward(flat[:-1], flat[-1], transform)
        return jnp.sum(jnp.asarray(scores, jnp.float32)), acts

    info = _record(record_fn, _abstract(r.input_specs, extra_int_rows=True), n_layers)
    variables: list[Any] = info["variables"]
    act_vars = info["jaxpr"].outvars[1:]
    act_leaves = jax.tree.leaves(info["shapes"][1])
    if len(act_vars) == len(act_leaves):
        offsets = np.cumsum([0] + [len(jax.tree.leaves(s)) for s in info["shapes"][1]])
        reached = _depends(info["jaxpr"], 0, list(act_vars))
        for i, name in enumerate(layer_names):
            if not any(reached[offsets[i]:offsets[i + 1]]):
                raise neutral.no_path_error(name)
    positions = _match_weights(weights, variables)
    weight_index = {p: k for k, p in enumerate(positions) if p is not None}
    last_call = [max(c - 1, 0) for c in info["calls"]]

    def step(diff_values: list[Any], other_values: list[Any], inputs: list[Any], targets: Any) -> dict[str, Any]:
        if on_trace is not None:
            on_trace()

        def loss(diff: list[Any], chosen: list[Any], deltas: list[Any]) -> tuple[Any, Any]:
            xs = list(inputs)  # the differentiated inputs replaced by the traced arguments
            for k, i in enumerate(wrt):
                xs[i] = chosen[k]
            other_iter = iter(other_values)
            values = [
                diff[weight_index[p]] if p in weight_index else next(other_iter)
                for p in range(len(variables))
            ]
            seen = [0] * n_layers

            def transform(i: int, _: Any, output: Any) -> Any:
                call = seen[i]
                seen[i] += 1
                if deltas is None or call != last_call[i]:
                    return output
                return jax.tree.map(lambda o, d: o + d.astype(o.dtype), output, deltas[i])

            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                scores, resolved, acts = forward(xs, targets, transform)
            scores = jnp.asarray(scores, jnp.float32)
            return jnp.sum(scores), (scores, resolved, acts)

        chosen = [inputs[i] for i in wrt]

        def shapes_only(xs: list[Any]) -> Any:
            return loss(diff_values, xs, None)[1][2]

        act_shapes = jax.eval_shape(shapes_only, chosen)
        deltas = [
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype if jnp.issubdtype(s.dtype, jnp.floating)
                                             else jnp.float32), a)
            for a in act_shapes
        ]
        argnums = (0, 1, 2) if wrt else (0, 2)
        (_, (scores, resolved, acts)), grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(
            diff_values, chosen, deltas
        )
        w_grads = [grads[0][weight_index[p]] if p is not None else None for p in positions]
        return neutral.gradient_result(
            scores, jnp.asarray(resolved, jnp.int32), acts, grads[-1], w_grads, weights,
            grads[1] if wrt else None, cast=lambda t: jnp.asarray(t, jnp.float32), post=post,
        )

    compiled = jax.jit(step)

    def run(inputs: list[np.ndarray], targets: np.ndarray) -> dict[str, Any]:
        values = [v.value for v in variables]
        diff_values = [None] * len(weight_index)
        for p, k in weight_index.items():
            diff_values[k] = values[p]
        other = [v for p, v in enumerate(values) if p not in weight_index]
        result = compiled(diff_values, other, [jnp.asarray(x) for x in inputs],
                          jnp.asarray(np.asarray(targets, np.int32)))
        return _to_numpy(result)

    return run


def compile_forward(
    forward: neutral.ForwardOnly, *, input_specs: neutral.Specs, jit_compile: bool = False
) -> neutral.ForwardFunction:
    """Compile a gradient-free forward function of a list of inputs with ``jax.jit``.

    The Keras variables it reads become jit arguments: each call reads their current values.

    Example:
        >>> import numpy as np
        >>> v = keras.Variable(np.ones(1, "float32"))
        >>> fn = compile_forward(lambda xs: xs[0] * v, input_specs=[((None, 1), "float32")])
        >>> _ = v.assign(np.array([3.0], "float32"))
        >>> fn([np.ones((2, 1), "float32")]).tolist()
        [[3.0], [3.0]]
    """
    info = _record(lambda flat, _t: forward(flat), _abstract(input_specs), 0)
    variables = info["variables"]

    def step(values: list[Any], inputs: list[Any]) -> Any:
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return forward(inputs)

    compiled = jax.jit(step)

    def run(inputs: list[np.ndarray]) -> Any:
        return _to_numpy(compiled([v.value for v in variables], [jnp.asarray(x) for x in inputs]))

    return run


def custom_backward(
    fn: Callable[..., Any], backward: neutral.Backward, name: str, fuse: neutral.Fuse = None
) -> Callable[..., Any]:
    """``fn(*xs)`` (arrays in, one array out) with the backward pass ``backward`` (a ``jax.custom_vjp``).

    ``backward`` is described at :data:`kerascope._backend.neutral.Backward`. ``fuse`` (the TensorFlow
    backend's one-kernel rules) is accepted and not needed: under ``jax.jit`` XLA
    already fuses the rule's element-wise work.

    Example:
        >>> twice = custom_backward(lambda x: x * 3.0, lambda xs, y, dy, vjp: [2.0 * vjp(dy)[0]], "twice")
        >>> jax.grad(lambda v: jnp.sum(twice(v)))(jnp.array([1.0, 2.0])).tolist()
        [6.0, 6.0]
    """

    @jax.custom_vjp
    def wrapped(*xs: Any) -> Any:
        return fn(*xs)

    def fwd(*xs: Any) -> tuple[Any, Any]:
        y, vjp = jax.vjp(fn, *xs)
        return y, (list(xs), y, vjp)

    def bwd(res: Any, dy: Any) -> tuple[Any, ...]:
        xs, y, vjp = res
        return tuple(backward(xs, y, dy, lambda d: list(vjp(d))))

    wrapped.defvjp(fwd, bwd)
    return neutral.named_call(wrapped, jnp.asarray, name)
