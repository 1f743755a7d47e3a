"""Cheaper exact convolution backward passes, scoped to one compiled pass that takes input gradients.

A backend may offer, per layer, a ``convolution_op(inputs, kernel)`` with the layer's own
forward and a cheaper exact input gradient (``_backend.<name>.conv_op``; on TensorFlow without a
GPU: the stem and 1x1 convolutions, ``kerascope/_backend/tf_conv.py``). Inside
``with cheaper_backward(ops)`` each such layer's ``convolution_op`` is that op; the instance
attribute is removed on exit, also after an exception, so the model is never changed. A folded
Conv + BatchNormalization pair (``propagation/bn_fold.py``) runs the patched op too (``affine_function``
calls a patched ``convolution_op``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import keras

from kerascope.core.layers import iter_layers
from kerascope.core.probe import patched_attribute

__all__ = ["cheaper_backward", "conv_ops"]

Op = tuple[keras.Layer, Callable[[Any, Any], Any]]


def conv_ops(model: keras.Layer, backend: ModuleType) -> list[Op]:
    """``(layer, op)`` for every layer below ``model`` for which ``backend`` has a cheaper ``convolution_op``.

    Example:
        >>> import keras
        >>> from kerascope import _backend
        >>> m = keras.Sequential([keras.Input((9, 9, 3)), keras.layers.Conv2D(2, 3, strides=2, name="stem")])
        >>> [layer.name for layer, _ in conv_ops(m, _backend.get())] in ([], ["stem"])
        True
    """
    make = getattr(backend, "conv_op", None)
    if make is None:
        return []
    found: list[Op] = []
    seen: set[int] = set()
    for _, layer in iter_layers(model):
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        op = make(layer)
        if op is not None:
            found.append((layer, op))
    return found


@contextlib.contextmanager
def cheaper_backward(ops: Sequence[Op]) -> Iterator[int]:
    """Give each layer its cheaper ``convolution_op`` for the block; yields how many were patched.

    Example:
        >>> import keras
        >>> conv = keras.layers.Conv2D(2, 1)
        >>> with cheaper_backward([(conv, lambda x, k: x)]) as n:
        ...     n, "convolution_op" in vars(conv)
        (1, True)
        >>> "convolution_op" in vars(conv)
        False
    """
    with contextlib.ExitStack() as stack:
        for layer, op in ops:
            stack.enter_context(patched_attribute(layer, "convolution_op", op))
        yield len(ops)
