"""More gradient-based and activation-based CAM variants, as pytorch-grad-cam 1.5.7 defines them.

Notation as in :mod:`kerascope.methods.cam_variants`: ``A`` the layer's
activations ``(N, *spatial, C)``, ``g`` the gradients of the target score
there. Each class overrides one function of :class:`~kerascope.methods.cam.CAM`
(:meth:`~kerascope.methods.cam.CAM.channel_weights` or
:meth:`~kerascope.methods.cam.CAM.combine`); layer choice, ReLU, upsampling and
batching come from ``CAM``. The projections (EigenGradCAM, KPCACAM) are batched
numpy decompositions on the host (one ``svd`` / ``eigh`` call for the whole
chunk, no loop per sample).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from kerascope.methods.cam import CAM, spatial_axes
from kerascope.methods.cam_variants import principal_projection
from kerascope.methods.registry import register

KERNELS = ("linear", "poly", "rbf", "sigmoid", "cosine")


@register
class GradCAMElementWise(CAM):
    """Grad-CAM element-wise (pytorch-grad-cam's ``GradCAMElementWise``): positive gradient x activation terms.

    Map ``ReLU(sum_c ReLU(g_c * A_c))``: like HiResCAM, but each channel's
    element-wise product is clipped at zero before the channels are summed.
    One forward and one backward pass.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.GradCAMElementWise(m, layer="c").explain(np.ones((1, 8, 8, 1)), 0).attributions.shape
        (1, 8, 8)
    """

    name = "gradcam_elementwise"
    description = "Positive element-wise gradient x activation products summed over channels (pytorch-grad-cam)."
    aliases = ("grad_cam_element_wise", "gradcamelementwise")

    def combine(self, activations: Any, gradients: Any) -> Any:
        """``sum_c ReLU(g * A)``, ``(N, *spatial)``.

        Example:
            >>> import numpy as np
            >>> g = np.array([[[[2.0, -1.0]]]])
            >>> np.asarray(GradCAMElementWise.combine(None, np.ones((1, 1, 1, 2)), g)).tolist()
            [[[2.0]]]
        """
        return ops.sum(ops.relu(gradients * activations), axis=-1)


@register
class FEM(CAM):
    """Feature Explanation Method (Fuad et al., 2020): channels weighted by their share of k-sigma outliers.

    Per sample and channel, the threshold is ``mean_ij(A_c) + k * std_ij(A_c)``
    (population std); the channel weight is the fraction of positions above it,
    and the map ``ReLU(sum_c w_c A_c)``. Class-agnostic: no gradients are used
    (the engine's pass still gives the scores and targets; one forward and one
    backward pass).

    Args:
        k: how many standard deviations above the mean a value must be (default 2).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.FEM(m, layer="c").explain(np.random.rand(1, 8, 8, 1), 0).attributions.shape
        (1, 8, 8)
    """

    name = "fem"
    description = "Channels weighted by their fraction of k-sigma high activations, class-agnostic (Fuad et al. 2020)."
    aliases = ("feature_explanation_method",)

    def __init__(self, model: keras.Layer, *, k: float = 2.0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not np.isfinite(k):
            raise ValueError(f"`k` must be a finite number of standard deviations. Received: k={k!r}.")
        self.k = float(k)

    def weighting_key(self) -> tuple:
        return (self.k,)

    def channel_weights(self, activations: Any, gradients: Any) -> Any:
        """Fraction of positions where ``A_c > mean(A_c) + k std(A_c)``, ``(N, C)``.

        Example:
            >>> import numpy as np
            >>> a = np.zeros((1, 2, 2, 1)); a[0, 0, 0, 0] = 1.0
            >>> fem = FEM.__new__(FEM); fem.k = 1.0
            >>> np.asarray(fem.channel_weights(a, None)).tolist()  # one position in four above the threshold
            [[0.25]]
        """
        axes = spatial_axes(activations)
        mean = ops.mean(activations, axis=axes, keepdims=True)
        std = ops.sqrt(ops.mean(ops.square(activations - mean), axis=axes, keepdims=True))
        above = ops.cast(ops.greater(activations, mean + self.k * std), "float32")
        return ops.mean(above, axis=axes)


@register
class EigenGradCAM(CAM):
    """Eigen-Grad-CAM (pytorch-grad-cam's ``EigenGradCAM``): first principal component of ``g * A``.

    Like :class:`~kerascope.methods.cam_variants.EigenCAM`, but on the element-wise
    products of gradients and activations, so the map depends on the target class.
    The projection and its sign convention are
    :func:`~kerascope.methods.cam_variants.principal_projection`'s. One forward and
    one backward pass, a batched SVD on the host.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).random((1, 8, 8, 1))
        >>> e = ks.EigenGradCAM(m, layer="c", upsample=False)  # the layer's 6 x 6 grid
        >>> a0, a1 = (e.explain(x, t).attributions for t in (0, 1))
        >>> a0.shape, bool(np.allclose(a0, a1))  # class-specific, unlike Eigen-CAM
        ((1, 6, 6), False)
    """

    name = "eigengradcam"
    description = "First principal component of gradient x activation, class-specific (pytorch-grad-cam)."
    aliases = ("eigen_grad_cam",)
    on_device = False  # a batched SVD in numpy (float64) on the host

    def combine(self, activations: Any, gradients: Any) -> np.ndarray:
        """Signed projection of ``g * A`` on its first principal component, ``(N, *spatial)``.

        Example:
            >>> import numpy as np
            >>> EigenGradCAM.combine(None, np.random.rand(2, 3, 3, 4), np.random.rand(2, 3, 3, 4)).shape
            (2, 3, 3)
        """
        return principal_projection(np.asarray(gradients, np.float32) * np.asarray(activations, np.float32))


def kernel_matrix(x: np.ndarray, kernel: str, gamma: float | None) -> np.ndarray:
    """Per-sample kernel matrices ``(N, P, P)`` of rows ``x`` ``(N, P, C)``, scikit-learn's ``pairwise_kernels``.

    ``gamma=None`` is ``1 / C``; ``poly`` has degree 3 and ``coef0=1``, ``sigmoid`` ``coef0=1``
    (scikit-learn's ``KernelPCA`` defaults).

    Example:
        >>> import numpy as np
        >>> kernel_matrix(np.array([[[1.0, 0.0], [0.0, 1.0]]]), "linear", None).tolist()
        [[[1.0, 0.0], [0.0, 1.0]]]
    """
    if kernel not in KERNELS:
        raise ValueError(f"Unknown kernel. Received: kernel={kernel!r}. Available: {list(KERNELS)}.")
    g = 1.0 / x.shape[-1] if gamma is None else gamma
    dots = np.matmul(x, x.transpose(0, 2, 1))
    if kernel == "linear":
        return dots
    if kernel in ("poly", "sigmoid"):  # in place: the (N, P, P) matrices are the large arrays here
        dots *= g
        dots += 1.0
        return np.power(dots, 3, out=dots) if kernel == "poly" else np.tanh(dots, out=dots)
    squares = np.einsum("npc,npc->np", x, x)
    if kernel == "rbf":
        distances = np.maximum(squares[:, :, None] + squares[:, None, :] - 2.0 * dots, 0.0)
        return np.exp(-g * distances)
    norms = np.sqrt(squares)
    norms = np.where(norms == 0, 1.0, norms)
    return dots / (norms[:, :, None] * norms[:, None, :])


def _tridiagonal(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Lanczos' symmetric tridiagonal matrices ``(N, m, m)``: ``alpha`` on the diagonal, ``beta[:, :-1]`` beside it."""
    n, m = alpha.shape
    tridiagonal = np.zeros((n, m, m))
    index = np.arange(m)
    tridiagonal[:, index, index] = alpha
    tridiagonal[:, index[:-1], index[1:]] = beta[:, :-1]
    tridiagonal[:, index[1:], index[:-1]] = beta[:, :-1]
    return tridiagonal


def top_eigenpairs(matrices: np.ndarray, steps: int = 64, dense_below: int = 160) -> tuple[np.ndarray, np.ndarray]:
    """The largest (algebraic) eigenvalue ``(N,)`` and a unit eigenvector ``(N, P)`` of symmetric ``(N, P, P)`` matrices.

    Small matrices: one batched ``eigh``. Larger ones: a batched Lanczos iteration
    (at most ``steps`` steps with full re-orthogonalisation, all samples at once, stopped
    early once every sample's leading Ritz pair has converged; checked every 8 steps), as
    scikit-learn's ARPACK path for more than 200 points finds only the leading pair;
    a sample whose residual ``|M v - lambda v|`` stays above ``1e-8 |lambda|`` is
    solved with the dense ``eigh`` instead, so the result is always the exact pair.

    Example:
        >>> import numpy as np
        >>> m = np.diag([1.0, 3.0, 2.0])[None]
        >>> value, vector = top_eigenpairs(m)
        >>> value.tolist(), np.abs(vector).round(6).tolist()
        ([3.0], [[0.0, 1.0, 0.0]])
    """
    matrices = np.asarray(matrices, np.float64)
    n, p, _ = matrices.shape
    if p <= dense_below:
        values, vectors = np.linalg.eigh(matrices)
        return values[:, -1], vectors[:, :, -1]
    m = min(steps, p)
    start = np.random.default_rng(0).standard_normal(p)  # deterministic; a double-centred kernel annihilates ones
    q = np.broadcast_to(start / np.linalg.norm(start), (n, p)).copy()
    basis = np.zeros((n, m, p))
    alpha, beta = np.zeros((n, m)), np.zeros((n, m))
    used = m
    for j in range(m):  # Lanczos steps (each one batched over the samples)
        basis[:, j] = q
        w = np.einsum("npq,nq->np", matrices, q)  # einsum: ~10x faster than a batched matmul for this
        alpha[:, j] = np.einsum("np,np->n", w, q)
        for _ in range(2):  # full re-orthogonalisation, twice
            done = basis[:, : j + 1]
            w -= np.einsum("nj,njp->np", np.einsum("njp,np->nj", done, w), done)
        beta[:, j] = np.linalg.norm(w, axis=1)
        q = w / np.maximum(beta[:, j: j + 1], 1e-300)
        if (j + 1) % 8 == 0 and j + 1 < m:  # stop early once every sample's leading Ritz pair has converged
            ritz_values, ritz_vectors = np.linalg.eigh(_tridiagonal(alpha[:, : j + 1], beta[:, : j + 1]))
            estimate = np.abs(beta[:, j] * ritz_vectors[:, -1, -1])  # = |M v - lambda v| of the Ritz pair
            if np.all(estimate <= 1e-10 * np.maximum(np.abs(ritz_values[:, -1]), 1e-300)):
                used = j + 1
                break
    ritz_values, ritz_vectors = np.linalg.eigh(_tridiagonal(alpha[:, :used], beta[:, :used]))
    value = ritz_values[:, -1]
    vector = np.einsum("njp,nj->np", basis[:, :used], ritz_vectors[:, :, -1])
    vector /= np.linalg.norm(vector, axis=1, keepdims=True)
    residual = np.linalg.norm(np.einsum("npq,nq->np", matrices, vector) - value[:, None] * vector, axis=1)
    largest = np.maximum(matrices.max(axis=(1, 2)), -matrices.min(axis=(1, 2)))  # max |M|, no (N, P, P) copy
    scale = np.maximum(np.abs(value), largest * 1e-12 + 1e-300)
    redo = np.flatnonzero(residual > 1e-8 * scale)
    if len(redo):
        values, vectors = np.linalg.eigh(matrices[redo])
        value[redo], vector[redo] = values[:, -1], vectors[:, :, -1]
    return value, vector


def kernel_projection(activations: np.ndarray, kernel: str = "sigmoid", gamma: float | None = None) -> np.ndarray:
    """First kernel principal component of each sample's centred activations, ``(N, *spatial)``.

    As pytorch-grad-cam's ``get_2d_projection_kernel``: the ``(positions, C)``
    matrix is centred over positions, its kernel matrix centred in feature space,
    and the map is the leading eigenvector times the square root of its
    eigenvalue (scikit-learn's ``KernelPCA(n_components=1).fit_transform``),
    with scikit-learn's sign rule (``svd_flip``: the largest component in
    absolute value is positive). Batched over samples (:func:`top_eigenpairs`).

    Example:
        >>> import numpy as np
        >>> a = np.zeros((1, 2, 2, 2)); a[0, 0, 0] = [1.0, 1.0]
        >>> np.round(kernel_projection(a, "linear").astype(float), 3).tolist()
        [[[1.061, -0.354], [-0.354, -0.354]]]
    """
    array = np.nan_to_num(np.asarray(activations, np.float64))
    n, channels = array.shape[0], array.shape[-1]
    flat = array.reshape(n, -1, channels)
    centred = flat - flat.mean(axis=1, keepdims=True)
    k = kernel_matrix(centred, kernel, gamma)
    rows, columns, total = k.mean(axis=1, keepdims=True), k.mean(axis=2, keepdims=True), k.mean(axis=(1, 2), keepdims=True)
    k -= rows  # centred in feature space, in place (the same operations in the same order)
    k -= columns
    k += total
    value, first = top_eigenpairs(k)
    value = np.maximum(value[:, None], 0.0)
    largest = np.take_along_axis(first, np.abs(first).argmax(axis=-1)[:, None], axis=-1)
    projection = first * np.sign(np.where(largest == 0, 1.0, largest)) * np.sqrt(value)
    return projection.reshape(array.shape[:-1]).astype(np.float32)


@register
class KPCACAM(CAM):
    """KPCA-CAM (Karmani et al., 2024): the first kernel principal component of the activations.

    Eigen-CAM with kernel PCA: each sample's centred ``(positions, C)``
    activations are projected on the leading component of a kernel PCA (see
    :func:`kernel_projection`); class-agnostic. One forward and one backward
    pass, a batched eigendecomposition of a ``positions x positions`` matrix per
    sample on the host.

    Args:
        kernel: ``"sigmoid"`` (default, as pytorch-grad-cam), ``"rbf"``, ``"poly"``,
            ``"linear"`` (= Eigen-CAM up to sign and scale) or ``"cosine"``.
        gamma: the kernel coefficient; ``None`` is ``1 / channels``.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> x = np.random.default_rng(0).random((2, 8, 8, 1))
        >>> e = ks.KPCACAM(m, layer="c", kernel="rbf")
        >>> a0, a1 = (e.explain(x, t).attributions for t in (0, 1))
        >>> a0.shape, bool(np.array_equal(a0, a1))  # class-agnostic: the same map for every target
        ((2, 8, 8), True)
    """

    name = "kpcacam"
    description = "First kernel principal component of the feature maps, class-agnostic (Karmani et al. 2024)."
    aliases = ("kpca_cam",)
    on_device = False  # a batched eigendecomposition in numpy (float64) on the host

    def __init__(self, model: keras.Layer, *, kernel: str = "sigmoid", gamma: float | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if kernel not in KERNELS:
            raise ValueError(f"Unknown kernel. Received: kernel={kernel!r}. Available: {list(KERNELS)}.")
        if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma > 0):
            raise ValueError(f"`gamma` must be a positive number or None (1 / channels). Received: gamma={gamma!r}.")
        self.kernel = kernel
        self.gamma = None if gamma is None else float(gamma)

    def combine(self, activations: Any, gradients: Any) -> np.ndarray:
        """Projection on the first kernel principal component, ``(N, *spatial)``.

        Example:
            >>> import numpy as np
            >>> cam = KPCACAM.__new__(KPCACAM); cam.kernel, cam.gamma = "rbf", None
            >>> cam.combine(np.random.rand(2, 3, 3, 4), None).shape
            (2, 3, 3)
        """
        return kernel_projection(np.asarray(activations, np.float32), self.kernel, self.gamma)


__all__ = [
    "EigenGradCAM", "FEM", "GradCAMElementWise", "KPCACAM", "kernel_matrix", "kernel_projection", "top_eigenpairs",
]
