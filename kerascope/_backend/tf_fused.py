"""Backward rules compiled by XLA into one kernel each (TensorFlow backend).

TensorFlow's CPU runtime runs every element-wise op as its own kernel, one
pass over memory each. A rule such as DeepLIFT's rescale rule is ~7 of them
per activation (two differences, an absolute value, a compare, a product, a
division, a select, plus the ordinary derivative), which on MobileNetV2 cost
as much as the convolutions. Compiled as one ``jit_compile=True`` function
called inside the ordinary graph, XLA fuses the rule, the function's own
derivative and its recomputed value into one loop that reads ``x`` and ``dy``
and writes the gradient: the memory traffic of the plain derivative.

Kernels are kept per *key*, not per call site: the caller keys a rule by what
defines it (the activation and its settings, the rule's layout), so the 35
ReLU6 layers of MobileNetV2 share one function, and XLA compiles it once per
distinct shape (~20-40 ms each on CPU, on the first call only). The function
a key is built with must not hold the user's model (the cache outlives it).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any

import tensorflow as tf

#: The dtypes fused (others keep the plain ops: XLA's CPU float16 arithmetic rounds differently).
FUSED_DTYPES = (tf.float32,)

_KERNELS: dict[Hashable, Callable[..., Any]] = {}
_LOCK = threading.Lock()


@functools.cache
def available() -> bool:
    """Whether this TensorFlow build can compile with XLA (the pip wheels can).

    Example:
        >>> available()
        True
    """
    return bool(tf.test.is_built_with_xla())


def kernel(
    key: Hashable, fn: Callable[..., Any], backward: Callable[[list[Any], Any, Any, Callable], list[Any]]
) -> Callable[..., Any]:
    """The XLA-compiled ``(xs, dy) -> backward(xs, fn(*xs), dy, vjp)`` for ``key`` (built on first use).

    ``fn`` is recomputed inside the kernel, and ``vjp`` is its own
    vector-Jacobian product there, so XLA fuses the value, the derivative and
    the rule. ``key`` must determine ``fn`` and ``backward``: the first ones
    given for a key are kept.

    Example:
        >>> k = kernel(("doc", "double"), lambda x: 2.0 * x, lambda xs, y, dy, vjp: [vjp(dy)[0] + y])
        >>> [g.numpy().tolist() for g in k([tf.constant([1.0, 2.0])], tf.constant([1.0, 1.0]))]
        [[4.0, 6.0]]
    """
    with _LOCK:
        compiled = _KERNELS.get(key)
        if compiled is None:
            def fused(xs: list[tf.Tensor], dy: tf.Tensor) -> list[tf.Tensor]:
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch(xs)
                    y = fn(*xs)

                def vjp(d: Any) -> list[Any]:
                    grads = tape.gradient(y, list(xs), output_gradients=d)
                    return [tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs, strict=True)]

                return list(backward(list(xs), y, dy, vjp))

            compiled = _KERNELS[key] = tf.function(fused, jit_compile=True, autograph=False)
        return compiled


def applies(xs: list[tf.Tensor], dy: tf.Tensor) -> bool:
    """Whether a fused kernel runs for these tensors: XLA available, every one of a fused dtype.

    Example:
        >>> applies([tf.constant([1.0])], tf.constant([1.0])), applies([tf.constant([1.0], tf.float16)], None)
        (True, False)
    """
    return available() and all(t is not None and t.dtype in FUSED_DTYPES for t in [*xs, dy])
