"""Warnings about maps that cannot be read as explanations: identically zero, or incomplete.

A plausible wrong map is worse than none. After every ``explain``, the result is checked:

* a sample whose map is zero everywhere gets an :class:`ExplanationWarning` naming the
  sample (its position in the call), why such a map comes out and what to do;
* an Integrated-Gradients-family result whose attributions miss ``f(x) - f(baseline)`` by
  more than :data:`COMPLETENESS_TOLERANCE` (relative) gets one too.

Silence them with ``warnings.simplefilter("ignore", ks.ExplanationWarning)``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = ["COMPLETENESS_TOLERANCE", "ExplanationWarning", "check_explanation"]

COMPLETENESS_TOLERANCE = 0.05
"""Relative completeness error ``|sum(attr) - (f(x) - f(b))| / |f(x) - f(b)|`` above which a warning is given."""


class ExplanationWarning(UserWarning):
    """A map that is identically zero, or an attribution that misses its own completeness check.

    Example:
        >>> issubclass(ExplanationWarning, UserWarning)
        True
    """


def _listed(indices: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in indices[:10])
    return f"[{shown}{', ...' if len(indices) > 10 else ''}]"


def _zero_reason(method: Any, explanation: Any) -> str:
    layer = getattr(explanation, "layer", None) or getattr(method, "layer", None)
    if getattr(method, "layer_data", None) is not None:  # a CAM: a map from one layer
        where = f"layer {layer!r}" if isinstance(layer, str) else "the CAM layer"
        return (
            f"at {where}, either the weighted sum of the channels is <= 0 at every position (the final ReLU "
            "clipped every position: a layer before a normalisation or an attention block often is), or the "
            "layer's positions do not reach the explained output (tokens that do not feed the class token, a "
            "transformer's last block). Choose another `layer=` (e.g. an earlier block's output, or the "
            "normalisation before the classifier), or a gradient method on the input"
        )
    return (
        "the score does not change with the input to first order: a saturated output (a sigmoid or softmax at "
        "0 or 1), an operation whose gradient is zero (keras.ops.sign, round, a step, argmax), or a ReLU path "
        "dead for this input. Explain the pre-activation with `output_layer=` (e.g. the Dense layer before a "
        "sigmoid written in your own call()), remove the zero-gradient operation from the path, or use a "
        "perturbation method (Occlusion, FeatureAblation) that does not differentiate"
    )


def check_explanation(explanation: Any, method: Any) -> None:
    """Warn (:class:`ExplanationWarning`) about zero maps and missed completeness in ``explanation``.

    Example:
        >>> import warnings, keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Lambda(keras.ops.sign), keras.layers.Dense(1)])
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     _ = ks.Saliency(m).explain(np.ones((2, 2)), 0)
        >>> [issubclass(w.category, ExplanationWarning) for w in seen]
        [True]
    """
    name = type(method).__name__
    maps = [np.asarray(a) for a in explanation.attributions] if isinstance(explanation.attributions, list) \
        else [np.asarray(explanation.attributions)]
    maps = [a for a in maps if a.ndim >= 1 and a.dtype.kind == "f" and len(a)]
    if maps:
        zero = np.all([np.all(a.reshape(len(a), -1) == 0, axis=1) for a in maps], axis=0)
        zero_rows = np.flatnonzero(zero)
        if len(zero_rows):
            warnings.warn(
                f"{name}: the map of sample(s) {_listed(zero_rows)} (of {len(zero)}) is identically zero: "
                f"{_zero_reason(method, explanation)}. A zero map says nothing about which inputs matter.",
                ExplanationWarning, stacklevel=3,
            )
    extras = getattr(explanation, "extras", None) or {}
    error, base = extras.get("completeness_error"), extras.get("baseline_scores")
    scores = getattr(explanation, "scores", None)
    if error is None or base is None or scores is None:
        return
    error = np.asarray(error, np.float64).reshape(-1)
    delta = np.asarray(scores, np.float64).reshape(-1) - np.asarray(base, np.float64).reshape(-1)
    if error.shape != delta.shape:
        return
    scale = np.maximum(np.abs(delta), 1e-6 * np.maximum(np.abs(np.asarray(scores, np.float64).reshape(-1)), 1.0))
    relative = np.abs(error) / scale
    bad = np.flatnonzero(relative > COMPLETENESS_TOLERANCE)
    if len(bad):
        worst = int(bad[np.argmax(relative[bad])])
        warnings.warn(
            f"{name}: the attributions of sample(s) {_listed(bad)} miss completeness by more than "
            f"{COMPLETENESS_TOLERANCE:.0%} (sample {worst}: sum {float(error[worst] + delta[worst]):.4g} where "
            f"f(x) - f(baseline) = {float(delta[worst]):.4g}). The path needs more points (raise `steps=`, or "
            "pass `tolerance=` to choose them per sample), or the gradient along the path is zero or misleading "
            "(a saturated output: explain its pre-activation with `output_layer=`; an operation with zero "
            "gradient such as keras.ops.sign; a normalisation that makes f constant along the path from the zero "
            "baseline: pass another `baseline=`).",
            ExplanationWarning, stacklevel=3,
        )
