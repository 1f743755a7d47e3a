"""ShapleyCAM (Cai, 2024): CAM channel weights from the gradient and a second-order (Hessian-vector) term.

Reading a CAM as a Shapley value of the channels, Cai derives the weight of
channel ``c`` from a second-order Taylor expansion of the score around the
activations ``A``: ``w_c = mean_ij(g - H A / 2)_ijc`` where ``g = dS/dA`` and
``H A`` the Hessian of the score w.r.t. ``A`` times ``A``. pytorch-grad-cam
1.5.7's ``ShapleyCAM`` computes the same weights (its ``get_cam_weights``). The
Hessian-vector product comes from
:func:`~kerascope.methods._second_order.hessian_vector_products` (compiled, per
chunk: one forward pass, two backward passes).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.engine import GradientResult
from kerascope.core.inputs import Inputs
from kerascope.methods._second_order import hessian_vector_products
from kerascope.methods.cam import CAM
from kerascope.methods.registry import register


@register
class ShapleyCAM(CAM):
    """ShapleyCAM (Cai, 2024): channels weighted by the mean of ``g - H A / 2`` (gradient and Hessian-vector product).

    ``ReLU(sum_c mean_ij(g - H A / 2)_ijc * A_c)`` with ``g`` the gradient of the target
    score at the layer and ``H A`` its Hessian there applied to the activations: Grad-CAM
    with a second-order correction (zero when everything after the layer is piecewise
    linear, e.g. ReLU convolutions and dense layers, where ShapleyCAM equals Grad-CAM).
    As pytorch-grad-cam 1.5.7's ``ShapleyCAM``.

    Cost: one forward pass and two backward passes from the layer to the output per
    chunk (the second differentiates the first), plus no pass below the layer.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Activation("tanh"), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.ShapleyCAM(m, layer="c").explain(np.random.rand(1, 8, 8, 1), 0).attributions.shape
        (1, 8, 8)
    """

    name = "shapleycam"
    description = "Channels weighted by gradient minus half the Hessian-vector product, second order (Cai 2024)."
    aliases = ("shapley_cam",)

    on_device = False  # the second-order pass is its own compiled function (see layer_data)

    def layer_data(self, inputs: Inputs, targets: Any, layer: keras.Layer) -> GradientResult:
        """Activations and the corrected gradients ``g - H A / 2`` at ``layer``: one compiled pass per chunk.

        Grad-CAM's weighting (the spatial mean, :meth:`CAM.channel_weights`) of these gives
        ShapleyCAM's weights; ``reduced`` keeps ``g`` (``"gradients"``) and ``H A`` (``"hvp"``).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> r = ks.ShapleyCAM(m).layer_data(Inputs(np.ones((1, 4, 4, 1))), 0, m.layers[0])
            >>> r.activations[0].shape, r.reduced["hvp"].shape
            ((1, 2, 2, 2), (1, 2, 2, 2))
        """
        out = hessian_vector_products(self.engine, inputs, targets, layer, batch_size=self.batch_size)
        return GradientResult(
            scores=out["scores"], targets=out["targets"], activations=[out["acts"]],
            layer_grads=[out["grads"] - np.float32(0.5) * out["hvp"]], reduced={"gradients": out["grads"], "hvp": out["hvp"]},
        )


__all__ = ["ShapleyCAM"]
