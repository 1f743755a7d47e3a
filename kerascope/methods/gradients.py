"""Plain gradient methods: Saliency, Gradient x Input, Guided Backprop."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.methods import _layer
from kerascope.methods._input_choice import gradient_inputs
from kerascope.methods.base import Method, check_flag
from kerascope.methods.registry import register


class LayerMethod(Method):
    """A gradient method that can attribute at a layer's output (``layer=``) instead of the inputs.

    With ``layer=`` (a path such as ``"embedding"`` or ``"block3_conv"``) the
    attributions have the layer's output shape and explain the target in
    terms of that activation; :meth:`Explanation.per_position` sums them over
    the last (embedding / channel) axis, e.g. one value per token ``(N, T)``.
    Subclasses implement :meth:`_explain_at`.

    ``input_index=`` (multi-input models; a position, an input name or a list of
    them) chooses the input(s) attributed; the others are held at their values.
    Default: the only image-like input, else the only float input, else an
    error asking to choose (see :func:`kerascope.methods._input_choice.gradient_inputs`).
    Attributions are one array for one chosen input, else a list in that order
    (all inputs: the inputs' own structure); ``extras["input_index"]`` lists them.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="h"), keras.layers.Dense(2)])
        >>> ks.Saliency(m, layer="h").explain(np.ones((1, 3)), 0).attributions.shape
        (1, 4)
    """

    #: ``layer=`` here means "attribute at this layer" (not a CAM feature-map layer).
    layer_attribution: bool = True

    def __init__(self, model: keras.Layer, *, layer: Any = None, input_index: Any = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._layer = None
        self.layer = None
        if layer is not None:
            self._layer, self.layer = _layer.resolve(self.engine, layer)
            if input_index is not None:
                raise ValueError(
                    "`input_index=` chooses the model input to attribute; with `layer=` the attributions are "
                    f"at that layer's output. Received: layer={layer!r}, input_index={input_index!r}. "
                    "Pass one of them."
                )
        self.input_index = input_index

    def attributed_inputs(self, inputs: Inputs) -> list[int]:
        """The positions of the model inputs this method attributes for ``inputs`` (see ``input_index``).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> t, img = keras.Input((3,), name="tab"), keras.Input((4, 4, 1), name="img")
            >>> m = keras.Model([t, img], keras.layers.Concatenate()([t, keras.layers.Flatten()(img)]))
            >>> ks.Saliency(m).attributed_inputs(Inputs([np.zeros((1, 3)), np.zeros((1, 4, 4, 1))]))
            [1]
        """
        return gradient_inputs(self.model, inputs, self.input_index)

    def _explain_at(self, inputs: Inputs, values: np.ndarray | None, targets: Any) -> Explanation:
        """Explain with the layer's output replaced by ``values`` (``None``: its real output)."""
        raise NotImplementedError

    def _layer_result(
        self, inputs: Inputs, attributions: np.ndarray, scores: Any, targets: Any, **extras: Any
    ) -> Explanation:
        return Explanation(
            attributions=np.asarray(attributions, np.float32),
            method=self.name,
            params=self.params(),
            targets=np.asarray(targets),
            scores=None if scores is None else np.asarray(scores),
            layer=self.layer,
            extras={"attributed_at": "layer", **extras},
        )


@register
class Saliency(LayerMethod):
    """Gradient of the target score w.r.t. the inputs (Simonyan et al., 2014).

    Signed by default; ``absolute=True`` returns ``|gradient|`` as in the
    paper's saliency map. One forward and one backward pass per sample.
    ``layer=`` differentiates w.r.t. that layer's output instead (attributions
    of the layer's shape, see :class:`LayerMethod`; e.g. ``layer="embedding"``
    for token inputs).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[2.0], [-3.0]])])
        >>> ks.Saliency(m).explain(np.ones((1, 2)), 0).attributions.tolist()
        [[2.0, -3.0]]
    """

    name = "saliency"
    description = "Gradient of the target score w.r.t. the input (Simonyan et al. 2014)."
    aliases = ("vanilla_gradients", "gradients")
    rule: str | None = None

    def __init__(self, model: keras.Layer, *, absolute: bool = False, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        check_flag(absolute, "absolute")
        self.absolute = absolute

    def _explain_at(self, inputs: Inputs, values: np.ndarray | None, targets: Any) -> Explanation:
        result = self.engine.gradients(
            inputs, targets, layers=[self._layer], wrt_inputs=False, rule=self.rule,
            replace=() if values is None else [values], batch_size=self.batch_size, progress=self.progress,
        )
        acts = _layer.check_output(result.activations[0], self.layer)
        grads = np.asarray(result.layer_grads[0], np.float32)
        return self._layer_result(inputs, self._combine(grads, acts), result.scores, result.targets)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        if self._layer is not None:
            return self._explain_at(inputs, None, targets)
        wrt = self.attributed_inputs(inputs)
        result = self.engine.gradients(
            inputs, targets, wrt_inputs=wrt, rule=self.rule, batch_size=self.batch_size, progress=self.progress
        )
        grads = [self._combine(g, inputs.arrays[i]) for g, i in zip(result.input_grads, wrt, strict=True)]
        return self._input_result(inputs, wrt, grads, result.scores, result.targets)

    def _combine(self, grad: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.abs(grad) if self.absolute else grad


@register
class GradientXInput(Saliency):
    """Element-wise product of the input and its gradient (Shrikumar et al., 2016).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[2.0], [-3.0]])])
        >>> ks.GradientXInput(m).explain(np.array([[1.0, 2.0]]), 0).attributions.tolist()
        [[2.0, -6.0]]
    """

    name = "gradient_x_input"
    description = "Input times its gradient (Shrikumar et al. 2016); for linear models the exact contribution."
    aliases = ("gradientxinput", "input_x_gradient", "inputxgradient")

    def _combine(self, grad: np.ndarray, x: np.ndarray) -> np.ndarray:
        product = grad * x
        return np.abs(product) if self.absolute else product


@register
class GuidedBackprop(Saliency):
    """Guided backpropagation (Springenberg et al., 2015).

    Every ReLU (``activation="relu"``/``"relu6"``, ``Activation("relu")`` or a
    ``ReLU`` layer) passes back only positive gradients, and only where its
    input was positive. The model is not changed: the rule is swapped in for
    the duration of the compiled call. ReLUs written as ``tf.nn.relu`` inside a
    subclassed ``call`` cannot be reached and keep their normal gradient.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
        >>> ks.GuidedBackprop(m).explain(np.ones((1, 3)), 0).attributions.shape
        (1, 3)
    """

    name = "guided_backprop"
    description = "Gradient with positive-only ReLU backward passes (Springenberg et al. 2015)."
    aliases = ("guidedbackprop", "guided_backpropagation")
    rule = "guided"


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
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="relu", use_bias=False),
        ...                       keras.layers.Dense(1, use_bias=False)])
        >>> m.set_weights([-np.eye(2), np.ones((2, 1))])  # every ReLU is off at x = 1: the gradient is 0
        >>> ks.Deconvnet(m).explain(np.ones((1, 2)), 0).attributions.tolist()  # relu(dy) passes anyway
        [[-1.0, -1.0]]
    """

    name = "deconvnet"
    description = "Gradient with ReLUs passing back only positive gradients (Zeiler & Fergus 2014)."
    aliases = ("deconvolution", "deconv")
    rule = "deconvnet"
