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
a key is built with must not hold the user's model (the cache outlives it);
the cache keeps the :data:`MAX_KERNELS` most recently built.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any

import tensorflow as tf

#: The dtypes fused (others keep the plain ops: XLA's CPU float16 arithmetic rounds differently).
FUSED_DTYPES = (tf.float32,)

#: Kernels kept (each new DeepLiftShap group length is a new layout, so a new key per activation).
MAX_KERNELS = 64

_KERNELS: collections.OrderedDict[Hashable, Callable[..., Any]] = collections.OrderedDict()
_LOCK = threading.Lock()


@functools.cache
def available(device: str = "") -> bool:
    """Whether XLA compiles and runs a kernel on ``device`` (``""``: where TensorFlow places ops by default).

    Built with XLA is not enough: some GPU set-ups (a missing ``ptxas`` / libdevice, plugin
    devices) run TensorFlow's own kernels but fail to compile. One tiny kernel is compiled and
    run once per device, outside any trace; any failure means the rules keep their separate ops.

    Example:
        >>> available()
        True
    """
    if not tf.test.is_built_with_xla():
        return False
    try:
        with tf.init_scope(), (tf.device(device) if device else contextlib.nullcontext()):
            probe = tf.function(lambda v: v * 2.0 + 1.0, jit_compile=True, autograph=False)
            return bool(probe(tf.constant([1.0])).numpy()[0] == 3.0)
    except Exception:  # noqa: BLE001  (any failure to compile or run: not available)
        return False


def kernel(
    key: Hashable, fn: Callable[..., Any], backward: Callable[[list[Any], Any, Any, Callable], list[Any]]
) -> Callable[..., Any]:
    """The XLA-compiled ``(xs, y, dy) -> backward(xs, y, dy, vjp)`` for ``key`` (built on first use).

    ``y`` is the forward pass's ``fn(*xs)`` (the rule's differences use the
    values the scores were computed from), or ``None`` where XLA's ``fn`` is
    bit for bit TensorFlow's (``max`` / ``min`` only, e.g. ReLU and ReLU6):
    then it is recomputed, and the kernel reads one tensor less (on
    MobileNetV2 the fused rules take 9.5 instead of 13.4 ms per pass).
    ``vjp`` is ``fn``'s own vector-Jacobian product, recomputed inside the
    kernel, so XLA fuses the derivative and the rule. ``key`` must determine
    ``fn`` and ``backward``: the first ones given for a key are kept.

    Example:
        >>> k = kernel(("doc", "double"), lambda x: 2.0 * x, lambda xs, y, dy, vjp: [vjp(dy)[0] + y])
        >>> x = tf.constant([1.0, 2.0])
        >>> [g.numpy().tolist() for g in k([x], 2.0 * x, tf.constant([1.0, 1.0]))]
        [[4.0, 6.0]]
    """
    with _LOCK:
        compiled = _KERNELS.get(key)
        if compiled is None:
            def fused(xs: list[tf.Tensor], y: tf.Tensor | None, dy: tf.Tensor) -> list[tf.Tensor]:
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch(xs)
                    again = fn(*xs)
                y = again if y is None else y

                def vjp(d: Any) -> list[Any]:
                    grads = tape.gradient(again, list(xs), output_gradients=d)
                    return [tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs, strict=True)]

                return list(backward(list(xs), y, dy, vjp))

            compiled = _KERNELS[key] = tf.function(fused, jit_compile=True, autograph=False)
            while len(_KERNELS) > MAX_KERNELS:
                _KERNELS.popitem(last=False)
        else:
            _KERNELS.move_to_end(key)
        return compiled


def applies(xs: list[tf.Tensor], dy: tf.Tensor) -> bool:
    """Whether a fused kernel runs for these tensors: XLA available, every one of a fused dtype.

    Example:
        >>> applies([tf.constant([1.0])], tf.constant([1.0])), applies([tf.constant([1.0], tf.float16)], None)
        (True, False)
    """
    return all(t is not None and t.dtype in FUSED_DTYPES for t in [*xs, dy]) and available()
