"""Attention rollout (Abnar & Zuidema 2020): how much each input token reaches the output through attention."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

from kerascope.core.attention import attention_layers, attention_maps, capture, gradient_rollout, rollout
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.methods.base import Method, UnsupportedModelError
from kerascope.methods.registry import register
from kerascope.numeric.resize import upsample as resize


class _Rollout(Method):
    """What both rollouts take: the attention layers read, the class token, the resize of a ViT's patch grid."""

    def __init__(
        self,
        model: keras.Layer,
        *,
        layers: Any = None,
        class_token: bool | None = None,
        upsample: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.layers = layers
        self.class_token = class_token
        self.upsample = bool(upsample)


@register
class AttentionRollout(_Rollout):
    """Attention rollout: the attention maps multiplied from the first layer to the last.

    Per layer the heads are averaged, the residual connection is added as
    ``0.5 A + 0.5 I`` and the rows are renormalised; the product
    ``R = A_L ... A_1`` says how much each token's information reaches each
    position at the last layer (Abnar & Zuidema 2020). The map is the class
    token's row over the other tokens (``class_token=True``, default for a model
    whose token count is a square grid plus one, as a ViT's), else the mean of
    ``R`` over the output positions. On a ViT the patch tokens are placed on
    their grid and, unless ``upsample=False``, resized to the image size
    ``(N, H, W)``; otherwise the map is per token ``(N, T)``. The map is the
    same for every class (``targets`` only fill ``scores``); it reads the
    attention probabilities of every ``keras.layers.MultiHeadAttention`` (or
    KerasHub attention layer) in forward order, or of ``layers=``.

    Cost: one forward pass with the explicit attention path (no gradient).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> x = keras.Input((5, 4))
        >>> h = keras.layers.MultiHeadAttention(2, 2, name="a1")(x, x)
        >>> h = keras.layers.MultiHeadAttention(2, 2, name="a2")(h, h)
        >>> m = keras.Model(x, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
        >>> e = ks.AttentionRollout(m, class_token=False).explain(np.random.rand(2, 5, 4), 0)
        >>> e.attributions.shape, bool(np.allclose(e.attributions.sum(-1), 1.0))
        ((2, 5), True)
    """

    name = "attention_rollout"
    description = "Attention maps multiplied from the first layer to the last (Abnar & Zuidema 2020)."
    aliases = ("rollout", "attentionrollout")

    def __init__(self, model: keras.Layer, *, residual: float = 0.5, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if not 0.0 <= float(residual) <= 1.0:
            raise ValueError(f"`residual` must be in [0, 1] (the identity's weight). Received: residual={residual!r}.")
        self.residual = float(residual)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        maps = _self_attention_maps(self.model, inputs, self.layers, self.batch_size)
        attributions = _token_map(rollout(list(maps.values()), self.residual), inputs, self.class_token,
                                  self.upsample)
        scores, resolved = (None, None)
        if self.scores:
            scores, resolved = self.engine.scores(inputs, targets, self.batch_size)
        return self._result(inputs, [attributions], scores, resolved, layers=np.asarray(list(maps)))


@register
class GradientRollout(_Rollout):
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021): class-specific attention relevance.

    Per attention layer, the gradient of the target score w.r.t. the attention
    probabilities weights the probabilities: ``A_bar = mean_heads((dA * A)^+)``
    (positive part, then the head mean). Starting from ``R = I``, each layer
    from the first to the last adds what it propagates: ``R <- R + A_bar R``.
    The map is the class token's row over the other tokens (``class_token=True``,
    default for a model whose token count is a square grid plus one, as a
    ViT's), else the mean of ``R`` over the output positions; on a ViT the patch
    grid is resized to the image ``(N, H, W)`` unless ``upsample=False``, as for
    :class:`AttentionRollout`. Unlike plain rollout the map depends on the
    target class. It reads every ``keras.layers.MultiHeadAttention`` (or
    KerasHub attention layer built on it) in forward order, or ``layers=``; each
    must be called once per forward pass.

    Cost: one forward pass of one sample (the layers' order), then one forward
    and backward pass with the explicit attention path, ``batch_size`` at a time.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> x = keras.Input((5, 4))
        >>> h = x + keras.layers.MultiHeadAttention(2, 2, name="a1")(x, x)
        >>> h = h + keras.layers.MultiHeadAttention(2, 2, name="a2")(h, h)
        >>> m = keras.Model(x, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
        >>> e = ks.GradientRollout(m, class_token=False).explain(np.random.rand(2, 5, 4), 0)
        >>> e.attributions.shape, bool((e.attributions >= 0).all())
        ((2, 5), True)
    """

    name = "gradient_rollout"
    description = "Attention weighted by its gradient, (dA * A)^+, rolled out over the layers (Chefer et al. 2021)."
    aliases = ("gradientrollout", "grad_rollout")

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        order = list(_self_attention_maps(self.model, inputs.subset(slice(0, 1)), self.layers, 1))
        if any("#" in name for name in order):
            raise ValueError(
                "Gradient-weighted rollout needs each attention layer called once per forward pass. Received: "
                f"calls {order}. Pass `layers=` with attention layers called once."
            )
        found = dict(attention_layers(self.model, self.layers))
        chosen = [found[name] for name in order]
        softmaxes = [getattr(layer, "_softmax", None) for layer in chosen]
        if any(not isinstance(s, keras.layers.Softmax) for s in softmaxes):
            raise UnsupportedModelError(
                f"An attention layer of {order} computes its probabilities without Keras' `Softmax` sub-layer, so "
                "their gradient cannot be read. Use `AttentionRollout` (no gradient)."
            )
        with capture(chosen):  # the explicit attention path, in this thread only, for this call only
            result = self.engine.gradients(
                inputs, targets, layers=softmaxes, wrt_inputs=False, batch_size=self.batch_size,
                progress=self.progress, reduce=_weighted_heads, reduce_key=("gradient_rollout",),
            )
        attributions = _token_map(gradient_rollout(list(result.reduced)), inputs, self.class_token, self.upsample)
        return self._result(inputs, [attributions], result.scores, result.targets, layers=np.asarray(order))


def _weighted_heads(acts: list[Any], grads: list[Any]) -> list[Any]:
    """Per layer ``mean_heads((dA * A)^+)``: ``(N, T, S)`` (inside the compiled function)."""
    return [keras.ops.mean(keras.ops.relu(g * a), axis=1) for a, g in zip(acts, grads, strict=True)]


def _self_attention_maps(model: keras.Layer, inputs: Inputs, layers: Any, batch_size: int) -> dict[str, np.ndarray]:
    """The attention maps of ``layers`` in forward order, refused unless they are square and of one length."""
    try:
        attention_layers(model, layers)
    except ValueError as error:  # no attention to roll out: this method does not apply to the model
        raise UnsupportedModelError(f"{error} Use a method that does not read attention maps.") from None
    maps = attention_maps(model, inputs, layers, batch_size)
    square = {a.shape[-1] for a in maps.values()}
    if len(square) != 1 or any(a.shape[-1] != a.shape[-2] for a in maps.values()):
        raise ValueError(
            "Attention rollout multiplies self-attention maps of one sequence length. Received: maps of "
            f"shapes { {k: v.shape for k, v in maps.items()} }. Pass `layers=` with the self-attention layers."
        )
    return maps


def _token_map(r: np.ndarray, inputs: Inputs, class_token: bool | None, upsample: bool) -> np.ndarray:
    """The class token's row of ``r`` (``(N, T, T)``) over the other tokens, or the mean over rows; a ViT's on
    its patch grid, resized to the image unless ``upsample=False``."""
    tokens = r.shape[-1]
    grid = math.isqrt(tokens - 1) if tokens > 1 else 0
    with_class = class_token if class_token is not None else grid * grid == tokens - 1 and grid > 1
    attributions = r[:, 0, 1:] if with_class else r.mean(axis=1)
    image = _image_shape(inputs)
    if with_class and grid * grid == tokens - 1 and image is not None:
        attributions = attributions.reshape(-1, grid, grid)
        if upsample:
            attributions = resize(attributions, image)
    return attributions.astype(np.float32)


def _image_shape(inputs: Inputs) -> tuple[int, int] | None:
    first = inputs.arrays[0]
    return tuple(first.shape[1:3]) if first.ndim == 4 else None
