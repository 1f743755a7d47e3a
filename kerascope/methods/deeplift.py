"""Modified-backpropagation methods: Deconvnet, DeepLIFT (rescale rule) and DeepLiftShap.

Each replaces the backward pass of the model's non-linearities for the
duration of one compiled call (the model is never changed): Deconvnet the
ReLUs', DeepLIFT every non-linearity's (see :mod:`kerascope.core.deeplift_rules`).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.deeplift_rules import classify
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.probe import softmax_candidates
from kerascope.methods._folding import chunk_ranges, forward_scores, reduce_rows, row_targets
from kerascope.methods.base import Method, UnsupportedModelError, check_positive_int, check_seed
from kerascope.methods.gradients import Saliency
from kerascope.methods.integrated import ExpectedGradients, _describe_baseline, resolve_baselines
from kerascope.methods.registry import register


@register
class Deconvnet(Saliency):
    """Deconvnet backward pass (Zeiler & Fergus, 2014).

    Every ReLU passes back the positive part of the incoming gradient,
    whatever its forward input was (``relu(dy)``); other layers use their
    ordinary (transposed) gradient. One forward and one backward pass per
    sample. Same reach as :class:`GuidedBackprop`: ReLUs written as
    ``tf.nn.relu`` inside a subclassed ``call`` keep their normal gradient.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
        >>> ks.Deconvnet(m).explain(np.ones((1, 3)), 0).attributions.shape
        (1, 3)
    """

    name = "deconvnet"
    description = "Gradient with ReLUs passing back only positive gradients (Zeiler & Fergus 2014)."
    aliases = ("deconvolution", "deconv")
    rule = "deconvnet"



def check_deeplift_support(model: keras.Layer, bypassed: list[str]) -> None:
    """Raise an ``UnsupportedModelError`` (a ``ValueError``) naming every layer DeepLIFT cannot handle exactly.

    Supported: affine layers (Dense, convolutions, average pooling, Flatten,
    Reshape, BatchNormalization at inference, Add / Concatenate, padding,
    cropping, dropout, Rescaling, ...); element-wise non-linearities (ReLU,
    LeakyReLU, ELU, sigmoid, tanh, softplus, swish, GELU, ... as fused
    ``activation=``, ``Activation`` layers, ``ReLU`` / ``LeakyReLU`` / ``ELU``
    layers or ``keras.ops`` nodes); max pooling; ``Multiply`` of two tensors;
    a final softmax the engine bypasses (``paths in bypassed``). Rejected:
    recurrent layers, attention, normalisation across features (LayerNorm),
    embeddings, a softmax in the middle, unknown custom layers.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3, 2)), keras.layers.LSTM(2, name="rnn")])
        >>> check_deeplift_support(m, [])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kerascope.methods.base.UnsupportedModelError: DeepLIFT cannot handle these layers exactly. Received: unsupported layers ['rnn' (LSTM)]. ...
    """
    _, problems = classify(model, bypassed)
    if problems:
        raise UnsupportedModelError(
            "DeepLIFT cannot handle these layers exactly. Received: unsupported layers "
            f"[{', '.join(problems)}]. Supported: Dense / convolutions (any element-wise activation), "
            "ReLU / LeakyReLU / ELU / sigmoid / tanh / softplus / swish / GELU, max and average pooling, "
            "BatchNormalization (inference), Add / Concatenate / Multiply, Flatten / Reshape, padding, "
            "dropout and a final softmax (bypassed with output='logits'). Recurrent layers, attention, "
            "LayerNormalization and embeddings are not. Use IntegratedGradients for these models."
        )


def _check_summation(attr_sums: np.ndarray, scores: np.ndarray, base_scores: np.ndarray) -> None:
    """Refuse when the pairs' attributions do not sum to ``f(x) - f(x')``: a non-linearity was not seen."""
    delta = scores.astype(np.float64) - base_scores
    error = np.abs(attr_sums - delta)
    tolerance = 1e-2 * np.abs(delta) + 1e-4 * (np.abs(scores) + np.abs(base_scores)) + 1e-5
    if np.any(error > tolerance):
        worst = int(np.argmax(error - tolerance))
        raise UnsupportedModelError(
            "DeepLIFT's attributions do not sum to f(x) - f(baseline) "
            f"(sum {attr_sums[worst]:.6g} vs {delta[worst]:.6g} for sample {worst}): the model applies a "
            "non-linearity that kerascope cannot see, such as an op written inside a subclassed model's "
            "or layer's `call` (e.g. `tf.nn.relu`, `keras.ops.max`). Received: a model whose "
            "non-linearities are not all layers or Functional ops. Make them layers (`keras.layers.ReLU()`, "
            "`Activation(...)`) or use IntegratedGradients."
        )


class _PairRunner:
    """Runs DeepLIFT on (input, reference) pairs, ``batch_size // 2`` pairs per compiled call."""

    def __init__(self, method: Method, inputs: Inputs, targets: Any, resolved: np.ndarray) -> None:
        self.method, self.inputs, self.targets, self.resolved = method, inputs, targets, resolved

    def run(self, xs: list[np.ndarray], refs: list[np.ndarray], owners: np.ndarray) -> tuple[list[np.ndarray], Any]:
        """Attributions ``(x - x') * multipliers`` of each pair, and the scores ``f(x)``, ``f(x')``."""
        m = len(owners)
        stacked = [np.concatenate([x, r]) for x, r in zip(xs, refs, strict=True)]
        result = self.method.engine.gradients(
            Inputs(self.inputs.model_arg(stacked)),
            row_targets(self.targets, self.resolved, np.concatenate([owners, owners])),
            rule="deeplift",
            batch_size=2 * m,
        )
        attributions = [g[:m] * (x - r) for g, x, r in zip(result.input_grads, xs, refs, strict=True)]
        total = sum(a.reshape(m, -1).astype(np.float64).sum(axis=1) for a in attributions)
        scores, base = result.scores[:m].astype(np.float64), result.scores[m:].astype(np.float64)
        _check_summation(total, scores, base)
        return attributions, base


@register
class DeepLIFT(Method):
    """DeepLIFT with the rescale rule (Shrikumar et al., 2017), as Captum's ``DeepLift``.

    Inputs and baselines run in one batch (first half, second half); every
    non-linearity's backward pass multiplies by DeepLIFT's multiplier computed
    from the paired rows: ``(f(z) - f(z')) / (z - z')`` for element-wise
    activations (ReLU, sigmoid, tanh, ELU, softplus, swish, GELU, ...; the
    ordinary derivative where ``|z - z'| < 1e-10``), Captum's rule for max
    pooling, and ``(b + b') / 2`` for a product ``a * b`` of two tensors.
    Affine layers pass multipliers back unchanged. Attributions are
    ``(x - baseline) * multipliers`` and sum to ``f(x) - f(baseline)``
    (summation-to-delta). The rules are in :mod:`kerascope.core.deeplift_rules`
    and the equations in ``docs/methods.md``.

    Layers no rule covers (LSTM, attention, LayerNormalization, embeddings,
    a softmax in the middle, unknown custom layers) raise
    :class:`UnsupportedModelError` before anything is computed (see
    :func:`check_deeplift_support`). Ops written directly inside a subclassed
    ``call`` cannot be seen: when the attributions then fail to sum to
    ``f(x) - f(baseline)`` (1% tolerance), DeepLIFT raises rather than return
    a wrong map.

    Args:
        baseline: the reference: ``None``/``"zeros"`` (default), a number,
            ``"blur"`` or an array (one sample's shape, or the batch's).

    ``Explanation.extras["completeness_error"]`` is ``sum(attr) - (f(x) -
    f(baseline))`` per sample (Captum's convergence delta) and
    ``baseline_scores`` the scores at the baselines. Cost: one forward and
    one backward pass on a batch of ``2 N`` (inputs and baselines), plus one
    forward pass to resolve the targets.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
        >>> e = ks.DeepLIFT(m).explain(np.ones((2, 3)), 0)
        >>> e.attributions.shape, bool(np.all(np.abs(e.extras["completeness_error"]) < 1e-4))
        ((2, 3), True)
    """

    name = "deeplift"
    description = "DeepLIFT rescale rule (Shrikumar et al. 2017); attributions sum to f(x) - f(baseline)."
    aliases = ("deep_lift",)

    def __init__(self, model: keras.Layer, *, baseline: Any = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.baseline = baseline

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline is reported by its shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.DeepLIFT(m, baseline=0.5).params()["baseline"]
            0.5
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params

    def _check_model(self) -> None:
        # refuse before running anything; a softmax is only known to be final (bypassed) after a pass
        softmaxes = [self.engine.path_of(layer) for layer in softmax_candidates(self.model)]
        check_deeplift_support(self.model, softmaxes)

    def _prepare(self, inputs: Inputs, targets: Any) -> tuple[np.ndarray, np.ndarray]:
        self._check_model()  # also when called as a noise wrapper's base (not through explain)
        scores, resolved = forward_scores(self.engine, inputs, targets, self.batch_size)
        bypassed = self.engine.bypassed_layers if self.output == "logits" else []
        check_deeplift_support(self.model, bypassed)
        return scores, resolved

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        scores, resolved = self._prepare(inputs, targets)
        baselines = resolve_baselines(self.baseline, inputs)
        runner = _PairRunner(self, inputs, targets, resolved)
        attributions = [np.zeros(a.shape, np.float32) for a in inputs.arrays]
        base_scores = np.zeros(inputs.num_samples, np.float32)
        for rows in chunk_ranges(inputs.num_samples, max(1, self.batch_size // 2)):
            parts, base = runner.run([a[rows] for a in inputs.arrays], [b[rows] for b in baselines], rows)
            for k, part in enumerate(parts):
                attributions[k][rows] = part
            base_scores[rows] = base
        total = sum(a.reshape(len(a), -1).astype(np.float64).sum(axis=1) for a in attributions)
        error = (total - (scores.astype(np.float64) - base_scores)).astype(np.float32)
        return self._result(
            inputs, attributions, scores, resolved, completeness_error=error, baseline_scores=base_scores
        )


@register
class DeepLiftShap(DeepLIFT):
    """DeepLIFT averaged over a background set (Lundberg & Lee 2017), as Captum's ``DeepLiftShap``.

    For each input, DeepLIFT attributions are computed against every
    baseline of the background (or ``samples`` of them drawn with ``seed``,
    the same draws for every input) and averaged; they sum to ``f(x) -
    mean_b f(b)``. Same rules and supported layers as :class:`DeepLIFT`.

    Args:
        baseline: background array ``(M, ...)`` (for multi-input models a
            list / dict of them with the same ``M``); default: one all-zeros
            baseline (then this is DeepLIFT).
        samples: baselines per input; ``None`` (default): all ``M``, Captum's
            definition; fewer: drawn without replacement (with replacement if
            ``samples > M``).
        seed: seed of the draws (only used when ``samples`` is set).

    ``extras``: ``baseline_indices`` (the background rows used),
    ``baseline_scores`` (the mean score over them) and ``completeness_error``
    (``sum(attr) - (f(x) - mean f(b))``). Cost: DeepLIFT on ``N * samples``
    pairs.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        >>> m.layers[0].set_weights([np.array([[2.0], [-3.0]])])
        >>> bg = np.array([[0.0, 0.0], [2.0, 2.0]])
        >>> ks.DeepLiftShap(m, baseline=bg).explain(np.array([[2.0, 2.0]]), 0).attributions.tolist()
        [[2.0, -3.0]]
    """

    name = "deeplift_shap"
    description = "DeepLIFT averaged over background baselines (DeepSHAP; Lundberg & Lee 2017)."
    aliases = ("deepliftshap", "deep_shap", "deepshap")

    def __init__(
        self,
        model: keras.Layer,
        *,
        baseline: Any = None,
        samples: int | None = None,
        seed: int | None = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, baseline=baseline, **kwargs)
        self.samples = None if samples is None else check_positive_int(samples, "samples")
        self.seed = check_seed(seed)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        background = ExpectedGradients._background(self, inputs)  # same background rules
        count = len(background[0])
        if self.samples is None:
            choice = np.arange(count)
        else:
            rng = np.random.default_rng(self.seed)
            choice = rng.choice(count, size=self.samples, replace=self.samples > count)
        k = len(choice)
        scores, resolved = self._prepare(inputs, targets)
        runner = _PairRunner(self, inputs, targets, resolved)
        attributions = [np.zeros(a.shape, np.float64) for a in inputs.arrays]
        base_scores = np.zeros(inputs.num_samples, np.float64)
        for rows in chunk_ranges(inputs.num_samples * k, max(1, self.batch_size // 2)):
            owners, draws = rows // k, choice[rows % k]
            parts, base = runner.run([a[owners] for a in inputs.arrays], [b[draws] for b in background], owners)
            weights = np.full(len(rows), 1.0 / k)
            for acc, part in zip(attributions, parts, strict=True):
                reduce_rows(acc, owners, weights, part)
            reduce_rows(base_scores[:, None], owners, weights, base[:, None])
        attributions = [a.astype(np.float32) for a in attributions]
        total = sum(a.reshape(len(a), -1).astype(np.float64).sum(axis=1) for a in attributions)
        error = (total - (scores.astype(np.float64) - base_scores)).astype(np.float32)
        return self._result(
            inputs, attributions, scores, resolved, completeness_error=error,
            baseline_scores=base_scores.astype(np.float32), baseline_indices=choice,
        )
