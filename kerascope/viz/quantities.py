"""What a method's map measures: one quantity and unit per method family, beside the sign conventions.

Every picture kerascope draws (report panels, :meth:`Explanation.figure`) labels its colour bar
with the map's *quantity* (what one value means) and *unit*, so that a reader knows what the
numbers on the bar are. ``score`` is the explained output: the class's logit when the model
ends in a softmax kerascope could bypass, else the output itself. ``{x}`` in a quantity is the
thing attributed to: ``pixel`` for images, ``feature``, ``time step``, ``token``, or
``activation`` for attributions at an inner layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Quantity:
    """What a map's values are (``quantity``) and in which unit (``unit``).

    Example:
        >>> map_quantity("saliency").label()
        'd score / d pixel [score per pixel value]'
    """

    family: str
    quantity: str
    unit: str

    def label(self) -> str:
        """``quantity [unit]``, the colour bar's caption."""
        return f"{self.quantity} [{self.unit}]"


#: One row per method family: (quantity, unit); ``{x}`` is what is attributed to (pixel, feature, ...).
FAMILIES: dict[str, tuple[str, str]] = {
    "gradient": ("d score / d {x}", "score per {x} value"),
    "absolute gradient": ("|d score / d {x}|", "score per {x} value"),
    "smoothed gradient": ("mean d score / d {x} over noisy copies", "score per {x} value"),
    "squared gradient": ("mean (d score / d {x})² over noisy copies", "(score per {x} value)²"),
    "gradient variance": ("variance of d score / d {x} over noisy copies", "(score per {x} value)²"),
    "contribution": ("contribution of each {x} to the score", "score units"),
    "completeness": ("share of score(input) − score(baseline)", "score units"),
    "perturbation": ("score drop when the {x} is replaced by the baseline", "score units"),
    "surrogate": ("weight of a local linear surrogate", "score units"),
    "cam": ("share of the score (gradient-weighted activations)", "score units"),
    "score cam": ("score-weighted activations", "score units"),
    "principal component": ("first principal component of the activations", "arbitrary units"),
    "guided cam": ("guided gradient × Grad-CAM", "arbitrary units"),
    "masking": ("mean score when the region is kept", "score units"),
    "sensitivity": ("share of the score's variance explained", "fraction (0-1)"),
    "dependence": ("dependence of the score on the region (HSIC)", "arbitrary units"),
    "attention": ("attention flow to each {x}", "share of attention"),
    "region": ("attribution summed over ranked regions", "score units"),
    "attribution": ("attribution", "the method's own units"),
}

#: Each registered method's family (methods not listed here are ``"attribution"``).
METHOD_FAMILIES: dict[str, str] = {
    **dict.fromkeys(("saliency", "guided_backprop", "deconvnet"), "gradient"),
    "smoothgrad": "smoothed gradient",
    "smoothgrad_squared": "squared gradient",
    "vargrad": "gradient variance",
    **dict.fromkeys(("gradient_x_input", "lrp", "fullgrad", "internal_influence"), "contribution"),
    **dict.fromkeys(("integrated_gradients", "expected_gradients", "deeplift", "deeplift_shap", "blur_ig",
                     "guided_ig", "shapley_exact", "shapley_sampling", "kernel_shap", "layer_conductance",
                     "neuron_conductance"), "completeness"),
    **dict.fromkeys(("occlusion", "feature_ablation"), "perturbation"),
    "lime": "surrogate",
    **dict.fromkeys(("gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "gradcam_elementwise", "fem",
                     "shapleycam"),
                    "cam"),
    **dict.fromkeys(("scorecam", "ablationcam"), "score cam"),
    **dict.fromkeys(("eigencam", "eigengradcam", "kpcacam"), "principal component"),
    "guided_gradcam": "guided cam",
    "rise": "masking",
    "sobol": "sensitivity",
    "hsic": "dependence",
    **dict.fromkeys(("attention_rollout", "gradient_rollout"), "attention"),
    "xrai": "region",
}

#: What ``{x}`` becomes for each kind of data.
ATTRIBUTED_TO = {"image": "pixel", "tabular": "feature", "sequence": "time step", "text": "token",
                 "layer": "activation"}


def map_quantity(method: str, params: Mapping[str, Any] | None = None, kind: str = "image") -> Quantity:
    """The quantity and unit of a method's map (see :data:`FAMILIES` and :data:`METHOD_FAMILIES`).

    ``params`` may change it (``absolute=True`` makes a gradient its magnitude); ``kind`` is
    ``"image"``, ``"tabular"``, ``"sequence"``, ``"text"`` or ``"layer"`` (attributions at an inner layer).

    Example:
        >>> map_quantity("gradcam").label()
        'share of the score (gradient-weighted activations) [score units]'
        >>> map_quantity("saliency", {"absolute": True}, kind="tabular").quantity
        '|d score / d feature|'
        >>> map_quantity("my_method").family
        'attribution'
    """
    key = str(method).lower().replace("-", "_")
    family = METHOD_FAMILIES.get(key) or ("contribution" if key.startswith("lrp") else "attribution")
    if family == "gradient" and params and bool(params.get("absolute", False)):
        family = "absolute gradient"
    quantity, unit = FAMILIES[family]
    word = ATTRIBUTED_TO.get(kind, "input")
    return Quantity(family, quantity.replace("{x}", word), unit.replace("{x}", word))


#: Families whose maps are a layer's spatial map drawn over the image, even when a layer is named.
SPATIAL_FAMILIES = ("cam", "score cam", "principal component", "guided cam")


def attribution_kind(method: str, layer: str | None) -> str:
    """``"layer"`` when a method's map attributes to an inner layer's activations, else ``"image"``.

    A CAM's layer is where its map is read, not what it attributes to.

    Example:
        >>> attribution_kind("saliency", "conv"), attribution_kind("gradcam", "conv"), attribution_kind("saliency", None)
        ('layer', 'image', 'image')
    """
    return "layer" if layer and map_quantity(method).family not in SPATIAL_FAMILIES else "image"
