"""Global sensitivity analysis over feature masks: total Sobol indices and HSIC (Xplique's estimators).

Both methods draw random *designs* over the ``k`` features of a feature mask
(see :mod:`kerascope.methods.feature_masks`: a ``grid_size`` x ``grid_size``
grid on images by default, one feature per column on tables), score the model
on the perturbed inputs and measure how much of the score's variation each
feature explains:

- :class:`Sobol` (Fel et al., 2021): continuous masks ``m`` in ``[0, 1]^k``; a
  feature becomes ``baseline + m_j (x - baseline)`` (Xplique's ``"inpainting"``
  with ``baseline=0``). Total Sobol indices by the Jansen estimator on
  scrambled Sobol quasi-random designs (``scipy.stats.qmc.Sobol``).
- :class:`HSIC` (Novello et al., 2022): binary masks (a feature kept or set to
  the baseline), the Hilbert-Schmidt independence criterion between each
  feature's mask and the score, with Xplique's kernels.

All designs of all samples are rows of compiled forward passes, ``batch_size``
rows at a time (:func:`~kerascope.methods.feature_masks.evaluate`); the
estimators are a few array operations over all features at once.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.methods._folding import forward_scores
from kerascope.methods.base import UnsupportedModelError, check_positive_int, check_seed
from kerascope.methods.coalitions import FeatureMaskMethod
from kerascope.methods.feature_masks import Plan, default_mask, grid_mask, make_plan
from kerascope.methods.registry import register

PERTURBATIONS = ("inpainting",)
EPS = 1e-12  # Xplique's floor on the variance of f(A) (sobol_estimators.py)


def sobol_points(dimension: int, samples: int, seed: int | None, scramble: bool = True) -> np.ndarray:
    """``samples`` points of a (scrambled) Sobol sequence in ``[0, 1)^dimension``, float32.

    Example:
        >>> sobol_points(2, 4, seed=None, scramble=False).tolist()
        [[0.0, 0.0], [0.5, 0.5], [0.75, 0.25], [0.25, 0.75]]
    """
    try:
        from scipy.stats import qmc
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("Sobol and HSIC draw Sobol sequences with scipy: pip install scipy.") from error

    with warnings.catch_warnings():  # scipy's note that balance needs a power of 2 (checked where it matters)
        warnings.simplefilter("ignore", UserWarning)
        return qmc.Sobol(dimension, scramble=scramble, seed=seed).random(samples).astype(np.float32)


def sobol_design(k: int, samples: int, seed: int | None, scramble: bool = True) -> np.ndarray:
    """The replicated design ``[A; B; C_1; ...; C_k]`` ``(samples (k + 2), k)`` of the Sobol estimators.

    ``A`` and ``B`` are the two halves of ``samples`` points of a ``2k``-dimensional
    Sobol sequence; ``C_i`` is ``A`` with column ``i`` taken from ``B`` (Xplique's
    ``ReplicatedSampler`` layout, ``replicated_designs.py``).

    Example:
        >>> d = sobol_design(2, 4, seed=0)
        >>> d.shape, bool((d[8:12, 1] == d[:4, 1]).all()), bool((d[8:12, 0] == d[4:8, 0]).all())
        ((16, 2), True, True)
    """
    ab = sobol_points(2 * k, samples, seed, scramble)
    a, b = ab[:, :k], ab[:, k:]
    c = np.repeat(a[None], k, axis=0)
    c[np.arange(k), :, np.arange(k)] = b.T
    return np.concatenate([a, b, c.reshape(k * samples, k)])


def jansen_total_indices(f_a: np.ndarray, f_c: np.ndarray) -> np.ndarray:
    """Total Sobol indices by the Jansen estimator: ``sum_n (f(A_n) - f(C_in))^2 / (2 N Var f(A))``.

    ``f_a`` (..., N) the scores of design ``A``, ``f_c`` (..., k, N) those of the
    ``C_i``; ``Var`` is the sample variance (ddof 1, floored at 1e-12), as
    Xplique's ``JansenEstimator`` (``sobol_estimators.py``; Jansen 1999).

    Example:
        >>> import numpy as np
        >>> a = np.array([0.0, 1.0, 2.0, 3.0])
        >>> jansen_total_indices(a, np.stack([a, a[::-1]])).round(4).tolist()
        [0.0, 1.5]
    """
    f_a = np.asarray(f_a, np.float64)
    n = f_a.shape[-1]
    variance = np.maximum(f_a.var(axis=-1, ddof=1) if n > 1 else np.zeros(f_a.shape[:-1]), EPS)
    squares = np.square(f_a[..., None, :] - np.asarray(f_c, np.float64)).sum(axis=-1)
    return squares / (2.0 * n * variance[..., None])


def hsic_scores(masks: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """HSIC between each binary feature mask and the scores, Xplique's ``BinaryEstimator``.

    Input kernel per feature ``1 + (0.5 - (z_n - z_m)^2)``, output kernel
    ``exp(-(y_n - y_m)^2 / (2 w^2))`` with ``w`` the median of the scores (Xplique's
    width, ``hsic_estimators.py``; when it is 0, the scores' standard deviation),
    and ``HSIC_j = sum_nm (H K_j H) * (H L H) / N`` with the centring matrix ``H``.
    With ``Lc = H L H`` (rows and columns summing to 0) this is ``2 z_j^T Lc z_j / N``:
    one matrix product for all features.

    Example:
        >>> import numpy as np
        >>> z = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], float)
        >>> s = hsic_scores(z, 1.0 + 2.0 * z[:, 0])   # the score follows feature 0 only
        >>> bool(s[0] > 0.1 and abs(s[1]) < 1e-12)
        True
    """
    z = np.asarray(masks, np.float64)
    y = np.asarray(outputs, np.float64)
    n = len(y)
    width = abs(float(np.median(y)))
    if width == 0.0:
        width = float(y.std())
    if width == 0.0:  # a constant score depends on no feature
        return np.zeros(z.shape[1])
    gram = np.exp(-np.square(y[:, None] - y[None, :]) / (2.0 * width**2))
    centred = gram - gram.mean(axis=0, keepdims=True) - gram.mean(axis=1, keepdims=True) + gram.mean()
    return 2.0 * np.einsum("nd,nm,md->d", z, centred, z) / n


class GlobalSensitivity(FeatureMaskMethod):
    """Base of :class:`Sobol` and :class:`HSIC`: the default grid mask, designs and their scoring.

    Args:
        grid_size: cells per side of the default mask on images (``mask=None``); tables and
            sequences get one feature per column / step.
        samples: the number of designs (Sobol: base designs ``N``; HSIC: masks).
        seed: seed of the scrambled Sobol sequence (``None``: fresh draws each call).
        perturbation: ``"inpainting"``: a feature becomes ``baseline + m (x - baseline)``
            (``baseline=0`` is Xplique's inpainting; ``baseline="blur"`` a blurred copy).
        mask, baseline, input_index: as every feature-mask method
            (:class:`~kerascope.methods.coalitions.FeatureMaskMethod`).
    """

    minimum_features = 1

    def __init__(
        self,
        model: keras.Layer,
        *,
        grid_size: int = 8,
        samples: int = 32,
        seed: int | None = 0,
        perturbation: str = "inpainting",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.grid_size = check_positive_int(grid_size, "grid_size")
        self.samples = check_positive_int(samples, "samples")
        self.seed = check_seed(seed)
        if perturbation not in PERTURBATIONS:
            raise ValueError(
                f"Unknown perturbation. Received: perturbation={perturbation!r}. Available: {list(PERTURBATIONS)}; "
                "for Xplique's 'blurring' pass baseline='blur'."
            )
        self.perturbation = perturbation

    def _plan(self, inputs: Inputs) -> Plan:
        mask = self.mask if self.mask is not None else self._default_mask
        plan = make_plan(inputs, self._positions(inputs), mask, self.baseline, self.blur_sigma)
        fewest = int(plan.features.min())
        if fewest <= self.minimum_features:
            raise ValueError(
                f"{type(self).__name__} compares the features of a mask; this input has {fewest} feature"
                f"{'s' if fewest != 1 else ''} (a model with one input feature, or a mask with one label). "
                "Received: mask giving features per sample "
                f"{plan.features.tolist()}. Pass a finer mask (e.g. a larger grid_size) or use Saliency / "
                "IntegratedGradients."
            )
        return plan

    def _default_mask(self, x: np.ndarray) -> np.ndarray:
        if x.ndim == 4 and np.issubdtype(x.dtype, np.floating):
            return grid_mask(x.shape[1:3], self.grid_size)
        return default_mask(x)

    def _designs(self, plan: Plan, make: Any) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Rows of every sample's design (one design per distinct feature count), owners and the designs."""
        width = int(plan.features.max())
        designs = {int(k): make(int(k)) for k in np.unique(plan.features)}
        blocks, owners = [], []
        for i, k in enumerate(plan.features):
            design = designs[int(k)]
            rows = np.ones((len(design), width), design.dtype)
            rows[:, :k] = design
            blocks.append(rows)
            owners.append(np.full(len(design), i))
        return np.concatenate(blocks), np.concatenate(owners), designs


@register
class Sobol(GlobalSensitivity):
    """Total Sobol indices of the features (Fel et al., 2021, "Look at the Variance!"; Xplique's ``SobolAttributionMethod``).

    Each feature ``j`` gets a weight ``m_j`` in ``[0, 1]`` and becomes
    ``baseline + m_j (x - baseline)``. Over random designs ``m``, the total
    index ``S_T,j = E[Var(f | m_~j)] / Var(f)`` is the share of the score's
    variance that involves feature ``j`` (its own effect and all its
    interactions). Estimated by Jansen's formula on a replicated design of
    ``samples`` base points ``A`` (and ``B``) from a scrambled Sobol sequence:
    ``S_T,j = sum_n (f(A_n) - f(C_jn))^2 / (2 N Var f(A))`` where ``C_j`` is ``A``
    with column ``j`` from ``B``. Designs are shared by all samples with the same
    number of features.

    Args:
        grid_size: cells per side of the default mask on images (default 8, as Xplique).
        samples: the number of base designs ``N``, a power of two (default 32, as Xplique).
        seed: seed of the scrambled Sobol sequence.
        perturbation, mask, baseline, input_index: see :class:`GlobalSensitivity`.

    Cost: ``N (k + 1)`` forward rows per sample for ``k`` features (the scores of
    ``A`` and of every ``C_j``; Xplique also scores ``B``, ``N (k + 2)``, which Jansen's
    estimator does not read), plus the clean pass. ``extras["feature_attributions"]``
    holds the indices per feature.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[1.0], [2.0], [0.0]])])
        >>> s = ks.Sobol(m, samples=1024).explain(np.ones((1, 3)), 0).attributions   # w^2 / sum w^2
        >>> np.round(s.astype(float), 2).tolist()
        [[0.2, 0.8, 0.0]]
    """

    name = "sobol"
    description = "Total Sobol indices of mask features by the Jansen estimator (Fel et al. 2021, Xplique)."
    aliases = ("sobol_attribution", "total_sobol")

    def __init__(self, model: keras.Layer, *, samples: int = 32, **kwargs: Any) -> None:
        super().__init__(model, samples=samples, **kwargs)
        if self.samples & (self.samples - 1) or self.samples < 2:
            raise ValueError(
                f"`samples` (the number of base designs of the Sobol sequence) must be a power of two >= 2, "
                f"as the sequence's balance needs. Received: samples={samples!r}. Use e.g. "
                f"{max(2, 1 << (self.samples - 1).bit_length())}."
            )

    def design(self, k: int) -> np.ndarray:
        """The replicated design ``(samples (k + 2), k)`` for ``k`` features (see :func:`sobol_design`).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> ks.Sobol(m, samples=4).design(3).shape
            (20, 3)
        """
        return sobol_design(k, self.samples, self.seed)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan = self._plan(inputs)
        for position in plan.index:
            if not np.issubdtype(inputs.arrays[position].dtype, np.floating):
                raise UnsupportedModelError(
                    f"Sobol interpolates features between the input and the baseline, so it needs float inputs. "
                    f"Received: input {position} of dtype {inputs.arrays[position].dtype} (integer ids). Use HSIC "
                    "(binary masks), KernelSHAP or FeatureAblation on token inputs."
                )
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        n = self.samples

        def scored_rows(k: int) -> np.ndarray:  # A and the C_j: B's scores are not needed
            design = self.design(k)
            return np.concatenate([design[:n], design[2 * n:]])

        rows, owners, _ = self._designs(plan, scored_rows)
        v = self._score(plan, rows, owners, targets, resolved)
        phi, start = [], 0
        for k in plan.features:
            block = v[start: start + n * (k + 1)]
            start += len(block)
            phi.append(jansen_total_indices(block[:n], block[n:].reshape(k, n)))
        return self._finish(inputs, plan, phi, scores, resolved)


@register
class HSIC(GlobalSensitivity):
    """HSIC attribution (Novello et al., 2022, "Making Sense of Dependence"; Xplique's ``HsicAttributionMethod``).

    ``samples`` binary masks (rounded scrambled Sobol points: each feature kept
    or set to the baseline with probability 1/2) are scored; each feature gets
    the Hilbert-Schmidt independence criterion between its mask and the score,
    with Xplique's default kernels (see :func:`hsic_scores`): high when the
    score depends on whether the feature is present, alone or with others.

    Args:
        grid_size: cells per side of the default mask on images (default 8, as Xplique).
        samples: the number of masks (default 512; Xplique's default is 500).
        seed, perturbation, mask, baseline, input_index: see :class:`GlobalSensitivity`.

    Cost: ``samples`` forward rows per sample, plus the clean pass; the estimator
    is ``O(samples^2 k)`` arithmetic.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[0.1], [3.0], [0.0]])])
        >>> int(np.argmax(ks.HSIC(m).explain(np.ones((1, 3)), 0).attributions))
        1
    """

    name = "hsic"
    description = "Hilbert-Schmidt independence between each feature's mask and the score (Novello et al. 2022)."
    aliases = ("hsic_attribution",)

    def __init__(self, model: keras.Layer, *, samples: int = 512, **kwargs: Any) -> None:
        super().__init__(model, samples=samples, **kwargs)
        if self.samples < 2:
            raise ValueError(f"`samples` must be at least 2 (HSIC compares masks). Received: samples={samples!r}.")

    def design(self, k: int) -> np.ndarray:
        """The binary masks ``(samples, k)`` for ``k`` features (rounded scrambled Sobol points).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> d = ks.HSIC(m, samples=8).design(3)
            >>> d.shape, d.dtype.name
            ((8, 3), 'bool')
        """
        return np.round(sobol_points(k, self.samples, self.seed)) > 0.5

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan = self._plan(inputs)
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        rows, owners, designs = self._designs(plan, self.design)
        v = self._score(plan, rows, owners, targets, resolved)
        phi, start = [], 0
        for k in plan.features:
            block = v[start: start + self.samples]
            start += self.samples
            phi.append(hsic_scores(designs[int(k)], block))
        return self._finish(inputs, plan, phi, scores, resolved)


__all__ = ["HSIC", "Sobol", "hsic_scores", "jansen_total_indices", "sobol_design", "sobol_points"]
