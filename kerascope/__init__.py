"""kerascope: explain the predictions of Keras 3 models.

Example:
    >>> import keras, numpy as np, kerascope as ks
    >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv"),
    ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2, activation="softmax")])
    >>> ks.GradCAM(m, layer="conv").explain(np.ones((1, 8, 8, 3))).attributions.shape
    (1, 8, 8)
"""

from kerascope import batch, callbacks, evaluation, methods, metrics
from kerascope.api import explain
from kerascope.core.engine import Engine
from kerascope.core.explanation import Explanation
from kerascope.core.layers import find_layer, layers
from kerascope.core.primitives import (
    LayerGradient,
    input_gradients,
    layer_gradients,
    layers_gradients,
    weight_gradients,
)
from kerascope.io.models import load_model
from kerascope.methods import (
    CAM,
    RISE,
    AblationCAM,
    Deconvnet,
    DeepLIFT,
    EigenCAM,
    ExpectedGradients,
    GradCAM,
    GradCAMPlusPlus,
    GradientSHAP,
    GradientXInput,
    GuidedBackprop,
    GuidedGradCAM,
    HiResCAM,
    IntegratedGradients,
    LayerCAM,
    Method,
    Occlusion,
    Saliency,
    ScoreCAM,
    SmoothGrad,
    SmoothGradSquared,
    VarGrad,
    XGradCAM,
)
from kerascope.report.rebuild import rebuild_report
from kerascope.viz.plots import plot_grid, plot_sequence, plot_tabular

__version__ = "0.1.0"

__all__ = [
    "AblationCAM",
    "CAM",
    "Deconvnet",
    "DeepLIFT",
    "EigenCAM",
    "Engine",
    "ExpectedGradients",
    "Explanation",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientSHAP",
    "GradientXInput",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "IntegratedGradients",
    "LayerCAM",
    "LayerGradient",
    "Method",
    "Occlusion",
    "RISE",
    "Saliency",
    "ScoreCAM",
    "SmoothGrad",
    "SmoothGradSquared",
    "VarGrad",
    "XGradCAM",
    "__version__",
    "batch",
    "evaluation",
    "explain",
    "find_layer",
    "input_gradients",
    "layer_gradients",
    "layers",
    "layers_gradients",
    "load_model",
    "methods",
    "metrics",
    "weight_gradients",
]
__all__ += ["callbacks", "plot_grid", "plot_sequence", "plot_tabular", "rebuild_report"]
