"""Model-agnostic attribution over feature masks: feature ablation, Shapley values, KernelSHAP, LIME.

Every method scores the model on coalitions of features (see
:mod:`kerascope.methods.feature_masks`): ``v(z)`` is the target score of the
input whose features with ``z_j = 0`` are replaced by the baseline. All
coalitions of all samples are rows of compiled forward passes in chunks of
``batch_size``, generated chunk by chunk (never the whole coalition matrix, see
:mod:`kerascope.methods._coalition_rows`); each sample's random draws come from its own
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
from kerascope.methods import _coalition_rows as streamed
from kerascope.methods._folding import forward_scores
from kerascope.methods.base import Method, check_number, check_positive_int, check_seed, subset_structure
from kerascope.methods.coalition_fits import (  # noqa: F401 - re-exported
    _bits,
    _design_size,
    _kernel_design,
    constrained_wls,
    exact_shapley,
    ridge,
    weighted_r2,
)
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
        explanation = self._result(inputs, maps, scores, resolved, **extras)
        explanation.attributions = subset_structure(inputs, plan.index, maps)
        return explanation


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
        owners, local = streamed.layout(features + 1)
        v = self._score(plan, streamed.ablation_rows(local, int(features.max())), owners, targets, resolved)
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
            rows = f"{2**k_max:,}" if k_max <= 64 else f"about 10^{int(k_max * math.log10(2))}"
            raise ValueError(
                f"ShapleyExact evaluates all 2^k coalitions; this mask has k={k_max:,} features "
                f"(2^{k_max} = {rows} forward rows per sample), more than max_features="
                f"{self.max_features}. Use a coarser mask (e.g. mask=ks.methods.feature_masks.segmentation("
                "'grid', cells=4)), ShapleySampling or KernelSHAP, or raise max_features."
            )
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        owners, local = streamed.layout(2**plan.features)
        v = self._score(plan, streamed.all_subsets_rows(local, k_max), owners, targets, resolved)
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
        plan, scores, resolved, draws = _seeded_setup(self, inputs, targets)
        features = plan.features
        width = int(features.max())
        # each feature's position in each random order (samples, width) per sample: the coalitions
        # (v(none), v(all), then the prefixes of length 1 .. k-1 of every order) are made from it chunk by chunk
        ranks = np.full((len(features), self.samples, width), width, np.int32)
        orders = []
        for i, k in enumerate(features):
            order = np.argsort(_sample_draws(self.seed, draws).random((self.samples, k)), axis=1)
            orders.append(order)
            ranks[i, np.arange(self.samples)[:, None], order] = np.arange(k)[None, :]
        owners, local = streamed.layout(2 + self.samples * (features - 1))
        v = self._score(plan, streamed.permutation_rows(owners, local, ranks, features), owners, targets, resolved)
        del ranks
        phi, base, start = [], [], 0
        for k, order in zip(features, orders, strict=True):
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


def _seeded_setup(method: Any, inputs: Inputs, targets: Any) -> tuple[Any, Any, Any, np.random.Generator]:
    """The mask plan, scores and targets of a sampling explainer, and its call's generator (``seed=None``:
    fresh draws for the whole call)."""
    plan, scores, resolved = method._setup(inputs, targets)
    return plan, scores, resolved, np.random.default_rng(method.seed)


def _sample_draws(seed: int | None, draws: np.random.Generator) -> np.random.Generator:
    """The generator of one sample's draws: from ``seed`` alone, so a sample's explanation does not depend on
    the other samples of its call or its position among them (``seed=None``: the call's fresh generator)."""
    return draws if seed is None else np.random.default_rng(seed)


_TOO_MANY = ("Use a coarser mask (e.g. mask='grid' or mask='slic'), fewer `samples`, or a method without a "
             "regression: ShapleySampling or FeatureAblation stream their coalitions in memory bounded by "
             "`batch_size`.")


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
        plan, scores, resolved, draws = _seeded_setup(self, inputs, targets)
        features = plan.features
        width = int(features.max())
        counts = [self.samples if self.samples is not None else 2 * int(k) + 2048 for k in features]
        sizes = np.array([_design_size(int(k), c) for k, c in zip(features, counts, strict=True)], np.int64)
        worst = int(np.argmax(sizes * features + 40 * features**2))
        streamed.check_fits("KernelSHAP", int(features[worst]), int(sizes[worst]) + 2, True, _TOO_MANY)
        phi, base, r2 = [], [], []
        for group in streamed.sample_groups(sizes * features):  # coalition designs of a few samples at a time
            designs = [_kernel_design(int(features[i]), counts[i], _sample_draws(self.seed, draws)) for i in group]
            owners, local = streamed.layout(sizes[group] + 2)
            rows_of = streamed.design_rows(owners, local, [z for z, _ in designs], 2, width)
            v = self._score(plan, rows_of, group[owners], targets, resolved)
            start = 0
            for k, (z, w) in zip(features[group], designs, strict=True):
                rows = v[start: start + len(z) + 2]
                start += len(rows)
                v0, total = rows[0], rows[1] - rows[0]
                if len(z) == 0:
                    coef = np.full(k, total)
                    fit = 1.0
                else:
                    coef = constrained_wls(z, rows[2:] - v0, w, total)
                    fit = weighted_r2(rows[2:], v0 + streamed.predict(z, coef), w)
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
        z = np.asarray(z)
        if len(z) * z.shape[1] > 2**21:  # a row's weight depends on that row only: in chunks of float64 rows
            step = max(1, 2**21 // z.shape[1])
            return np.concatenate([self.kernel(z[i: i + step]) for i in range(0, len(z), step)])
        z = z.astype(np.float64)
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
        plan, scores, resolved, draws = _seeded_setup(self, inputs, targets)
        features = plan.features
        width = int(features.max())
        streamed.check_fits("LIME", width, self.samples, True, _TOO_MANY)
        phi, intercepts, r2, local_prediction = [], [], [], []
        for group in streamed.sample_groups(self.samples * features):  # designs of a few samples at a time
            designs = []
            for k in features[group]:
                z = _sample_draws(self.seed, draws).integers(0, 2, size=(self.samples, k)).astype(bool)
                z[0] = True
                designs.append(z)
            owners, local = streamed.layout(np.full(len(group), self.samples))
            v = self._score(plan, streamed.design_rows(owners, local, designs, 0, width), group[owners], targets,
                            resolved)
            for i, z in enumerate(designs):
                y = v[i * self.samples: (i + 1) * self.samples]
                w = self.kernel(z)
                coef, intercept = ridge(z, y, w, self.alpha)
                phi.append(coef)
                intercepts.append(intercept)
                r2.append(weighted_r2(y, intercept + streamed.predict(z, coef), w))
                local_prediction.append(intercept + coef.sum())
        explanation = self._finish(
            inputs, plan, phi, scores, resolved, intercept=np.asarray(intercepts, np.float32),
            r2=np.asarray(r2, np.float32), local_prediction=np.asarray(local_prediction, np.float32),
        )
        explanation.extras["coefficients"] = explanation.extras["feature_attributions"]
        return explanation
