"""Path methods: Integrated Gradients and Expected Gradients (GradientSHAP).

Both average ``(x - b) * grad f(b + alpha (x - b))`` over path points: IG over
a deterministic quadrature rule on ``alpha in [0, 1]`` with one baseline,
Expected Gradients over random baselines from a background set and random
``alpha``. Path points are folded into the batch axis and built ``batch_size``
rows at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kerascope.core import targets as targets_lib
from kerascope.core.engine import check_finite
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.rows import REFERENCE, rows_of
from kerascope.methods import _layer
from kerascope.methods._convergence import (
    NESTED_RULES,
    check_tolerance,
    estimate,
    grid_points,
    level_nodes,
    pair_chunk_rows,
    pair_rows,
    pair_samples,
    relative_change,
    run_pairs,
    warn_not_converged,
)
from kerascope.methods._folding import Stream, clean_scores, forward_scores, reduce_rows
from kerascope.methods.base import check_number, check_seed
from kerascope.methods.paths import (  # noqa: F401  (also imported from here by other methods)
    QUADRATURES,
    PathMethod,
    _chosen_baselines,
    _describe_baseline,
    _numeric_baseline,
    _substitute,
    quadrature,
    resolve_baselines,
)
from kerascope.methods.registry import register
from kerascope.numeric.blur import gaussian_blur  # noqa: F401  (imported from here by feature masks and tests)

_FIRST_LEVEL = 3  # tolerance=: the first batch is the grid of 2**3 intervals (7 open / 9 closed points)


@register
class IntegratedGradients(PathMethod):
    """Integrated Gradients (Sundararajan et al., 2017).

    ``(x - b) * integral_0^1 grad f(b + alpha (x - b)) d alpha``, the integral
    computed with ``steps`` points of the quadrature ``method`` (see
    :func:`quadrature`; Captum's default is also ``"gausslegendre"``).

    Args:
        steps: path points per input.
        method: ``"gausslegendre"``, ``"riemann_left"``, ``"riemann_right"``,
            ``"riemann_middle"`` or ``"riemann_trapezoid"``.
        baseline: ``None``/``"zeros"`` (default), a number, ``"blur"`` (the
            input blurred with a Gaussian of std ``blur_sigma`` pixels) or an
            array (one sample's shape, or the batch's).
        blur_sigma: standard deviation for ``baseline="blur"``.
        layer: attribute at this layer's output instead of the inputs: the path
            runs from the baseline *activation* to the layer's activation, with
            the layer's output replaced by each path point; attributions have
            the layer's shape and completeness holds at the layer
            (``sum = f(x) - f(baseline at the layer)``). The baseline at a layer
            is zeros (default), a number, an activation array, or model inputs
            run through the model (``baseline=np.zeros_like(tokens)``: the
            pad-token embedding). See
            :meth:`~kerascope.core.explanation.Explanation.per_position` for
            per-token maps.

        tolerance: choose the number of path points per sample: the path is
            evaluated on nested dyadic grids (``method`` ``"open_trapezoid"``, the
            default then, or ``"riemann_trapezoid"``), doubling the points and
            reusing every pass already run, until the relative completeness
            error ``|sum(attr) - (f(x) - f(b))| / |f(x) - f(b)|`` and the relative
            L2 change of the map from the previous grid are both ``<= tolerance``
            (first check at 7 / 9 points). ``extras["steps"]`` records the points
            used per sample, ``extras["estimated_error"]`` the larger of the two.
        max_steps: the most path points with ``tolerance=`` (a ``RuntimeWarning``
            names the samples that did not converge within it).

    ``Explanation.extras`` holds ``completeness_error`` (per sample,
    ``sum(attributions) - (f(x) - f(baseline))``, summed over the attributed
    inputs; on a multi-input model the others keep their values in
    ``f(baseline)``) and ``baseline_scores``. ``input_index=`` chooses the
    attributed input(s) of a multi-input model (see
    :class:`~kerascope.methods.gradients.LayerMethod`); a list / dict
    ``baseline`` with one entry per model input is narrowed to them. Cost: ``steps`` forward+backward passes
    per input plus a forward pass at the input and one at the baseline, each
    skipped when the quadrature already evaluates that end of the path
    (``riemann_trapezoid`` both, ``riemann_left`` / ``riemann_right`` one;
    the input's pass is still needed to find the predicted class when
    ``targets`` is None).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[2.0], [-3.0]])])
        >>> e = ks.IntegratedGradients(m, steps=4).explain(np.array([[1.0, 2.0]]), 0)
        >>> e.attributions.tolist(), abs(float(e.extras["completeness_error"][0])) < 1e-5
        ([[2.0, -6.0]], True)
    """

    name = "integrated_gradients"
    description = "Integral of gradients along a straight path from a baseline (Sundararajan et al. 2017)."
    aliases = ("integratedgradients", "ig")

    def __init__(
        self,
        model: keras.Layer,
        *,
        steps: int = 50,
        method: str | None = None,
        baseline: Any = None,
        blur_sigma: float = 4.0,
        tolerance: float | None = None,
        max_steps: int = 1023,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        check_tolerance(tolerance, max_steps, "max_steps")
        if method is None:
            method = "gausslegendre" if tolerance is None else "open_trapezoid"
        quadrature(steps, method)  # validate early
        check_number(blur_sigma, "blur_sigma", low=0.0)
        if tolerance is not None and method not in NESTED_RULES:
            raise ValueError(
                "`tolerance=` doubles the path points on nested grids, which this quadrature does not "
                f"have. Received: method={method!r}, tolerance={tolerance!r}. Use method=None (the "
                f"default, 'open_trapezoid') or one of {NESTED_RULES}."
            )
        if tolerance is not None and max_steps < grid_points(_FIRST_LEVEL, method == "riemann_trapezoid"):
            raise ValueError(
                f"With tolerance=, `max_steps` must allow the first grid of "
                f"{grid_points(_FIRST_LEVEL, method == 'riemann_trapezoid')} path points. "
                f"Received: max_steps={max_steps}."
            )
        self.steps = steps
        self.method = method
        self.baseline = baseline
        self.blur_sigma = blur_sigma
        self.tolerance = None if tolerance is None else float(tolerance)
        self.max_steps = max_steps

    def _baselines(self, inputs: Inputs, values: np.ndarray | None) -> list[np.ndarray]:
        if values is None:
            wrt = self.attributed_inputs(inputs)
            chosen = Inputs([inputs.arrays[i] for i in wrt])
            return resolve_baselines(_chosen_baselines(self.baseline, inputs, wrt), chosen, self.blur_sigma)
        return [_layer.baseline_values(self.baseline, self.engine, inputs, self._layer, values, self.batch_size)]

    def _end_scores(
        self, inputs: Inputs, targets: Any, values: np.ndarray | None, at_baseline: list[np.ndarray] | None = None,
        resolved: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """f at the inputs (``at_baseline=None``) or at the baselines, and the resolved targets."""
        if at_baseline is None:
            if values is None:
                return forward_scores(self.engine, inputs, targets, self.batch_size)
            return self._layer_scores(inputs, targets, values)
        targets = targets if callable(targets) else resolved
        with rows_of(np.full(inputs.num_samples, REFERENCE)):  # these rows are the baselines
            if values is None:
                arg = Inputs(inputs.model_arg(
                    _substitute(inputs, np.arange(inputs.num_samples), self.attributed_inputs(inputs), at_baseline)))
                found = forward_scores(self.engine, arg, targets, self.batch_size)
            else:
                found = self._layer_scores(inputs, targets, at_baseline[0])
            # a forward pass checks nothing: a NaN f(baseline) would leave NaN completeness errors (and with
            # tolerance= run every sample to max_steps) without a word
            check_finite(found[0], "the model's scores at the baselines", "Check the baseline and the model's weights.")
        return found

    def _run(self, inputs: Inputs, targets: Any, values: np.ndarray | None) -> Explanation:
        """IG at the inputs (``values=None``) or at the layer, ending at its activation ``values``."""
        if self.tolerance is not None:
            return self._run_to_tolerance(inputs, targets, values)
        alphas, weights = quadrature(self.steps, self.method)
        baselines = self._baselines(inputs, values)
        n = inputs.num_samples
        # Path points at alpha = 1 (the input) and alpha = 0 (the baseline) already give f(x) and
        # f(baseline) in the gradient pass: no forward pass is spent on them (riemann_trapezoid has
        # both, riemann_left / right one). The predicted class (targets=None) needs f(x) first.
        at_input = np.flatnonzero(alphas == 1.0)
        at_baseline = np.flatnonzero(alphas == 0.0)
        if targets is None or not len(at_input):
            scores, resolved = self._end_scores(inputs, targets, values)
        else:
            scores, resolved = None, targets_lib.encode(targets, n)[0].astype(np.int64)
        row_scores = np.zeros((n, self.steps), np.float32)

        def path_rows(rows: np.ndarray) -> Any:
            owners, steps = rows // self.steps, rows % self.steps
            return owners, weights[steps], [b[owners] for b in baselines], alphas[steps]

        attributions = self._integrate(inputs, targets, resolved, self.steps, path_rows, row_scores, values)
        if scores is None:
            scores = row_scores[:, at_input[0]]
        if len(at_baseline):
            base_scores = row_scores[:, at_baseline[0]]
        else:
            base_scores, _ = self._end_scores(inputs, targets, values, baselines, resolved)
        total = sum(a.reshape(len(a), -1).astype(np.float64).sum(axis=1) for a in attributions)
        error = (total - (scores.astype(np.float64) - base_scores)).astype(np.float32)
        if values is not None:
            return self._layer_result(
                inputs, attributions[0], scores, resolved, completeness_error=error, baseline_scores=base_scores
            )
        return self._input_result(
            inputs, self.attributed_inputs(inputs), attributions, scores, resolved, completeness_error=error,
            baseline_scores=base_scores,
        )

    def _run_to_tolerance(self, inputs: Inputs, targets: Any, values: np.ndarray | None) -> Explanation:
        """Double the path points on nested dyadic grids until every sample meets ``tolerance``.

        Per sample, after each level ``k >= 2``: the relative completeness error
        ``|sum(attr) - (f(x) - f(b))| / |f(x) - f(b)|`` and the relative L2 change of the map
        from level ``k - 1`` must both be ``<= tolerance``; converged samples get no more rows.
        """
        closed = self.method == "riemann_trapezoid"
        baselines = self._baselines(inputs, values)
        ends = self._ends(inputs, values)
        n = inputs.num_samples
        if closed and targets is not None:  # f(x) and f(b) come from the alpha = 1 and 0 rows
            scores = np.zeros(n)
            resolved = targets_lib.encode(targets, n)[0].astype(np.int64)
        else:
            scores, resolved = self._end_scores(inputs, targets, values)
            scores = scores.astype(np.float64)
        if closed:  # f(b) from the alpha = 0 rows
            base_scores = np.zeros(n)
        else:
            base_scores = self._end_scores(inputs, targets, values, baselines, resolved)[0].astype(np.float64)
        zeros = [np.zeros(a.shape, np.float64) for a in ends]
        interior, boundary = [z.copy() for z in zeros], [z.copy() for z in zeros]  # boundary: alpha 0 and 1
        current: list[np.ndarray] = [z.copy() for z in zeros]
        steps_used = np.zeros(n, np.int64)
        comp_error, change = np.full(n, np.inf), np.full(n, np.inf)
        active = np.arange(n)
        top = max(k for k in range(_FIRST_LEVEL, 31) if grid_points(k, closed) <= self.max_steps)
        batch_levels = list(range(0 if closed else 1, _FIRST_LEVEL + 1))
        while len(active):
            nodes = [level_nodes(k, closed) for k in batch_levels]
            alphas = np.concatenate([a for a, _ in nodes])
            level_of = np.concatenate([np.full(len(a), k) for k, (a, _) in zip(batch_levels, nodes, strict=True)])
            near_end = np.concatenate([near for _, near in nodes])
            per = len(alphas)
            level_sums = {k: [z[active].copy() for z in zeros] for k in batch_levels}
            near_sums = {k: [z[active].copy() for z in zeros] for k in batch_levels}
            slot = np.full(n, -1)
            slot[active] = np.arange(len(active))

            def path_rows(rows: np.ndarray, active: np.ndarray = active, per: int = per,
                          alphas: np.ndarray = alphas) -> Any:
                owners = active[rows // per]
                return owners, None, [b[owners] for b in baselines], alphas[rows % per]

            for rows, owners, _, products, row_scores in self._path_chunks(
                inputs, targets, resolved, len(active) * per, path_rows, values
            ):
                node = rows % per
                where = slot[owners]
                ones = np.ones(len(rows))
                for k in batch_levels:
                    at = level_of[node] == k
                    if not at.any():
                        continue
                    if k == 0:  # alpha 0 and 1: the boundary sum, and f(b), f(x) when closed
                        for total, product in zip(boundary, products, strict=True):
                            reduce_rows(total, owners[at], ones[at], product[at])
                        is_one, is_zero = at & (alphas[node] == 1.0), at & (alphas[node] == 0.0)
                        if targets is not None:
                            scores[owners[is_one]] = row_scores[is_one]
                        base_scores[owners[is_zero]] = row_scores[is_zero]
                        continue
                    near = at & near_end[node]
                    for total, product in zip(level_sums[k], products, strict=True):
                        reduce_rows(total, where[at], ones[at], product[at])
                    for total, product in zip(near_sums[k], products, strict=True):
                        if near.any():
                            reduce_rows(total, where[near], ones[near], product[near])
            delta = scores - base_scores
            for k in batch_levels:
                if k == 0:
                    continue
                previous = [c[active].copy() for c in current]
                for i, total in enumerate(interior):
                    total[active] += level_sums[k][i]
                    current[i][active] = estimate(
                        k, closed, total[active], near_sums[k][i], boundary[i][active] if closed else None
                    )
                steps_used[active] = grid_points(k, closed)
                if k < 2:
                    continue
                now = [c[active] for c in current]
                change[active] = relative_change(now, previous)
                total = sum(c.reshape(len(c), -1).sum(axis=1) for c in now)
                gap = np.abs(delta[active])
                comp_error[active] = np.abs(total - delta[active]) / np.where(gap > 0, gap, 1.0)
                comp_error[active[(gap == 0) & (total == 0)]] = 0.0
            done = (comp_error[active] <= self.tolerance) & (change[active] <= self.tolerance)
            active = active[~done]
            level = batch_levels[-1] + 1
            if level > top:
                break
            batch_levels = [level]
        if len(active):
            warn_not_converged(
                type(self).__name__, self.tolerance, "max_steps", self.max_steps,
                np.maximum(comp_error, change), "completeness error / map change",
            )
        attributions = [c.astype(np.float32) for c in current]
        total = sum(a.reshape(n, -1).astype(np.float64).sum(axis=1) for a in attributions)
        extras = {
            "completeness_error": (total - delta).astype(np.float32),
            "baseline_scores": base_scores.astype(np.float32),
            "steps": steps_used,
            "estimated_error": np.maximum(comp_error, change).astype(np.float32),
        }
        if values is not None:
            return self._layer_result(inputs, attributions[0], scores.astype(np.float32), resolved, **extras)
        return self._input_result(inputs, self.attributed_inputs(inputs), attributions, scores.astype(np.float32), resolved, **extras)

    def _layer_scores(self, inputs: Inputs, targets: Any, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scores with the layer's output replaced by ``values`` (and the resolved targets)."""
        result = self.engine.gradients(
            inputs, targets, layers=[self._layer], wrt_inputs=False, replace=[values], batch_size=self.batch_size
        )
        return result.scores.astype(np.float64), result.targets


@register
class ExpectedGradients(PathMethod):
    """Expected Gradients / GradientSHAP (Erion et al. 2021; Lundberg & Lee 2017).

    The expectation over baselines ``b`` drawn uniformly from a background set
    and ``alpha ~ U(0, 1)`` of ``(x - b) * grad f(b + alpha (x - b))``,
    estimated with ``samples`` draws per input. The draws depend only on
    ``seed`` (and are shared by all inputs of a batch), so results do not
    depend on batching. Captum's ``GradientShap`` with ``stdevs=0`` computes
    the same estimator.

    Args:
        samples: draws (baseline, alpha) per input (default 50; with ``tolerance=``, the first round, default 32).
        baseline: background array ``(M, ...)`` (for multi-input models a
            list / dict of them with the same ``M``, one per model input or per
            input chosen with ``input_index=``); default: one all-zeros
            baseline. With ``layer=``: activations ``(M, *layer_shape)`` or
            model inputs ``(M, ...)`` (e.g. token ids) whose activations are used.
        layer: attribute at this layer's output (see :class:`IntegratedGradients`).
        seed: seed of the numpy generator (``None``: fresh draws each call).
        tolerance: draw in antithetic pairs ``(b, alpha)``, ``(b, 1 - alpha)``, in
            rounds (the first of ``samples``, default 32, then sized from the error
            so far), until the estimated ``1 - rho`` (``rho``: Pearson correlation
            with the exact map) is ``<= tolerance`` for every sample (see
            :class:`~kerascope.methods.smoothing.NoiseWrapper`); ``extras["samples"]``
            and ``extras["estimated_error"]`` record it per sample.
        max_samples: the most draws per input with ``tolerance=``.

    Cost: ``samples`` forward+backward passes per input plus one forward pass (none with ``scores=False``
    and given targets).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[2.0], [-3.0]])])
        >>> bg = np.array([[1.0, 1.0], [1.0, 1.0]])
        >>> ks.ExpectedGradients(m, samples=4, baseline=bg).explain(np.array([[2.0, 2.0]]), 0).attributions.tolist()
        [[2.0, -3.0]]
    """

    name = "expected_gradients"
    description = "Gradients x (input - baseline) averaged over random background baselines and path points (Erion et al. 2021)."
    aliases = ("expectedgradients", "gradient_shap", "gradientshap")

    def __init__(
        self,
        model: keras.Layer,
        *,
        samples: int | None = None,
        baseline: Any = None,
        seed: int | None = 0,
        tolerance: float | None = None,
        max_samples: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.samples = pair_samples(samples, tolerance, max_samples)
        self.baseline = baseline
        self.seed = check_seed(seed)
        self.tolerance = None if tolerance is None else float(tolerance)
        self.max_samples = max_samples

    def _background(self, inputs: Inputs, wrt: list[int] | None = None) -> list[np.ndarray]:
        """One background array per attributed input (``wrt``; default: every input)."""
        wrt = list(range(len(inputs.arrays))) if wrt is None else wrt
        chosen = Inputs([inputs.arrays[i] for i in wrt])
        if self.baseline is None:
            return [np.zeros((1, *a.shape[1:]), np.float32) for a in chosen.arrays]
        given = _chosen_baselines(self.baseline, inputs, wrt)
        inputs = chosen
        if not (isinstance(given, (list, tuple)) and len(inputs.arrays) > 1):
            given = [given]
        background = [_numeric_baseline(b) for b in given]
        if len(background) != len(inputs.arrays):
            raise ValueError(
                f"Expected one `baseline` (background array) per model input ({len(inputs.arrays)}). "
                f"Received: baseline with {len(background)}."
            )
        for b, x in zip(background, inputs.arrays, strict=True):
            if b.shape[1:] != x.shape[1:] or len(b) == 0:
                raise ValueError(
                    "The background must be an array of baselines (M, ...) with the inputs' sample "
                    f"shape {x.shape[1:]}. Received: baseline with shape {b.shape}."
                )
        if len({len(b) for b in background}) != 1:
            raise ValueError(
                f"All background arrays need the same count. Received: {[len(b) for b in background]}."
            )
        return background

    def _run(self, inputs: Inputs, targets: Any, values: np.ndarray | None) -> Explanation:
        """At the inputs (``values=None``) or at the layer: the background is then activations."""
        if values is None:
            background = self._background(inputs, self.attributed_inputs(inputs))
        else:
            background = [_layer.baseline_values(
                self.baseline, self.engine, inputs, self._layer, values, self.batch_size, background=True)]
        if self.tolerance is not None:
            return self._run_to_tolerance(inputs, targets, values, background)
        rng = np.random.default_rng(self.seed)
        choice = rng.integers(0, len(background[0]), size=self.samples)
        alphas = rng.uniform(0.0, 1.0, size=self.samples)
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)

        def path_rows(rows: np.ndarray) -> Any:
            owners, draws = rows // self.samples, rows % self.samples
            weights = np.full(len(rows), 1.0 / self.samples)
            return owners, weights, [b[choice[draws]] for b in background], alphas[draws]

        attributions = self._integrate(inputs, targets, resolved, self.samples, path_rows, values=values)
        if values is not None:
            return self._layer_result(
                inputs, attributions[0], scores, resolved, baseline_indices=choice, alphas=alphas
            )
        return self._input_result(
            inputs, self.attributed_inputs(inputs), attributions, scores, resolved, baseline_indices=choice, alphas=alphas
        )

    def _run_to_tolerance(
        self, inputs: Inputs, targets: Any, values: np.ndarray | None, background: list[np.ndarray]
    ) -> Explanation:
        """Antithetic draws, ``(b, alpha)`` and ``(b, 1 - alpha)``, in rounds of pairs until every
        sample's estimated ``1 - rho`` is ``<= tolerance`` (as the noise wrappers)."""
        n = inputs.num_samples
        ends = self._ends(inputs, values)
        offsets = np.cumsum([0, *[int(np.prod(a.shape[1:])) for a in ends]])
        count = len(background[0])
        # one item per pair: (u, alpha), both uniform, drawn row by row so that an item depends only on
        # the seed and its index (never on the chunking); the baseline is background[floor(u * count)]
        draws = Stream(self.seed, lambda rng, k: rng.uniform(0.0, 1.0, size=(k, 2)))
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)

        def chunks(active: np.ndarray, done: int, rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            def path_rows(rows: np.ndarray) -> Any:
                owners, pairs, signs = pair_rows(rows, active, done)
                drawn = draws.take(int(pairs[0]), int(pairs[-1]) + 1)[pairs - pairs[0]]
                alphas = np.where(signs > 0, drawn[:, 1], 1.0 - drawn[:, 1])
                choice = np.minimum((drawn[:, 0] * count).astype(np.int64), count - 1)
                return owners, None, [b[choice] for b in background], alphas

            for chunk, owners, _, products, _ in self._path_chunks(
                inputs, targets, resolved, rows, path_rows, values, pair_chunk_rows(self.batch_size)
            ):
                yield owners, np.concatenate([p.reshape(len(chunk), -1) for p in products], axis=1)

        run = run_pairs(n, int(offsets[-1]), "mean", chunks, samples=self.samples, max_samples=self.max_samples,
                        tolerance=self.tolerance, method=type(self).__name__)
        attributions = [
            run.value[:, offsets[k]: offsets[k + 1]].reshape(a.shape).astype(np.float32) for k, a in enumerate(ends)
        ]
        extras = {"samples": run.samples, "estimated_error": run.error.astype(np.float32)}
        if values is not None:
            return self._layer_result(inputs, attributions[0], scores, resolved, **extras)
        return self._input_result(inputs, self.attributed_inputs(inputs), attributions, scores, resolved, **extras)


GradientSHAP = ExpectedGradients
"""Alias of :class:`ExpectedGradients` under Captum's / SHAP's name (``ks.GradientSHAP(model, baseline=bg)``)."""
