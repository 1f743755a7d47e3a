"""Model-agnostic attribution over feature masks: feature ablation, Shapley values, KernelSHAP, LIME.

Every method scores the model on coalitions of features (see
:mod:`kerascope.methods.feature_masks`): ``v(z)`` is the target score of the
input whose features with ``z_j = 0`` are replaced by the baseline. All
coalitions of all samples are rows of compiled forward passes in chunks of
``batch_size``; each sample's random draws come from its own
``numpy.random.default_rng(seed)``, so a sample's result depends neither on
``batch_size`` nor on the other samples of the call (alone or at any position
of a batch, the same map).

Conventions (as Captum): attributions have each perturbed input's shape and
every element carries the value of its feature; the per-feature values are in
``extras["feature_attributions"]`` (``(N, K)``, NaN-padded when per-sample
masks have different numbers of features), with ``extras["features"]`` (K per
sample) and ``extras["base_scores"]`` (``v`` of the empty coalition).
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.spatial import choose_input
from kerascope.methods._folding import forward_scores
from kerascope.methods.base import Method, check_number, check_positive_int, check_seed
from kerascope.methods.feature_masks import Plan, evaluate, make_plan, spread
from kerascope.methods.registry import register


class FeatureMaskMethod(Method):
    """Base of the feature-mask methods: ``mask``, ``baseline`` and ``input_index`` handling.

    Args:
        mask: the feature mask (see :mod:`kerascope.methods.feature_masks`), or a
            list of masks, one per perturbed input.
        baseline: what absent features become (a number, an array, ``"blur"``,
            ``"mean"``, a :class:`~kerascope.methods.feature_masks.Background`), or
            a list, one per perturbed input. Default 0 (the pad id for token inputs).
        input_index: which input(s) of a multi-input model to perturb: a position, an input name
            or a list of them (default: all).
        blur_sigma: the Gaussian's std in pixels for ``baseline="blur"``.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
        >>> ks.FeatureAblation(m, mask=np.array([0, 0, 1])).explain(np.ones((1, 3)), 0).attributions.tolist()
        [[2.0, 2.0, 1.0]]
    """

    def __init__(
        self,
        model: keras.Layer,
        *,
        mask: Any = None,
        baseline: Any = 0.0,
        input_index: int | list[int] | None = None,
        blur_sigma: float = 4.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.mask = mask
        self.baseline = baseline
        self.input_index = input_index
        self.blur_sigma = check_number(blur_sigma, "blur_sigma", low=0.0)

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (arrays are reported by their shape, callables by name).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> ks.FeatureAblation(m, mask=np.array([0, 0, 1])).params()["mask"]
            '<array shape=(3,)>'
        """
        params = super().params()
        for key in ("mask", "baseline"):
            params[key] = _describe(params[key])
        return params

    def _positions(self, inputs: Inputs) -> Any:
        """``input_index`` with input names replaced by positions (``None`` stays: every input)."""
        given = self.input_index
        if given is None:
            return None
        items = given if isinstance(given, (list, tuple)) else [given]
        positions = [choose_input(self.model, inputs, i) if isinstance(i, str) else i for i in items]
        return positions if isinstance(given, (list, tuple)) else positions[0]

    def _setup(self, inputs: Inputs, targets: Any) -> tuple[Plan, np.ndarray, np.ndarray]:
        plan = make_plan(inputs, self._positions(inputs), self.mask, self.baseline, self.blur_sigma)
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        return plan, scores, resolved

    def _score(self, plan: Plan, z: np.ndarray, owners: np.ndarray, targets: Any, resolved: np.ndarray) -> np.ndarray:
        return evaluate(
            self.engine, plan, z, owners, targets, resolved, self.batch_size, self.progress, type(self).__name__
        )

    def _finish(
        self, inputs: Inputs, plan: Plan, phi: list[np.ndarray], scores: np.ndarray, resolved: np.ndarray, **extras: Any
    ) -> Explanation:
        width = int(plan.features.max())
        values = np.full((len(phi), width), np.nan)
        for i, p in enumerate(phi):
            values[i, : len(p)] = p
        maps = spread(plan, values)
        extras = {
            "feature_attributions": values.astype(np.float32),
            "features": plan.features.copy(),
            "input_index": plan.index,
            **extras,
        }
        # before the maps become an Inputs (which refuses NaN as bad inputs, a wrong message for NaN scores)
        self._check_finite_result(maps, scores)
        if len(maps) == 1:
            return self._result(Inputs(maps[0]), maps, scores, resolved, **extras)
        return self._result(Inputs(list(maps)), maps, scores, resolved, **extras)


def _describe(value: Any) -> Any:
    if isinstance(value, list):
        return [_describe(v) for v in value]
    if isinstance(value, np.ndarray):
        return f"<array shape={value.shape}>"
    if callable(value):
        return getattr(value, "__name__", repr(value))
    if type(value).__name__ == "Background":
        return f"<background shape={np.shape(value.data)}>"
    return value


def _bits(k: int) -> np.ndarray:
    """All 2^k coalitions as rows (bit j of the row index = feature j present)."""
    codes = np.arange(2**k, dtype=np.int64)
    return ((codes[:, None] >> np.arange(k)) & 1).astype(bool)


def exact_shapley(values: np.ndarray, k: int) -> np.ndarray:
    """Shapley values from ``v`` on all ``2^k`` coalitions in :func:`_bits` order.

    ``phi_j = sum_{S not containing j} |S|! (k-|S|-1)! / k! (v(S + j) - v(S))``.

    Example:
        >>> import numpy as np
        >>> z = _bits(3); v = z @ np.array([1.0, 2.0, 3.0])   # additive game
        >>> exact_shapley(v, 3).round(12).tolist()
        [1.0, 2.0, 3.0]
    """
    z = _bits(k)
    size = z.sum(axis=1)
    weight = np.array([math.factorial(s) * math.factorial(k - s - 1) / math.factorial(k) for s in range(k)])
    with_j = weight[np.clip(size - 1, 0, k - 1)] * values  # v(S + j) counted with |S| = size - 1
    without_j = weight[np.clip(size, 0, k - 1)] * values
    return z.T.astype(np.float64) @ with_j - (~z).T.astype(np.float64) @ without_j


@register
class FeatureAblation(FeatureMaskMethod):
    """Feature ablation (Captum's ``FeatureAblation``): ``f(x) - f(x with feature j set to the baseline)``.

    Every element of feature ``j`` gets that score drop. With the default
    mask this is per-column ablation of tabular inputs / tokens, and a 4 x 4
    grid occlusion of images. See :class:`FeatureMaskMethod` for ``mask``,
    ``baseline`` and ``input_index``.

    Cost: one forward row per feature per sample, plus one.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[1.0], [2.0], [3.0], [4.0]])])
        >>> ks.FeatureAblation(m).explain(np.ones((1, 4)), 0).attributions.tolist()
        [[1.0, 2.0, 3.0, 4.0]]
    """

    name = "feature_ablation"
    description = "Score drop when each feature (mask group) is set to a baseline (Captum FeatureAblation)."
    aliases = ("ablation",)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan, scores, resolved = self._setup(inputs, targets)
        features = plan.features
        width = int(features.max())
        blocks, owners = [], []
        for i, k in enumerate(features):
            z = np.ones((k + 1, width), bool)
            z[np.arange(1, k + 1), np.arange(k)] = False
            blocks.append(z)
            owners.append(np.full(k + 1, i))
        v = self._score(plan, np.concatenate(blocks), np.concatenate(owners), targets, resolved)
        phi, start = [], 0
        for k in features:
            phi.append(v[start] - v[start + 1: start + 1 + k])
            start += k + 1
        return self._finish(inputs, plan, phi, scores, resolved)


@register
class ShapleyExact(FeatureMaskMethod):
    """Exact Shapley values of the features: the model scored on all ``2^k`` coalitions.

    ``phi_j = sum_S |S|! (k-|S|-1)! / k! (v(S + j) - v(S))`` where ``v(S)``
    keeps the features in ``S`` and sets the others to the baseline. Efficiency
    holds exactly: ``sum_j phi_j = v(all) - v(none)`` (``f(x) - f(baseline)``).

    Args:
        max_features: refuse masks with more features than this (cost ``2^k``
            rows per sample; 16 features = 65,536 rows).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
        >>> e = ks.ShapleyExact(m).explain(np.array([[1.0, 2.0, 3.0]]), 0)
        >>> np.round(e.attributions, 5).tolist()
        [[1.0, 2.0, 3.0]]
    """

    name = "shapley_exact"
    description = "Exact Shapley values of mask features over all 2^k coalitions."
    aliases = ("exact_shapley",)

    def __init__(self, model: keras.Layer, *, max_features: int = 16, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.max_features = check_positive_int(max_features, "max_features")

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan = make_plan(inputs, self._positions(inputs), self.mask, self.baseline, self.blur_sigma)
        k_max = int(plan.features.max())
        if k_max > self.max_features:
            raise ValueError(
                f"ShapleyExact evaluates all 2^k coalitions; this mask has k={k_max} features "
                f"(2^{k_max} = {2**k_max:,} forward rows per sample), more than max_features="
                f"{self.max_features}. Use a coarser mask (e.g. mask=ks.methods.feature_masks.segmentation("
                "'grid', cells=4)), ShapleySampling or KernelSHAP, or raise max_features."
            )
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        width = k_max
        blocks, owners = [], []
        for i, k in enumerate(plan.features):
            z = np.ones((2**k, width), bool)
            z[:, :k] = _bits(int(k))
            blocks.append(z)
            owners.append(np.full(2**k, i))
        v = self._score(plan, np.concatenate(blocks), np.concatenate(owners), targets, resolved)
        phi, base, start = [], [], 0
        for k in plan.features:
            values = v[start: start + 2**k]
            phi.append(exact_shapley(values, int(k)))
            base.append(values[0])
            start += 2**k
        return self._finish(inputs, plan, phi, scores, resolved, base_scores=np.asarray(base, np.float32))


@register
class ShapleySampling(FeatureMaskMethod):
    """Shapley values by permutation sampling (Captum's ``ShapleyValueSampling``; Castro et al. 2009).

    For each of ``samples`` random feature orders, features are added one at
    a time to the all-baseline input and each gets its marginal change of the
    score; the attributions are the means over orders. Efficiency
    (``sum_j phi_j = f(x) - f(baseline)``) holds exactly for any ``samples``.

    Args:
        samples: number of permutations per sample (Captum's ``n_samples``, default 25).
        seed: seed of the numpy generator (``None``: fresh draws each call).

    Cost: ``samples * (k - 1) + 2`` forward rows per sample.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
        >>> e = ks.ShapleySampling(m, samples=4).explain(np.array([[1.0, 2.0, 3.0]]), 0)
        >>> np.round(e.attributions, 5).tolist()
        [[1.0, 2.0, 3.0]]
    """

    name = "shapley_sampling"
    description = "Shapley values of mask features by permutation sampling (Captum ShapleyValueSampling)."
    aliases = ("shapley_value_sampling", "shapley")

    def __init__(self, model: keras.Layer, *, samples: int = 25, seed: int | None = 0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.samples = check_positive_int(samples, "samples")
        self.seed = check_seed(seed)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan, scores, resolved = self._setup(inputs, targets)
        draws = np.random.default_rng(self.seed)  # seed=None: fresh draws for the whole call
        width = int(plan.features.max())
        blocks, owners, orders = [], [], []
        for i, k in enumerate(plan.features):
            rng = _sample_draws(self.seed, draws)
            order = np.argsort(rng.random((self.samples, k)), axis=1)
            orders.append(order)
            # rows: v(none), v(all), then the prefixes of length 1 .. k-1 of every order
            z = np.ones((2 + self.samples * (k - 1), width), bool)
            z[0, :k] = False
            if k > 1:
                rank = np.empty_like(order)
                rank[np.arange(self.samples)[:, None], order] = np.arange(k)[None, :]
                lengths = np.arange(1, k)
                prefix = rank[:, None, :] < lengths[None, :, None]  # (samples, k-1, k)
                z[2:, :k] = prefix.reshape(-1, k)
            blocks.append(z)
            owners.append(np.full(len(z), i))
        v = self._score(plan, np.concatenate(blocks), np.concatenate(owners), targets, resolved)
        phi, base, start = [], [], 0
        for k, order in zip(plan.features, orders, strict=True):
            rows = v[start: start + 2 + self.samples * (k - 1)]
            start += len(rows)
            path = np.concatenate(
                [np.full((self.samples, 1), rows[0]), rows[2:].reshape(self.samples, k - 1), np.full((self.samples, 1), rows[1])],
                axis=1,
            )
            marginal = np.diff(path, axis=1)  # marginal[m, t] belongs to feature order[m, t]
            total = np.zeros(k)
            np.add.at(total, order.ravel(), marginal.ravel())
            phi.append(total / self.samples)
            base.append(rows[0])
        return self._finish(inputs, plan, phi, scores, resolved, base_scores=np.asarray(base, np.float32))


def _sample_draws(seed: int | None, draws: np.random.Generator) -> np.random.Generator:
    """The generator of one sample's draws: from ``seed`` alone, so a sample's explanation does not depend on
    the other samples of its call or its position among them (``seed=None``: the call's fresh generator)."""
    return draws if seed is None else np.random.default_rng(seed)


def _kernel_design(k: int, samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Coalitions (sizes 1..k-1) and their weights for KernelSHAP.

    All ``2^k - 2`` coalitions with the exact Shapley kernel weights when
    ``samples`` allows; otherwise sizes drawn with probability proportional to
    the kernel's total weight per size, ``(k-1) / (s (k-s))``, uniform subsets
    of that size, each paired with its complement (shap's paired sampling),
    all with weight 1.
    """
    if k < 2:
        return np.zeros((0, k), bool), np.zeros(0)
    if samples >= 2**k - 2:
        z = _bits(k)[1:-1]
        size = z.sum(axis=1)
        comb = np.array([math.comb(k, int(s)) for s in size], np.float64)
        return z, (k - 1) / (comb * size * (k - size))
    sizes = np.arange(1, k)
    p = (k - 1) / (sizes * (k - sizes))
    p /= p.sum()
    half = max(1, samples // 2)
    drawn = rng.choice(sizes, size=half, p=p)
    ranks = np.argsort(rng.random((half, k)), axis=1)
    z = ranks < drawn[:, None]
    z = np.concatenate([z, ~z])[:samples] if samples >= 2 else z
    return z, np.ones(len(z))


def constrained_wls(z: np.ndarray, y: np.ndarray, w: np.ndarray, total: float) -> np.ndarray:
    """``argmin_phi sum_i w_i (y_i - z_i . phi)^2`` subject to ``sum(phi) = total`` (KKT system, closed form).

    Example:
        >>> import numpy as np
        >>> z = np.array([[1, 0], [0, 1], [1, 1]], float)
        >>> constrained_wls(z, z @ np.array([2.0, 3.0]), np.ones(3), 5.0).round(6).tolist()
        [2.0, 3.0]
    """
    k = z.shape[1]
    zw = z.T * w
    system = np.zeros((k + 1, k + 1))
    system[:k, :k] = zw @ z
    system[:k, k] = system[k, :k] = 1.0
    rhs = np.concatenate([zw @ y, [total]])
    solution = np.linalg.lstsq(system, rhs, rcond=None)[0]
    return solution[:k]


def weighted_r2(y: np.ndarray, prediction: np.ndarray, w: np.ndarray) -> float:
    """``1 - sum w (y - prediction)^2 / sum w (y - mean_w(y))^2`` (sklearn's ``score`` with sample weights).

    Example:
        >>> import numpy as np
        >>> weighted_r2(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]), np.ones(3))
        1.0
    """
    mean = np.sum(w * y) / np.sum(w)
    total = np.sum(w * (y - mean) ** 2)
    residual = np.sum(w * (y - prediction) ** 2)
    if total <= 0:
        return 1.0 if residual <= 1e-12 * max(1.0, float(np.sum(w * y * y))) else 0.0
    return float(1.0 - residual / total)


@register
class KernelSHAP(FeatureMaskMethod):
    """Kernel SHAP (Lundberg & Lee, 2017): Shapley values as a weighted linear regression over coalitions.

    Coalitions ``z`` get the Shapley kernel weight
    ``(k-1) / (C(k, |z|) |z| (k-|z|))``; the linear model
    ``v(z) = v(none) + z . phi`` is fitted by weighted least squares subject to
    the efficiency constraint ``sum(phi) = f(x) - f(baseline)``, solved in
    closed form (no iterative solver). When ``samples >= 2^k - 2`` every
    coalition is enumerated and the result is the exact Shapley values;
    otherwise coalition sizes are drawn in proportion to the kernel and each
    drawn coalition is paired with its complement (as shap does).

    Args:
        samples: coalitions per sample (default ``2k + 2048``, shap's ``"auto"``).
        seed: seed of the numpy generator.

    ``extras``: ``coefficients`` (``(N, K)``, = the attributions per feature),
    ``intercept`` (``v(none)``), ``r2`` (weighted R^2 of the fit).

    Cost: ``samples + 2`` forward rows per sample (times the background size).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
        >>> e = ks.KernelSHAP(m, samples=6).explain(np.array([[1.0, 2.0, 3.0]]), 0)
        >>> np.round(e.attributions, 5).tolist(), round(float(e.extras["r2"][0]), 5)
        ([[1.0, 2.0, 3.0]], 1.0)
    """

    name = "kernel_shap"
    description = "Shapley values by the Shapley-kernel weighted regression over coalitions (Lundberg & Lee 2017)."
    aliases = ("kernelshap",)

    def __init__(self, model: keras.Layer, *, samples: int | None = None, seed: int | None = 0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.samples = None if samples is None else check_positive_int(samples, "samples")
        self.seed = check_seed(seed)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan, scores, resolved = self._setup(inputs, targets)
        draws = np.random.default_rng(self.seed)  # seed=None: fresh draws for the whole call
        width = int(plan.features.max())
        blocks, owners, designs = [], [], []
        for i, k in enumerate(plan.features):
            rng = _sample_draws(self.seed, draws)
            count = self.samples if self.samples is not None else 2 * int(k) + 2048
            z, w = _kernel_design(int(k), count, rng)
            designs.append((z, w))
            rows = np.ones((len(z) + 2, width), bool)
            rows[0, :k] = False
            rows[2:, :k] = z
            blocks.append(rows)
            owners.append(np.full(len(rows), i))
        v = self._score(plan, np.concatenate(blocks), np.concatenate(owners), targets, resolved)
        phi, base, r2, start = [], [], [], 0
        for k, (z, w) in zip(plan.features, designs, strict=True):
            rows = v[start: start + len(z) + 2]
            start += len(rows)
            v0, total = rows[0], rows[1] - rows[0]
            if len(z) == 0:
                coef = np.full(k, total)
                fit = 1.0
            else:
                zf = z.astype(np.float64)
                coef = constrained_wls(zf, rows[2:] - v0, w, total)
                fit = weighted_r2(rows[2:], v0 + zf @ coef, w)
            phi.append(coef)
            base.append(v0)
            r2.append(fit)
        base_scores = np.asarray(base, np.float32)
        explanation = self._finish(
            inputs, plan, phi, scores, resolved, base_scores=base_scores, intercept=base_scores,
            r2=np.asarray(r2, np.float32),
        )
        explanation.extras["coefficients"] = explanation.extras["feature_attributions"]
        return explanation


@register
class LIME(FeatureMaskMethod):
    """LIME (Ribeiro et al., 2016) over mask features, as the ``lime`` package explains images.

    ``samples`` binary coalitions (the first all ones, the others each feature
    kept with probability 1/2: ``lime_image``'s sampling) are scored; each gets
    the weight ``sqrt(exp(-d^2 / kernel_width^2))`` of its distance ``d`` to the
    all-ones vector (cosine by default, or ``"euclidean"``); a ridge regression
    with intercept (``alpha``, sklearn's ``Ridge``) is fitted to the scores with
    those weights, in closed form. Its coefficients are the attributions.

    Args:
        samples: coalitions per sample, including the unperturbed one (lime's ``num_samples``).
        kernel_width: default 0.25 for cosine (``lime_image``), ``0.75 sqrt(k)`` for euclidean
            (``lime_tabular``).
        distance: ``"cosine"`` or ``"euclidean"`` (``"l2"``).
        alpha: ridge penalty (lime's default ``Ridge(alpha=1)``; 0 = weighted least squares).
        seed: seed of the numpy generator.

    ``extras``: ``coefficients`` (``(N, K)``), ``intercept``, ``r2`` (weighted R^2,
    lime's ``score``), ``local_prediction`` (the surrogate at the input).

    Cost: ``samples`` forward rows per sample.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
        >>> e = ks.LIME(m, samples=64, alpha=0.0).explain(np.array([[1.0, 2.0, 3.0]]), 0)
        >>> np.round(e.attributions, 4).tolist()
        [[1.0, 2.0, 3.0]]
    """

    name = "lime"
    description = "Weighted ridge surrogate over random coalitions of mask features (Ribeiro et al. 2016)."
    aliases = ()

    def __init__(
        self,
        model: keras.Layer,
        *,
        samples: int = 1000,
        kernel_width: float | None = None,
        distance: str = "cosine",
        alpha: float = 1.0,
        seed: int | None = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        if distance not in ("cosine", "euclidean", "l2"):
            raise ValueError(f"Unknown distance. Received: distance={distance!r}. Expected 'cosine' or 'euclidean'.")
        self.samples = check_positive_int(samples, "samples")
        self.kernel_width = None if kernel_width is None else check_number(kernel_width, "kernel_width", low=0.0,
                                                                           low_inclusive=False)
        self.distance = distance
        self.alpha = check_number(alpha, "alpha", low=0.0)
        self.seed = check_seed(seed)

    def kernel(self, z: np.ndarray) -> np.ndarray:
        """Sample weights of coalitions ``z`` (rows), lime's ``sqrt(exp(-d^2 / width^2))``.

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.LIME(m).kernel(np.array([[1, 1], [1, 0], [0, 0]])).round(4).tolist()
            [1.0, 0.5034, 0.0003]
        """
        z = np.asarray(z, np.float64)
        k = z.shape[1]
        if self.distance == "cosine":
            norms = np.linalg.norm(z, axis=1) * math.sqrt(k)
            similarity = np.divide(z.sum(axis=1), norms, out=np.zeros(len(z)), where=norms > 0)
            d = 1.0 - similarity
            width = 0.25 if self.kernel_width is None else float(self.kernel_width)
        else:
            d = np.linalg.norm(z - 1.0, axis=1)
            width = 0.75 * math.sqrt(k) if self.kernel_width is None else float(self.kernel_width)
        return np.sqrt(np.exp(-(d**2) / width**2))

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        plan, scores, resolved = self._setup(inputs, targets)
        draws = np.random.default_rng(self.seed)  # seed=None: fresh draws for the whole call
        width = int(plan.features.max())
        blocks, owners, designs = [], [], []
        for i, k in enumerate(plan.features):
            rng = _sample_draws(self.seed, draws)
            z = rng.integers(0, 2, size=(self.samples, k)).astype(bool)
            z[0] = True
            designs.append(z)
            rows = np.ones((self.samples, width), bool)
            rows[:, :k] = z
            blocks.append(rows)
            owners.append(np.full(self.samples, i))
        v = self._score(plan, np.concatenate(blocks), np.concatenate(owners), targets, resolved)
        phi, intercepts, r2, local, start = [], [], [], [], 0
        for z in designs:
            y = v[start: start + len(z)]
            start += len(z)
            coef, intercept = ridge(z.astype(np.float64), y, self.kernel(z), self.alpha)
            phi.append(coef)
            intercepts.append(intercept)
            prediction = intercept + z @ coef
            r2.append(weighted_r2(y, prediction, self.kernel(z)))
            local.append(intercept + coef.sum())
        explanation = self._finish(
            inputs, plan, phi, scores, resolved, intercept=np.asarray(intercepts, np.float32),
            r2=np.asarray(r2, np.float32), local_prediction=np.asarray(local, np.float32),
        )
        explanation.extras["coefficients"] = explanation.extras["feature_attributions"]
        return explanation


def ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Weighted ridge regression with an unpenalised intercept (sklearn ``Ridge`` with ``sample_weight``).

    Example:
        >>> import numpy as np
        >>> x = np.array([[0.0], [1.0], [2.0]])
        >>> coef, b = ridge(x, 2 * x[:, 0] + 1, np.ones(3), 0.0)
        >>> coef.round(6).tolist(), round(b, 6)
        ([2.0], 1.0)
    """
    w = np.asarray(w, np.float64)
    total = w.sum()
    x_mean = (w @ x) / total
    y_mean = float(w @ y) / total
    xc, yc = x - x_mean, y - y_mean
    gram = (xc.T * w) @ xc + alpha * np.eye(x.shape[1])
    coef = np.linalg.lstsq(gram, (xc.T * w) @ yc, rcond=None)[0]
    return coef, float(y_mean - x_mean @ coef)
