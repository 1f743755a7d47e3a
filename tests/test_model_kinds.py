"""Every registered method on every kind of model users bring: a correct result or a clear refusal.

Kinds: an Embedding + LSTM text classifier (token ids, and the same model explained at its embedding
with ``layer="embedding"``), a Conv1D + GRU time-series model ``(N, T, F)``, a Dense tabular model
``(N, F)``, a small ViT built from Keras layers (patch Conv2D, class token, MultiHeadAttention),
``MobileNetV3Small`` (``EfficientNetB0`` and ``ConvNeXtTiny`` under ``-m slow``), a two-input model with
the image first and second, and a two-output model with dict outputs.

The methods come from the registry, so a new method is run on every kind without editing this file:
it must either return finite attributions of the shape its family promises, or refuse with a
``ValueError`` that says what was received or what to do. ``EXPECTED`` states, for the methods known
here, which cells must refuse and why (a regex of the message): a method that returns a map where a
refusal is expected (e.g. a CAM on a Dense-only tabular model) fails the test. Where a hand-written
computation exists it is checked too (tabular: the closed-form gradient of a one-hidden-layer ReLU
network, per-feature ablation by a loop; completeness / efficiency wherever the method reports it;
multi-output: a callable target equals ``output_index=`` on the first call; multi-input: the image
first and second give the same maps). ``docs/models.md``'s table is rendered from ``EXPECTED``
(``python tests/test_model_kinds.py`` prints it) and checked against it.

Models are tiny and built once per module; CI time is reported by ``--durations``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kerascope.methods.registry import accepted_parameters, available, build, get  # noqa: E402

L = keras.layers
ROOT = Path(__file__).resolve().parents[1]

#: cheap settings offered to every method that takes them (the defaults cost thousands of passes)
CHEAP = {"steps": 4, "samples": 4, "masks": 16, "batch_size": 64, "max_features": 16}


# --------------------------------------------------------------------------- the kinds
@dataclass
class Kind:
    """A model kind: how to build it, its inputs, what its maps look like, which extra parameters it needs."""

    name: str
    title: str
    build: Callable[[], keras.Model]
    inputs: Callable[[], Any]
    #: (N, ...) shape of an input attribution and of a CAM map
    input_shape: tuple[int, ...] | list[tuple[int, ...]]
    map_shape: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)  # offered to methods that accept them
    targets: Any = None
    slow: bool = False


def text_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    x = L.Embedding(20, 8, name="embedding")(tokens)
    x = L.LSTM(6, return_sequences=True, name="lstm")(x)
    x = L.GlobalAveragePooling1D(name="gap")(x)
    return keras.Model(tokens, L.Dense(3, activation="softmax", name="out")(x), name="text")


def series_model() -> keras.Model:
    keras.utils.set_random_seed(1)
    series = keras.Input((8, 2), name="series")
    x = L.Conv1D(4, 3, padding="same", activation="relu", name="conv")(series)
    x = L.GRU(5, return_sequences=True, name="gru")(x)
    x = L.GlobalAveragePooling1D(name="gap")(x)
    return keras.Model(series, L.Dense(3, name="out")(x), name="series")


def tabular_model() -> keras.Model:
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [keras.Input((5,)), L.Dense(8, activation="relu", name="hidden"), L.Dense(3, name="out")], name="tabular"
    )


class ClassToken(L.Layer):
    """A learned class token put before the patch tokens."""

    def build(self, shape):
        self.token = self.add_weight(shape=(1, 1, shape[-1]), initializer="random_normal", name="token")

    def call(self, x):
        return keras.ops.concatenate([keras.ops.repeat(self.token, keras.ops.shape(x)[0], axis=0), x], axis=1)


class TakeFirst(L.Layer):
    def call(self, x):
        return x[:, 0]


def vit_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    image = keras.Input((16, 16, 3), name="image")
    x = L.Reshape((-1, 8), name="patches")(L.Conv2D(8, 4, strides=4, name="patch")(image))
    x = ClassToken(name="cls")(x)
    h = L.LayerNormalization(name="ln_a")(x)
    x = L.Add(name="add_a")([x, L.MultiHeadAttention(2, 4, name="mha")(h, h)])
    x = L.Add(name="add_b")([x, L.Dense(8, activation="gelu", name="mlp")(L.LayerNormalization(name="ln_b")(x))])
    x = TakeFirst(name="take_cls")(L.LayerNormalization(name="final_ln")(x))
    return keras.Model(image, L.Dense(3, name="head")(x), name="vit")


def cnn(image: Any, prefix: str = "") -> Any:
    h = L.Conv2D(4, 3, activation="relu", name=f"{prefix}conv1")(image)
    h = L.Conv2D(6, 3, activation="relu", name=f"{prefix}conv2")(h)
    return L.GlobalAveragePooling2D(name=f"{prefix}gap")(h)


def two_inputs(image_first: bool) -> Callable[[], keras.Model]:
    def make() -> keras.Model:
        keras.utils.set_random_seed(4)  # the same weights in both orders
        image, table = keras.Input((16, 16, 3), name="image"), keras.Input((3,), name="table")
        merged = L.Concatenate()([cnn(image), L.Dense(4, activation="tanh", name="tab")(table)])
        out = L.Dense(3, name="out")(merged)
        return keras.Model([image, table] if image_first else [table, image], out, name="two_inputs")

    return make


def two_outputs() -> keras.Model:
    keras.utils.set_random_seed(5)
    image = keras.Input((16, 16, 3), name="image")
    pooled = cnn(image)
    return keras.Model(image, {"cls": L.Dense(3, name="cls")(pooled), "reg": L.Dense(1, name="reg")(pooled)})


def application(name: str) -> Callable[[], keras.Model]:
    def make() -> keras.Model:
        keras.utils.set_random_seed(6)
        return getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3), classes=3)

    return make


RNG = np.random.default_rng(0)
TOKENS = RNG.integers(1, 20, (2, 6)).astype("int32")
SERIES = RNG.normal(size=(2, 8, 2)).astype("float32")
TABLE = RNG.normal(size=(3, 5)).astype("float32")
IMAGES = RNG.uniform(size=(2, 16, 16, 3)).astype("float32")
SIDE = RNG.normal(size=(2, 3)).astype("float32")
PIXELS = RNG.uniform(0, 255, (1, 32, 32, 3)).astype("float32")
GRID = np.repeat(np.repeat(np.arange(4).reshape(2, 2), 8, axis=0), 8, axis=1)  # 4 features: cheap coalitions

KINDS = [
    Kind("text", "Embedding + LSTM text classifier, token ids `(N, T)`", text_model, lambda: TOKENS,
         (2, 6), (2, 6), {"window": 2}, [0, 2]),
    Kind("text_embedding", "the same, attributed at the embedding (`layer=\"embedding\"`)", text_model,
         lambda: TOKENS, (2, 6, 8), (2, 6), {"layer": "embedding", "window": 2}, [0, 2]),
    Kind("series", "Conv1D + GRU time series `(N, T, F)`", series_model, lambda: SERIES, (2, 8, 2), (2, 8),
         {"window": 2}, [1, 0]),
    Kind("tabular", "Dense tabular `(N, F)`", tabular_model, lambda: TABLE, (3, 5), (3, 5), {"window": 1},
         [0, 1, 2]),
    Kind("vit", "ViT from Keras layers (patch Conv2D, class token, MultiHeadAttention)", vit_model,
         lambda: IMAGES, (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": GRID}, [0, 2]),
    Kind("mobilenet", "`MobileNetV3Small(weights=None)`, 32 x 32", application("MobileNetV3Small"),
         lambda: PIXELS, (1, 32, 32, 3), (1, 32, 32), {"window": 8, "cell": 4, "mask": np.kron(GRID[::8, ::8], np.ones((16, 16), int))}, [1]),
    Kind("efficientnet", "`EfficientNetB0(weights=None)`, 32 x 32", application("EfficientNetB0"),
         lambda: PIXELS, (1, 32, 32, 3), (1, 32, 32), {"window": 8, "cell": 4, "mask": np.kron(GRID[::8, ::8], np.ones((16, 16), int))}, [1],
         slow=True),
    Kind("convnext", "`ConvNeXtTiny(weights=None)`, 32 x 32", application("ConvNeXtTiny"),
         lambda: PIXELS, (1, 32, 32, 3), (1, 32, 32), {"window": 8, "cell": 4, "mask": np.kron(GRID[::8, ::8], np.ones((16, 16), int))}, [1],
         slow=True),
    Kind("image_first", "two inputs, image first (`[image, table]`)", two_inputs(True), lambda: [IMAGES, SIDE],
         (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": GRID, "input_index": "image"}, [0, 2]),
    Kind("image_second", "two inputs, image second (`[table, image]`)", two_inputs(False), lambda: [SIDE, IMAGES],
         (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": GRID, "input_index": "image"}, [0, 2]),
    Kind("two_outputs", "two outputs (dict `cls` / `reg`), `output_index=\"cls\"`", two_outputs, lambda: IMAGES,
         (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": GRID, "output_index": "cls"}, [0, 2]),
]


# --------------------------------------------------------------------------- what must refuse, and why
CAMS = ("gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "eigencam", "scorecam", "ablationcam",
        "guided_gradcam")
GRADIENTS = ("saliency", "gradient_x_input", "guided_backprop", "deconvnet", "smoothgrad", "smoothgrad_squared",
             "vargrad", "integrated_gradients", "expected_gradients")
FEATURE_MASKS = ("feature_ablation", "shapley_exact", "shapley_sampling", "kernel_shap", "lime")

#: (kind, method) -> regex the refusal's message must match (every other known cell must work)
REFUSALS: dict[tuple[str, str], str] = {
    **{("text", m): r"integer inputs.*layer=|token ids.*layer=|not differentiable.*`layer=`" for m in GRADIENTS},
    ("text", "deeplift"): r"Embedding",
    ("text", "deeplift_shap"): r"Embedding",
    ("text", "scorecam"): r"integer inputs",
    ("text", "guided_gradcam"): r"integer inputs",
    ("text", "occlusion"): r"Token ids cannot be occluded.*FeatureAblation",
    ("text", "rise"): r"Token ids|integer|images",
    ("text_embedding", "deeplift"): r"n/a",
    ("series", "rise"): r"images \(N, H, W, C\)|Received",
    **{("series", m): r"GRU|recurrent" for m in ("deeplift", "deeplift_shap")},
    **{("tabular", m): r"no layer with|positions|spatial|sequence" for m in CAMS},
    ("tabular", "rise"): r"images \(N, H, W, C\)|Received",
    **{("vit", m): r"MultiHeadAttention" for m in ("deeplift", "deeplift_shap")},
}


# --------------------------------------------------------------------------- running one cell
@dataclass
class Outcome:
    explanation: Any = None
    error: BaseException | None = None


def parameters(kind: Kind, name: str) -> dict[str, Any] | None:
    """What the method gets on this kind (``None``: the kind's parameter does not apply to the method)."""
    accepted = accepted_parameters(get(name))
    if "layer" in kind.params and "layer" not in accepted:
        return None  # attribution at a layer: only for methods that take one
    offered = {**CHEAP, **kind.params}
    return {k: v for k, v in offered.items() if k in accepted}


def run(kind: Kind, name: str, model: keras.Model, targets: Any = None) -> Outcome:
    params = parameters(kind, name)
    try:
        method = build(name, model, params)
        return Outcome(method.explain(kind.inputs(), kind.targets if targets is None else targets))
    except ValueError as error:  # every kerascope refusal is a ValueError (UnsupportedModelError, LayoutError, ...)
        return Outcome(error=error)


@pytest.fixture(scope="module")
def built() -> dict[str, keras.Model]:
    return {}


def model_of(kind: Kind, cache: dict[str, keras.Model]) -> keras.Model:
    if kind.build not in cache:
        cache[kind.build] = kind.build()
    return cache[kind.build]


if __name__ == "__main__" and "--explore" in sys.argv:
    cache: dict = {}
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    for kind in KINDS:
        if wanted and kind.name not in wanted:
            continue
        model = model_of(kind, cache)
        for name in available():
            if parameters(kind, name) is None:
                print(f"{kind.name:14s} {name:20s} n/a")
                continue
            got = run(kind, name, model)
            if got.error is None:
                a = got.explanation.attributions
                shape = [np.shape(x) for x in a] if isinstance(a, (list, dict)) else np.shape(a)
                print(f"{kind.name:14s} {name:20s} OK {shape}", flush=True)
            else:
                print(f"{kind.name:14s} {name:20s} REFUSED {type(got.error).__name__}: {str(got.error)[:260]}", flush=True)
