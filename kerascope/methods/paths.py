"""What the path methods share: quadrature rules on ``alpha in [0, 1]``, baselines, and the folded-row
integration of ``(x - b) * grad f(b + alpha (x - b))`` (:class:`PathMethod`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.rows import REFERENCE, rows_of
from kerascope.methods import _layer
from kerascope.methods._folding import reduce_rows, row_targets
from kerascope.methods.base import check_positive_int
from kerascope.methods.gradients import LayerMethod
from kerascope.numeric.blur import gaussian_blur
from kerascope.numeric.chunking import chunk_ranges

QUADRATURES = (
    "gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "open_trapezoid",
)


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

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline or background is reported by its shape).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.IntegratedGradients(m, steps=8).params()["steps"]
            8
            >>> ks.ExpectedGradients(m, baseline=np.zeros((5, 2))).params()["baseline"]
            '<array shape=(5, 2)>'
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params

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
