"""The affine part of Dense / Conv layers with given parameters, and a BatchNormalization folded into it.

Shared by the LRP walk (rules evaluate the layer with modified parameters) and batch-norm folding
(a Conv / Dense + BatchNormalization pair run as one layer in the compiled passes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from kerascope import _backend
from kerascope.core.probe import own_patch


def is_linear_activation(activation: Any) -> bool:
    """``activation`` is Keras's identity (``None`` or ``keras.activations.linear`` itself).

    By identity, never by name: a layer instance, a ``functools.partial`` or a user function called
    ``linear`` is an activation to apply, not one to skip.

    Example:
        >>> import functools, keras
        >>> is_linear_activation(keras.layers.Dense(2).activation), is_linear_activation(keras.layers.ReLU())
        (True, False)
        >>> is_linear_activation(functools.partial(keras.activations.leaky_relu, negative_slope=0.1))
        False
    """
    return activation is None or activation is keras.activations.linear


def _types(names: tuple[str, ...]) -> tuple[type, ...]:
    return tuple(getattr(keras.layers, n) for n in names if hasattr(keras.layers, n))


def affine_function(layer: keras.Layer) -> Callable[[Any, Any, Any], Any]:
    """``f(x, kernel, bias)``: the linear part of a Dense / Conv layer with the given parameters.

    Example:
        >>> import numpy as np
        >>> d = keras.layers.Dense(1); d.build((None, 2))
        >>> f = affine_function(d)
        >>> keras.ops.convert_to_numpy(f(np.ones((1, 2), "float32"), np.full((2, 1), 2.0, "float32"), None)).tolist()
        [[4.0]]
    """
    if isinstance(layer, keras.layers.Dense):
        def dense(x: Any, kernel: Any, bias: Any) -> Any:
            return _add_bias(keras.ops.matmul(x, kernel), bias, lambda out, b: out + b)
        return dense

    rank, channels_last = layer.rank, layer.data_format == "channels_last"
    depthwise = _is_depthwise(layer)

    def conv(x: Any, kernel: Any, bias: Any) -> Any:
        patched = own_patch(layer, "convolution_op")  # a scoped cheaper backward (propagation/conv_backward.py)
        if patched is not None and not depthwise:
            out = patched(x, kernel)
        else:
            op = keras.ops.depthwise_conv if depthwise else keras.ops.conv
            out = op(x, kernel, strides=layer.strides if depthwise else list(layer.strides), padding=layer.padding,
                     dilation_rate=layer.dilation_rate, data_format=layer.data_format)
        shape = (1,) * (rank + 1) + (-1,) if channels_last else (1, -1) + (1,) * rank
        return _add_bias(out, bias, lambda o, b: o + keras.ops.reshape(b, shape), channels_last)
    return conv


def _add_bias(out: Any, bias: Any, plain: Callable[[Any, Any], Any], channels_last: bool = True) -> Any:
    """``plain(out, bias)``, or the backend's ``bias_add`` where it has one and ``bias`` is one value per
    channel of ``out``'s last axis (``None``: ``out``).

    On TensorFlow that is a ``BiasAdd`` op, which Grappler fuses into the convolution or matrix
    product before it (with a following ReLU / ReLU6, and with a residual ``Add`` + ReLU); a plain
    ``AddV2`` of the bias is merged by Grappler's arithmetic optimiser with the residual ``Add`` into
    an ``AddN`` that nothing fuses. Same values up to float32 rounding (oneDNN adds the bias inside the
    fused op).

    Example:
        >>> import numpy as np
        >>> b = np.array([1.0, 2.0], "float32")
        >>> keras.ops.convert_to_numpy(_add_bias(np.zeros((1, 2), "float32"), b, lambda o, b: o + b)).tolist()
        [[1.0, 2.0]]
    """
    if bias is None:
        return out
    bias_add = getattr(_backend.get(), "bias_add", None)
    if bias_add is not None and channels_last and len(getattr(bias, "shape", ())) == 1:
        return bias_add(out, bias)
    return plain(out, bias)


def _is_depthwise(layer: keras.Layer) -> bool:
    return isinstance(layer, _types(("DepthwiseConv1D", "DepthwiseConv2D")))


def _params(layer: keras.Layer) -> tuple[Any, Any]:
    kernel = keras.ops.convert_to_tensor(layer.kernel)
    bias = keras.ops.convert_to_tensor(layer.bias) if getattr(layer, "bias", None) is not None else None
    return kernel, bias


def _on_channels(affine: keras.Layer, bn: keras.Layer, ndim: int) -> bool:
    """Whether ``bn`` normalises the output channels of ``affine`` (then it folds into it)."""
    channel = ndim - 1 if getattr(affine, "data_format", "channels_last") == "channels_last" else 1
    axes = [bn.axis] if isinstance(bn.axis, int) else list(bn.axis)
    return len(axes) == 1 and axes[0] % ndim == channel


def batchnorm_fold(bias: Any, bn: keras.Layer) -> tuple[Any, Any]:
    """``(s, (bias - mean) * s + beta)`` with ``s = gamma / sqrt(var + eps)``: ``bn(z + bias) == z * s + shift``.

    Example:
        >>> bn = keras.layers.BatchNormalization(epsilon=0.0); bn.build((None, 2))
        >>> [keras.ops.convert_to_numpy(v).tolist() for v in batchnorm_fold(None, bn)]
        [[1.0, 1.0], [0.0, 0.0]]
    """
    scale = keras.ops.rsqrt(keras.ops.convert_to_tensor(bn.moving_variance) + bn.epsilon)
    if bn.gamma is not None:
        scale = scale * keras.ops.convert_to_tensor(bn.gamma)
    mean = keras.ops.convert_to_tensor(bn.moving_mean)
    shift = keras.ops.convert_to_tensor(bn.beta) if bn.beta is not None else 0.0
    return scale, ((bias if bias is not None else 0.0) - mean) * scale + shift


def _fused_params(affine: keras.Layer, bn: keras.Layer, ndim: int) -> tuple[Any, Any] | None:
    """The parameters of ``affine`` followed by ``bn`` as one layer (``None``: BN not on the output channels)."""
    if not _on_channels(affine, bn, ndim):
        return None
    kernel, bias = _params(affine)
    scale, fused_bias = batchnorm_fold(bias, bn)
    # output channel c of a depthwise kernel (..., in, multiplier) is (c // multiplier, c % multiplier)
    kernel_scale = keras.ops.reshape(scale, tuple(kernel.shape[-2:])) if _is_depthwise(affine) else scale
    return kernel * kernel_scale, fused_bias
