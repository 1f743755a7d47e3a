"""Which pixel preprocessing a model expects: read from its own layers where it says so.

A model that starts with a ``Rescaling`` or ``Normalization`` layer (also inside a nested
model, e.g. a Keras application built with ``include_preprocessing=True``) scales its inputs
itself and wants raw pixels in [0, 255]. A few Keras applications without such a layer are
recognised by name (MobileNet/Inception/Xception: [-1, 1]; VGG/ResNet50: ``caffe``;
DenseNet: ``torch``). Otherwise pixels / 255 in [0, 1] is assumed, and the reason says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from kerascope.io.images import PREPROCESS

#: ``--preprocess`` choices: every mode of :data:`kerascope.io.images.PREPROCESS` plus ``auto``.
CHOICES = ("auto", *PREPROCESS)

_SCALING = ("Rescaling", "Normalization")
# layers that keep the pixel scale (inactive augmentation, resizing, cropping) are looked through
_TRANSPARENT = ("InputLayer", "Resizing", "CenterCrop", "Identity", "Cropping2D", "ZeroPadding2D")
# Keras applications that expect a scale but carry no layer for it (by the model's name)
_APPLICATIONS = (
    (r"^(mobilenet_|mobilenetv2_|inception_v3|inception_resnet_v2|xception|resnet\d+v2|nasnet)", "symmetric"),
    (r"^(vgg1[69]|resnet(50|101|152))$", "caffe"),
    (r"^densenet\d+$", "torch"),
)


def _first_layers(model: Any) -> Iterator[Any]:
    """Layers in call order, nested models opened, stopping at the first layer that computes."""
    for layer in getattr(model, "layers", []):
        if hasattr(layer, "layers") and getattr(layer, "layers", None):
            yield layer  # the nested model itself (for its name), then its layers
            yield from _first_layers(layer)
            return
        yield layer
        name = type(layer).__name__
        if name not in _TRANSPARENT and not name.startswith("Random"):
            return


def scaling_layer(model: Any) -> Any | None:
    """The ``Rescaling``/``Normalization`` layer a model starts with (nested models searched), or ``None``.

    Example:
        >>> import keras
        >>> inner = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255, name="scale")])
        >>> m = keras.Sequential([keras.Input((8, 8, 3)), inner, keras.layers.Flatten()])
        >>> scaling_layer(m).name
        'scale'
        >>> scaling_layer(keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten()])) is None
        True
    """
    for layer in _first_layers(model):
        if type(layer).__name__ in _SCALING:
            return layer
    return None


def _describe(layer: Any) -> str:
    config = layer.get_config()
    if type(layer).__name__ == "Rescaling":
        scale, offset = config.get("scale"), config.get("offset")
        return f"Rescaling layer {layer.name!r} (scale={scale:.4g}, offset={offset:.4g})" if isinstance(
            scale, (int, float)) and isinstance(offset, (int, float)) else f"Rescaling layer {layer.name!r}"
    return f"Normalization layer {layer.name!r}"


def _normalization_range(layer: Any) -> float | None:
    """The largest absolute mean a ``Normalization`` layer was adapted to (None when unknown)."""
    import numpy as np

    mean = getattr(layer, "mean", None)
    if mean is None:
        return None
    try:
        return float(np.max(np.abs(np.asarray(mean))))
    except (TypeError, ValueError):
        return None


def resolve_preprocess(model: Any, mode: str = "auto") -> tuple[str, str]:
    """The pixel preprocessing for ``model`` and why: ``(mode, reason)``.

    ``mode="auto"`` reads the model: ``"raw"`` when it starts with a ``Rescaling`` or
    ``Normalization`` layer (nested models searched; a ``Normalization`` adapted to values
    in [0, 1] gives ``"unit"``), the documented scale of a recognised Keras application,
    else ``"unit"`` (pixels / 255). Any other mode is returned as given.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 127.5, -1, name="r"),
        ...                       keras.layers.Flatten()])
        >>> resolve_preprocess(m)
        ('raw', "the model rescales its inputs itself (Rescaling layer 'r' (scale=0.007843, offset=-1)): pixels in [0, 255]")
        >>> resolve_preprocess(keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten()]))[0]
        'unit'
        >>> resolve_preprocess(m, "symmetric")
        ('symmetric', 'chosen with --preprocess')
    """
    if mode != "auto":
        if mode not in PREPROCESS:
            raise ValueError(f"Unknown preprocessing. Received: preprocess={mode!r}. Expected one of {list(CHOICES)}.")
        return mode, "chosen with --preprocess"
    layer = scaling_layer(model)
    if layer is not None:
        if type(layer).__name__ == "Normalization":
            largest = _normalization_range(layer)
            if largest is not None and largest <= 1.0:
                return "unit", (f"the model normalises its inputs itself ({_describe(layer)}, adapted to values "
                                "in [0, 1]): pixels / 255")
        return "raw", f"the model rescales its inputs itself ({_describe(layer)}): pixels in [0, 255]"
    names = [getattr(model, "name", "")] + [getattr(x, "name", "") for x in _first_layers(model) if hasattr(x, "layers")]
    for name in names:
        for pattern, known in _APPLICATIONS:
            if re.match(pattern, str(name).lower()):
                return known, f"Keras application {name!r} without a preprocessing layer: {PREPROCESS[known]}"
    return "unit", ("no Rescaling/Normalization layer at the model's input, so pixels / 255 -> [0, 1] is assumed; "
                    "choose another with --preprocess (raw, symmetric, caffe, torch)")
