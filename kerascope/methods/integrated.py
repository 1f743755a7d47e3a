"""Path methods: Integrated Gradients and Expected Gradients (GradientSHAP).

Both average ``(x - b) * grad f(b + alpha (x - b))`` over path points: IG over
a deterministic quadrature rule on ``alpha in [0, 1]`` with one baseline,
Expected Gradients over random baselines from a background set and random
``alpha``. Path points are folded into the batch axis and built ``batch_size``
rows at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from kerascope.methods._folding import Stream, clean_scores, forward_scores, reduce_rows, row_targets
from kerascope.methods.base import check_number, check_positive_int, check_seed
from kerascope.methods.gradients import LayerMethod
from kerascope.methods.registry import register
from kerascope.numeric.blur import gaussian_blur
from kerascope.numeric.chunking import chunk_ranges

QUADRATURES = (
    "gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "open_trapezoid",
)


_FIRST_LEVEL = 3  # tolerance=: the first batch is the grid of 2**3 intervals (7 open / 9 closed points)


def quadrature(steps: int, method: str = "gausslegendre") -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``alpha`` in ``[0, 1]`` and weights (summing to 1) of a quadrature rule.

    ``riemann_left``/``right``/``middle``: ``alpha = k/n``, ``(k+1)/n``,
    ``(k+1/2)/n`` with weights ``1/n``. ``riemann_trapezoid``: the textbook
    trapezoid rule, ``alpha = k/(n-1)`` with weights ``1/(n-1)`` halved at both
    ends (sum 1). Captum's ``riemann_trapezoid`` uses the same nodes with
    weights ``1/n`` halved at both ends (sum ``(n-1)/n``), so Captum's result is
    ``(n-1)/n`` times kerascope's. ``gausslegendre``: Gauss-Legendre nodes
    mapped to ``[0, 1]`` (exact for polynomial integrands of degree ``<= 2n-1``).
    ``open_trapezoid``: ``alpha = k/(n+1)``, ``k = 1..n``, weights ``1/(n+1)``, ``3/2`` of that
    at both ends (second order, never evaluates the end points; nested when ``n + 1``
    doubles, which ``tolerance=`` uses).

    Example:
        >>> a, w = quadrature(4, "riemann_trapezoid")
        >>> a.tolist(), w.tolist()
        ([0.0, 0.3333333333333333, 0.6666666666666666, 1.0], [0.16666666666666666, 0.3333333333333333, 0.3333333333333333, 0.16666666666666666])
    """
    n = check_positive_int(steps, "steps")
    k = np.arange(n, dtype=np.float64)
    if method == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(n)
        return (nodes + 1.0) / 2.0, weights / 2.0
    if method == "riemann_left":
        return k / n, np.full(n, 1.0 / n)
    if method == "riemann_right":
        return (k + 1) / n, np.full(n, 1.0 / n)
    if method == "riemann_middle":
        return (k + 0.5) / n, np.full(n, 1.0 / n)
    if method == "riemann_trapezoid":
        if n < 2:
            raise ValueError(f"The trapezoid rule needs steps >= 2. Received: steps={steps}.")
        weights = np.full(n, 1.0 / (n - 1))
        weights[[0, -1]] /= 2
        return k / (n - 1), weights
    if method == "open_trapezoid":
        if n == 1:
            return np.array([0.5]), np.array([1.0])
        weights = np.full(n, 1.0 / (n + 1))
        weights[[0, -1]] *= 1.5
        return (k + 1) / (n + 1), weights
    raise ValueError(f"Unknown quadrature. Received: method={method!r}. Expected one of {QUADRATURES}.")


def resolve_baselines(baseline: Any, inputs: Inputs, blur_sigma: float = 4.0) -> list[np.ndarray]:
    """One baseline array per model input, shaped like the inputs.

    ``None`` or ``"zeros"``: zeros; a number: that constant; ``"blur"``: each
    input blurred (see :func:`gaussian_blur`); an array shaped like one sample
    (broadcast) or like the whole batch; for multi-input models a list / dict
    of those, one per input.

    Example:
        >>> import numpy as np
        >>> resolve_baselines(0.5, Inputs(np.zeros((2, 3))))[0].tolist()
        [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
    """
    arrays = inputs.arrays
    if isinstance(baseline, dict):
        if inputs.kind == "dict" and set(baseline) != set(inputs.keys):
            raise ValueError(
                f"A `baseline` dict needs the inputs' keys. Received: baseline with keys {sorted(baseline)}; "
                f"the inputs have keys {inputs.keys}."
            )
        per_input = [baseline[k] for k in inputs.keys] if inputs.kind == "dict" else list(baseline.values())
    elif isinstance(baseline, (list, tuple)) and len(arrays) > 1:
        per_input = list(baseline)
    else:
        per_input = [baseline] * len(arrays)
    if len(per_input) != len(arrays):
        raise ValueError(
            f"Expected one baseline per model input ({len(arrays)}). Received: {len(per_input)} baselines."
        )
    result = []
    for x, b in zip(arrays, per_input, strict=True):
        if b is None or (isinstance(b, str) and b == "zeros"):
            result.append(np.zeros_like(x, np.float32))
        elif isinstance(b, str) and b == "blur":
            result.append(gaussian_blur(x, blur_sigma))
        elif isinstance(b, str):
            raise ValueError(
                f"Unknown baseline. Received: baseline={b!r}. Expected None, 'zeros', 'blur', a number or an array."
            )
        elif np.isscalar(b):
            result.append(np.full(x.shape, _numeric_baseline(b), np.float32))
        else:
            b = _numeric_baseline(b)
            if b.shape == x.shape[1:]:
                b = np.broadcast_to(b, x.shape)
            if b.shape != x.shape:
                raise ValueError(
                    f"The baseline's shape must be one sample's shape {x.shape[1:]} or the batch's "
                    f"shape {x.shape}. Received: baseline with shape {b.shape}."
                )
            result.append(np.ascontiguousarray(b))
    return result


class PathMethod(LayerMethod):
    """Shared routine: accumulate ``w * (x - b) * grad f(b + alpha (x - b))`` over folded rows.

    With ``layer=``, ``x`` and ``b`` are the layer's activations at the input and
    at the baseline, and the layer's output is replaced by the path point
    ``b + alpha (x - b)`` during each forward pass (the layers before it still
    see the real inputs).
    """

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        if self._layer is not None:
            return self._explain_at(inputs, None, targets)
        return self._run(inputs, targets, None)

    def _explain_at(self, inputs: Inputs, values: np.ndarray | None, targets: Any) -> Explanation:
        if values is None:
            values = _layer.activations(self.engine, inputs, self._layer, self.batch_size)
        return self._run(inputs, targets, values)

    def _run(self, inputs: Inputs, targets: Any, values: np.ndarray | None) -> Explanation:
        """The method on the inputs (``values is None``) or on the layer's activations ``values``."""
        raise NotImplementedError

    def _ends(self, inputs: Inputs, values: np.ndarray | None) -> list[np.ndarray]:
        """What the path ends at: the attributed inputs (``input_index``), or the layer's activations."""
        return [inputs.arrays[i] for i in self.attributed_inputs(inputs)] if values is None else [values]

    def _integrate(
        self, inputs: Inputs, targets: Any, resolved: np.ndarray, count: int, path_rows: Callable,
        row_scores: np.ndarray | None = None, values: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Rows are input-major (row r: point r % count of input r // count); ``path_rows(rows)``
        returns ``(owners, weights, baselines per input, alphas)`` for a chunk of rows. The target
        score of every row is written to ``row_scores`` (``(n, count)``) when given. ``values``:
        the layer's activations (layer attribution; then one baseline, at the layer)."""
        ends = self._ends(inputs, values)
        totals = [np.zeros(a.shape, np.float64) for a in ends]
        chunks = self._path_chunks(inputs, targets, resolved, inputs.num_samples * count, path_rows, values)
        for rows, owners, weights, products, scores in chunks:
            for total, product in zip(totals, products, strict=True):
                reduce_rows(total, owners, weights, product)
            if row_scores is not None:
                row_scores.reshape(-1)[rows] = scores
        return [t.astype(np.float32) for t in totals]

    def _path_chunks(
        self, inputs: Inputs, targets: Any, resolved: np.ndarray, total_rows: int, path_rows: Callable,
        values: np.ndarray | None = None, chunk: int | None = None,
    ) -> Any:
        """Yield ``(rows, owners, weights, (x - b) * gradient per input, target scores)`` per chunk
        of ``chunk`` rows (default ``batch_size``)."""
        ends = self._ends(inputs, values)
        for rows in chunk_ranges(total_rows, chunk or self.batch_size):
            owners, weights, baselines, alphas = path_rows(rows)
            points, deltas = [], []
            for array, base in zip(ends, baselines, strict=True):
                # x - b in the inputs' precision, computed once for the path points and the product: the
                # float64 copies of every row and product cost ~30% of a 32-row MobileNetV2 chunk; the
                # products are still summed in float64 (reduce_rows)
                delta = array[owners] - base
                alpha = alphas.reshape((-1,) + (1,) * (array.ndim - 1)).astype(np.float32)
                points.append(base + alpha * delta)
                deltas.append(delta)
            whose = np.where(np.asarray(alphas).reshape(-1) == 0.0, REFERENCE, owners)  # alpha = 0: the baseline
            if values is None:  # the attributed inputs move along the path, the others keep their values
                wrt = self.attributed_inputs(inputs)
                with rows_of(whose):
                    result = self.engine.gradients(
                        Inputs(inputs.model_arg(_substitute(inputs, owners, wrt, points))),
                        row_targets(targets, resolved, owners),
                        wrt_inputs=wrt,
                        batch_size=self.batch_size,
                    )
                grads = result.input_grads
            else:
                with rows_of(whose):
                    result = self.engine.gradients(
                        _layer.rows(inputs, owners), row_targets(targets, resolved, owners),
                        layers=[self._layer], wrt_inputs=False, replace=points, batch_size=self.batch_size,
                    )
                grads = result.layer_grads
            yield rows, owners, weights, [g * d for g, d in zip(grads, deltas, strict=True)], result.scores


def _substitute(inputs: Inputs, owners: np.ndarray, wrt: list[int], values: list[np.ndarray]) -> list[np.ndarray]:
    """The rows ``owners`` of every model input, the inputs at ``wrt`` replaced by ``values``."""
    arrays = [a[owners] for a in inputs.arrays]
    for i, value in zip(wrt, values, strict=True):
        arrays[i] = value
    return arrays


def _chosen_baselines(baseline: Any, inputs: Inputs, wrt: list[int]) -> Any:
    """The baseline spec of the attributed inputs: a list / dict with one entry per model input is
    narrowed to ``wrt``; anything else applies to the attributed input(s)."""
    count = len(inputs.arrays)
    if isinstance(baseline, dict):  # by input name, else in the model inputs' order
        names = inputs.keys if inputs.kind == "dict" else None
        if names is not None and all(names[i] in baseline for i in wrt):
            picked = [baseline[names[i]] for i in wrt]
        else:
            picked = list(baseline.values())
            picked = [picked[i] for i in wrt] if len(picked) == count else picked
        return picked if len(picked) > 1 else picked[0]
    if isinstance(baseline, (list, tuple)) and count > 1 and len(baseline) == count:
        picked = [baseline[i] for i in wrt]
        return picked if len(wrt) > 1 else picked[0]
    return baseline


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

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline is reported by its shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.IntegratedGradients(m, steps=8).params()["steps"]
            8
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params


def _describe_baseline(baseline: Any) -> Any:
    if baseline is None or isinstance(baseline, (str, int, float)):
        return baseline
    if isinstance(baseline, (list, tuple, dict)):
        values = baseline.values() if isinstance(baseline, dict) else baseline
        return [_describe_baseline(b) for b in values]
    return f"<array shape={tuple(np.shape(baseline))}>"


def _numeric_baseline(value: Any) -> np.ndarray:
    """A baseline as a finite float32 array, or kerascope's error naming ``baseline``."""
    try:
        array = np.asarray(value, np.float32)
    except (TypeError, ValueError):
        raise ValueError(
            f"`baseline` must be numbers or numeric arrays. Received: baseline={value!r}."
        ) from None
    if not np.all(np.isfinite(array)):
        raise ValueError(
            f"`baseline` contains NaN or infinite values. Received: baseline of shape {array.shape} with "
            f"{int(np.sum(~np.isfinite(array)))} non-finite values."
        )
    return array


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

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (the background reported by its shape).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.ExpectedGradients(m, baseline=np.zeros((5, 2))).params()["baseline"]
            '<array shape=(5, 2)>'
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params


GradientSHAP = ExpectedGradients
"""Alias of :class:`ExpectedGradients` under Captum's / SHAP's name (``ks.GradientSHAP(model, baseline=bg)``)."""
