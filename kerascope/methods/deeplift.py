"""Modified-backpropagation methods: Deconvnet and DeepLIFT (rescale rule).

Both replace the backward pass of every ReLU for the duration of one
compiled call (the model is never changed); everything else is the ordinary
gradient.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.layers import iter_layers
from kerascope.methods._folding import forward_scores, row_targets
from kerascope.methods.base import Method, UnsupportedModelError
from kerascope.methods.gradients import Saliency
from kerascope.methods.integrated import _describe_baseline, resolve_baselines
from kerascope.methods.registry import register


@register
class Deconvnet(Saliency):
    """Deconvnet backward pass (Zeiler & Fergus, 2014).

    Every ReLU passes back the positive part of the incoming gradient,
    whatever its forward input was (``relu(dy)``); other layers use their
    ordinary (transposed) gradient. One forward and one backward pass per
    sample. Same reach as :class:`GuidedBackprop`: ReLUs written as
    ``tf.nn.relu`` inside a subclassed ``call`` keep their normal gradient.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
        >>> ks.Deconvnet(m).explain(np.ones((1, 3)), 0).attributions.shape
        (1, 3)
    """

    name = "deconvnet"
    description = "Gradient with ReLUs passing back only positive gradients (Zeiler & Fergus 2014)."
    aliases = ("deconvolution", "deconv")
    rule = "deconvnet"


def _linear_layer_types() -> tuple[type, ...]:
    names = [
        "InputLayer", "Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose",
        "Conv2DTranspose", "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
        "SeparableConv2D", "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
        "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D", "Flatten", "Reshape",
        "Permute", "RepeatVector", "BatchNormalization", "Add", "Subtract", "Average", "Concatenate",
        "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
        "GaussianDropout", "AlphaDropout", "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
        "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D", "UpSampling3D",
        "Rescaling", "Normalization", "Identity", "Activation", "ReLU",
    ]
    return tuple(getattr(keras.layers, n) for n in names if hasattr(keras.layers, n))


SUPPORTED_ACTIVATIONS = ("linear", "relu", "relu6")


def check_deeplift_support(model: keras.Layer, bypassed: list[str]) -> None:
    """Raise an ``UnsupportedModelError`` (a ``ValueError``) naming every layer the rescale rule cannot handle.

    Supported: linear layers (Dense, convolutions, average pooling, Flatten,
    Reshape, BatchNormalization in inference, Add/Concatenate, padding,
    cropping, dropout, ...), ReLU / ReLU6 (as activations, ``Activation`` or
    ``ReLU`` layers) and a final softmax that the engine bypasses (``paths in
    bypassed``). Everything else, e.g. sigmoid / tanh / softmax in the middle,
    max pooling, multiplicative layers, normalisation across features, is
    rejected.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh", name="h")])
        >>> check_deeplift_support(m, [])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kerascope.methods.base.UnsupportedModelError: DeepLIFT (rescale rule) supports ReLU networks built from linear layers. Received: unsupported layers ['h' (Dense with activation 'tanh')]. ...
    """
    linear = _linear_layer_types()
    problems = []
    for path, layer in iter_layers(model):
        if isinstance(layer, keras.Model):
            continue  # containers: their layers are checked one by one
        if not isinstance(layer, linear):
            problems.append(f"{path!r} ({type(layer).__name__})")
            continue
        activation = getattr(layer, "activation", None)
        if activation is None:
            continue
        act = getattr(activation, "__name__", type(activation).__name__)
        if act == "softmax" and path in bypassed:
            continue
        if act not in SUPPORTED_ACTIVATIONS:
            problems.append(f"{path!r} ({type(layer).__name__} with activation {act!r})")
    if problems:
        raise UnsupportedModelError(
            "DeepLIFT (rescale rule) supports ReLU networks built from linear layers. Received: "
            f"unsupported layers [{', '.join(problems)}]. Supported: Dense, convolutions, average "
            "pooling, Flatten/Reshape, BatchNormalization (inference), Add/Concatenate, padding, "
            "cropping, dropout, ReLU/ReLU6 and a final softmax (bypassed with output='logits'). "
            "Use IntegratedGradients for other models."
        )


@register
class DeepLIFT(Method):
    """DeepLIFT with the rescale rule (Shrikumar et al., 2017), for ReLU networks.

    Each ReLU's backward pass multiplies by ``(relu(z) - relu(z_ref)) /
    (z - z_ref)`` (the ordinary derivative where ``|z - z_ref| < 1e-10``),
    where ``z_ref`` is the same unit's input when the network runs on the
    baseline; linear layers pass multipliers back unchanged. Attributions
    are ``(x - baseline) * multipliers``; they sum exactly to ``f(x) -
    f(baseline)``. Inputs and baselines run in the same batch (first half,
    second half) so the custom ReLU gradient sees both.

    Supported layers (others raise ``ValueError`` before anything runs):
    see :func:`check_deeplift_support`. Ops written directly inside a
    subclassed model's ``call`` (e.g. ``tf.nn.relu``) cannot be seen and keep
    their ordinary gradient. Max pooling is not supported (use average
    pooling, or IntegratedGradients).

    Args:
        baseline: the reference: ``None``/``"zeros"`` (default), a number,
            ``"blur"`` or an array (one sample's shape, or the batch's).

    ``Explanation.extras["completeness_error"]`` is ``sum(attr) - (f(x) -
    f(baseline))`` per sample (Captum's convergence delta) and
    ``baseline_scores`` the scores at the baselines. Cost: one forward and
    one backward pass per input and per baseline (a batch of ``2 N``), plus
    one forward pass to resolve the targets.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
        >>> e = ks.DeepLIFT(m).explain(np.ones((2, 3)), 0)
        >>> e.attributions.shape, bool(np.all(np.abs(e.extras["completeness_error"]) < 1e-4))
        ((2, 3), True)
    """

    name = "deeplift"
    description = "DeepLIFT rescale rule for ReLU networks (Shrikumar et al. 2017); attributions sum to f(x) - f(baseline)."
    aliases = ("deep_lift",)

    def __init__(self, model: keras.Layer, *, baseline: Any = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.baseline = baseline

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline is reported by its shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.DeepLIFT(m, baseline=0.5).params()["baseline"]
            0.5
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        bypassed = self.engine.bypassed_layers if self.output == "logits" else []
        check_deeplift_support(self.model, bypassed)
        baselines = resolve_baselines(self.baseline, inputs)
        attributions = [np.zeros(a.shape, np.float32) for a in inputs.arrays]
        base_scores = np.zeros(inputs.batch_size, np.float32)
        for part, arrays in inputs.chunks(max(1, self.batch_size // 2)):
            m = len(arrays[0])
            owners = np.arange(part.start, part.stop)
            refs = [b[part] for b in baselines]
            stacked = [np.concatenate([x, r]) for x, r in zip(arrays, refs, strict=True)]
            result = self.engine.gradients(
                Inputs(inputs.model_arg(stacked)),
                row_targets(targets, resolved, np.concatenate([owners, owners])),
                rule="deeplift",
                batch_size=2 * m,
            )
            for k, grad in enumerate(result.input_grads):
                attributions[k][part] = grad[:m] * (arrays[k] - refs[k])
            base_scores[part] = result.scores[m:]
        total = sum(a.reshape(len(a), -1).astype(np.float64).sum(axis=1) for a in attributions)
        error = (total - (scores.astype(np.float64) - base_scores)).astype(np.float32)
        return self._result(
            inputs, attributions, scores, resolved, completeness_error=error, baseline_scores=base_scores
        )
