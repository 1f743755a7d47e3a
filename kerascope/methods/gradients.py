"""Plain gradient methods: Saliency, Gradient x Input, Guided Backprop."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.methods.base import Method
from kerascope.methods.registry import register


@register
class Saliency(Method):
    """Gradient of the target score w.r.t. the inputs (Simonyan et al., 2014).

    Signed by default; ``absolute=True`` returns ``|gradient|`` as in the
    paper's saliency map. One forward and one backward pass per sample.

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
        self.absolute = absolute

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        result = self.engine.gradients(
            inputs, targets, rule=self.rule, batch_size=self.batch_size, progress=self.progress
        )
        grads = [self._combine(g, x) for g, x in zip(result.input_grads, inputs.arrays)]
        return self._result(inputs, grads, result.scores, result.targets)

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
