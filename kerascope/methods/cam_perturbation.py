"""Gradient-free CAM variants whose channel weights come from perturbed forward passes.

Both start like every CAM: one engine call on the clean inputs gives the
layer's activations ``A`` ``(N, *spatial, C)``, the resolved targets and the
clean scores. The ``N x C`` perturbed variants (one per sample and channel)
are then folded into the batch axis and scored ``batch_size`` rows at a time,
each chunk generated lazily (memory is bounded by ``batch_size``), with the
same targets as the clean pass and in the same output space (logits by
default), by one loop (:meth:`PerturbationCAM.score_variants`). The map is
``ReLU(sum_c w_c A_c)``, upsampled like every CAM (the CAM pipeline).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import ops

from kerascope.core import targets as targets_lib
from kerascope.core.inputs import Inputs
from kerascope.core.intervene import compile_scorer
from kerascope.methods._folding import chunk_ranges
from kerascope.methods.cam import CAM, channels_first, refuse_token_ids, weighted_sum
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


def zero_channel_first(output: Any, channel: Any) -> Any:
    """:func:`zero_channel` on a channels-first ``(N, C, *spatial)`` output (axis 1).

    Example:
        >>> import numpy as np
        >>> out = zero_channel_first(np.ones((1, 2, 3), "float32"), np.array([0], "int32"))
        >>> np.asarray(out)[0].sum(axis=1).tolist()
        [0.0, 3.0]
    """
    return ops.moveaxis(zero_channel(ops.moveaxis(output, 1, -1), channel), -1, 1)


class PerturbationCAM(CAM):
    """CAM whose channel weights come from scoring perturbed variants, ``per_sample`` per input.

    Subclasses implement :meth:`variant_weights`, usually with :meth:`score_variants`
    (the shared loop: rows folded into the batch axis, built ``batch_size`` at a time,
    scored with the clean pass's targets in the engine's output space). The rest
    (layer choice, clean pass, ``ReLU(sum_c w_c A_c)``, upsampling) is the CAM pipeline.

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

    def weigh(
        self, inputs: Inputs, targets: Any, layer: keras.Layer, result: Any, activations: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``sum_c w_c A_c`` with the weights of :meth:`variant_weights` (kept in the extras).

        Example:
            >>> PerturbationCAM.weigh.__name__
            'weigh'
        """
        weights, variant_scores = self.variant_weights(inputs, targets, result, layer, activations)
        extras = {"channel_weights": weights.astype(np.float32), "variant_scores": variant_scores.astype(np.float32)}
        return np.asarray(weighted_sum(activations, weights), np.float32), extras

    def score_variants(
        self,
        inputs: Inputs,
        targets: Any,
        result: Any,
        per_sample: int,
        make: Callable[[np.ndarray, np.ndarray], tuple[list[np.ndarray], np.ndarray | None]],
        **scorer_options: Any,
    ) -> np.ndarray:
        """Scores ``(N, per_sample)`` of the variants: the one scoring loop of the perturbation CAMs.

        Rows ``0 .. N * per_sample - 1`` are scored ``batch_size`` at a time;
        ``make(sample, variant)`` (the row's sample and variant index) returns the
        chunk's model inputs and the ``extra`` rows (or ``None``) for a scorer compiled
        with ``scorer_options`` (``layer=``, ``transform=``, ``extra_spec=``; see
        :meth:`~kerascope.core.engine.Engine.scorer`). Targets are the clean pass's.

        Example:
            >>> PerturbationCAM.score_variants.__name__
            'score_variants'
        """
        n = inputs.num_samples
        scorer = compile_scorer(self.engine, inputs, target_fn=targets_lib.encode(targets, n)[1], **scorer_options)
        resolved = np.asarray(result.targets, np.int32)
        scores = np.empty(n * per_sample, np.float32)
        for rows in chunk_ranges(n * per_sample, self.batch_size):  # progress: the method's scope hears the chunks
            sample, variant = rows // per_sample, rows % per_sample
            arrays, extra = make(sample, variant)
            scores[rows] = scorer(arrays, resolved[sample], extra)[0]
        return scores.reshape(n, per_sample)


@register
class ScoreCAM(PerturbationCAM):
    """Score-CAM (Wang et al., 2020): channels weighted by the score of the input they mask.

    Each channel ``A_c`` is upsampled (bilinear, half-pixel centres) to the
    input's extent (linearly along time for sequences), min-max normalised to
    ``[0, 1]`` (``eps = 1e-8``) and multiplies the chosen input (``input_index``;
    the others are kept; token-id inputs are refused: nothing to multiply); ``s_c`` is the target score of that masked
    input in the engine's output space (logits by default) and
    ``w = softmax_c(s_c)``. This follows pytorch-grad-cam's ``ScoreCAM``
    (raw target score, softmax over channels); the authors' code instead
    uses the softmax *probability* of the class as the weight, without a
    baseline (pass ``output="probabilities"`` for scores in probability space;
    the softmax over channels is still applied). Cost: one forward and one
    backward pass on the clean inputs, then ``N x C`` forward passes in
    batches of ``batch_size``.

    Example (the channel weights, kept in the extras, are a softmax over the channels):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> e = ks.ScoreCAM(m, layer="c").explain(np.random.rand(2, 8, 8, 1), [0, 1])
        >>> e.attributions.shape, np.round(e.extras["channel_weights"].sum(axis=1), 4).tolist()
        ((2, 8, 8), [1.0, 1.0])
    """

    name = "scorecam"
    description = "Channels weighted by the softmax of the scores of the inputs they mask (Wang et al. 2020)."
    aliases = ("score_cam",)

    def variant_weights(
        self, inputs: Inputs, targets: Any, result: Any, layer: keras.Layer, activations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Softmax over channels of the masked inputs' scores, and the scores (the class example shows them)."""
        channels = activations.shape[-1]
        layout = result.layout
        index = layout.input_index
        first = channels_first(layer)
        refuse_token_ids(inputs, index, "ScoreCAM", "it multiplies the input by masks")

        def masked(sample: np.ndarray, channel: np.ndarray) -> tuple[list[np.ndarray], None]:
            masks = layout.upsample(activations[sample, ..., channel])
            flat = masks.reshape(len(sample), -1)
            low, high = flat.min(axis=1), flat.max(axis=1)
            shape = (-1,) + (1,) * (masks.ndim - 1)
            masks = (masks - low.reshape(shape)) / (high - low + 1e-8).reshape(shape)
            arrays = [a[sample] for a in inputs.arrays]
            x = arrays[index]
            shape = masks.shape + (1,) * (x.ndim - masks.ndim)
            if first and x.ndim == masks.ndim + 1:  # a channels-first input: (n, C, *spatial)
                shape = (len(masks), 1) + masks.shape[1:]
            arrays[index] = (x * masks.reshape(shape)).astype(x.dtype)
            return arrays, None

        scores = self.score_variants(inputs, targets, result, channels, masked)
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

    Example (the weights are the relative drops of the score ``y`` to the ablated scores ``y_c``):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> e = ks.AblationCAM(m, layer="c").explain(np.random.default_rng(0).random((1, 8, 8, 1)), 0)
        >>> y, y_c = e.scores[:, None], e.extras["variant_scores"]
        >>> e.attributions.shape, bool(np.allclose(e.extras["channel_weights"], (y - y_c) / y, rtol=1e-4))
        ((1, 8, 8), True)
    """

    name = "ablationcam"
    description = "Channels weighted by the relative score drop when each is zeroed (Desai & Ramaswamy 2020)."
    aliases = ("ablation_cam",)

    def variant_weights(
        self, inputs: Inputs, targets: Any, result: Any, layer: keras.Layer, activations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(y - y_c) / y`` per channel, and the ablated scores ``y_c`` (the class example shows them)."""
        channels = activations.shape[-1]

        def ablated(sample: np.ndarray, variant: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
            # variant 0 of each sample: nothing ablated (the clean score y); variant c + 1: channel c zeroed
            return [a[sample] for a in inputs.arrays], (variant - 1).astype(np.int32)

        scores = self.score_variants(
            inputs, targets, result, channels + 1, ablated,
            layer=layer, transform=zero_channel_first if channels_first(layer) else zero_channel, extra_spec=((None,), "int32"),
        ).astype(np.float64)
        clean, ablated = scores[:, :1], scores[:, 1:]
        drop = clean - ablated
        safe = np.where(clean == 0, 1.0, clean)
        weights = np.where(clean == 0, drop, drop / safe)
        return weights, ablated
