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
from kerascope.methods.cam import CAM, channels_first, spatial_axes, weighted_sum
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

    def layer_data(self, inputs: Inputs, targets: Any, layer: keras.Layer) -> GradientResult:
        """Activations, gradients and (in ``reduced["hvp"]``) ``H A`` at ``layer``: one compiled pass per chunk.

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
            scores=out["scores"], targets=out["targets"], activations=[out["acts"]], layer_grads=[out["grads"]],
            reduced={"hvp": out["hvp"]},
        )

    def weigh(
        self, inputs: Inputs, targets: Any, layer: keras.Layer, result: Any, activations: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``sum_c w_c A_c`` with ``w = mean over positions of (g - H A / 2)``, ``(N, *positions)``.

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> cam, x = ks.ShapleyCAM(m), Inputs(np.ones((1, 4, 4, 1)))
            >>> layer, result, a = cam.spatial_data(x, 0)
            >>> cam.weigh(x, 0, layer, result, a)[0].shape
            (1, 2, 2)
        """
        hvp = np.asarray(result.reduced["hvp"], np.float32)
        if channels_first(layer) and hvp.ndim >= 3:
            hvp = np.moveaxis(hvp, 1, -1)
        hvp = np.asarray(result.layout.to_positions(hvp), np.float32)
        gradients = np.asarray(result.layer_grads[0], np.float32)
        weights = np.mean(gradients - 0.5 * hvp, axis=spatial_axes(gradients))
        return np.asarray(weighted_sum(activations, weights), np.float32), {}


__all__ = ["ShapleyCAM"]
