"""The CAM family: one shared routine, each variant overrides how maps are formed.

One pipeline for every CAM (:meth:`CAM._explain`): choose the layer, one engine
call gives its activations ``A`` (``(N, *spatial, C)``, channels last), the
gradients ``G`` of the target score there and the scores; :meth:`CAM.weigh` turns
them into the map before ReLU; ReLU; bilinear upsampling to the input's
resolution unless ``upsample=False``. A gradient variant overrides ONE function:
:meth:`CAM.channel_weights` (``(N, C)``, e.g. Grad-CAM's mean gradient) or, for
element-wise variants, :meth:`CAM.combine`. Perturbation variants (ScoreCAM,
AblationCAM) override :meth:`CAM.weigh` through
:class:`~kerascope.methods.cam_perturbation.PerturbationCAM`, which owns the
shared scoring loop over the perturbed variants.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.layers import find_layer, iter_layers
from kerascope.core.probe import probe
from kerascope.core.resize import upsample
from kerascope.methods.base import Method
from kerascope.methods.registry import register


def weighted_sum(activations: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sum_c w_c A_c``: ``(N, *spatial, C)`` activations weighted by ``(N, C)`` channel weights.

    Example:
        >>> import numpy as np
        >>> weighted_sum(np.ones((1, 2, 2, 3)), np.array([[1.0, 2.0, 3.0]])).tolist()
        [[[6.0, 6.0], [6.0, 6.0]]]
    """
    shape = (weights.shape[0],) + (1,) * (activations.ndim - 2) + (weights.shape[1],)
    return np.sum(activations * weights.reshape(shape), axis=-1)


def default_layer(model: keras.Layer, inputs: Inputs) -> keras.Layer:
    """The last layer called in the forward pass whose output is a spatial feature map.

    "Spatial" means rank 4 (images) or, for sequence models without any rank-4
    output, rank 3. Found with one probed forward pass on one sample, so it
    works for subclassed models too.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> default_layer(m, Inputs(np.zeros((1, 8, 8, 1)))).name
        'c'
    """
    candidates = [layer for _, layer in iter_layers(model)]
    order: list[tuple[keras.Layer, int]] = []

    def note(_: int, layer: keras.Layer, output: Any) -> Any:
        shape = getattr(output, "shape", None)
        if shape is not None:
            order.append((layer, len(shape)))
        return output

    first = [a[:1] for a in inputs.arrays]
    with probe(candidates, note):
        model(inputs.model_arg(first), training=False)
    for rank in (4, 3):
        found = [layer for layer, r in order if r == rank]
        if found:
            return found[-1]
    raise ValueError(
        f"Could not find a layer with a spatial output (rank 4 or 3) in model {model.name!r}. "
        "Received: layer=None. Pass `layer=` with the path of a convolutional layer "
        "(see `kerascope.layers(model)`)."
    )


class CAM(Method):
    """Shared class-activation-map routine; subclasses define the weighting.

    Args:
        layer: path or layer object of the feature layer; default: the last
            layer with a spatial output (found with a probed forward pass).
        upsample: resize maps to the input's spatial size (bilinear).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> ks.GradCAM(m, layer="c", upsample=False).explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 6, 6)
    """

    def __init__(
        self, model: keras.Layer, *, layer: str | keras.Layer | None = None, upsample: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.layer = layer
        self.upsample = upsample
        if layer is not None:
            find_layer(model, layer)  # fail early on unknown names

    def params(self) -> dict[str, Any]:
        """Hyper-parameters, with the layer given by its path.

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m, layer="c").params()["layer"]
            'c'
        """
        params = super().params()
        if isinstance(self.layer, keras.Layer):
            params["layer"] = self.engine.path_of(self.layer)
        return params

    def resolved_params(self, inputs: Any = None) -> dict[str, Any]:
        """Hyper-parameters with ``layer`` resolved to the path used for ``inputs`` (default layer found).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m).resolved_params(np.zeros((1, 8, 8, 1)))["layer"]
            'c'
        """
        params = self.params()
        if inputs is not None:
            prepared = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
            params["layer"] = self.engine.path_of(self.resolve_layer(prepared))
        return params

    def resolve_layer(self, inputs: Inputs) -> keras.Layer:
        """The feature layer used for ``inputs`` (explicit, or the default one).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m).resolve_layer(Inputs(np.zeros((1, 8, 8, 1)))).name
            'c'
        """
        if self.layer is None:
            signature = ("default_layer", tuple((shape[1:], dtype) for shape, dtype in inputs.specs))
            return self.engine.memo(signature, lambda: default_layer(self.model, inputs))
        return self.engine.resolve_layers([self.layer])[0]

    # --- what variants override -------------------------------------------
    def channel_weights(self, activations: np.ndarray, gradients: np.ndarray) -> np.ndarray:
        """``(N, C)`` channel weights; Grad-CAM: the spatial mean of the gradients.

        Example:
            >>> import numpy as np
            >>> CAM.channel_weights(None, np.ones((1, 2, 2, 3)), np.ones((1, 2, 2, 3))).shape
            (1, 3)
        """
        return gradients.mean(axis=tuple(range(1, gradients.ndim - 1)))

    def combine(self, activations: np.ndarray, gradients: np.ndarray) -> np.ndarray:
        """Map before ReLU, ``(N, *spatial)``: ``sum_c w_c A_c`` by default.

        Example:
            >>> import numpy as np
            >>> cam = GradCAM.__new__(GradCAM)
            >>> cam.combine(np.ones((1, 2, 2, 3)), np.ones((1, 2, 2, 3))).shape
            (1, 2, 2)
        """
        return weighted_sum(activations, self.channel_weights(activations, gradients))

    def weigh(
        self, inputs: Inputs, targets: Any, layer: keras.Layer, result: Any, activations: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The map before ReLU ``(N, *spatial)`` and extra arrays for the Explanation.

        Gradient CAMs: :meth:`combine` of the activations and the layer gradients
        in ``result``. Perturbation CAMs override this step (their weights come
        from scoring perturbed variants).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> cam, x = ks.GradCAM(m), Inputs(np.ones((1, 4, 4, 1)))
            >>> layer, result, a = cam.spatial_data(x, 0)
            >>> cam.weigh(x, 0, layer, result, a)[0].shape
            (1, 2, 2)
        """
        return self.combine(activations, np.asarray(result.layer_grads[0], np.float32)), {}

    # --- shared routine -----------------------------------------------------
    def layer_data(self, inputs: Inputs, targets: Any, layer: keras.Layer) -> Any:
        """Activations and gradients at ``layer`` for the targets (one engine call).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> r = ks.GradCAM(m).layer_data(Inputs(np.ones((1, 4, 4, 1))), 0, m.layers[0])
            >>> r.activations[0].shape
            (1, 2, 2, 2)
        """
        return self.engine.gradients(
            inputs, targets, layers=[layer], wrt_inputs=False,
            batch_size=self.batch_size, progress=self.progress,
        )

    def spatial_data(self, inputs: Inputs, targets: Any) -> tuple[keras.Layer, Any, np.ndarray]:
        """The feature layer, the engine result there, and its activations as float32 ``(N, *spatial, C)``.

        Raises a clear error when the layer's output is not spatial.

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> ks.GradCAM(m).spatial_data(Inputs(np.ones((1, 4, 4, 1))), 0)[2].shape
            (1, 2, 2, 2)
        """
        layer = self.resolve_layer(inputs)
        result = self.layer_data(inputs, targets, layer)
        activations = np.asarray(result.activations[0], np.float32)
        if activations.ndim < 3:
            raise ValueError(
                f"CAM methods need a layer with spatial output (N, h, w, C) or (N, t, C). Received: "
                f"layer={self.engine.path_of(layer)!r} with output shape {activations.shape}. "
                "Pick a convolutional layer (see `kerascope.layers(model)`)."
            )
        return layer, result, activations

    def maps(self, inputs: Inputs, targets: Any) -> tuple[np.ndarray, Any, keras.Layer]:
        """Raw (post-ReLU, not upsampled) maps, the engine result and the layer.

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> ks.GradCAM(m).maps(Inputs(np.ones((1, 4, 4, 1))), 0)[0].shape
            (1, 2, 2)
        """
        cams, result, layer, _ = self._maps(inputs, targets)
        return cams, result, layer

    def _maps(self, inputs: Inputs, targets: Any) -> tuple[np.ndarray, Any, keras.Layer, dict[str, np.ndarray]]:
        layer, result, activations = self.spatial_data(inputs, targets)
        before_relu, extras = self.weigh(inputs, targets, layer, result, activations)
        return np.maximum(before_relu, 0.0).astype(np.float32), result, layer, extras

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        cams, result, layer, extras = self._maps(inputs, targets)
        if self.upsample:
            cams = upsample(cams, inputs.arrays[0].shape[1:-1])
        return self._result(
            inputs, [cams], result.scores, result.targets, layer=self.engine.path_of(layer), **extras
        )


@register
class GradCAM(CAM):
    """Grad-CAM (Selvaraju et al., 2017): channels weighted by their mean gradient.

    ``ReLU(sum_c mean_ij(dS/dA_ijc) * A_c)``. One forward and one backward pass.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> ks.GradCAM(m).explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 8, 8)
    """

    name = "gradcam"
    description = "Feature maps weighted by their spatially averaged gradients (Selvaraju et al. 2017)."
    aliases = ("grad_cam",)


@register
class GuidedGradCAM(CAM):
    """Guided Grad-CAM (Selvaraju et al., 2017): guided backprop x upsampled Grad-CAM.

    Returns the input's shape: each channel of the guided-backprop gradient
    multiplied by the Grad-CAM map at input resolution.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, activation="relu", name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> ks.GuidedGradCAM(m).explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 8, 8, 1)
    """

    name = "guided_gradcam"
    description = "Guided backprop multiplied by the upsampled Grad-CAM map (Selvaraju et al. 2017)."
    aliases = ("guided_grad_cam",)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        cams, result, layer = self.maps(inputs, targets)
        cams = upsample(cams, inputs.arrays[0].shape[1:-1])
        guided = self.engine.gradients(
            inputs, result.targets, rule="guided", batch_size=self.batch_size, progress=self.progress
        )
        attributions = guided.input_grads[0] * cams[..., None]
        return self._result(
            inputs, [attributions], result.scores, result.targets, layer=self.engine.path_of(layer)
        )
