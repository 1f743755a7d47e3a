"""Layer-wise Relevance Propagation rules for Dense / Conv layers, term by term as zennit 0.5.

A rule is a sum of terms, as in zennit's ``BasicHook``: term ``k`` evaluates
the layer on a modified input ``m_k(x)`` with modified parameters
``(W_k, b_k)``, ``z_k = f(m_k(x); W_k, b_k)``, and the relevance is

    ``R_in = sum_k c_k * m_k(x) * J_k^T (R_out * s_k)``,

with ``s_k`` a scale (``1 / stabilize(denominator)``, times a mask for the
gamma rule). :class:`Epsilon`, :class:`Gamma`, :class:`ZPlus`,
:class:`AlphaBeta`, :class:`Flat` and :class:`ZBox` follow zennit term by
term (which parameters are clamped, which biases are zeroed, the sign-aware
stabiliser). How the terms become a backward pass, and what the other layers
do, is in :mod:`kerascope.propagation.lrp_walk`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np


# ---------------------------------------------------------------------------------------------- rules
def stabilize(z: Any, epsilon: float) -> Any:
    """zennit's stabiliser: ``z + epsilon * sign(z)``, with ``sign(0) = +1``.

    Example:
        >>> import numpy as np
        >>> keras.ops.convert_to_numpy(stabilize(np.array([-2.0, 0.0, 3.0], "float32"), 0.5)).tolist()
        [-2.5, 0.5, 3.5]
    """
    z = keras.ops.convert_to_tensor(z)
    # z + (epsilon or -epsilon): the same numbers as ``where(z >= 0, z + epsilon, z - epsilon)`` (doubling
    # and the difference epsilon - 2 epsilon are exact; -0.0 and NaN go the same way), without a select:
    # TensorFlow's CPU select took as long as three or four arithmetic ops (1.2 vs 0.6 ms on 8x64x64x16)
    return z + (epsilon - (2.0 * epsilon) * keras.ops.cast(z < 0.0, z.dtype))


def nonnegative_stabilize(z: Any, epsilon: float) -> Any:
    """:func:`stabilize` of a ``z`` that is never negative: ``z + epsilon`` (one op instead of four).

    For the positive parts ``x⁺W⁺ + b⁺ + x⁻W⁻`` (z⁺, the α part of αβ) and the flat rule's counts
    every product and sum is of non-negative numbers, so ``z >= 0`` (``-0.0`` included) and
    ``stabilize`` always takes its ``z + epsilon`` branch: the same numbers.

    Example:
        >>> import numpy as np
        >>> z = np.array([0.0, 3.0], "float32")
        >>> keras.ops.convert_to_numpy(nonnegative_stabilize(z, 0.5)).tolist() == keras.ops.convert_to_numpy(stabilize(z, 0.5)).tolist()
        True
    """
    return keras.ops.convert_to_tensor(z) + epsilon


def _pos(v: Any) -> Any:
    return None if v is None else keras.ops.maximum(v, 0.0)


def _neg(v: Any) -> Any:
    return None if v is None else keras.ops.minimum(v, 0.0)


def _plus_gamma(v: Any, gamma: float, part: Callable[[Any], Any]) -> Any:
    return None if v is None else v + gamma * part(v)


#: Term: (input modifier name, kernel, bias or None, coefficient).
Term = tuple[str, Any, Any, float]


@dataclass(frozen=True)
class Rule:
    """Base of the LRP rules for Dense / Conv layers (zennit ``BasicHook`` semantics).

    ``terms(kernel, bias)`` lists ``(input modifier, W_k, b_k, c_k)`` with the
    modifier one of ``"x"``, ``"pos"`` (``max(x, 0)``), ``"neg"``
    (``min(x, 0)``), ``"ones"``, ``"low"``, ``"high"``; ``scales(outputs, y)``
    the stopped-gradient scale of each term from the terms' outputs and the
    layer's pre-activation output ``y``.

    Example:
        >>> Epsilon(0.1).name, Gamma().gamma, AlphaBeta(2, 1).name
        ('epsilon', 0.25, 'alpha2beta1')
    """

    name = "rule"
    #: The first term is ``x`` with the layer's own parameters: the layer's output itself (ε, LRP-0, zᴮ).
    first_term_is_output = False

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        raise NotImplementedError

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Epsilon(Rule):
    """LRP-ε: ``R_i = x_i * sum_j w_ij R_j / (z_j + ε sign(z_j))`` (``epsilon=0``: LRP-0).

    Example:
        >>> Epsilon().epsilon
        1e-06
    """

    epsilon: float = 1e-6
    name = "epsilon"
    first_term_is_output = True

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        return [("x", kernel, bias, 1.0)]

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        return [1.0 / stabilize(outputs[0], self.epsilon)]


@dataclass(frozen=True)
class ZPlus(Rule):
    """LRP-z⁺ (zennit ``ZPlus``, α=1 β=0 allowing negative inputs): positive contributions only.

    ``z⁺ = x⁺ W⁺ + b⁺ + x⁻ W⁻``; ``R_i = (x⁺_i w⁺_ij + x⁻_i w⁻_ij) R_j / z⁺_j``.

    Example:
        >>> import numpy as np
        >>> [(name, keras.ops.convert_to_numpy(w).tolist()) for name, w, _, _ in ZPlus().terms(np.array([1.0, -2.0]), None)]
        [('pos', [1.0, 0.0]), ('neg', [0.0, -2.0])]
    """

    stabilizer: float = 1e-6
    name = "zplus"

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        return [("pos", _pos(kernel), _pos(bias), 1.0), ("neg", _neg(kernel), None, 1.0)]

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        s = 1.0 / nonnegative_stabilize(outputs[0] + outputs[1], self.stabilizer)
        return [s, s]


@dataclass(frozen=True)
class AlphaBeta(Rule):
    """LRP-αβ: ``α`` times the positive-contribution split minus ``β`` times the negative one (``α - β = 1``).

    Example:
        >>> AlphaBeta(1, 0).name
        'alpha1beta0'
        >>> AlphaBeta(2, 2)
        Traceback (most recent call last):
        ...
        ValueError: The alpha-beta rule needs alpha >= 0, beta >= 0 and alpha - beta = 1. Received: alpha=2, beta=2.
    """

    alpha: float = 2.0
    beta: float = 1.0
    stabilizer: float = 1e-6

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta < 0 or self.alpha - self.beta != 1:
            raise ValueError(
                "The alpha-beta rule needs alpha >= 0, beta >= 0 and alpha - beta = 1. "
                f"Received: alpha={self.alpha}, beta={self.beta}."
            )

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"alpha{self.alpha:g}beta{self.beta:g}"

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        a, b = self.alpha, -self.beta
        return [("pos", _pos(kernel), _pos(bias), a), ("neg", _neg(kernel), None, a),
                ("pos", _neg(kernel), _neg(bias), b), ("neg", _pos(kernel), None, b)]

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        plus = 1.0 / nonnegative_stabilize(outputs[0] + outputs[1], self.stabilizer)
        minus = 1.0 / stabilize(outputs[2] + outputs[3], self.stabilizer)
        return [plus, plus, minus, minus]


@dataclass(frozen=True)
class Gamma(Rule):
    """LRP-γ (zennit's generalised form): weights ``W + γ W⁺`` for positive outputs, ``W + γ W⁻`` for negative.

    Example:
        >>> Gamma(0.5).gamma
        0.5
    """

    gamma: float = 0.25
    stabilizer: float = 1e-6
    name = "gamma"

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        g = self.gamma
        up_k, down_k = _plus_gamma(kernel, g, _pos), _plus_gamma(kernel, g, _neg)
        return [("pos", up_k, _plus_gamma(bias, g, _pos), 1.0), ("neg", down_k, None, 1.0),
                ("pos", down_k, _plus_gamma(bias, g, _neg), 1.0), ("neg", up_k, None, 1.0)]

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        up = keras.ops.cast(y > 0, y.dtype) / stabilize(outputs[0] + outputs[1], self.stabilizer)
        down = keras.ops.cast(y < 0, y.dtype) / stabilize(outputs[2] + outputs[3], self.stabilizer)
        return [up, up, down, down]


@dataclass(frozen=True)
class Flat(Rule):
    """LRP-flat: relevance spread uniformly over each output's receptive field (all weights 1, no bias).

    Example:
        >>> import numpy as np
        >>> [(name, keras.ops.convert_to_numpy(w).tolist()) for name, w, _, _ in Flat().terms(np.array([3.0, -2.0]), None)]
        [('ones', [1.0, 1.0])]
    """

    stabilizer: float = 1e-6
    name = "flat"

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        return [("ones", keras.ops.ones_like(kernel), None, 1.0)]

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        return [1.0 / nonnegative_stabilize(outputs[0], self.stabilizer)]


@dataclass(frozen=True, eq=False)
class ZBox(Rule):
    """LRP-zᴮ for inputs bounded by ``low <= x <= high`` (numbers or arrays broadcast to one sample).

    ``R_i = sum_j (x_i w_ij - l_i w⁺_ij - h_i w⁻_ij) R_j / sum_i (x_i w_ij - l_i w⁺_ij - h_i w⁻_ij)``.

    Example:
        >>> ZBox(0.0, 1.0).name
        'zbox'
    """

    low: Any = 0.0
    high: Any = 1.0
    stabilizer: float = 1e-6
    name = "zbox"
    first_term_is_output = True

    def _key(self) -> tuple[Any, ...]:
        bounds = [np.asarray(v, np.float32) for v in (self.low, self.high)]
        return tuple((b.shape, b.tobytes()) for b in bounds) + (self.stabilizer,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ZBox) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def terms(self, kernel: Any, bias: Any) -> list[Term]:
        return [("x", kernel, bias, 1.0), ("low", _pos(kernel), _pos(bias), -1.0),
                ("high", _neg(kernel), _neg(bias), -1.0)]

    def scales(self, outputs: list[Any], y: Any) -> list[Any]:
        s = 1.0 / stabilize(outputs[0] - outputs[1] - outputs[2], self.stabilizer)
        return [s, s, s]


#: Rules by name (``"alpha2beta1"`` and ``"alpha1beta0"`` are AlphaBeta(2, 1) and AlphaBeta(1, 0)).
RULES: dict[str, Callable[[], Rule]] = {
    "epsilon": Epsilon, "gamma": Gamma, "zplus": ZPlus, "alpha2beta1": lambda: AlphaBeta(2.0, 1.0),
    "alpha1beta0": lambda: AlphaBeta(1.0, 0.0), "flat": Flat, "zbox": ZBox,
}


def make_rule(spec: Rule | str) -> Rule:
    """A rule from a :class:`Rule` instance or a name in :data:`RULES` (case, ``-``, ``_`` ignored).

    Example:
        >>> make_rule("Alpha2-Beta1")
        AlphaBeta(alpha=2.0, beta=1.0, stabilizer=1e-06)
        >>> make_rule("lrp0")
        Traceback (most recent call last):
        ...
        ValueError: Unknown LRP rule. Received: rule='lrp0'. Available: ['alpha1beta0', 'alpha2beta1', 'epsilon', 'flat', 'gamma', 'zbox', 'zplus'] or a Rule instance such as Epsilon(epsilon=0.0).
    """
    if isinstance(spec, Rule):
        return spec
    key = str(spec).lower().replace("-", "").replace("_", "")
    if key not in RULES:
        raise ValueError(
            f"Unknown LRP rule. Received: rule={spec!r}. Available: {sorted(RULES)} or a Rule instance "
            "such as Epsilon(epsilon=0.0)."
        )
    return RULES[key]()
