"""Gradient-based CAM variants: each overrides one function of :class:`~kerascope.methods.cam.CAM`.

Notation: ``A`` are the layer's activations ``(N, *spatial, C)``, ``g`` the
gradients of the target score (a logit by default) w.r.t. ``A``, sums over
``ij`` run over the spatial positions. The map is ``ReLU(...)``, upsampled
bilinearly to the input unless ``upsample=False``; no min-max normalisation
(that is display, see :mod:`kerascope.viz`). The formulas are those of
pytorch-grad-cam (``pytorch_grad_cam/*.py``), which follow the papers. They are
written with ``keras.ops`` and run in float32 inside the engine's compiled
function (see :class:`~kerascope.methods.cam.CAM`), as pytorch-grad-cam computes
them in float32 numpy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from keras import ops

from kerascope.methods.cam import CAM, spatial_axes
from kerascope.methods.registry import register


@register
class GradCAMPlusPlus(CAM):
    """Grad-CAM++ (Chattopadhay et al., 2018): positive gradients weighted by a closed-form alpha.

    ``alpha = g^2 / (2 g^2 + sum_ij(A) * g^3 + eps)`` (0 where ``g == 0``),
    ``w_c = sum_ij(alpha * ReLU(g))``, map ``ReLU(sum_c w_c A_c)``. This is
    the paper's eq. 19 with the exponential-score trick (``Y = exp(S)``, so
    higher derivatives are powers of ``g``); as in pytorch-grad-cam the
    constant positive factor ``exp(S)`` is dropped from the weights, and
    ``eps = 1e-6``. One forward and one backward pass.

    Example (two images, a target each; the maps at the layer's 6 x 6 resolution, non-negative):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> cam = ks.GradCAMPlusPlus(m, layer="c", upsample=False)
        >>> maps = cam.explain(np.random.default_rng(0).random((2, 8, 8, 1)), [0, 1]).attributions
        >>> maps.shape, bool((maps >= 0).all())
        ((2, 6, 6), True)
    """

    name = "gradcam_plusplus"
    description = "Grad-CAM with pixel-wise weights of positive gradients (Chattopadhay et al. 2018)."
    aliases = ("gradcam++", "gradcampp", "grad_cam_plus_plus")
    eps: ClassVar[float] = 1e-6

    def channel_weights(self, activations: Any, gradients: Any) -> Any:
        """``sum_ij(alpha * ReLU(g))`` with the closed-form alpha, ``(N, C)``.

        Example:
            >>> import numpy as np
            >>> w = GradCAMPlusPlus.channel_weights(GradCAMPlusPlus, np.ones((1, 2, 2, 1)), np.ones((1, 2, 2, 1)))
            >>> round(float(np.asarray(w)[0, 0]), 4)  # 4 positions x alpha = 1 / (2 + 4)
            0.6667
        """
        axes = spatial_axes(gradients)
        g2 = ops.square(gradients)
        g3 = g2 * gradients
        sums = ops.sum(activations, axis=axes, keepdims=True)
        alpha = ops.where(ops.not_equal(gradients, 0), g2 / (2.0 * g2 + sums * g3 + self.eps), 0.0)
        return ops.sum(alpha * ops.relu(gradients), axis=axes)


@register
class XGradCAM(CAM):
    """XGrad-CAM (Fu et al., 2020): gradients weighted by the normalised activations.

    ``w_c = sum_ij(g * A) / (sum_ij(A) + eps)`` with ``eps = 1e-7`` (as
    pytorch-grad-cam), map ``ReLU(sum_c w_c A_c)``. One forward and one
    backward pass.

    Example (on ReLU activations, which the weights' derivation assumes non-negative):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, activation="relu", name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> e = ks.XGradCAM(m, layer="c").explain(np.random.default_rng(0).random((2, 8, 8, 1)), [0, 1])
        >>> e.attributions.shape, bool((e.attributions >= 0).all())
        ((2, 8, 8), True)
    """

    name = "xgradcam"
    description = "Gradients weighted by normalised activations, axiom-based (Fu et al. 2020)."
    aliases = ("xgrad_cam",)
    eps: ClassVar[float] = 1e-7

    def channel_weights(self, activations: Any, gradients: Any) -> Any:
        """``sum_ij(g * A) / (sum_ij(A) + eps)``, ``(N, C)``.

        Example:
            >>> import numpy as np
            >>> w = XGradCAM.channel_weights(XGradCAM, np.ones((1, 2, 2, 1)), np.full((1, 2, 2, 1), 3.0))
            >>> round(float(np.asarray(w)[0, 0]), 4)
            3.0
        """
        axes = spatial_axes(gradients)
        return ops.sum(gradients * activations, axis=axes) / (ops.sum(activations, axis=axes) + self.eps)


@register
class LayerCAM(CAM):
    """LayerCAM (Jiang et al., 2021): activations weighted element-wise by positive gradients.

    Map ``ReLU(sum_c ReLU(g_c) * A_c)`` (per position, no spatial pooling),
    as pytorch-grad-cam's ``LayerCAM``: :class:`HiResCAM` on the positive
    gradients. One forward and one backward pass. Made for shallow layers too,
    whose maps keep their fine resolution with ``upsample=False``.

    Example (an early layer's map, at that layer's resolution):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, padding="same", name="early"),
        ...                       keras.layers.Conv2D(2, 3, name="late"), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.LayerCAM(m, layer="early", upsample=False).explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 8, 8)
    """

    name = "layercam"
    description = "Activations weighted element-wise by positive gradients (Jiang et al. 2021)."
    aliases = ("layer_cam",)

    def combine(self, activations: Any, gradients: Any) -> Any:
        """``sum_c ReLU(g) * A``, ``(N, *spatial)``: HiResCAM's map of the positive gradients.

        Example:
            >>> import numpy as np
            >>> np.asarray(LayerCAM.combine(LayerCAM, np.ones((1, 1, 1, 2)), np.array([[[[2.0, -1.0]]]]))).tolist()
            [[[2.0]]]
        """
        return HiResCAM.combine(self, activations, ops.relu(gradients))


@register
class HiResCAM(CAM):
    """HiResCAM (Draelos & Carin, 2020): activations times gradients, element-wise.

    Map ``ReLU(sum_c g_c * A_c)``; for models ending in global average
    pooling and a dense layer it equals Grad-CAM. Same as pytorch-grad-cam's
    ``HiResCAM``. One forward and one backward pass.

    Example (after global average pooling and a dense layer, the Grad-CAM map):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).random((1, 8, 8, 1))
        >>> hires = ks.HiResCAM(m, layer="c").explain(x, 0).attributions
        >>> bool(np.allclose(hires, ks.GradCAM(m, layer="c").explain(x, 0).attributions, atol=1e-5))
        True
    """

    name = "hirescam"
    description = "Element-wise gradient x activation summed over channels (Draelos & Carin 2020)."
    aliases = ("hires_cam",)

    def combine(self, activations: Any, gradients: Any) -> Any:
        """``sum_c g * A``, ``(N, *spatial)``.

        Example:
            >>> import numpy as np
            >>> np.asarray(HiResCAM.combine(HiResCAM, np.ones((1, 1, 1, 2)), np.array([[[[2.0, -1.0]]]]))).tolist()
            [[[1.0]]]
        """
        return ops.sum(gradients * activations, axis=-1)


def principal_projection(activations: np.ndarray) -> np.ndarray:
    """Project each sample's activations on their first principal component, ``(N, *spatial)``.

    Per sample, the ``(positions, C)`` matrix is centred over positions and
    decomposed with an SVD (batched, no loop); the map is the centred matrix
    times the first right singular vector, as pytorch-grad-cam's
    ``get_2d_projection``. The SVD leaves the sign free (pytorch-grad-cam
    leaves it to LAPACK, so its map can come out inverted); here it is fixed so
    that the singular vector's components sum to ``> 0``, which is the same as
    making the projection positively correlated with the channel-summed
    activation map ``sum_c A_c`` (the map is high where features are active).
    Where that sum is no signal (``|sum(v)| <= 1e-3 * sum(|v|)``: e.g. after a
    ``LayerNormalization``, whose outputs sum to the same value at every
    token, so ``sum_c A_c`` is constant), the largest component of ``v`` in
    absolute value is made positive (scikit-learn's ``svd_flip`` rule) instead
    of leaving the sign to rounding.

    Example:
        >>> import numpy as np
        >>> a = np.zeros((1, 2, 2, 2)); a[0, 0, 0] = [1.0, 1.0]
        >>> np.round(principal_projection(a).astype(float), 3).tolist()
        [[[1.061, -0.354], [-0.354, -0.354]]]
    """
    array = np.nan_to_num(np.asarray(activations, np.float64))
    n, channels = array.shape[0], array.shape[-1]
    flat = array.reshape(n, -1, channels)
    centred = flat - flat.mean(axis=1, keepdims=True)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    first = vt[:, 0, :]
    total = first.sum(axis=-1, keepdims=True)
    largest = np.take_along_axis(first, np.abs(first).argmax(axis=-1)[:, None], axis=-1)
    informative = np.abs(total) > 1e-3 * np.abs(first).sum(axis=-1, keepdims=True)
    sign = np.where(np.where(informative, total, largest) < 0, -1.0, 1.0)
    projection = np.einsum("npc,nc->np", centred, first * sign)
    return projection.reshape(array.shape[:-1]).astype(np.float32)


@register
class EigenCAM(CAM):
    """Eigen-CAM (Muhammad & Yeasin, 2020): the first principal component of the activations.

    Class-agnostic: the map is ``ReLU`` of the projection of each sample's
    centred activations on their first principal component (see
    :func:`principal_projection` for the sign convention). Gradients are not
    used; the engine's pass still provides activations, targets and scores
    (one forward and one backward pass).

    Example (class-agnostic: every target gets the same map):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> x, cam = np.random.default_rng(0).random((1, 8, 8, 1)), ks.EigenCAM(m, layer="c")
        >>> bool(np.array_equal(cam.explain(x, 0).attributions, cam.explain(x, 1).attributions))
        True
    """

    name = "eigencam"
    description = "First principal component of the feature maps, class-agnostic (Muhammad & Yeasin 2020)."
    aliases = ("eigen_cam",)
    on_device = False  # a batched SVD in numpy (float64) on the host

    def combine(self, activations: np.ndarray, gradients: Any) -> np.ndarray:
        """Signed projection on the first principal component, ``(N, *spatial)``.

        Example:
            >>> import numpy as np
            >>> EigenCAM.combine(EigenCAM, np.random.rand(2, 3, 3, 4), None).shape
            (2, 3, 3)
        """
        return principal_projection(activations)


__all__ = ["EigenCAM", "GradCAMPlusPlus", "HiResCAM", "LayerCAM", "XGradCAM", "principal_projection"]
