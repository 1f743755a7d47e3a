"""Path methods off the straight line: Blur IG (Xu et al. 2020) and Guided IG (Kapishnikov et al. 2021).

Both are PAIR ``saliency`` 0.2.1's algorithms, computed batched: Blur IG folds its blur levels
into the batch axis (the blurs as batched matrix products), Guided IG moves every sample of a
chunk one step at a time, with one compiled gradient pass per step for the whole chunk (its path
depends on the gradients met so far, so the steps of one sample cannot run in parallel).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.rows import rows_of
from kerascope.methods._folding import clean_scores, reduce_rows, row_targets
from kerascope.methods._input_choice import gradient_inputs
from kerascope.methods.base import Method, check_flag, check_number, check_positive_int
from kerascope.methods.integrated import _chosen_baselines, _describe_baseline, _substitute, resolve_baselines
from kerascope.methods.registry import register
from kerascope.numeric.blur import blur_and_slope_rows
from kerascope.numeric.chunking import ahead, chunk_ranges


def _in_unit_interval(value: Any, name: str) -> float:
    """``value`` as a float in ``[0, 1]``, or the standard error."""
    number = check_number(value, name, low=0.0)
    if number > 1:
        raise ValueError(f"`{name}` must be in [0, 1]. Received: {name}={value!r}.")
    return number


class _OneInputPath(Method):
    """Shared part: one attributed input, gradients at arbitrary points of it for folded rows."""

    def __init__(self, model: keras.Layer, *, steps: int, input_index: Any = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.steps = check_positive_int(steps, "steps")
        self.input_index = input_index

    def _start(self, inputs: Inputs, targets: Any) -> tuple[int, np.ndarray, Any, np.ndarray]:
        """The attributed input's position and array, the clean scores and the resolved targets."""
        at = self._input(inputs)
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)
        return at, inputs.arrays[at], scores, resolved

    def _input(self, inputs: Inputs) -> int:
        wrt = gradient_inputs(self.model, inputs, self.input_index)
        if len(wrt) != 1:
            raise ValueError(
                f"{type(self).__name__} attributes one model input. Received: input_index={self.input_index!r} "
                f"(inputs {wrt}). Pass one position or name."
            )
        return wrt[0]

    def _gradients(
        self, inputs: Inputs, targets: Any, resolved: np.ndarray, at: int, owners: np.ndarray, points: np.ndarray
    ) -> np.ndarray:
        """The target's gradient w.r.t. input ``at`` with that input set to ``points`` (rows of ``owners``)."""
        with rows_of(owners):
            result = self.engine.gradients(
                Inputs(inputs.model_arg(_substitute(inputs, owners, [at], [points.astype(np.float32)]))),
                row_targets(targets, resolved, owners), wrt_inputs=[at], batch_size=self.batch_size,
            )
        return result.input_grads[0]

    def _done(self, inputs: Inputs, at: int, attributions: np.ndarray, scores: Any, resolved: np.ndarray,
              **extras: Any) -> Explanation:
        return self._input_result(inputs, [at], [attributions.astype(np.float32)], scores, resolved, **extras)


@register
class BlurIG(_OneInputPath):
    """Blur Integrated Gradients (Xu et al. 2020): IG along a path of successively blurred inputs.

    The path runs from the input blurred with a Gaussian of std ``max_sigma`` pixels to the
    input itself; the attribution is ``-sum_i (sigma_{i+1} - sigma_i) dx/dsigma (sigma_i)
    grad f(x(sigma_i))`` over ``steps`` blur levels ``sigma_i = i max_sigma / steps``
    (``sqrt=True``: ``sqrt(i max_sigma / steps)``), with ``dx/dsigma`` the finite difference
    over ``grad_step``. As PAIR's ``BlurIG``: zero padding, kernels truncated at 4 std, the
    spatial axes (all but the batch and channel axes) blurred. Summed over the input, the
    attributions approach ``f(x) - f(x blurred by max_sigma)``.

    Args:
        max_sigma: the largest blur, in pixels (PAIR's default 50).
        steps: blur levels along the path (PAIR's default 100).
        grad_step: the sigma step of the finite difference ``dx/dsigma``.
        sqrt: space the levels by the square root (PAIR's ``sqrt``).
        input_index: the model input attributed (multi-input models).

    Cost: ``steps`` forward+backward passes per sample (plus one forward pass for the scores);
    the blurs on the host, as float32 matrix products, each chunk's while the previous chunk's gradients run.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> ks.BlurIG(m, max_sigma=3, steps=10).explain(np.ones((2, 8, 8, 1)), 0).attributions.shape
        (2, 8, 8, 1)
    """

    name = "blur_ig"
    description = "Integrated Gradients along a path of successively blurred inputs (Xu et al. 2020)."
    aliases = ("blurig", "blur_integrated_gradients")

    def __init__(
        self,
        model: keras.Layer,
        *,
        max_sigma: float = 50.0,
        steps: int = 100,
        grad_step: float = 0.01,
        sqrt: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, steps=steps, **kwargs)
        self.max_sigma = check_number(max_sigma, "max_sigma", low=0.0, low_inclusive=False)
        self.grad_step = check_number(grad_step, "grad_step", low=0.0, low_inclusive=False)
        self.sqrt = check_flag(sqrt, "sqrt")

    def sigmas(self) -> np.ndarray:
        """The ``steps + 1`` blur levels of the path, from 0 to ``max_sigma``.

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])
            >>> ks.BlurIG(m, max_sigma=2, steps=4).sigmas().tolist()
            [0.0, 0.5, 1.0, 1.5, 2.0]
        """
        levels = np.arange(self.steps + 1, dtype=np.float64) * self.max_sigma / self.steps
        return np.sqrt(levels) if self.sqrt else levels

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        at = self._input(inputs)
        x = inputs.arrays[at]
        if x.ndim < 3:  # refused before the clean pass
            raise ValueError(
                f"BlurIG blurs the spatial axes of an input (batch, ..., channels). Received: input of shape "
                f"{x.shape}. Use IntegratedGradients for tabular inputs."
            )
        _, _, scores, resolved = self._start(inputs, targets)
        sigmas = self.sigmas()
        widths = np.diff(sigmas)
        total = np.zeros(x.shape, np.float64)

        def blurred(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            owners, steps = rows // self.steps, rows % self.steps
            return (owners, steps, *blur_and_slope_rows(x[owners], sigmas[steps], self.grad_step))

        # the next chunk is blurred on the host while the current one's gradients run
        chunks = chunk_ranges(inputs.num_samples * self.steps, self.batch_size)
        for owners, steps, point, slope in ahead(blurred, chunks):
            grads = self._gradients(inputs, targets, resolved, at, owners, point)
            reduce_rows(total, owners, -widths[steps], slope * grads)
        return self._done(inputs, at, total, scores, resolved)


@register
class GuidedIG(_OneInputPath):
    """Guided Integrated Gradients (Kapishnikov et al. 2021): an adaptive path from the baseline.

    At each of ``steps`` steps the features with the smallest ``|gradient|`` (the ``fraction``
    lowest, PAIR's ``np.quantile(..., 'lower')``) move first towards the input, until the L1
    distance to the input has shrunk by ``1 / steps`` of the total; no feature strays more than
    ``max_dist`` (relative) from the straight path. The attribution is
    ``sum over moves (x_new - x_old) * gradient``: it sums to about ``f(x) - f(baseline)``;
    ``max_dist=0`` is IG on the straight line. As PAIR's ``GuidedIG`` (float64 path).

    Args:
        steps: path steps (one forward+backward pass each; PAIR's default 200).
        fraction: the share of features moved per inner iteration (PAIR's default 0.25).
        max_dist: the largest relative deviation from the straight path, in ``[0, 1]`` (default 0.02).
        baseline: where the path starts (as :class:`IntegratedGradients`; default zeros).
        input_index: the model input attributed (multi-input models).

    Cost: ``steps`` forward+backward passes per sample, run for ``batch_size`` samples at once
    (plus one forward pass for the scores).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[1.0], [2.0], [-1.0]])])
        >>> a = ks.GuidedIG(m, steps=10).explain(np.array([[1.0, 1.0, 1.0]]), 0).attributions
        >>> np.round(a, 5).tolist()
        [[1.0, 2.0, -1.0]]
    """

    name = "guided_ig"
    description = "Integrated Gradients along an adaptive path moving low-gradient features first (Kapishnikov et al. 2021)."
    aliases = ("guidedig", "guided_integrated_gradients")

    def __init__(
        self,
        model: keras.Layer,
        *,
        steps: int = 200,
        fraction: float = 0.25,
        max_dist: float = 0.02,
        baseline: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, steps=steps, **kwargs)
        self.fraction, self.max_dist = _in_unit_interval(fraction, "fraction"), _in_unit_interval(max_dist, "max_dist")
        self.baseline = baseline

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline reported by its shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.GuidedIG(m, steps=8).params()["steps"]
            8
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        at, x, scores, resolved = self._start(inputs, targets)
        baseline = resolve_baselines(_chosen_baselines(self.baseline, inputs, [at]), Inputs([x]))[0]
        n = inputs.num_samples
        attributions = np.zeros((n, int(np.prod(x.shape[1:]))), np.float64)
        for rows in chunk_ranges(n, self.batch_size):  # memory: one chunk of samples walks its paths at a time
            attributions[rows] = self._walk(inputs, targets, resolved, at, rows, baseline[rows])
        return self._done(inputs, at, attributions.reshape(x.shape), scores, resolved)

    def _walk(
        self, inputs: Inputs, targets: Any, resolved: np.ndarray, at: int, owners: np.ndarray, baseline: np.ndarray
    ) -> np.ndarray:
        """PAIR's ``guided_ig_impl`` for the samples ``owners`` at once (flattened, float64).

        Within a step the features only move towards ``x_max`` after the first clamp to ``x_min``, so
        PAIR's clamp (repeated at every inner iteration) is applied once per step, with the same result.
        """
        shape = inputs.arrays[at].shape[1:]
        result = np.zeros((len(owners), int(np.prod(shape))))
        end_all = inputs.arrays[at][owners].reshape(len(owners), -1).astype(np.float64)
        start_all = baseline.reshape(len(owners), -1).astype(np.float64)
        moving = np.flatnonzero(np.abs(end_all - start_all).sum(axis=1) != 0)  # PAIR returns zeros for x == baseline
        if not len(moving):
            return result
        end, start = end_all[moving], start_all[moving]
        diff = end - start
        still = diff == 0
        safe = np.where(still, 1.0, diff)
        l1_total = np.abs(diff).sum(axis=1)
        x, attr = start.copy(), np.zeros_like(end)
        k = int(np.floor(self.fraction * (end.shape[1] - 1)))  # np.quantile(method="lower")'s order statistic
        for step in range(self.steps):
            grad_actual = self._gradients(
                inputs, targets, resolved, at, owners[moving], x.reshape((len(moving), *shape))
            ).reshape(len(moving), -1).astype(np.float64)
            alpha = (step + 1.0) / self.steps
            alpha_min, alpha_max = max(alpha - self.max_dist, 0.0), min(alpha + self.max_dist, 1.0)
            x_max = start + diff * alpha_max
            below = ~still & ((x - start) / safe < alpha_min)
            moved = np.where(below, start + diff * alpha_min, x)
            attr += (moved - x) * grad_actual
            x = moved
            l1_target = l1_total * (1 - (step + 1) / self.steps)
            grad = grad_actual.copy()
            live = np.ones(len(moving), bool)  # PAIR's `while gamma > 1`, per sample
            while live.any():
                i = slice(None) if live.all() else np.flatnonzero(live)
                xs, top, g = x[i], x_max[i], grad[i]
                l1_current = np.abs(xs - end[i]).sum(axis=1)
                target = l1_target[i]
                close = np.abs(target - l1_current) <= np.maximum(
                    1e-9 * np.maximum(np.abs(target), np.abs(l1_current)), 1e-9)  # math.isclose
                g[xs == top] = np.inf
                grad[i] = g
                magnitude = np.abs(g)
                threshold = np.partition(magnitude, k, axis=1)[:, k]
                chosen = (magnitude <= threshold[:, None]) & (g != np.inf) & ~close[:, None]
                l1_s = (np.abs(xs - top) * chosen).sum(axis=1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    gamma = np.where(l1_s > 0, (l1_current - target) / l1_s, np.inf)
                step_to = np.where((gamma > 1.0)[:, None], top, xs + (top - xs) * np.minimum(gamma, 1.0)[:, None])
                new = np.where(chosen, step_to, xs)
                attr[i] += (new - xs) * grad_actual[i]
                x[i] = new
                live[i] = ~close & (gamma > 1.0)
        result[moving] = attr
        return result
