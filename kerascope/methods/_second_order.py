"""Second-order terms at a layer: the Hessian-vector product ``H A`` of the target score, batched and compiled.

``H`` is the Hessian of the target score w.r.t. a layer's output ``A`` and the
vector is ``A`` itself (ShapleyCAM's second-order term). One compiled function per
(layer, target, input signature) returns, for a chunk of samples, the activations
``A``, the gradients ``g = dS/dA``, ``H A`` and the scores, from one forward pass and
two backward passes:

- TensorFlow: nested gradient tapes in a ``tf.function`` (double backward,
  ``outer.gradient(g, A, output_gradients=A)``);
- JAX: forward-over-reverse in ``jax.jit``: ``jax.jvp`` of ``jax.grad`` along
  the scaling ``A -> (1 + t) A`` (its tangent is ``A``);
- PyTorch: ``torch.autograd.grad`` twice (``create_graph=True``), as
  pytorch-grad-cam does.

Samples are independent, so the Hessian of the summed scores is block diagonal
and each sample gets its own ``H A``. The layer is reached with a scoped
:func:`~kerascope.core.probe.probe` and the softmax bypassed as in every engine
pass (:meth:`~kerascope.core.engine.Engine.call_model`): the model is never changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core import targets as targets_lib
from kerascope.core.engine import Engine, check_finite, check_single_tensor
from kerascope.core.inputs import Inputs
from kerascope.core.probe import probe

Forward = Callable[[list[Any], Any, Callable[[int, keras.Layer, Any], Any]], tuple[Any, Any]]
Reduce = Callable[[Any, Any, Any], dict[str, Any]]


def _terms(a: Any, g: Any, hvp: Any) -> dict[str, Any]:
    """The default output: the three arrays as they are (float32)."""
    return {"acts": a, "grads": g, "hvp": hvp}


def _float32(out: dict[str, Any]) -> dict[str, Any]:
    return {k: keras.ops.cast(v, "float32") for k, v in out.items()}


def _forward(engine: Engine, inputs: Inputs, layer: keras.Layer, target_fn: Callable | None,
             positions: Sequence[int | None]) -> Forward:
    """``forward(arrays, indices, transform) -> (scores, resolved)`` with ``layer``'s output passed through
    ``transform`` (at the chosen call), the softmax bypassed as the engine does."""
    bypass = engine.space.bypass()
    model_arg = inputs.structurer()

    def forward(arrays: list[Any], indices: Any, transform: Callable[[int, keras.Layer, Any], Any]) -> tuple[Any, Any]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(probe([layer], transform, positions))
            outputs = engine.call_model(model_arg(arrays), stack, bypass)
        if target_fn is not None:
            return keras.ops.cast(targets_lib.callable_scores(target_fn, outputs), "float32"), indices
        scores, resolved = targets_lib.class_scores(engine.select(outputs), indices)
        return keras.ops.cast(scores, "float32"), resolved

    return forward


def _tensorflow(forward: Forward, specs: list[tuple[tuple[int, ...], str]], path: str, _: list[Any],
                reduce: Reduce) -> Callable:
    import tensorflow as tf

    signature = [
        [tf.TensorSpec(shape=(None, *shape[1:]), dtype=dtype) for shape, dtype in specs],
        tf.TensorSpec(shape=(None,), dtype=tf.int32),
    ]

    @tf.function(input_signature=signature, autograph=False)
    def step(arrays: list[Any], indices: Any) -> dict[str, Any]:
        held: list[Any] = []
        with tf.GradientTape(watch_accessed_variables=False) as outer:
            with tf.GradientTape(watch_accessed_variables=False) as inner:

                def transform(_: int, __: keras.Layer, output: Any) -> Any:
                    check_single_tensor(output, path)
                    outer.watch(output)
                    inner.watch(output)
                    held.append(output)
                    return output

                scores, resolved = forward(arrays, indices, transform)
                total = tf.reduce_sum(scores)
            a = held[-1]
            g = inner.gradient(total, a)
            if g is None:
                raise _disconnected(path)
        hvp = outer.gradient(g, a, output_gradients=tf.stop_gradient(a))
        hvp = tf.zeros_like(a) if hvp is None else hvp
        f32 = lambda t: tf.cast(t, tf.float32)  # noqa: E731
        return {**_float32(reduce(f32(a), f32(g), f32(hvp))), "scores": scores, "targets": resolved}

    def run(arrays: list[np.ndarray], indices: np.ndarray) -> dict[str, np.ndarray]:
        out = step([tf.convert_to_tensor(a) for a in arrays], tf.convert_to_tensor(indices.astype(np.int32)))
        return {k: np.asarray(v) for k, v in out.items()}

    return run


def _jax(forward: Forward, specs: list[tuple[tuple[int, ...], str]], path: str, variables_of: list[Any],
         reduce: Reduce) -> Callable:
    import jax
    import jax.numpy as jnp

    # every variable of the model becomes a jit argument (current values at each call, no stale constants)
    variables = list(variables_of)

    def step(values: list[Any], arrays: list[Any], indices: Any) -> dict[str, Any]:
        def score(t: Any, delta: Any) -> tuple[Any, Any]:
            held: list[Any] = []

            def transform(_: int, __: keras.Layer, output: Any) -> Any:
                check_single_tensor(output, path)
                held.append(output)
                scaled = output * (1.0 + t).astype(output.dtype)
                return scaled if delta is None else scaled + delta.astype(output.dtype)

            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                scores, resolved = forward(arrays, indices, transform)
            return jnp.sum(scores), (scores, resolved, held[-1])

        shape = jax.eval_shape(lambda: score(jnp.float32(0.0), None)[1][2]).shape

        def gradient(t: Any) -> tuple[Any, Any]:  # dS/dA at (1 + t) A
            return jax.grad(lambda delta: score(t, delta), has_aux=True)(jnp.zeros(shape, jnp.float32))

        # the tangent of (1 + t) A along t is A: the jvp of the gradient is H A
        g, hvp, (scores, resolved, a) = jax.jvp(gradient, (jnp.float32(0.0),), (jnp.float32(1.0),), has_aux=True)
        f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
        return {**_float32(reduce(f32(a), f32(g), f32(hvp))), "scores": f32(scores),
                "targets": jnp.asarray(resolved, jnp.int32)}

    compiled = jax.jit(step)

    def run(arrays: list[np.ndarray], indices: np.ndarray) -> dict[str, np.ndarray]:
        out = compiled([v.value for v in variables], [jnp.asarray(a) for a in arrays],
                       jnp.asarray(indices.astype(np.int32)))
        return {k: np.asarray(v) for k, v in out.items()}

    return run


def _torch(forward: Forward, specs: list[tuple[tuple[int, ...], str]], path: str, _: list[Any],
           reduce: Reduce) -> Callable:
    import torch

    def run(arrays: list[np.ndarray], indices: np.ndarray) -> dict[str, np.ndarray]:
        held: list[Any] = []

        def transform(_: int, __: keras.Layer, output: Any) -> Any:
            check_single_tensor(output, path)
            leaf = output.detach().requires_grad_(True)  # nothing upstream of the layer is differentiated
            held.append(leaf)
            return leaf

        device = keras.ops.convert_to_tensor(np.zeros(1, np.float32)).device
        with torch.enable_grad():
            tensors = [torch.as_tensor(a, device=device) for a in arrays]
            scores, resolved = forward(tensors, torch.as_tensor(indices.astype(np.int32), device=device), transform)
            a = held[-1]
            total = scores.sum()
            if not total.requires_grad:
                raise _disconnected(path)
            (g,) = torch.autograd.grad(total, a, create_graph=True)
            if g.requires_grad:
                (hvp,) = torch.autograd.grad(g, a, grad_outputs=a.detach(), allow_unused=True)
                hvp = torch.zeros_like(a) if hvp is None else hvp
            else:  # piecewise linear after the layer: no second-order term
                hvp = torch.zeros_like(a)
        as_numpy = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
        with torch.no_grad():
            reduced = reduce(a.detach().float(), g.detach().float(), hvp.detach().float())
        return {**{k: as_numpy(v) for k, v in reduced.items()}, "scores": as_numpy(scores),
                "targets": resolved.detach().cpu().numpy() if hasattr(resolved, "detach") else np.asarray(resolved)}

    return run


def _disconnected(path: str) -> ValueError:
    return ValueError(
        f"The target score does not depend on the output of layer {path!r}: there is no differentiable path "
        f"from this layer to the score. Received: layer={path!r}. Pick a layer between the inputs and the output."
    )


BUILDERS = {"tensorflow": _tensorflow, "jax": _jax, "torch": _torch}


def hessian_vector_products(
    engine: Engine, inputs: Any, targets: Any, layer: keras.Layer, batch_size: int = 32,
    reduce: Reduce | None = None, reduce_key: Any = None,
) -> dict[str, np.ndarray]:
    """Activations ``A``, gradients ``g`` and ``H A`` at ``layer``, scores and resolved targets.

    Per chunk of ``batch_size`` samples one compiled call (cached per layer, target
    and input signature on the engine). Arrays are float32 in the layer's own layout.
    ``reduce(A, g, HA) -> dict`` (``keras.ops``, float32 tensors) runs inside the compiled
    function and replaces the three arrays in the output by what it returns (e.g. a CAM map,
    far smaller than the layer's activations); ``reduce_key`` identifies it in the cache.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> d = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones", name="d")
        >>> m = keras.Sequential([keras.Input((2,)), d, keras.layers.Activation("tanh")])
        >>> out = hessian_vector_products(engine_for(m), np.array([[0.5, 0.0]], "float32"), 0, d)
        >>> # S = tanh(a): g = 1 - tanh(a)^2, H a = -2 tanh(a) (1 - tanh(a)^2) a
        >>> t = np.tanh(0.5)
        >>> bool(np.allclose(out["hvp"], -2 * t * (1 - t**2) * 0.5, atol=1e-6))
        True
    """
    backend = keras.backend.backend()
    if backend not in BUILDERS:
        raise NotImplementedError(
            f"Second-order terms need TensorFlow, JAX or PyTorch. Received: backend={backend!r}."
        )
    engine.check_inputs(inputs, [layer])
    prepared, indices, target_fn = engine.prepare(inputs, targets)
    positions = engine.call_positions(prepared, [layer])
    path = engine.path_of(layer)
    key = ("hessian_vector_products", layer, target_fn, prepared.signature, positions, engine.call_index,
           None if reduce is None else ("reduce", reduce if reduce_key is None else reduce_key))

    def build() -> Callable:
        forward = _forward(engine, prepared, layer, target_fn, positions)
        specs = [(tuple(s), d) for s, d in prepared.specs]
        return BUILDERS[backend](forward, specs, path, list(engine.model.variables), reduce or _terms)

    fn = engine.memo(key, build)
    parts = [fn(arrays, indices[part]) for part, arrays in prepared.chunks(batch_size)]
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if target_fn is not None:
        merged["targets"] = indices.astype(np.int64)
    merged["targets"] = merged["targets"].astype(np.int64)
    what = {"grads": "gradients", "hvp": "second-order terms"}
    for name in merged.keys() - {"scores", "targets"}:
        check_finite(merged[name], f"The {what.get(name, name)} at {path!r}")
    return merged


__all__ = ["hessian_vector_products"]
