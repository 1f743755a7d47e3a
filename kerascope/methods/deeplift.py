"""Modified-backpropagation methods: Deconvnet, DeepLIFT (rescale rule) and DeepLiftShap.

Each replaces the backward pass of the model's non-linearities for the
duration of one compiled call (the model is never changed): Deconvnet the
ReLUs', DeepLIFT every non-linearity's (see :mod:`kerascope.propagation.deeplift_rules`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from kerascope.core import targets as targets_lib
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.precision import UNIT_ROUNDOFF, model_reduced_dtype
from kerascope.core.probe import softmax_candidates
from kerascope.core.rows import REFERENCE, rows_of, sample_of
from kerascope.methods._folding import chunk_ranges, forward_scores, reduce_rows
from kerascope.methods._input_choice import gradient_inputs
from kerascope.methods.base import (
    StabilisedDivisionMethod,
    UnsupportedModelError,
    check_positive_int,
    check_seed,
    problem_path,
)
from kerascope.methods.integrated import (
    ExpectedGradients,
    _chosen_baselines,
    _describe_baseline,
    resolve_baselines,
)
from kerascope.methods.registry import register
from kerascope.propagation.deeplift_rules import DeepLiftBackward, classify, fused_kernels, rules_fuse
from kerascope.propagation.fuse_tier import FuseTier

#: Default ``fuse_rules=None``: calls comparing at least this many inputs with references (a default chunk)
#: fuse the rules. Below it, XLA's compilations (~0.6 s for each new number of rows on MobileNetV2 at
#: 160 px) outweigh the gain of one call; from it on the fused first call is about even (fewer temporaries
#: to allocate) and later ones ~35% faster: docs/performance.md, "DeepLIFT's rules fused". Smaller calls
#: repeated at one shape fuse once they have paid for it (:class:`~kerascope.propagation.fuse_tier.FuseTier`).
FUSE_MIN_ROWS = 32


def check_deeplift_support(model: keras.Layer, bypassed: list[str], feeds: Callable[[str], bool] | None = None) -> None:
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
    problems = [p for p in problems if feeds is None or feeds(problem_path(p))]
    if problems:
        raise UnsupportedModelError(
            "DeepLIFT cannot handle these layers exactly. Received: unsupported layers "
            f"[{', '.join(problems)}]. Supported: Dense / convolutions (any element-wise activation), "
            "ReLU / LeakyReLU / ELU / sigmoid / tanh / softplus / swish / GELU, max and average pooling, "
            "BatchNormalization (inference), Add / Concatenate / Multiply, Flatten / Reshape, padding, "
            "dropout and a final softmax (bypassed with output='logits'). Recurrent layers, attention, "
            "LayerNormalization and embeddings are not. Use IntegratedGradients for these models."
        )


def _check_summation(
    attr_sums: np.ndarray, scores: np.ndarray, base_scores: np.ndarray, precision: str | None = None
) -> None:
    """Refuse when the pairs' attributions do not sum to ``f(x) - f(x')``: a non-linearity was not seen.

    In reduced precision every layer's output is rounded (bfloat16: 8 bits), so the sums also carry
    that rounding (measured up to ~2% of ``f(x) - f(x')`` on a small CNN): the bound is widened by 5%
    of the difference and 8 unit roundoffs of the scores.
    """
    delta = scores.astype(np.float64) - base_scores
    error = np.abs(attr_sums - delta)
    tolerance = 1e-2 * np.abs(delta) + 1e-4 * (np.abs(scores) + np.abs(base_scores)) + 1e-5
    if precision in UNIT_ROUNDOFF:
        tolerance = tolerance + 5e-2 * np.abs(delta) + 8 * UNIT_ROUNDOFF[precision] * (np.abs(scores) + np.abs(base_scores))
    if np.any(error > tolerance):
        worst = int(np.argmax(error - tolerance))
        sample = sample_of(worst, len(error))  # (the user's sample: pairs run a subset of the rows)
        where = f"sample {sample}" if sample is not None else f"row {worst} of an inner pass"
        if precision in UNIT_ROUNDOFF:  # the rounding may be the cause: say so first (the check cannot tell)
            raise UnsupportedModelError(
                "DeepLIFT's attributions do not sum to f(x) - f(baseline) "
                f"(sum {attr_sums[worst]:.6g} vs {delta[worst]:.6g} for {where}), by more than "
                f"{precision} rounding is allowed. Received: passes computed in {precision} (precision= or "
                "the model's dtype policy), which rounds every layer's output to "
                f"{int(round(-np.log2(UNIT_ROUNDOFF[precision])))} bits; a small f(x) - f(baseline) may not "
                "survive that. Explain in float32 (precision=None, or a float32 copy of the model) to get "
                "exact sums; if they still do not hold, the model applies a non-linearity kerascope cannot see."
            )
        raise UnsupportedModelError(
            "DeepLIFT's attributions do not sum to f(x) - f(baseline) "
            f"(sum {attr_sums[worst]:.6g} vs {delta[worst]:.6g} for {where}): the model applies a "
            "non-linearity that kerascope cannot see, such as an op written inside a subclassed model's "
            "or layer's `call` (e.g. `tf.nn.relu`, `keras.ops.max`). Received: a model whose "
            "non-linearities are not all layers or Functional ops. Make them layers (`keras.layers.ReLU()`, "
            "`Activation(...)`) or use IntegratedGradients."
        )


def _constant_rows(array: np.ndarray) -> bool:
    """Whether every row of ``array`` is the first one (then one reference row serves every input)."""
    return len(array) <= 1 or bool(np.all(array == array[:1]))


class _Runner:
    """Runs DeepLIFT's compiled passes for one ``explain`` call.

    Two layouts: :meth:`shared` compares ``batch_size - 1`` inputs with ONE
    reference row (batch ``N + 1``: about one forward and one backward pass,
    the default zeros / constant / one-array baselines and every DeepLiftShap
    background row); :meth:`pairs` runs ``batch_size // 2`` (input, reference)
    pairs (per-sample references such as ``"blur"``; batch ``2 N``).
    """

    def __init__(self, method: DeepLIFT, inputs: Inputs, targets: Any, wrt: list[int], pairs: int) -> None:
        self.method, self.inputs, self.targets, self.wrt = method, inputs, targets, wrt
        self.indices = targets_lib.encode(targets, inputs.num_samples)[0] if not callable(targets) else None
        self._resolved: np.ndarray | None = None
        #: the reduced precision the passes run in (``precision=``, else the model's own compute dtype)
        self.rounding = method.engine.precision or model_reduced_dtype(method.model)
        #: fused element-wise rules (``fuse_rules``; by default for ``pairs`` (inputs x references) >= FUSE_MIN_ROWS,
        #: or once repeated calls of this layout and shape have paid for the compilation: :class:`FuseTier`), only
        #: where they fuse: float32 passes on a backend that compiles them (else one rule: one trace). Decided at
        #: the first pass, whose layout is the tier's key.
        self.fuse: bool | None = None
        self.comparisons = pairs
        self._tier: FuseTier | None = None
        self._graph: tuple[Any, ...] | None = None
        self._shape = (inputs.num_samples, pairs, method.batch_size)
        self._started = time.perf_counter()

    def rule(self, shared: bool, group: int | None = None) -> DeepLiftBackward:
        """The pass's rule; the first decides ``fuse`` (``fuse_rules``, else the row threshold or the tier)."""
        if self.fuse is None:
            method, wanted = self.method, self.method.fuse_rules
            # only TensorFlow fuses rules (rules_fuse); XLA's probe (~0.1 s, once) runs only when fusing is wanted,
            # so neither fuse_rules=False nor the default's unfused small calls pay for it
            if wanted is not False and self.rounding is None and keras.backend.backend() == "tensorflow":
                self._tier = method.engine.memo(("deeplift_fuse_tier",), lambda: FuseTier(fused_kernels(method.model)))
                targets = "callable" if callable(self.targets) else "predicted" if self.targets is None else "indices"
                self._graph = (type(method).__name__, self.inputs.signature, tuple(self.wrt), shared, group, targets)
            if wanted is None:
                wanted = self.comparisons >= FUSE_MIN_ROWS or (
                    self._tier is not None and self._tier.fuses(self._graph, self._shape))
            self.fuse = bool(wanted) and self.rounding is None and rules_fuse()
        return DeepLiftBackward(shared=shared, group=group, fuse=self.fuse)

    def finish(self) -> None:
        """Record the call's wall time for the default's choice of the next calls (:class:`FuseTier`)."""
        if self._tier is not None and self.fuse is not None:
            self._tier.record(self._graph, self._shape, time.perf_counter() - self._started, self.fuse)

    def can_share(self, references: list[np.ndarray]) -> bool:
        """One reference row fits: each attributed input's references and every other input are constant."""
        held = [a for k, a in enumerate(self.inputs.arrays) if k not in self.wrt]
        return all(_constant_rows(a) for a in [*references, *held])

    def shared(
        self, reference: list[np.ndarray], reference_outputs: Callable[[], np.ndarray] | None = None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """``(attributions, f(x), targets, f(reference))`` against one reference (one row per model input).

        Each pass is ``batch_size - 1`` inputs and, last, the reference. The reference row is
        scored in the pass for the chunk's first target (a callable target: for itself); when
        that is every input's target class (one class for all, the usual ``explain(x, 3)``) its
        scores come from the pass, otherwise from one forward pass of that one row (on the demo
        model a tenth of the call), or from ``reference_outputs()`` (the model's outputs at the
        reference, one row) when given: DeepLiftShap scores all its background rows in one pass."""
        method, inputs, n = self.method, self.inputs, self.inputs.num_samples
        attributions = [np.zeros(inputs.arrays[i].shape, np.float32) for i in self.wrt]
        scores, resolved = np.zeros(n, np.float32), np.zeros(n, np.int64)
        last, same_class = 0.0, True
        for rows in chunk_ranges(n, max(1, method.batch_size - 1)):
            m = len(rows)
            arrays = [np.concatenate([a[rows], r.astype(a.dtype)]) for a, r in zip(inputs.arrays, reference, strict=True)]
            if callable(self.targets) or self.targets is None:
                targets = self.targets  # the predicted class is resolved in the pass (the reference's is unused)
            else:
                targets = self.indices[np.append(rows, rows[0])]
            with rows_of([*rows, REFERENCE]):
                result = method.engine.gradients(
                    Inputs(inputs.model_arg(arrays)), targets, wrt_inputs=self.wrt,
                    rule=self.rule(True), batch_size=m + 1,
                )
            for k, (g, i) in enumerate(zip(result.input_grads, self.wrt, strict=True)):
                attributions[k][rows] = g[:m] * (inputs.arrays[i][rows] - reference[i])
            scores[rows], resolved[rows], last = result.scores[:m], result.targets[:m], result.scores[m]
            # the reference was scored for the class of every input of this chunk, and of the chunks before
            same_class = same_class and bool(np.all(result.targets[:m] == result.targets[m])
                                             and result.targets[m] == resolved[0])
        if callable(self.targets) or same_class:
            base = np.full(n, last, np.float32)
        else:
            outputs = (reference_outputs() if reference_outputs is not None
                       else method.engine.select(method.engine.forward(Inputs(inputs.model_arg(reference)))))
            base = np.asarray(outputs, np.float32).reshape(-1)[resolved]
        _check_summation(_sums(attributions), scores, base, self.rounding)
        return attributions, scores, resolved, base

    def groups_per_pass(self, references: int) -> int:
        """How many references :meth:`grouped` puts in one pass (all inputs each): 0 or 1 when it does not pay."""
        return min(references, self.method.batch_size // (self.inputs.num_samples + 1))

    def grouped(
        self, references: list[np.ndarray], weights: np.ndarray, reference_outputs: Callable[[int], np.ndarray]
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """``(sum_j weights[j] * attributions against reference j, f(x), targets, sum_j weights[j] f(r_j))``.

        ``references``: one array per model input, ``K`` rows each. Each pass holds
        :meth:`groups_per_pass` groups of ``N + 1`` rows: every input, then one reference
        (the rules find each row's reference by the group length), so ``K`` references cost
        ``ceil(K / groups)`` passes of at most ``batch_size`` rows instead of ``K`` passes.
        A reference row is scored for its group's first target; when that is not every
        input's class, its scores come from ``reference_outputs(j)`` (the model's outputs at
        reference ``j``, one row). Accumulated in float64, reference by reference, as
        :meth:`shared` calls one by one would be.
        """
        method, inputs, n = self.method, self.inputs, self.inputs.num_samples
        length, count = n + 1, len(references[0])
        rule = self.rule(True, length)
        attributions = [np.zeros(inputs.arrays[i].shape, np.float64) for i in self.wrt]
        base = np.zeros(n, np.float64)
        for refs in chunk_ranges(count, max(1, self.groups_per_pass(count))):
            g = len(refs)
            arrays = []
            for a, r in zip(inputs.arrays, references, strict=True):
                rows = np.empty((g, length, *a.shape[1:]), a.dtype)
                rows[:, :n], rows[:, n] = a, r[refs].astype(a.dtype)
                arrays.append(rows.reshape(g * length, *a.shape[1:]))
            if callable(self.targets) or self.targets is None:
                targets = self.targets
            else:
                targets = np.tile(np.append(self.indices, self.indices[0]), g)
            with rows_of(np.tile([*range(n), REFERENCE], g)):
                result = method.engine.gradients(Inputs(inputs.model_arg(arrays)), targets, wrt_inputs=self.wrt,
                                                 rule=rule, batch_size=g * length)
            scores = result.scores.reshape(g, length)
            classes = np.asarray(result.targets).reshape(g, length)
            grads = [grad.reshape(g, length, *grad.shape[1:]) for grad in result.input_grads]
            for j, ref in enumerate(refs):
                parts = [grad[j, :n] * (inputs.arrays[i] - references[i][ref : ref + 1])
                         for grad, i in zip(grads, self.wrt, strict=True)]
                if callable(self.targets) or np.all(classes[j, :n] == classes[j, n]):
                    row_base = np.full(n, scores[j, n], np.float32)
                else:
                    outputs = np.asarray(reference_outputs(int(ref)), np.float32).reshape(-1)
                    row_base = outputs[classes[j, :n]]
                _check_summation(_sums(parts), scores[j, :n], row_base, self.rounding)
                for acc, part in zip(attributions, parts, strict=True):
                    acc += weights[ref] * part
                base += weights[ref] * row_base
        return attributions, scores[0, :n], classes[0, :n].astype(np.int64), base

    def resolved(self) -> np.ndarray:
        """The target classes (the predicted ones need a forward pass first: the pairs share them)."""
        if self._resolved is None:
            if self.targets is None:
                _, self._resolved = forward_scores(self.method.engine, self.inputs, None, self.method.batch_size)
            else:
                self._resolved = self.indices if self.indices is not None else np.zeros(self.inputs.num_samples, int)
        return self._resolved

    def pairs(self, owners: np.ndarray, references: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """``(attributions, f(x), f(x'))`` of the rows ``owners`` against their references (one per row)."""
        method, inputs, m = self.method, self.inputs, len(owners)
        chosen = dict(zip(self.wrt, references, strict=True))
        arrays = [np.concatenate([a[owners], chosen[k].astype(a.dtype) if k in chosen else a[owners]])
                  for k, a in enumerate(inputs.arrays)]
        targets = self.targets if callable(self.targets) else np.concatenate([self.resolved()[owners]] * 2)
        with rows_of(np.concatenate([owners, np.full(m, REFERENCE)])):
            result = method.engine.gradients(
                Inputs(inputs.model_arg(arrays)), targets, wrt_inputs=self.wrt, rule=self.rule(False),
                batch_size=2 * m,
            )
        attributions = [g[:m] * (inputs.arrays[i][owners] - chosen[i])
                        for g, i in zip(result.input_grads, self.wrt, strict=True)]
        scores, base = result.scores[:m], result.scores[m:]
        with rows_of(owners):
            _check_summation(_sums(attributions), scores, base, self.rounding)
        return attributions, scores, base


def _sums(attributions: list[np.ndarray]) -> np.ndarray:
    return sum(a.reshape(len(a), -1).astype(np.float64).sum(axis=1) for a in attributions)


@register
class DeepLIFT(StabilisedDivisionMethod):
    """DeepLIFT with the rescale rule (Shrikumar et al., 2017), as Captum's ``DeepLift``.

    Inputs and baselines run in one batch (first half, second half); every
    non-linearity's backward pass multiplies by DeepLIFT's multiplier computed
    from the paired rows: ``(f(z) - f(z')) / (z - z')`` for element-wise
    activations (ReLU, sigmoid, tanh, ELU, softplus, swish, GELU, ...; the
    ordinary derivative where ``|z - z'| < 1e-10``), Captum's rule for max
    pooling, and ``(b + b') / 2`` for a product ``a * b`` of two tensors.
    Affine layers pass multipliers back unchanged. Attributions are
    ``(x - baseline) * multipliers`` and sum to ``f(x) - f(baseline)``
    (summation-to-delta). The rules are in :mod:`kerascope.propagation.deeplift_rules`
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
            ``"blur"`` or an array (one sample's shape, or the batch's); for
            multi-input models a list / dict with one per model input, or one
            for the attributed input.
        input_index: multi-input models: the input(s) attributed (a position,
            an input name or a list of them, as the gradient methods'); the
            others are held at their values in the input and in the reference
            (Captum's ``additional_forward_args``), so the attributions sum to
            ``f(x) - f(x with the chosen inputs at their baselines)``. Default:
            every input (Captum's ``DeepLift`` on all of them).
        fuse_rules: TensorFlow, float32: ``True`` runs the rescale rule of
            each Keras activation function and built-in ``ReLU`` /
            ``LeakyReLU`` / ``ELU`` layer as one XLA-compiled kernel (its ~8
            element-wise ops fused: a MobileNetV2 pass ~25% cheaper) instead
            of TensorFlow's separate kernels, and the max-pool rule of each
            ``MaxPooling1D/2D`` with ``pool_size == strides`` likewise (the
            demo model at 1.33x the floor instead of 2.0x, VGG16 1.17x
            instead of 1.57x), the same numbers
            up to float32 rounding. XLA compiles each activation's kernel once per shape,
            so every new number of rows per pass costs ~0.6 s on MobileNetV2;
            worth it for large calls or repeated calls with the same number
            of inputs. ``None`` (default): fused when a call compares at least
            ``FUSE_MIN_ROWS`` (32) inputs with references (DeepLiftShap:
            inputs x background rows), and for smaller calls repeated with
            the same number of inputs once the time the separate ops cost
            over the fused ones reaches the estimated compilation (a
            ski-rental rule, :mod:`kerascope.propagation.fuse_tier`: 114-135 calls of 8
            images on the demo model, 70-80 on MobileNetV2); ``False``: never.
            JAX fuses the whole pass anyway; PyTorch runs op by op.

    ``Explanation.extras["completeness_error"]`` is ``sum(attr) - (f(x) -
    f(baseline))`` per sample (Captum's convergence delta),
    ``baseline_scores`` the scores at the baselines and ``fused_rules``
    whether this call ran the fused rules (``fuse_rules``). Cost: one forward and
    one backward pass on a batch of ``N + 1`` rows (the inputs and, last, the
    one reference they share) when the reference is the same for every input
    (zeros, a number, one array); ``2 N`` rows (inputs and their own
    references) for per-sample references (``"blur"``, a batch of arrays).

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

    def __init__(
        self, model: keras.Layer, *, baseline: Any = None, input_index: Any = None,
        fuse_rules: bool | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.baseline = baseline
        self.input_index = input_index
        if not (fuse_rules is None or isinstance(fuse_rules, (bool, np.bool_))):
            raise ValueError(f"`fuse_rules` must be True, False or None (fused from {FUSE_MIN_ROWS} comparisons). "
                             f"Received: fuse_rules={fuse_rules!r}.")
        self.fuse_rules = None if fuse_rules is None else bool(fuse_rules)

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

    def attributed_inputs(self, inputs: Inputs) -> list[int]:
        """Positions of the model inputs attributed (``input_index``; default: every input).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> t, img = keras.Input((3,), name="tab"), keras.Input((4, 4, 1), name="img")
            >>> m = keras.Model([t, img], keras.layers.Concatenate()([t, keras.layers.Flatten()(img)]))
            >>> x = Inputs([np.zeros((1, 3)), np.zeros((1, 4, 4, 1))])
            >>> ks.DeepLIFT(m).attributed_inputs(x), ks.DeepLIFT(m, input_index="tab").attributed_inputs(x)
            ([0, 1], [0])
        """
        if self.input_index is None:
            return list(range(len(inputs.arrays)))
        return gradient_inputs(self.model, inputs, self.input_index)

    def _check_model(self) -> None:
        # refuse before running anything; a softmax is only known to be final (bypassed) after a pass
        softmaxes = [self.engine.path_of(layer) for layer in softmax_candidates(self.model)]
        check_deeplift_support(self.model, softmaxes, self.engine.feeds_explained())

    def _prepare(self, inputs: Inputs, targets: Any) -> list[int]:
        """Check the model (also as a noise wrapper's base) and the targets; the attributed inputs."""
        self._check_model()
        self.engine.prepare(inputs, targets)  # validates the targets, finds a final softmax (one sample)
        check_deeplift_support(self.model, self.engine.bypassed_layers if self.output == "logits" else [],
                               self.engine.feeds_explained())
        return self.attributed_inputs(inputs)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        wrt = self._prepare(inputs, targets)
        chosen = Inputs([inputs.arrays[i] for i in wrt])
        references = resolve_baselines(_chosen_baselines(self.baseline, inputs, wrt), chosen)
        runner = _Runner(self, inputs, targets, wrt, inputs.num_samples)
        if runner.can_share(references):
            rows = [references[wrt.index(k)][:1] if k in wrt else a[:1] for k, a in enumerate(inputs.arrays)]
            attributions, scores, resolved, base_scores = runner.shared(rows)
        else:
            n = inputs.num_samples
            attributions = [np.zeros(a.shape, np.float32) for a in chosen.arrays]
            scores, base_scores = np.zeros(n, np.float32), np.zeros(n, np.float32)
            for rows in chunk_ranges(n, max(1, self.batch_size // 2)):
                parts, scores[rows], base_scores[rows] = runner.pairs(rows, [r[rows] for r in references])
                for k, part in enumerate(parts):
                    attributions[k][rows] = part
            resolved = runner.resolved()
        runner.finish()
        error = (_sums(attributions) - (scores.astype(np.float64) - base_scores)).astype(np.float32)
        return self._input_result(
            inputs, wrt, attributions, scores, resolved, completeness_error=error, baseline_scores=base_scores,
            fused_rules=bool(runner.fuse),
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
            list / dict of them with the same ``M``, or one for the attributed
            input); default: one all-zeros baseline (then this is DeepLIFT).
        samples: baselines per input; ``None`` (default): all ``M``, Captum's
            definition; fewer: drawn without replacement (with replacement if
            ``samples > M``).
        seed: seed of the draws (only used when ``samples`` is set).
        input_index: the input(s) attributed, as :class:`DeepLIFT`'s.
        fuse_rules: one compiled kernel per element-wise rule on TensorFlow,
            as :class:`DeepLIFT`'s.

    ``extras``: ``baseline_indices`` (the background rows used),
    ``baseline_scores`` (the mean score over them), ``completeness_error``
    (``sum(attr) - (f(x) - mean f(b))``) and ``fused_rules`` (as
    :class:`DeepLIFT`'s). Cost: DeepLIFT once per background
    row, each on ``N + 1`` rows (the inputs share the background row); when
    ``N + 1`` rows fit more than once in ``batch_size``, one pass holds
    ``batch_size // (N + 1)`` background rows (one group of ``N + 1`` rows
    each: e.g. one image and 16 background rows, one pass of 32 rows instead
    of 16 of 2; on TensorFlow each such ``N`` traces its pass once); on
    ``2 N`` rows per background row when the other inputs of a multi-input
    model differ between samples.

    Example (through a tanh layer, the attributions sum to ``f(x) - mean_b f(b)``):
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
        >>> x, background = np.ones((1, 3)), np.random.default_rng(0).normal(size=(4, 3))
        >>> e = ks.DeepLiftShap(m, baseline=background).explain(x, 1)
        >>> gap = m.predict(x, verbose=0)[:, 1] - m.predict(background, verbose=0)[:, 1].mean()
        >>> e.attributions.shape, bool(np.allclose(e.attributions.sum(axis=1), gap, atol=1e-4))
        ((1, 3), True)
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
        wrt = self._prepare(inputs, targets)
        background = ExpectedGradients._background(self, inputs, wrt)  # same background rules
        count = len(background[0])
        if self.samples is None:
            choice = np.arange(count)
        else:
            rng = np.random.default_rng(self.seed)
            choice = rng.choice(count, size=self.samples, replace=self.samples > count)
        k, n = len(choice), inputs.num_samples
        runner = _Runner(self, inputs, targets, wrt, n * k)
        attributions = [np.zeros(inputs.arrays[i].shape, np.float64) for i in wrt]
        base_scores = np.zeros(n, np.float64)
        if runner.can_share([]):  # the other inputs are the same in every sample: shared background rows
            rows, weights = np.unique(choice, return_counts=True)
            references = [background[wrt.index(j)][rows] if j in wrt else np.repeat(a[:1], len(rows), axis=0)
                          for j, a in enumerate(inputs.arrays)]
            scored: list[np.ndarray] = []

            def outputs_at(i: int) -> np.ndarray:  # every background row's outputs in one pass, when needed
                if not scored:
                    engine = self.engine
                    outputs = engine.forward(Inputs(inputs.model_arg(references)), batch_size=self.batch_size)
                    scored.append(np.asarray(engine.select(outputs), np.float32))
                return scored[0][i : i + 1]

            if runner.groups_per_pass(len(rows)) > 1:  # several background rows per pass, all inputs each
                attributions, scores, resolved, base_scores = runner.grouped(references, weights / k, outputs_at)
            else:  # one background row per pass (the inputs fill the batch)
                for i, weight in enumerate(weights / k):
                    reference = [r[i : i + 1] for r in references]
                    parts, scores, resolved, base = runner.shared(reference, functools.partial(outputs_at, i))
                    for acc, part in zip(attributions, parts, strict=True):
                        acc += weight * part
                    base_scores += weight * base
        else:
            scores = np.zeros(n, np.float32)
            for rows in chunk_ranges(n * k, max(1, self.batch_size // 2)):
                owners, draws = rows // k, choice[rows % k]
                parts, row_scores, base = runner.pairs(owners, [b[draws] for b in background])
                weights = np.full(len(rows), 1.0 / k)
                for acc, part in zip(attributions, parts, strict=True):
                    reduce_rows(acc, owners, weights, part)
                reduce_rows(base_scores[:, None], owners, weights, base[:, None])
                scores[owners] = row_scores
            resolved = runner.resolved()
        runner.finish()
        attributions = [a.astype(np.float32) for a in attributions]
        error = (_sums(attributions) - (scores.astype(np.float64) - base_scores)).astype(np.float32)
        return self._input_result(
            inputs, wrt, attributions, scores, resolved, completeness_error=error,
            baseline_scores=base_scores.astype(np.float32), baseline_indices=choice, fused_rules=bool(runner.fuse),
        )
