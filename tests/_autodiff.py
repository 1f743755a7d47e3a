"""Reference gradients by the current Keras backend's own autodiff (no kerascope code).

``gradient(fn, x)`` is ``d sum(fn(x)) / dx`` computed with ``tf.GradientTape``, ``jax.grad`` or
``torch.autograd``, whichever backend Keras runs on, so a test's hand-written reference holds on all three.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np


def gradient(fn: Callable[[Any], Any], x: np.ndarray) -> np.ndarray:
    """The gradient of ``sum(fn(x))`` with respect to ``x`` (a float32 numpy array), as numpy."""
    x = np.asarray(x, np.float32)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        v = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(v)
            total = tf.reduce_sum(fn(v))
        return tape.gradient(total, v).numpy()
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        # jit: one compilation of the whole function instead of one per eager primitive (seconds on attention)
        return np.asarray(jax.jit(jax.grad(lambda v: jnp.sum(fn(v))))(jnp.asarray(x)))
    if backend == "torch":
        import torch

        v = torch.tensor(x, requires_grad=True)
        torch.sum(fn(v)).backward()
        return v.grad.detach().cpu().numpy()
    raise ValueError(f"No reference autodiff for this Keras backend. Received: backend={backend!r}")
