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

from dataclasses import fields
from typing import Any

import keras
import numpy as np

from kerascope.core import spatial
from kerascope.core.engine import GradientResult
from kerascope.core.inputs import Inputs
from kerascope.methods._second_order import hessian_vector_products
from kerascope.methods.cam import CAM, CamResult, channels_first, input_view
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

    # the weighting runs inside the second-order pass's own compiled function (see _device_map)

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
        return _result(hessian_vector_products(self.engine, inputs, targets, layer, batch_size=self.batch_size))

    def _device_map(self, inputs: Inputs, targets: Any, layer: keras.Layer) -> tuple[np.ndarray | None, CamResult]:
        """The map computed inside the second-order pass: only ``(N, *spatial)`` leaves it.

        As :meth:`CAM._device_map`, but on :func:`hessian_vector_products`' compiled function;
        a layer whose output does not lie on the input as it is gets the three arrays back
        and is weighed on the placed arrays (the map is then ``None``).
        """
        index = self.chosen_input(inputs)
        first = channels_first(layer)
        extent = spatial.input_extent(input_view(inputs.arrays[index], layer))
        rank = len(extent) + 2

        def reduce(a: Any, g: Any, hvp: Any) -> dict[str, Any]:
            if len(a.shape) != rank:
                return {"acts": a, "grads": g, "hvp": hvp}
            corrected = g - 0.5 * hvp
            if first:  # (N, C, *spatial): weighed channels-last
                a, corrected = keras.ops.moveaxis(a, 1, -1), keras.ops.moveaxis(corrected, 1, -1)
            return {"map": self.combine(a, corrected)}

        out = hessian_vector_products(
            self.engine, inputs, targets, layer, batch_size=self.batch_size,
            reduce=reduce, reduce_key=("cam", type(self), rank, first, self.weighting_key()),
        )
        if "map" in out:
            layout = spatial.Layout("image" if len(extent) == 2 else "sequence", index, extent)
            return out["map"], CamResult(scores=out["scores"], targets=out["targets"], layout=layout)
        raw = _result(out)
        return None, self._placed(inputs, layer, {f.name: getattr(raw, f.name) for f in fields(raw)})


def _result(out: dict[str, np.ndarray]) -> GradientResult:
    """The engine-style result of :func:`hessian_vector_products`: ``layer_grads`` holds ``g - H A / 2``."""
    return GradientResult(
        scores=out["scores"], targets=out["targets"], activations=[out["acts"]],
        layer_grads=[out["grads"] - np.float32(0.5) * out["hvp"]], reduced={"gradients": out["grads"], "hvp": out["hvp"]},
    )


__all__ = ["ShapleyCAM"]
