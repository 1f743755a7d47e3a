"""The models every scenario shares: the bundled demo CNN and Keras applications with ``weights=None``.

Nothing is downloaded. Imports are inside the functions, so listing scenarios stays cheap.

Example::

    model = build_model("mobilenetv2", size=160)
    x = random_images(model, 8)
"""

from __future__ import annotations

from typing import Any

#: the model names the scenarios accept, with the input sides their families use
MODELS = ("demo", "mobilenetv2", "resnet50", "vgg16")
#: (Grad-CAM layer, Score-CAM layer of <= 64 channels) of each model at the peers' settings
PEER_LAYERS = {"mobilenetv2": ("out_relu", "block_9_project_BN"), "resnet50": ("conv5_block3_out", "conv1_relu"),
               "demo": ("conv3b", "conv3b")}


def build_model(name: str, size: int = 224) -> Any:
    """The model ``name`` (``size`` x ``size`` RGB inputs for the applications; the demo model is 64 px)."""
    import keras

    shape = (size, size, 3)
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None, classifier_activation=None, input_shape=shape)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, classifier_activation=None, input_shape=shape)
    if name == "vgg16":  # five 2x2 max poolings (DeepLIFT's max-pool rule)
        return keras.applications.VGG16(weights=None, classifier_activation=None, input_shape=shape)
    if name == "demo":
        import kerascope as ks
        from kerascope.data import demo_model_path

        return ks.load_model(demo_model_path())
    raise ValueError(f"Unknown model. Received: model={name!r}. Expected one of {', '.join(MODELS)}.")


def random_images(model: Any, n: int, seed: int | None = None) -> Any:
    """``n`` float32 inputs uniform in [0, 1] of ``model``'s input shape (seed ``n`` by default)."""
    import numpy as np

    shape = tuple(model.inputs[0].shape[1:])
    return np.random.default_rng(n if seed is None else seed).uniform(0, 1, (n, *shape)).astype(np.float32)


def demo_images(n: int) -> Any:
    """``n`` of the demo model's own 64 px images (repeated when ``n`` is larger than the set), float32."""
    import numpy as np

    from kerascope.data import demo_images as files
    from kerascope.io.images import load_images

    found = files()
    return np.asarray(load_images([found[i % len(found)] for i in range(n)], size=(64, 64)).inputs, np.float32)


def few_channel_layer(model: Any, limit: int) -> Any:
    """The last layer with a rank-4 output of at most ``limit`` channels (for Score-/Ablation-CAM)."""
    found = None
    for layer in model.layers:
        shape = getattr(getattr(layer, "output", None), "shape", None)
        if shape is not None and len(shape) == 4 and shape[-1] is not None and shape[-1] <= limit:
            found = layer
    if found is None:
        raise ValueError(f"No rank-4 layer with at most {limit} channels in {model.name}.")
    return found
