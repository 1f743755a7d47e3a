"""The CAM family: one shared routine, each variant overrides how maps are formed.

One pipeline for every CAM (:meth:`CAM._explain`): choose the layer, one engine
call gives its activations ``A`` (``(N, *spatial, C)``, channels last), the
gradients ``G`` of the target score there and the scores; :meth:`CAM.weigh` turns
them into the map before ReLU; ReLU; bilinear upsampling to the input's
resolution unless ``upsample=False``. A gradient variant overrides ONE function:
:meth:`CAM.channel_weights` (``(N, C)``, e.g. Grad-CAM's mean gradient) or, for
element-wise variants, :meth:`CAM.combine`. Both are written with ``keras.ops``:
on an image or sequence layer they run inside the engine's compiled function
(``Engine.gradients(reduce=...)``), so only the ``(N, *spatial)`` map leaves the
device; on token layers (placed on a grid first) and with ``reshape=`` they run
eagerly on the placed arrays. Perturbation variants (ScoreCAM,
AblationCAM) override :meth:`CAM.weigh` through
:class:`~kerascope.methods.cam_perturbation.PerturbationCAM`, which owns the
shared scoring loop over the perturbed variants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import keras
import numpy as np
from keras import ops

from kerascope.core import spatial
from kerascope.core import targets as targets_lib
from kerascope.core.engine import GradientResult
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.layers import find_layer
from kerascope.methods._input_choice import refuse_integer_input
from kerascope.methods.base import Method, check_flag
from kerascope.methods.registry import register
from kerascope.numeric.chunking import chunk_bounds


def weighted_sum(activations: Any, weights: Any) -> Any:
    """``sum_c w_c A_c``: ``(N, *spatial, C)`` activations weighted by ``(N, C)`` channel weights.

    ``keras.ops``: works on numpy arrays and on backend tensors (inside a compiled function).

    Example:
        >>> import numpy as np
        >>> np.asarray(weighted_sum(np.ones((1, 2, 2, 3)), np.array([[1.0, 2.0, 3.0]]))).tolist()
        [[[6.0, 6.0], [6.0, 6.0]]]
    """
    activations = ops.convert_to_tensor(activations)
    rank = len(activations.shape)
    weights = ops.reshape(ops.cast(weights, activations.dtype), (-1,) + (1,) * (rank - 2) + (weights.shape[-1],))
    return ops.sum(ops.multiply(activations, weights), axis=-1)


def spatial_axes(array: Any) -> tuple[int, ...]:
    """The position axes of a channels-last ``(N, *spatial, C)`` array or tensor.

    Example:
        >>> import numpy as np
        >>> spatial_axes(np.zeros((1, 4, 4, 3)))
        (1, 2)
    """
    return tuple(range(1, len(array.shape) - 1))


def channels_first(layer: keras.Layer) -> bool:
    """Whether ``layer`` outputs ``(N, C, *spatial)`` (``data_format="channels_first"``).

    Example:
        >>> import keras
        >>> channels_first(keras.layers.Conv2D(2, 3, data_format="channels_first")), channels_first(keras.layers.Dense(2))
        (True, False)
    """
    return getattr(layer, "data_format", None) == "channels_first"


def input_view(array: np.ndarray, layer: keras.Layer, rank: int | None = None) -> np.ndarray:
    """The input as a channels-last view when ``layer`` is channels-first (a model in ``channels_first``
    takes ``(N, C, *spatial)`` inputs; its maps cover ``spatial``); ``rank``: the layer output's, when known.

    Example:
        >>> import keras
        >>> input_view(np.zeros((1, 3, 8, 6)), keras.layers.Conv2D(2, 3, data_format="channels_first")).shape
        (1, 8, 6, 3)
    """
    if channels_first(layer) and array.ndim >= 3 and (rank is None or rank == array.ndim):
        return np.moveaxis(array, 1, -1)
    return array


def default_layer(model: keras.Layer, inputs: Inputs, input_index: int = 0) -> keras.Layer:
    """The default CAM layer (see :func:`kerascope.core.spatial.default_layer`).

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> default_layer(m, Inputs(np.zeros((1, 8, 8, 1)))).name
        'c'
    """
    return spatial.default_layer(model, inputs, input_index)


@dataclass
class CamResult(GradientResult):
    """The engine result of a CAM's clean pass, with the layer gradients placed on the input's positions
    (``(N, *positions, C)``, like the activations CAMs receive) and the :class:`~kerascope.core.spatial.Layout`.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> _, result, _ = ks.GradCAM(m).spatial_data(Inputs(np.ones((1, 4, 4, 1))), 0)
        >>> result.layout.kind, result.layer_grads[0].shape
        ('image', (1, 2, 2, 2))
    """

    layout: spatial.Layout | None = None


class CAM(Method):
    """Shared class-activation-map routine; subclasses define the weighting.

    Args:
        layer: path or layer object of the feature layer. Default: the last
            layer whose output keeps an extent > 1 along every spatial (or
            temporal) axis, depends on the chosen input and feeds the
            prediction (see :func:`kerascope.core.spatial.default_layer`);
            ``Explanation.layer`` names it.
        upsample: resize maps to the input's extent (bilinear for images,
            linear along time for sequences); ``False`` keeps the layer's grid.
        input_index: the input the maps are for (a position or an input
            name); default: the only input, else the only image input.
        reshape: ``(N, T, C) -> (N, h, w, C)`` (numpy, channels last) placing a
            token layer's output on a grid, like pytorch-grad-cam's
            ``reshape_transform``; default: tokens are put on the patch grid
            automatically (a leading class token is dropped), see
            :func:`kerascope.core.spatial.token_grid`.

    A layer ``(N, h, w, C)`` of an image gives ``(N, H, W)`` maps; ``(N, t, C)``
    of a sequence input (token ids ``(N, T)`` or features ``(N, T, F)``) gives
    ``(N, T)`` maps; the tokens ``(N, T, C)`` of a vision transformer give
    ``(N, H, W)`` maps.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> ks.GradCAM(m, layer="c", upsample=False).explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 6, 6)
    """

    #: whether :meth:`combine` can run inside the compiled function (``keras.ops`` only, no numpy)
    on_device: ClassVar[bool] = True

    def __init__(
        self,
        model: keras.Layer,
        *,
        layer: str | keras.Layer | None = None,
        upsample: bool = True,
        input_index: int | str | None = None,
        reshape: Callable[[np.ndarray], np.ndarray] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        check_flag(upsample, "upsample")
        self.layer = layer
        self.upsample = upsample
        self.input_index = input_index
        self.reshape = reshape
        if layer is not None:
            find_layer(model, layer)  # fail early on unknown names
        if reshape is not None and not callable(reshape):
            raise TypeError(
                "`reshape` must be a function (N, T, C) -> (N, h, w, C). "
                f"Received: reshape={reshape!r} of type {type(reshape).__name__}."
            )

    def _reads_layer(self) -> bool:
        return True  # the default layer too: `call_index` applies to it

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

    def chosen_input(self, inputs: Inputs) -> int:
        """The position of the input the maps are for (see :func:`kerascope.core.spatial.choose_input`).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m).chosen_input(Inputs(np.zeros((1, 8, 8, 1))))
            0
        """
        return spatial.choose_input(self.model, inputs, self.input_index)

    def _signature(self, inputs: Inputs) -> tuple:
        return inputs.signature

    def resolve_layer(self, inputs: Inputs) -> keras.Layer:
        """The feature layer used for ``inputs`` (explicit, or the default one).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m).resolve_layer(Inputs(np.zeros((1, 8, 8, 1)))).name
            'c'
        """
        if self.layer is None:
            self.engine.check_inputs(inputs)  # before the probed pass that finds the layer
            index = self.chosen_input(inputs)
            signature = ("default_layer", self._signature(inputs), index)
            return self.engine.memo(signature, lambda: spatial.default_layer(
                self.model, inputs, index, select=self._selector()))
        return self.engine.resolve_layers([self.layer])[0]

    def _selector(self) -> Callable[[Any], Any] | None:
        engine = self.engine
        if self.output_index is None or callable(self.output_index):
            return None
        return engine.select

    def layout(self, inputs: Inputs, layer: keras.Layer, shape: tuple[int, ...]) -> spatial.Layout:
        """How ``layer``'s output of ``shape`` lies on the chosen input (image grid, sequence, tokens).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m).layout(Inputs(np.zeros((1, 8, 8, 1))), m.layers[0], (1, 6, 6, 2)).kind
            'image'
        """
        index = self.chosen_input(inputs)
        array = input_view(inputs.arrays[index], layer, len(shape))
        grids: list[tuple[int, int]] = []
        if self.reshape is None and len(shape) == 3 and array.ndim == 4:  # tokens: the patch grid seen before
            key = ("seen_grids", self._signature(inputs), id(layer))
            grids = self.engine.memo(key, lambda: spatial.seen_grids(spatial.survey(self.model, inputs), layer))
        return spatial.layout_for(
            tuple(shape), array, index, reshape=self.reshape, seen_grids=grids,
            layer_name=self.engine.path_of(layer),
        )

    # --- what variants override -------------------------------------------
    def channel_weights(self, activations: Any, gradients: Any) -> Any:
        """``(N, C)`` channel weights; Grad-CAM: the spatial mean of the gradients.

        Written with ``keras.ops`` (float32 tensors inside the compiled function, or numpy).

        Example:
            >>> import numpy as np
            >>> tuple(CAM.channel_weights(None, np.ones((1, 2, 2, 3)), np.ones((1, 2, 2, 3))).shape)
            (1, 3)
        """
        return ops.mean(gradients, axis=spatial_axes(gradients))

    def combine(self, activations: Any, gradients: Any) -> Any:
        """Map before ReLU, ``(N, *spatial)``: ``sum_c w_c A_c`` by default (``keras.ops``).

        Example:
            >>> import numpy as np
            >>> cam = GradCAM.__new__(GradCAM)
            >>> tuple(cam.combine(np.ones((1, 2, 2, 3)), np.ones((1, 2, 2, 3))).shape)
            (1, 2, 2)
        """
        return weighted_sum(activations, self.channel_weights(activations, gradients))

    def weighting_key(self) -> tuple:
        """Hashable values of the instance parameters that :meth:`combine` reads (default: none).

        With the class, it identifies the compiled function that computes the map on the
        device: two instances with equal keys share it. A variant whose weighting reads an
        instance parameter returns it here.

        Example:
            >>> GradCAM.weighting_key(None)
            ()
        """
        return ()

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
        # the same keras.ops weighting as inside the compiled function, eagerly, on backend tensors
        gradients = ops.convert_to_tensor(np.asarray(result.layer_grads[0], np.float32))
        return np.asarray(self.combine(ops.convert_to_tensor(activations), gradients), np.float32), {}

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

    def spatial_data(self, inputs: Inputs, targets: Any) -> tuple[keras.Layer, CamResult, np.ndarray]:
        """The feature layer, the engine result there and its activations, on the input's positions.

        Activations (and the result's layer gradients) are float32 ``(N, *positions, C)``:
        ``(N, h, w, C)`` on an image (transformer tokens put on their patch grid) or
        ``(N, t, C)`` on a sequence; ``result.layout`` says how they lie on the input.
        Raises a clear error when the layer's output cannot be placed on the chosen input.

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
            >>> ks.GradCAM(m).spatial_data(Inputs(np.ones((1, 4, 4, 1))), 0)[2].shape
            (1, 2, 2, 2)
        """
        layer = self.resolve_layer(inputs)
        raw = self.layer_data(inputs, targets, layer)
        result = self._placed(inputs, layer, {f.name: getattr(raw, f.name) for f in fields(GradientResult)})
        return layer, result, result.activations[0]

    def _placed(self, inputs: Inputs, layer: keras.Layer, values: dict[str, Any]) -> CamResult:
        """A :class:`CamResult` from an engine result's fields, activations and gradients placed on the input."""
        activations = np.asarray(values["activations"][0], np.float32)
        gradients = np.asarray(values["layer_grads"][0], np.float32)
        if channels_first(layer) and activations.ndim >= 3:  # (N, C, *spatial) -> (N, *spatial, C)
            activations, gradients = np.moveaxis(activations, 1, -1), np.moveaxis(gradients, 1, -1)
        layout = self.layout(inputs, layer, activations.shape)
        activations = np.asarray(layout.to_positions(activations), np.float32)
        gradients = np.asarray(layout.to_positions(gradients), np.float32)
        values.update(activations=[activations], layer_grads=[gradients])
        return CamResult(**values, layout=layout)

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
        if self.on_device and self.reshape is None and type(self).weigh is CAM.weigh:
            layer = self.resolve_layer(inputs)
            before_relu, result = self._device_map(inputs, targets, layer)
            if before_relu is not None:
                return np.maximum(before_relu, 0.0).astype(np.float32), result, layer, {}
            activations = np.asarray(result.activations[0], np.float32)  # tokens: placed on their grid here
        else:
            layer, result, activations = self.spatial_data(inputs, targets)
        before_relu, extras = self.weigh(inputs, targets, layer, result, activations)
        return np.maximum(before_relu, 0.0).astype(np.float32), result, layer, extras

    def _device_map(self, inputs: Inputs, targets: Any, layer: keras.Layer) -> tuple[np.ndarray | None, CamResult]:
        """:meth:`combine` inside the engine's compiled function: ``(map before ReLU, result)``.

        When the layer's output lies on the input as it is (``(N, h, w, C)`` on an image,
        ``(N, t, C)`` on a sequence), only the map leaves the compiled function. Otherwise
        (tokens to place on a grid, a structured output, a rank that fits no layout) it hands
        back the activations and gradients, and the map is ``None``: the caller weighs them
        on the placed arrays (the result is then :meth:`spatial_data`'s).
        """
        index = self.chosen_input(inputs)
        first = channels_first(layer)
        extent = spatial.input_extent(input_view(inputs.arrays[index], layer))
        rank = len(extent) + 2  # (N, h, w, C) on an image, (N, t, C) on a sequence


        def reduce(acts: list[Any], grads: list[Any]) -> dict[str, Any]:
            a, g = acts[0], grads[0]
            if keras.tree.is_nested(a) or len(a.shape) != rank:
                return {"acts": a, "grads": g}
            if first:  # (N, C, *spatial): weighed channels-last, as the same layer in channels_last
                a, g = keras.ops.moveaxis(a, 1, -1), keras.ops.moveaxis(g, 1, -1)
            return {"map": self.combine(a, g)}

        raw = self.engine.gradients(
            inputs, targets, layers=[layer], wrt_inputs=False, batch_size=self.batch_size, progress=self.progress,
            reduce=reduce, reduce_key=("cam", type(self), rank, self.weighting_key()),
        )
        values = {f.name: getattr(raw, f.name) for f in fields(GradientResult)}
        if "map" in raw.reduced:
            kind = "image" if len(extent) == 2 else "sequence"
            layout = spatial.Layout(kind, index, extent)
            return np.asarray(raw.reduced["map"], np.float32), CamResult(**values, layout=layout)
        values.update(activations=[raw.reduced["acts"]], layer_grads=[raw.reduced["grads"]], reduced=None)
        return None, self._placed(inputs, layer, values)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        # `batch_size` samples at a time: the layer's activations and gradients (far larger than
        # the maps) are never held for all N samples, so peak memory is bounded by batch_size
        targets_lib.encode(targets, inputs.num_samples)  # per-sample targets checked once, up front
        parts = []
        n = inputs.num_samples
        # one chunk: no outer loop, so the progress bar follows the inner loop (e.g. ScoreCAM's variants)
        bounds = chunk_bounds(n, self.batch_size) if n > self.batch_size else [(0, n)]
        for start, stop in bounds:
            part = slice(start, stop)
            parts.append(self._explain_chunk(inputs.subset(part), targets_lib.subset(targets, inputs.num_samples, part)))
        layer = parts[0][3]
        extras = {
            key: np.concatenate([p[4][key] for p in parts]) if _per_sample(value, parts[0][0]) else value
            for key, value in parts[0][4].items()
        }
        return self._result(
            inputs, [np.concatenate([p[0] for p in parts])], np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), layer=layer, **extras,
        )

    def _explain_chunk(
        self, inputs: Inputs, targets: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, dict[str, Any]]:
        """``(maps, scores, targets, layer path, extras)`` for one chunk of samples."""
        cams, result, layer, extras = self._maps(inputs, targets)
        if self.upsample:
            cams = result.layout.upsample(cams)
        return cams, result.scores, result.targets, self.engine.path_of(layer), extras


def _per_sample(value: Any, maps: np.ndarray) -> bool:
    return isinstance(value, np.ndarray) and value.ndim >= 1 and len(value) == len(maps)


def refuse_token_ids(inputs: Inputs, index: int, method: str, why: str) -> None:
    """Raise a clear error when input ``index`` holds integer ids (no pixel or value to mask or differentiate).

    Example:
        >>> import numpy as np
        >>> refuse_token_ids(Inputs(np.zeros((1, 4), "float32")), 0, "ScoreCAM", "it masks the input")
    """
    refuse_integer_input(
        inputs, index, f"{method} does not apply to integer inputs (token ids): {why}",
        "Use GradCAM (or another gradient CAM) on the sequence layer, or AblationCAM, which zeroes the "
        "layer's channels instead of changing the input.",
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
    progress_passes = 2  # the CAM, then guided backpropagation: one progress bar through both

    def _explain_chunk(
        self, inputs: Inputs, targets: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, dict[str, Any]]:
        index = self.chosen_input(inputs)
        refuse_token_ids(inputs, index, "GuidedGradCAM", "guided backpropagation differentiates the input")
        cams, result, layer = self.maps(inputs, targets)
        cams = result.layout.upsample(cams)
        guided = self.engine.gradients(  # only the chosen input: others (e.g. token ids) need no gradient
            inputs, targets if callable(targets) else result.targets, wrt_inputs=[index], rule="guided",
            batch_size=self.batch_size,
            progress=self.progress,
        )
        grads = np.asarray(guided.input_grads[0])
        attributions = grads * cams.reshape(cams.shape + (1,) * (grads.ndim - cams.ndim))
        return attributions, result.scores, result.targets, self.engine.path_of(layer), {}
