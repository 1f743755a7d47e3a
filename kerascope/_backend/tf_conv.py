"""Exact, cheaper input gradients for two kinds of 2-D convolution on CPU (TensorFlow).

On a CPU, TensorFlow's input gradient of a convolution (``Conv2DBackpropInput``, oneDNN) is
much slower than the forward convolution for two shapes that image models always have
(ResNet50 at 160 px, one thread, 2 rows; the conv-backward study in ``bench/HISTORY.md``):

- the **stem**: a strided convolution of the 3 image channels (ResNet50's 7x7/2, 3 -> 64:
  forward 1.4 ms, input gradient 7.3 ms; 12 and 53-61 ms at 16 rows). The gradient is the same
  transposed convolution written as one stride-1 convolution with ``s*s*C_in`` output
  channels (the polyphase form: the kernel taps that reach one output phase) followed by
  ``depth_to_space``: 3.4 ms (20 ms at 16 rows);
- **1x1 convolutions** with large kernels on small maps (ResNet50's last stage, 5x5 positions,
  512 <-> 2048 channels: 1.8-2.4 ms against 1.0 forward): the gradient is one matrix product
  ``dy @ W^T`` (1.2 ms); a strided 1x1 convolution's gradient is that product placed on the
  input grid's strided positions, zeros elsewhere.

Each rewritten layer costs ~11 ms more tracing and graph optimisation on the first call, so only
layers where the gain is large are rewritten (:data:`POINTWISE_WEIGHTS`).

:func:`conv_op` gives such a layer a ``convolution_op`` with the same forward (``keras.ops.conv``,
bit for bit) and that backward (``tf.custom_gradient``); the kernel gradient stays TensorFlow's
own (``Conv2DBackpropFilter``), so weight gradients and second derivatives are unchanged. The
input gradient equals TensorFlow's up to float32 rounding (the sums are ordered differently).
Only where no GPU is visible (cuDNN's backward has no such gap), for exact ``Conv2D`` layers,
channels-last, undilated, ungrouped, float32 with static spatial sizes at trace time; anything
else runs TensorFlow's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

__all__ = ["POINTWISE_POSITIONS", "POINTWISE_WEIGHTS", "STEM_CHANNELS", "conv_op", "pointwise_input_gradient",
           "polyphase_input_gradient"]

#: A strided convolution with at most this many input channels is a stem: polyphase gradient.
STEM_CHANNELS = 4
#: A stride-1 1x1 convolution whose output has at most this many positions per row: matrix-product
#: gradient (measured faster up to 7x7 maps; at 10x10 and more the two were level within noise).
POINTWISE_POSITIONS = 64
#: ... and at least this many weights: ResNet50's 512 x 2048 kernels on 5x5 maps measured 2.4 -> 1.2 ms,
#: MobileNetV2's <= 960 x 320 ones 0.41 -> 0.36 ms, while each rewritten layer adds ~11 ms of tracing and
#: graph optimisation to the first call (9 layers: +0.1 CPU s).
POINTWISE_WEIGHTS = 2**20


def _before(size: int, kernel: int, stride: int, padding: str) -> int:
    """Rows of zeros TensorFlow pads before the input along one axis (``padding`` ``"SAME"`` / ``"VALID"``)."""
    if padding == "VALID":
        return 0
    out = -(-size // stride)
    return max((out - 1) * stride + kernel - size, 0) // 2


def polyphase_input_gradient(dy: Any, kernel: Any, strides: tuple[int, int], padding: str,
                             size: tuple[int, int]) -> Any:
    """``d conv2d(x, kernel) / dx`` applied to ``dy``, as one stride-1 convolution and ``depth_to_space``.

    Input row ``i = q * s + r - p`` (``p`` the padding before it) receives ``dy[q - m] * w[r + s m]``:
    for each phase ``r`` that is a full convolution of ``dy`` with the kernel taps ``w[r::s]``. The
    phases of both axes become output channels of one convolution (flipped taps, ``dy`` padded
    ``ceil(k / s) - 1`` before), ``depth_to_space`` interleaves them, and the slice drops ``p``.
    ``size`` is the input's ``(height, width)``; NHWC.

    Example:
        >>> x = tf.random.stateless_normal((1, 9, 9, 3), (1, 2))
        >>> w = tf.random.stateless_normal((5, 5, 3, 4), (3, 4))
        >>> with tf.GradientTape() as t:
        ...     t.watch(x)
        ...     y = tf.nn.conv2d(x, w, 2, "SAME")
        >>> dy = tf.ones_like(y)
        >>> reference = t.gradient(y, x, output_gradients=dy)
        >>> ours = polyphase_input_gradient(dy, w, (2, 2), "SAME", (9, 9))
        >>> bool(tf.reduce_max(tf.abs(ours - reference)) < 1e-4)
        True
    """
    kh, kw, cin, cout = (int(d) for d in kernel.shape)
    sh, sw = strides
    th, tw = -(-kh // sh), -(-kw // sw)  # taps per phase
    taps = tf.pad(kernel, [[0, th * sh - kh], [0, tw * sw - kw], [0, 0], [0, 0]])
    taps = tf.reshape(taps, [th, sh, tw, sw, cin, cout])  # w[m * s + r]
    taps = tf.reverse(taps, [0, 2])  # a full convolution as a correlation
    taps = tf.reshape(tf.transpose(taps, [0, 2, 5, 1, 3, 4]), [th, tw, cout, sh * sw * cin])
    (h, w), (oh, ow) = size, (int(dy.shape[1]), int(dy.shape[2]))
    ph, pw = _before(h, kh, sh, padding), _before(w, kw, sw, padding)
    rows, cols = -(-(ph + h) // sh), -(-(pw + w) // sw)  # phase rows needed to cover the input
    padded = tf.pad(dy, [[0, 0], [th - 1, max(rows - oh, 0)], [tw - 1, max(cols - ow, 0)], [0, 0]])
    phases = tf.nn.conv2d(padded, taps, 1, "VALID")
    if sh == sw and sh > 1:
        full = tf.nn.depth_to_space(phases, sh)
    else:  # unequal strides: interleave by reshapes
        n, ph_rows, ph_cols = tf.shape(phases)[0], phases.shape[1], phases.shape[2]
        full = tf.reshape(phases, [n, ph_rows, ph_cols, sh, sw, cin])
        full = tf.reshape(tf.transpose(full, [0, 1, 3, 2, 4, 5]), [n, ph_rows * sh, ph_cols * sw, cin])
    return full[:, ph:ph + h, pw:pw + w, :]


def pointwise_input_gradient(dy: Any, kernel: Any, strides: tuple[int, int], size: tuple[int, int]) -> Any:
    """``d conv2d(x, kernel) / dx`` applied to ``dy`` for a 1x1 ``kernel``: ``dy @ W^T`` on the strided positions.

    A 1x1 convolution reads input ``(o_h * s_h, o_w * s_w)`` only (``"SAME"`` pads nothing
    before for a 1x1 kernel), so the gradient is the matrix product there and zero on the other
    positions. ``size`` is the input's ``(height, width)``; NHWC.

    Example:
        >>> x = tf.random.stateless_normal((2, 5, 5, 6), (1, 2))
        >>> w = tf.random.stateless_normal((1, 1, 6, 3), (3, 4))
        >>> with tf.GradientTape() as t:
        ...     t.watch(x)
        ...     y = tf.nn.conv2d(x, w, 2, "VALID")
        >>> dy = tf.ones_like(y)
        >>> reference = t.gradient(y, x, output_gradients=dy)
        >>> bool(tf.reduce_max(tf.abs(pointwise_input_gradient(dy, w, (2, 2), (5, 5)) - reference)) < 1e-5)
        True
    """
    cin, cout = int(kernel.shape[2]), int(kernel.shape[3])
    n, oh, ow = tf.shape(dy)[0], int(dy.shape[1]), int(dy.shape[2])
    flat = tf.matmul(tf.reshape(dy, [-1, cout]), kernel[0, 0], transpose_b=True)
    grad = tf.reshape(flat, [n, oh, 1, ow, 1, cin])
    (sh, sw), (h, w) = strides, size
    if (sh, sw) == (1, 1) and (oh, ow) == (h, w):
        return tf.reshape(grad, [n, h, w, cin])
    grad = tf.pad(grad, [[0, 0], [0, 0], [0, sh - 1], [0, 0], [0, sw - 1], [0, 0]])
    grad = tf.reshape(grad, [n, oh * sh, ow * sw, cin])
    grad = grad[:, :h, :w, :]
    return tf.pad(grad, [[0, 0], [0, max(h - oh * sh, 0)], [0, max(w - ow * sw, 0)], [0, 0]])


def _kind(layer: keras.Layer) -> str | None:
    """``"stem"``, ``"pointwise"`` or ``None`` (TensorFlow's own gradient) for ``layer``."""
    if type(layer) is not keras.layers.Conv2D or layer.data_format != "channels_last":
        return None
    own = vars(layer).get("convolution_op")
    # an op set on this object: its gradient is not the plain convolution's (kerascope's own scoped patches,
    # a dispatcher marked `_kerascope_slot`, leave other threads the plain op)
    if own is not None and not hasattr(own, "_kerascope_slot"):
        return None
    if tuple(layer.dilation_rate) != (1, 1) or getattr(layer, "groups", 1) != 1 or layer.padding not in ("valid", "same"):
        return None
    if getattr(layer, "compute_dtype", None) != "float32" or getattr(layer, "kernel", None) is None:
        return None
    kh, kw, cin, _ = (int(d) for d in layer.kernel.shape)
    if cin <= STEM_CHANNELS and max(layer.strides) > 1:
        return "stem"
    if (kh, kw) == (1, 1) and (max(layer.strides) > 1 or cin * int(layer.kernel.shape[3]) >= POINTWISE_WEIGHTS):
        return "pointwise"
    return None


def conv_op(layer: keras.Layer) -> Callable[[Any, Any], Any] | None:
    """A ``convolution_op(inputs, kernel)`` for ``layer`` with a cheaper exact input gradient, or ``None``.

    ``None`` where a GPU is visible, or the layer is not a stem or 1x1 ``Conv2D`` (see the module
    docstring). At trace time an input without static spatial sizes, a stride-1 1x1 convolution on
    a map of more than :data:`POINTWISE_POSITIONS` positions, or a dtype other than float32 runs
    the layer's own op.

    Example:
        >>> stem = keras.layers.Conv2D(4, 3, strides=2)
        >>> stem.build((None, 9, 9, 3))
        >>> op = conv_op(stem)
        >>> x = tf.random.stateless_normal((2, 9, 9, 3), (0, 1))
        >>> with tf.GradientTape(persistent=True) as t:
        ...     t.watch(x)
        ...     ours, theirs = op(x, stem.kernel), stem.convolution_op(x, stem.kernel)
        >>> bool(tf.reduce_all(ours == theirs))
        True
        >>> bool(tf.reduce_max(tf.abs(t.gradient(ours, x) - t.gradient(theirs, x))) < 1e-5)
        True
    """
    kind = _kind(layer)
    if kind is None or tf.config.list_logical_devices("GPU"):
        return None
    own = layer.convolution_op
    strides, padding = (int(layer.strides[0]), int(layer.strides[1])), layer.padding.upper()

    def op(inputs: Any, kernel: Any) -> Any:
        x = tf.convert_to_tensor(inputs)
        size = tuple(x.shape[1:3])
        if x.dtype != tf.float32 or None in size or len(x.shape) != 4:
            return own(inputs, kernel)
        k = tf.convert_to_tensor(kernel)
        if k.dtype != tf.float32:
            return own(inputs, kernel)
        if kind == "pointwise" and (tuple(k.shape[:2]) != (1, 1) or (
                strides == (1, 1) and int(size[0]) * int(size[1]) > POINTWISE_POSITIONS)):
            return own(inputs, kernel)

        @tf.custom_gradient
        def conv(x: tf.Tensor, k: tf.Tensor) -> Any:
            y = own(x, k)

            def grad(dy: tf.Tensor) -> tuple[Any, Any]:
                dy = tf.ensure_shape(dy, y.shape)  # an upstream op (tf.py_function) may hand it without a static shape
                if kind == "stem":
                    dx = polyphase_input_gradient(dy, k, strides, padding, size)
                else:
                    dx = pointwise_input_gradient(dy, k, strides, size)
                dk = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=tf.shape(k), out_backprop=dy,
                                                     strides=[1, *strides, 1], padding=padding)
                return dx, dk

            return y, grad

        return conv(x, k)

    return op
