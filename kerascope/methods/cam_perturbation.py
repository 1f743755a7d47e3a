"""Gradient-free CAM variants whose channel weights come from perturbed forward passes.

Both start like every CAM: one engine call on the clean inputs gives the
layer's activations ``A`` ``(N, *spatial, C)``, the resolved targets and the
clean scores. The ``N x C`` perturbed variants (one per sample and channel)
are then folded into the batch axis and scored ``batch_size`` rows at a time,
each chunk generated lazily (memory is bounded by ``batch_size``), with the
same targets as the clean pass and in the same output space (logits by
default). The map is ``ReLU(sum_c w_c A_c)``, upsampled like every CAM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
from keras import ops

from kerascope.core import targets as targets_lib
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.intervene import compile_scorer
from kerascope.core.progress import progress_bar
from kerascope.core.resize import upsample
from kerascope.methods.cam import CAM
from kerascope.methods.registry import register


def zero_channel(output: Any, channel: Any) -> Any:
    """Set channel ``channel[i]`` (last axis) of row ``i`` of ``output`` to zero; ``-1`` keeps the row.

    Written with ``keras.ops``; used as a probe transform inside a compiled
    forward pass (see :func:`kerascope.core.intervene.compile_scorer`).

    Example:
        >>> import numpy as np
        >>> out = zero_channel(np.ones((2, 1, 3), "float32"), np.array([1, -1], "int32"))
        >>> np.asarray(out)[:, 0].tolist()
        [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    """
    channels = output.shape[-1]
    keep = ops.not_equal(ops.arange(channels, dtype="int32")[None, :], ops.expand_dims(channel, -1))
    keep = ops.reshape(ops.cast(keep, output.dtype), (-1,) + (1,) * (len(output.shape) - 2) + (channels,))
    return output * keep


def _rows(count: int, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, count, batch_size):
        yield np.arange(start, min(start + batch_size, count))


class PerturbationCAM(CAM):
    """CAM whose channel weights come from scoring ``N x C`` perturbed variants in batches.

    Subclasses implement :meth:`variant_weights`; the rest (layer choice,
    clean pass, ``ReLU(sum_c w_c A_c)``, upsampling) is the shared CAM routine.

    Example:
        >>> issubclass(ScoreCAM, PerturbationCAM)
        True
    """

    def variant_weights(
        self, inputs: Inputs, targets: Any, result: Any, layer: keras.Layer, activations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(weights, variant_scores)``, both ``(N, C)``.

        Example:
            >>> PerturbationCAM.variant_weights.__name__
            'variant_weights'
        """
        raise NotImplementedError

    def _target_fn(self, targets: Any, n: int) -> Any:
        return targets_lib.encode(targets, n)[1]

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        layer, result, activations = self.spatial_data(inputs, targets)
        weights, variant_scores = self.variant_weights(inputs, targets, result, layer, activations)
        shape = (weights.shape[0],) + (1,) * (activations.ndim - 2) + (weights.shape[1],)
        cams = np.maximum(np.sum(activations * weights.reshape(shape), axis=-1), 0.0).astype(np.float32)
        if self.upsample:
            cams = upsample(cams, inputs.arrays[0].shape[1:-1])
        return self._result(
            inputs, [cams], result.scores, result.targets, layer=self.engine.path_of(layer),
            channel_weights=weights.astype(np.float32), variant_scores=variant_scores.astype(np.float32),
        )


@register
class ScoreCAM(PerturbationCAM):
    """Score-CAM (Wang et al., 2020): channels weighted by the score of the input they mask.

    Each channel ``A_c`` is upsampled (bilinear, half-pixel centres) to the
    input's size, min-max normalised to ``[0, 1]`` (``eps = 1e-8``) and
    multiplies the (first) input; ``s_c`` is the target score of that masked
    input in the engine's output space (logits by default) and
    ``w = softmax_c(s_c)``. This follows pytorch-grad-cam's ``ScoreCAM``
    (raw target score, softmax over channels); the authors' code instead
    uses the softmax *probability* of the class as the weight, without a
    baseline (pass ``output="probabilities"`` for scores in probability space;
    the softmax over channels is still applied). Cost: one forward and one
    backward pass on the clean inputs, then ``N x C`` forward passes in
    batches of ``batch_size``.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.ScoreCAM(m, layer="c").explain(np.random.rand(1, 8, 8, 1), 0).attributions.shape
        (1, 8, 8)
    """

    name = "scorecam"
    description = "Channels weighted by the softmax of the scores of the inputs they mask (Wang et al. 2020)."
    aliases = ("score_cam",)

    def variant_weights(
        self, inputs: Inputs, targets: Any, result: Any, layer: keras.Layer, activations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Softmax over channels of the masked inputs' scores, and the scores.

        Example:
            >>> ScoreCAM.variant_weights.__name__
            'variant_weights'
        """
        n, channels = activations.shape[0], activations.shape[-1]
        size = inputs.arrays[0].shape[1:-1]
        scorer = compile_scorer(self.engine, inputs, target_fn=self._target_fn(targets, n))
        resolved = np.asarray(result.targets, np.int32)
        scores = np.empty(n * channels, np.float32)
        for rows in progress_bar(
            list(_rows(n * channels, self.batch_size)), enabled=self.progress, desc="scorecam", unit="batch"
        ):
            sample, channel = rows // channels, rows % channels
            masks = upsample(activations[sample, ..., channel], size)
            flat = masks.reshape(len(rows), -1)
            low, high = flat.min(axis=1), flat.max(axis=1)
            shape = (-1,) + (1,) * (masks.ndim - 1)
            masks = (masks - low.reshape(shape)) / (high - low + 1e-8).reshape(shape)
            arrays = [a[sample] for a in inputs.arrays]
            arrays[0] = (arrays[0] * masks[..., None]).astype(arrays[0].dtype)
            scores[rows] = scorer(arrays, resolved[sample])[0]
        scores = scores.reshape(n, channels)
        shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True), scores


@register
class AblationCAM(PerturbationCAM):
    """Ablation-CAM (Desai & Ramaswamy, 2020): channels weighted by the score drop when zeroed.

    ``w_c = (y - y_c) / y`` where ``y`` is the target score (logit by
    default) and ``y_c`` the score with channel ``c`` of the layer's output
    set to zero, as in the paper and pytorch-grad-cam's ``AblationCAM``
    (which zeroes only when the layer's minimum is 0 and otherwise uses
    ``min - 1e7``; here it is always zero). Note the division by ``y``: a
    negative score flips the sign of every weight (pytorch-grad-cam does the
    same); where ``y == 0`` the raw drop ``y - y_c`` is used. The channel is
    zeroed by a scoped probe inside a compiled forward pass; the model is
    never modified. ``y`` and ``y_c`` come from the same compiled function.
    Cost: one forward and one backward pass on the clean inputs, then
    ``N x (C + 1)`` forward passes in batches of ``batch_size``.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.AblationCAM(m, layer="c").explain(np.random.rand(1, 8, 8, 1), 0).attributions.shape
        (1, 8, 8)
    """

    name = "ablationcam"
    description = "Channels weighted by the relative score drop when each is zeroed (Desai & Ramaswamy 2020)."
    aliases = ("ablation_cam",)

    def variant_weights(
        self, inputs: Inputs, targets: Any, result: Any, layer: keras.Layer, activations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(y - y_c) / y`` per channel, and the ablated scores ``y_c``.

        Example:
            >>> AblationCAM.variant_weights.__name__
            'variant_weights'
        """
        n, channels = activations.shape[0], activations.shape[-1]
        per_sample = channels + 1  # row 0 of each sample: nothing ablated (the clean score y)
        scorer = compile_scorer(
            self.engine, inputs, target_fn=self._target_fn(targets, n), layer=layer,
            transform=zero_channel, extra_spec=((None,), "int32"),
        )
        resolved = np.asarray(result.targets, np.int32)
        scores = np.empty(n * per_sample, np.float32)
        for rows in progress_bar(
            list(_rows(n * per_sample, self.batch_size)), enabled=self.progress, desc="ablationcam", unit="batch"
        ):
            sample, channel = rows // per_sample, rows % per_sample - 1
            arrays = [a[sample] for a in inputs.arrays]
            scores[rows] = scorer(arrays, resolved[sample], channel.astype(np.int32))[0]
        scores = scores.reshape(n, per_sample).astype(np.float64)
        clean, ablated = scores[:, :1], scores[:, 1:]
        drop = clean - ablated
        safe = np.where(clean == 0, 1.0, clean)
        weights = np.where(clean == 0, drop, drop / safe)
        return weights, ablated
