"""LRP composites: which rule each Dense / Conv layer gets, by zennit's definitions or by the user's map.

Composites by name (zennit 0.5; ``first`` is the first Dense / Conv layer in
the model's layer order that the composite's first-layer rule applies to):

=========================  ====================  ==================  ===========================
name                       Dense                 Conv                first layer
=========================  ====================  ==================  ===========================
``epsilon``                ε                     ε                   —
``epsilon_plus``           ε                     z⁺                  —
``epsilon_plus_flat``      ε                     z⁺                  flat (first Dense or Conv)
``epsilon_alpha2_beta1``   ε                     α2β1                —
``epsilon_gamma_box``      ε                     γ                   zᴮ (first Conv)
=========================  ====================  ==================  ===========================

``rules={key: rule}`` overrides them; a key is a layer path or name, or a
class name (``"Dense"``, ``"Conv2D"``); paths and names win over classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

from kerascope.propagation.lrp_rules import AlphaBeta, Epsilon, Flat, Gamma, Rule, ZBox, ZPlus, make_rule

COMPOSITES = ("epsilon", "epsilon_plus", "epsilon_plus_flat", "epsilon_alpha2_beta1", "epsilon_gamma_box")


def composite_rules(
    name: str | None, *, epsilon: float = 1e-6, gamma: float = 0.25, low: Any = 0.0, high: Any = 1.0,
    stabilizer: float = 1e-6,
) -> tuple[Rule | None, Rule | None, tuple[Rule, str] | None]:
    """``(dense rule, conv rule, (first-layer rule, "any" | "conv") or None)`` of a composite.

    Example:
        >>> dense, conv, first = composite_rules("epsilon_gamma_box", low=-1.0, high=1.0)
        >>> dense, conv.name, first[0].name, first[1]
        (Epsilon(epsilon=1e-06), 'gamma', 'zbox', 'conv')
        >>> composite_rules("lrp")
        Traceback (most recent call last):
        ...
        ValueError: Unknown LRP composite. Received: composite='lrp'. Available: ('epsilon', 'epsilon_plus', 'epsilon_plus_flat', 'epsilon_alpha2_beta1', 'epsilon_gamma_box') or None (then `rules` must cover every Dense / Conv layer).
    """
    if name is None:
        return None, None, None
    key = str(name).lower().replace("-", "_")
    if key not in COMPOSITES:
        raise ValueError(
            f"Unknown LRP composite. Received: composite={name!r}. Available: {COMPOSITES} or None "
            "(then `rules` must cover every Dense / Conv layer)."
        )
    dense = Epsilon(epsilon)
    conv: Rule = {
        "epsilon": dense, "epsilon_plus": ZPlus(stabilizer), "epsilon_plus_flat": ZPlus(stabilizer),
        "epsilon_alpha2_beta1": AlphaBeta(2.0, 1.0, stabilizer),
        "epsilon_gamma_box": Gamma(gamma, stabilizer),
    }[key]
    first: tuple[Rule, str] | None = None
    if key == "epsilon_plus_flat":
        first = (Flat(stabilizer), "any")
    elif key == "epsilon_gamma_box":
        first = (ZBox(low, high, stabilizer), "conv")
    return dense, conv, first


def assign_rules(
    affine: list[tuple[str, keras.Layer]],
    composite: tuple[Rule | None, Rule | None, tuple[Rule, str] | None],
    overrides: Mapping[str, Rule | str] | None = None,
    all_layers: list[tuple[str, keras.Layer]] | None = None,
) -> dict[str, Rule]:
    """The rule of every Dense / Conv layer (``affine``: ``(path, layer)`` in model order).

    Raises a ``ValueError`` for an override key that names no Dense / Conv
    layer or class, and for layers left without a rule (``composite=None``).

    Example:
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c1"),
        ...                       keras.layers.Conv2D(2, 2, name="c2"), keras.layers.Flatten(),
        ...                       keras.layers.Dense(1, name="d")])
        >>> affine = [(l.name, l) for l in m.layers if l.name in ("c1", "c2", "d")]
        >>> r = assign_rules(affine, composite_rules("epsilon_plus_flat"), {"c2": "gamma"})
        >>> {p: rule.name for p, rule in r.items()}
        {'c1': 'flat', 'c2': 'gamma', 'd': 'epsilon'}
    """
    dense_rule, conv_rule, first = composite
    overrides = {k: make_rule(v) for k, v in (overrides or {}).items()}
    known = {p for p, _ in affine} | {layer.name for _, layer in affine} | {type(layer).__name__ for _, layer in affine}
    unknown = [k for k in overrides if k not in known]
    if unknown:
        names = sorted({p for p, _ in (all_layers or affine)})
        raise ValueError(
            f"LRP `rules` keys must name Dense / Conv layers (path or name) or their classes. Received: "
            f"{unknown}. Dense / Conv layers: {[p for p, _ in affine]}; all layers: {names}."
        )
    result: dict[str, Rule] = {}
    first_done = first is None
    missing = []
    for path, layer in affine:
        is_dense = isinstance(layer, keras.layers.Dense)
        rule = dense_rule if is_dense else conv_rule
        if not first_done and (first[1] == "any" or not is_dense):  # type: ignore[index]
            rule, first_done = first[0], True  # type: ignore[index]
        for key in (type(layer).__name__, layer.name, path):  # most specific last
            rule = overrides.get(key, rule)
        if rule is None:
            missing.append(path)
        else:
            result[path] = rule
    if missing:
        raise ValueError(
            f"LRP needs a rule for every Dense / Conv layer. Received: no rule for {missing} (composite=None). "
            "Pass a composite (e.g. composite='epsilon_plus') or cover them in `rules`."
        )
    return result
