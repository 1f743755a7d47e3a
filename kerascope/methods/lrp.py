"""Layer-wise Relevance Propagation (Bach et al. 2015; Montavon et al. 2019) with zennit's rules and composites.

The rules are in :mod:`kerascope.propagation.lrp_rules`, how they run in
:mod:`kerascope.propagation.lrp_walk`, the composites in
:mod:`kerascope.propagation.lrp_composites`, the equations in ``docs/methods.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.layers import iter_layers
from kerascope.methods._input_choice import gradient_inputs
from kerascope.methods.base import (
    StabilisedDivisionMethod,
    UnsupportedModelError,
    check_number,
    problem_path,
)
from kerascope.methods.registry import register
from kerascope.propagation.lrp_composites import COMPOSITES, assign_rules, composite_rules
from kerascope.propagation.lrp_rules import AlphaBeta, Epsilon, Flat, Gamma, Rule, ZBox, ZPlus, make_rule
from kerascope.propagation.lrp_walk import LRPBackward, classify

__all__ = ["COMPOSITES", "LRP", "AlphaBeta", "Epsilon", "Flat", "Gamma", "Rule", "ZBox", "ZPlus", "check_lrp_support"]

INITS = ("logit", "one_hot")


def relevance_seed(target_fn: Callable[[Any], Any], outputs: Any) -> Any:
    """``target_fn(outputs)``, written so that its gradient w.r.t. each output ``y`` is ``y * dS/dy``.

    LRP starts the relevance of a callable target ``S`` at ``y * dS/dy`` (the output's share
    of ``S`` for a linear ``S``: the sum of two logits gives each logit its own value); its
    backward pass carries the gradient it is seeded with. Each output enters as
    ``stop_gradient(y) * exp(y - stop_gradient(y))``: the same value, gradient ``y``.

    Example:
        >>> import numpy as np
        >>> float(relevance_seed(lambda o: o[:, 0] + o[:, 1], np.array([[2.0, 3.0]], "float32"))[0])
        5.0
    """

    def seed(y: Any) -> Any:
        if not keras.backend.is_float_dtype(keras.backend.standardize_dtype(getattr(y, "dtype", "int32"))):
            return y
        held = keras.ops.stop_gradient(y)
        return held * keras.ops.exp(y - held)

    return target_fn(keras.tree.map_structure(seed, outputs))


def check_lrp_support(model: keras.Layer, bypassed: list[str], feeds: Callable[[str], bool] | None = None) -> None:
    """Raise an ``UnsupportedModelError`` (a ``ValueError``) naming every layer LRP has no rule for.

    Example:
        >>> m = keras.Sequential([keras.Input((3, 2)), keras.layers.LSTM(2, name="rnn")])
        >>> check_lrp_support(m, [])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kerascope.methods.base.UnsupportedModelError: LRP has no rule for these layers. Received: unsupported layers ['rnn' (LSTM)]. ...
    """
    problems = [p for p in classify(model, bypassed).problems if feeds is None or feeds(problem_path(p))]
    if problems:
        raise UnsupportedModelError(
            "LRP has no rule for these layers. Received: unsupported layers "
            f"[{', '.join(problems)}]. Supported: Dense / Conv1D / Conv2D / Conv3D / DepthwiseConv1D / DepthwiseConv2D (element-wise "
            "activations), "
            "ReLU / LeakyReLU / ELU / PReLU / Activation layers, max and average pooling, BatchNormalization, "
            "Add / Average / Subtract / Concatenate, Flatten / Reshape, padding, cropping, dropout, Rescaling "
            "and a final softmax (bypassed with output='logits'). Recurrent layers, attention, "
            "LayerNormalization and embeddings are not. Use IntegratedGradients or DeepLIFT for these models."
        )


@register
class LRP(StabilisedDivisionMethod):
    """Layer-wise Relevance Propagation with per-layer rules (zennit's rules and composites, on Keras 3).

    Relevance starts at the target output (``init="logit"``: the target logit
    ``f_t(x)``, so a conservative network's input relevance sums to it;
    ``"one_hot"``: 1, as zennit's and Captum's usual one-hot output) and is
    propagated back layer by layer: Dense / Conv layers by their rule, average
    pooling and residual ``Add`` in proportion to the contributions, max
    pooling winner-take-all, activations passed through, a
    ``BatchNormalization`` after a Dense / Conv canonised into it, a final
    softmax bypassed (``output="logits"``). One compiled forward + backward
    pass per chunk (each rule term adds one evaluation of its layer); the model
    is never changed.

    Args:
        composite: ``"epsilon_plus"`` (default; ε for Dense, z⁺ for Conv),
            ``"epsilon_plus_flat"`` (flat for the first Dense / Conv layer),
            ``"epsilon_alpha2_beta1"`` (α2β1 for Conv), ``"epsilon_gamma_box"``
            (γ for Conv, zᴮ for the first Conv), ``"epsilon"`` (ε everywhere)
            or ``None`` (then ``rules`` covers every Dense / Conv layer).
        rules: overrides, ``{key: rule}`` with key a layer path / name or a
            class name (``"Dense"``, ``"Conv2D"``) and rule a name
            (``"epsilon"``, ``"gamma"``, ``"zplus"``, ``"alpha2beta1"``,
            ``"alpha1beta0"``, ``"flat"``, ``"zbox"``) or a :class:`Rule`
            (``Epsilon(0.25)``, ``Gamma(0.5)``, ``ZBox(low, high)``, ...).
        epsilon: ε of the ε rule (default 1e-6, zennit's).
        gamma: γ of the γ rule in ``"epsilon_gamma_box"`` (default 0.25).
        low, high: bounds of the zᴮ rule (numbers or arrays broadcast to one
            input sample; default 0 and 1, images scaled to [0, 1]).
        stabilizer: the other rules' stabiliser (default 1e-6).
        init: ``"logit"`` (default) or ``"one_hot"``.
        input_index: multi-input models: the input(s) whose relevance is
            returned (a position, an input name or a list, as the gradient
            methods'); the others are held at their values and their share of
            the relevance is not returned. Default: every input.

    ``extras["relevance_sum"]`` is the input relevance per sample and
    ``extras["conservation"]`` its ratio to the initial relevance (1 for
    bias-free ReLU networks with ε → 0; biases and the z⁺ / γ / αβ rules
    absorb or add relevance).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu", use_bias=False),
        ...                       keras.layers.Dense(2, use_bias=False)])
        >>> m.set_weights([np.arange(12.0).reshape(3, 4) / 10, np.ones((4, 2))])  # no dead units, logit != 0
        >>> e = ks.LRP(m, composite="epsilon").explain(np.ones((2, 3)), 0)
        >>> e.attributions.shape, bool(np.allclose(e.extras["conservation"], 1.0, atol=1e-4))
        ((2, 3), True)
    """

    name = "lrp"
    description = "Layer-wise Relevance Propagation with zennit's rules and composites (Bach et al. 2015)."
    aliases = ("layerwise_relevance_propagation",)

    def __init__(
        self,
        model: keras.Layer,
        *,
        composite: str | None = "epsilon_plus",
        rules: Mapping[str, Rule | str] | None = None,
        epsilon: float = 1e-6,
        gamma: float = 0.25,
        low: Any = 0.0,
        high: Any = 1.0,
        stabilizer: float = 1e-6,
        init: str = "logit",
        input_index: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.input_index = input_index
        if init not in INITS:
            raise ValueError(f"`init` must be one of {INITS}. Received: init={init!r}.")
        if rules is not None and not isinstance(rules, Mapping):
            raise TypeError(f"`rules` must be a dict {{layer or class name: rule}}. Received: rules={rules!r}.")
        self.composite = composite
        self.rules = dict(rules or {})
        self.epsilon, self.gamma, self.low, self.high = epsilon, gamma, low, high
        self.stabilizer = check_number(stabilizer, "stabilizer", low=0.0)
        self.init = init
        self._composite = composite_rules(composite, epsilon=epsilon, gamma=gamma, low=low, high=high,
                                          stabilizer=stabilizer)
        for spec in self.rules.values():
            make_rule(spec)  # unknown rule names fail here

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (array bounds reported by their shape, rules by their repr).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> ks.LRP(m, rules={"Dense": "epsilon"}).params()["rules"]
            {'Dense': 'epsilon'}
        """
        params = super().params()
        for key in ("low", "high"):
            if np.ndim(params[key]):
                params[key] = f"array{np.shape(params[key])}"
        params["rules"] = {k: v if isinstance(v, str) else repr(v) for k, v in self.rules.items()}
        return params

    def attributed_inputs(self, inputs: Inputs) -> list[int]:
        """Positions of the model inputs whose relevance is returned (``input_index``; default: every input).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> t, img = keras.Input((3,), name="tab"), keras.Input((4, 4, 1), name="img")
            >>> m = keras.Model([t, img], keras.layers.Dense(1)(keras.layers.Concatenate()([t, keras.layers.Flatten()(img)])))
            >>> ks.LRP(m, input_index="img").attributed_inputs(Inputs([np.zeros((1, 3)), np.zeros((1, 4, 4, 1))]))
            [1]
        """
        if self.input_index is None:
            return list(range(len(inputs.arrays)))
        return gradient_inputs(self.model, inputs, self.input_index)

    def layer_rules(self) -> dict[str, Rule]:
        """The rule each Dense / Conv layer gets, by path (the composite with ``rules`` applied).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
            ...                       keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
            >>> {p: r.name for p, r in ks.LRP(m, composite="epsilon_gamma_box").layer_rules().items()}
            {'c': 'zbox', 'd': 'epsilon'}
        """
        return assign_rules(classify(self.model, []).affine, self._composite, self.rules,
                            list(iter_layers(self.model)))

    def _check_box(self, inputs: Inputs, rules: Mapping[str, Rule]) -> None:
        for rule in rules.values():
            if not isinstance(rule, ZBox):
                continue
            for x in inputs.arrays:
                low = np.broadcast_to(np.asarray(rule.low, np.float32), x.shape[1:]) if np.ndim(rule.low) else rule.low
                high = (np.broadcast_to(np.asarray(rule.high, np.float32), x.shape[1:]) if np.ndim(rule.high)
                        else rule.high)
                if np.any(x < low - 1e-6) or np.any(x > high + 1e-6):
                    raise ValueError(
                        "The zB (box) rule needs every input value within [low, high]. Received: inputs in "
                        f"[{x.min():.4g}, {x.max():.4g}] with low={self.params()['low']!r}, "
                        f"high={self.params()['high']!r}. Pass the bounds of your preprocessing, e.g. "
                        "LRP(model, composite='epsilon_gamma_box', low=-1.0, high=1.0), or per-channel arrays."
                    )

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        self.engine.prepare(inputs, targets)  # finds the final softmax before the support check
        check_lrp_support(self.model, self.engine.bypassed_layers if self.output == "logits" else [],
                          self.engine.feeds_explained())
        wrt = self.attributed_inputs(inputs)
        backward = LRPBackward(self.layer_rules(), self.stabilizer)  # equal rules: the same compiled function
        self._check_box(inputs, backward.rules)
        seeded = callable(targets) and self.init == "logit"
        result = self.engine.gradients(
            inputs, functools.partial(relevance_seed, targets) if seeded else targets, wrt_inputs=wrt,
            rule=backward, batch_size=self.batch_size, progress=self.progress
        )
        scores = result.scores.astype(np.float32)
        # a class score starts the relevance at its logit (the gradient times the score); a callable target
        # starts it at y * dS/dy, which relevance_seed's gradient already is
        start = scores if self.init == "logit" and not seeded else np.ones_like(scores)
        attributions = [
            (g * start.reshape((-1,) + (1,) * (g.ndim - 1))).astype(np.float32) for g in result.input_grads
        ]
        total = sum(a.reshape(len(a), -1).astype(np.float64).sum(axis=1) for a in attributions)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = (total / (scores if seeded else start).astype(np.float64)).astype(np.float32)
        return self._input_result(
            inputs, wrt, attributions, scores, result.targets, relevance_sum=total.astype(np.float32),
            conservation=ratio,
        )
