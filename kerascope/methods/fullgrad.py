"""FullGrad (Srinivas & Fleuret, 2019): input-gradient and bias-gradient maps of every convolutional layer.

The full-gradient decomposition writes a ReLU network's output as
``f(x) = grad_x f . x + sum_l grad_{b_l} f . b_l``; FullGrad shows both parts
as maps: ``psi(|x * grad_x f|)`` summed over the input's channels, plus, for
every layer with a spatial bias (``Conv2D``, ``DepthwiseConv2D``,
``SeparableConv2D`` with ``use_bias``, and ``BatchNormalization``, whose
bias is ``beta - mean * gamma / sqrt(var + eps)``), ``psi(|b_c * g_c|)`` summed
over its channels, where ``g`` is the gradient w.r.t. the layer's
pre-activation output. ``psi`` is the paper's post-processing per channel map:
``abs``, min-max scaling to ``[0, 1]`` (``(m - min) / (max(m - min) + 1e-7)``)
and bilinear resizing to the input. This is pytorch-grad-cam's ``FullGrad`` (and
the official ``fullgrad-saliency``) up to its final min-max scaling of the
summed map, which is display (see :mod:`kerascope.viz`).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core import spatial
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.layers import iter_layers
from kerascope.methods.base import Method, UnsupportedModelError
from kerascope.methods.registry import register
from kerascope.numeric.resize import upsample

CONVOLUTIONS = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D)
#: d activation / d pre-activation, written with the activation's output ``y`` (``keras.ops``: they run inside
#: the compiled pass)
ACTIVATION_SLOPES = {
    "linear": lambda y: keras.ops.ones_like(y),
    "relu": lambda y: keras.ops.cast(y > 0, y.dtype),
    "tanh": lambda y: 1.0 - keras.ops.square(y),
    "sigmoid": lambda y: y * (1.0 - y),
}


def bias_layers(model: keras.Layer) -> list[tuple[str, keras.Layer]]:
    """``(path, layer)`` of every layer with a spatial bias: biased 2-D convolutions and batch normalisations.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Conv2D(2, 3, use_bias=False, name="nb"),
        ...                       keras.layers.BatchNormalization(name="bn"), keras.layers.Flatten(),
        ...                       keras.layers.Dense(2)])
        >>> [path for path, _ in bias_layers(m)]
        ['c', 'bn']
    """
    found = []
    for path, layer in iter_layers(model):
        if isinstance(layer, CONVOLUTIONS) and layer.use_bias:
            found.append((path, layer))
        elif isinstance(layer, keras.layers.BatchNormalization) and (layer.center or layer.scale):
            found.append((path, layer))
    return found


def effective_bias(layer: keras.Layer) -> np.ndarray:
    """The per-channel bias a layer adds: a convolution's ``bias``; a batch norm's ``beta - mean gamma / sqrt(var + eps)``.

    Example:
        >>> import keras, numpy as np
        >>> bn = keras.layers.BatchNormalization(epsilon=0.0); bn.build((None, 2))
        >>> bn.set_weights([np.full(2, 2.0), np.ones(2), np.full(2, 3.0), np.full(2, 4.0)])
        >>> effective_bias(bn).tolist()   # 1 - 3 * 2 / sqrt(4)
        [-2.0, -2.0]
    """
    if isinstance(layer, keras.layers.BatchNormalization):
        mean = keras.ops.convert_to_numpy(layer.moving_mean).astype(np.float64)
        variance = keras.ops.convert_to_numpy(layer.moving_variance).astype(np.float64)
        gamma = keras.ops.convert_to_numpy(layer.gamma).astype(np.float64) if layer.scale else 1.0
        beta = keras.ops.convert_to_numpy(layer.beta).astype(np.float64) if layer.center else 0.0
        return (beta - mean * gamma / np.sqrt(variance + layer.epsilon)).astype(np.float32)
    return keras.ops.convert_to_numpy(layer.bias).astype(np.float32)


def channel_scaled(maps: np.ndarray) -> np.ndarray:
    """Each ``(N, h, w, C)`` channel map min-max scaled to ``[0, 1]``, then summed over channels: ``(N, h, w)``.

    ``(m - min) / (max(m - min) + 1e-7)`` per sample and channel (pytorch-grad-cam's ``scale_cam_image``).

    Example:
        >>> import numpy as np
        >>> channel_scaled(np.array([[[[1.0, 5.0], [3.0, 5.0]]]])).round(4).tolist()
        [[[0.0, 1.0]]]
    """
    maps = np.asarray(maps, np.float32)
    low = maps.min(axis=(1, 2), keepdims=True)
    shifted = maps - low
    return (shifted / (shifted.max(axis=(1, 2), keepdims=True) + np.float32(1e-7))).sum(axis=-1)


@register
class FullGrad(Method):
    """FullGrad (Srinivas & Fleuret, 2019): the input-gradient map plus every convolutional layer's bias-gradient map.

    ``sum_c psi(|x_c grad_x_c f|) + sum_l sum_c psi(|b_lc g_lc|)`` where ``g_l`` is the
    gradient of the target score w.r.t. layer ``l``'s pre-activation output and ``psi``
    scales each channel map to ``[0, 1]`` and resizes it bilinearly to the input (see
    :mod:`kerascope.methods.fullgrad`). The layers are found automatically (biased
    ``Conv2D`` / ``DepthwiseConv2D`` / ``SeparableConv2D``, ``BatchNormalization``); a
    convolution's fused activation must be linear, ReLU, tanh or sigmoid.

    Args:
        input_index: the image input the map is for (a position or a name); default: the only
            input, else the only image input.

    Cost: one forward and one backward pass; the gradients at every bias layer of a
    ``batch_size`` chunk are held at once.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, activation="relu"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> ks.FullGrad(m).explain(np.random.rand(2, 8, 8, 1), 0).attributions.shape
        (2, 8, 8)
    """

    name = "fullgrad"
    description = "Input-gradient map plus the bias-gradient maps of every convolutional layer (Srinivas & Fleuret 2019)."
    aliases = ("full_grad",)

    def __init__(self, model: keras.Layer, *, input_index: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.input_index = input_index

    def _layers(self) -> list[tuple[str, keras.Layer]]:
        layers = bias_layers(self.model)
        for path, layer in layers:
            if getattr(layer, "data_format", "channels_last") != "channels_last" or (
                isinstance(layer, keras.layers.BatchNormalization) and layer.axis not in (-1, 3, [-1], [3])
            ):
                raise UnsupportedModelError(
                    f"FullGrad reads channels-last layers. Received: layer {path!r} with channels first. "
                    "Use a channels-last model (data_format='channels_last')."
                )
            name = getattr(getattr(layer, "activation", None), "__name__", "linear")
            if name not in ACTIVATION_SLOPES:
                raise UnsupportedModelError(
                    f"FullGrad needs the gradient at {path!r} before its activation. Received: a fused "
                    f"activation={name!r}; supported: {sorted(ACTIVATION_SLOPES)}. Move the activation into its "
                    "own layer (e.g. keras.layers.Activation)."
                )
        return layers

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        index = spatial.choose_input(self.model, inputs, self.input_index)
        x = inputs.arrays[index]
        if x.ndim != 4 or not np.issubdtype(x.dtype, np.floating):
            raise UnsupportedModelError(
                f"FullGrad explains image inputs (batch, height, width, channels). Received: input {index} of "
                f"shape {x.shape} and dtype {x.dtype}. Use Saliency or IntegratedGradients."
            )
        layers = self._layers()
        # the bias maps are formed inside the compiled function: only (N, h, w) per layer leaves it. The
        # biases are constants of that function (their values in the key: new weights, a new function).
        names = tuple(getattr(getattr(layer, "activation", None), "__name__", "linear") for _, layer in layers)
        biases = [effective_bias(layer) for _, layer in layers]
        result = self.engine.gradients(
            inputs, targets, layers=[layer for _, layer in layers], wrt_inputs=[index],
            batch_size=self.batch_size, progress=self.progress, reduce=_bias_maps(names, biases),
            reduce_key=("fullgrad", names, tuple(b.tobytes() for b in biases)),
        )
        size = x.shape[1:3]
        total = upsample(channel_scaled(np.abs(x * np.asarray(result.input_grads[0], np.float32))), size)
        for bias_map in result.reduced:
            total = total + upsample(np.asarray(bias_map, np.float32), size)
        return self._result(inputs, [total.astype(np.float32)], result.scores, result.targets)


def _bias_maps(names: tuple[str, ...], biases: list[np.ndarray]) -> Any:
    """``reduce(activations, gradients)``: each spatial bias layer's ``sum_c psi(|b_c g_c|)`` before resizing,
    as :func:`channel_scaled` in ``keras.ops``, with ``ACTIVATION_SLOPES`` (run inside the compiled pass)."""
    ops = keras.ops

    def reduce(acts: list[Any], grads: list[Any]) -> list[Any]:
        maps = []
        for name, bias, output, grad in zip(names, biases, acts, grads, strict=True):
            if len(output.shape) != 4:
                continue  # a batch norm of a non-spatial layer: no map
            pre = grad * ACTIVATION_SLOPES[name](output)  # the gradient before the activation
            values = ops.abs(ops.convert_to_tensor(bias) * pre)
            shifted = values - ops.min(values, axis=(1, 2), keepdims=True)
            maps.append(ops.sum(shifted / (ops.max(shifted, axis=(1, 2), keepdims=True) + 1e-7), axis=-1))
        return maps

    return reduce


__all__ = ["FullGrad", "bias_layers", "channel_scaled", "effective_bias"]
