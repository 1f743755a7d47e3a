"""kerascope: explain the predictions of Keras 3 models.

Public names are imported on first use (PEP 562), so ``import kerascope`` and
the command line's ``--help``, ``methods`` and ``report`` never load Keras or
its backend; ``ks.GradCAM`` and friends load it the first time they are touched.

Example:
    >>> import keras, numpy as np, kerascope as ks
    >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"),
    ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2, activation="softmax")])
    >>> ks.GradCAM(m, layer="conv").explain(np.ones((1, 8, 8, 3))).attributions.shape
    (1, 8, 8)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kerascope.catalog import METHODS as _METHODS

__version__ = "0.1.0"

# public name -> module that defines it (method classes come from the catalogue)
_LAZY: dict[str, str] = {
    "CAM": "kerascope.methods.cam",
    "Method": "kerascope.methods.base",
    "GradientSHAP": "kerascope.methods.integrated",
    "Engine": "kerascope.core.engine",
    "Explanation": "kerascope.core.explanation",
    "ExplanationWarning": "kerascope.core.diagnostics",
    "LayerGradient": "kerascope.core.primitives",
    "input_gradients": "kerascope.core.primitives",
    "layer_gradients": "kerascope.core.primitives",
    "layers_gradients": "kerascope.core.primitives",
    "weight_gradients": "kerascope.core.primitives",
    "find_layer": "kerascope.core.layers",
    "layers": "kerascope.core.layers",
    "explain": "kerascope.api",
    "explain_generation": "kerascope.language.generation",
    "attention_maps": "kerascope.core.attention",
    "GenerationExplanation": "kerascope.language.generation",
    "explain_tokens": "kerascope.language.tokens",
    "TokenExplanation": "kerascope.language.tokens",
    "load_model": "kerascope.io.models",
    "quiet_backends": "kerascope.cli.quiet",
    "rebuild_report": "kerascope.report.rebuild",
    "add_feature_grid": "kerascope.report.features",
    "FeatureVisualization": "kerascope.features.visualize",
    "CRAFT": "kerascope.concepts.craft",
    "TCAV": "kerascope.concepts.tcav",
    "TCAVResult": "kerascope.concepts.tcav",
    "visualize_features": "kerascope.features.visualize",
    "plot_grid": "kerascope.viz.plots",
    "plot_sequence": "kerascope.viz.plots",
    "plot_tabular": "kerascope.viz.plots",
    "plot_tokens": "kerascope.viz.plots",
    **{entry.class_name: entry.module for entry in _METHODS},
}
_SUBMODULES = ("batch", "callbacks", "evaluation", "methods", "metrics", "targets")

__all__ = sorted([*_LAZY, *_SUBMODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        module = importlib.import_module(f"kerascope.{name}")
    elif name in _LAZY:
        module = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'kerascope' has no attribute {name!r}")
    globals()[name] = module  # later look-ups skip this function
    return module


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from kerascope import batch, callbacks, evaluation, methods, metrics, targets  # noqa: F401
    from kerascope.api import explain  # noqa: F401
    from kerascope.cli.quiet import quiet_backends  # noqa: F401
    from kerascope.concepts.craft import CRAFT  # noqa: F401
    from kerascope.concepts.tcav import TCAV, TCAVResult  # noqa: F401
    from kerascope.core.attention import attention_maps  # noqa: F401
    from kerascope.core.diagnostics import ExplanationWarning  # noqa: F401
    from kerascope.core.engine import Engine  # noqa: F401
    from kerascope.core.explanation import Explanation  # noqa: F401
    from kerascope.core.layers import find_layer, layers  # noqa: F401
    from kerascope.core.primitives import (  # noqa: F401
        LayerGradient,
        input_gradients,
        layer_gradients,
        layers_gradients,
        weight_gradients,
    )
    from kerascope.features.visualize import FeatureVisualization, visualize_features  # noqa: F401
    from kerascope.io.models import load_model  # noqa: F401
    from kerascope.language.generation import GenerationExplanation, explain_generation  # noqa: F401
    from kerascope.language.tokens import TokenExplanation, explain_tokens  # noqa: F401
    from kerascope.methods import *  # noqa: F401,F403
    from kerascope.report.features import add_feature_grid  # noqa: F401
    from kerascope.report.rebuild import rebuild_report  # noqa: F401
    from kerascope.viz.plots import plot_grid, plot_sequence, plot_tabular, plot_tokens  # noqa: F401
