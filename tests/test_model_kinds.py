"""Every registered method on every kind of model users bring: a correct result or a clear refusal.

Kinds: an Embedding + LSTM text classifier (token ids, and the same model explained at its embedding
with ``layer="embedding"``), a Conv1D + GRU time-series model ``(N, T, F)``, a Dense tabular model
``(N, F)``, a small ViT built from Keras layers (patch Conv2D, class token, MultiHeadAttention),
``MobileNetV3Small``, ``EfficientNetB0`` and ``ConvNeXtTiny`` (under ``-m slow``: ScoreCAM and AblationCAM
re-run the whole network once per channel; ``tests/test_cam_models.py`` checks their default CAM layer in
the default run), a two-input model with
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

Models are tiny and built once per module; CI time is reported by ``--durations``. Every cell runs on
TensorFlow, JAX and PyTorch: on JAX and PyTorch (scripts/test.sh) the default run keeps each kind's ``LIGHT``
part, the rest runs with ``-m slow`` there (JAX compiles every method for every model).
"""

from __future__ import annotations

import inspect
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
         lambda: PIXELS, (1, 32, 32, 3), (1, 32, 32), {"window": 8, "cell": 4, "mask": np.kron(GRID[::8, ::8], np.ones((16, 16), int))}, [1],
         slow=True),
    Kind("efficientnet", "`EfficientNetB0(weights=None)`, 32 x 32", application("EfficientNetB0"),
         lambda: PIXELS, (1, 32, 32, 3), (1, 32, 32), {"window": 8, "cell": 4, "mask": np.kron(GRID[::8, ::8], np.ones((16, 16), int))}, [1],
         slow=True),
    Kind("convnext", "`ConvNeXtTiny(weights=None)`, 32 x 32", application("ConvNeXtTiny"),
         lambda: PIXELS, (1, 32, 32, 3), (1, 32, 32), {"window": 8, "cell": 4, "mask": np.kron(GRID[::8, ::8], np.ones((16, 16), int))}, [1],
         slow=True),
    Kind("image_first", "two inputs, image first (`[image, table]`)", two_inputs(True), lambda: [IMAGES, SIDE],
         (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": [GRID, None]}, [0, 2]),
    Kind("image_second", "two inputs, image second (`[table, image]`)", two_inputs(False), lambda: [SIDE, IMAGES],
         (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": [None, GRID]}, [0, 2]),
    Kind("two_outputs", "two outputs (dict `cls` / `reg`), `output_index=\"cls\"`", two_outputs, lambda: IMAGES,
         (2, 16, 16, 3), (2, 16, 16), {"window": 4, "cell": 4, "mask": GRID, "output_index": "cls"}, [0, 2]),
]


# --------------------------------------------------------------------------- what must refuse, and why
CAMS = ("gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "eigencam", "scorecam", "ablationcam",
        "guided_gradcam")
GRADIENTS = ("saliency", "gradient_x_input", "guided_backprop", "deconvnet", "smoothgrad", "smoothgrad_squared",
             "vargrad", "integrated_gradients", "expected_gradients")
RULES = ("deeplift", "deeplift_shap", "lrp")
FEATURE_MASKS = ("feature_ablation", "shapley_exact", "shapley_sampling", "kernel_shap", "lime")
KNOWN = (*CAMS, *GRADIENTS, *RULES, "occlusion", "rise", *FEATURE_MASKS)

TOKEN_IDS = (r"integer inputs \(token ids\).*layer=", "token ids have no gradient: use `layer=\"embedding\"`")
RECURRENT = (r"unsupported layers.*(LSTM|GRU)", "no rule for recurrent layers")
ATTENTION = (r"unsupported layers.*(MultiHeadAttention|LayerNormalization)", "no rule for attention / LayerNorm")
NO_POSITIONS = (r"no layer output is a sequence.*tabular input \(N, F\).*Saliency",
                "a Dense-only model has no positions for a map")
IMAGES_ONLY = (r"RISE explains images", "masks are 2-D: images only")

#: (kind, method) -> (regex the refusal's message must match, short reason for docs/models.md);
#: every other cell of a method in KNOWN must return a map
REFUSALS: dict[tuple[str, str], tuple[str, str]] = {
    **{("text", m): TOKEN_IDS for m in GRADIENTS},
    **{("text", m): (r"unsupported layers.*Embedding", "no rule for Embedding / LSTM") for m in RULES},
    ("text", "scorecam"): (r"ScoreCAM does not apply to integer inputs", "masks cannot multiply token ids"),
    ("text", "guided_gradcam"): (r"GuidedGradCAM does not apply to integer inputs", TOKEN_IDS[1]),
    ("text", "occlusion"): (r"Token ids cannot be occluded.*FeatureAblation", "use FeatureAblation (pad id)"),
    ("text", "rise"): (r"Token ids cannot be occluded", "use FeatureAblation (pad id)"),
    ("text_embedding", "scorecam"): (r"ScoreCAM does not apply to integer inputs", "masks cannot multiply token ids"),
    ("text_embedding", "guided_gradcam"): (r"GuidedGradCAM does not apply to integer inputs", TOKEN_IDS[1]),
    **{("series", m): RECURRENT for m in RULES},
    ("series", "rise"): IMAGES_ONLY,
    **{("tabular", m): NO_POSITIONS for m in CAMS},
    ("tabular", "rise"): IMAGES_ONLY,
    **{("vit", m): ATTENTION for m in RULES},
    ("mobilenet", "lrp"): (r"LRP has no rule.*DepthwiseConv2D", "no LRP rule for depthwise convolutions"),
    ("efficientnet", "lrp"): (r"LRP has no rule.*DepthwiseConv2D", "no LRP rule for depthwise convolutions"),
    **{("convnext", m): (r"unsupported layers.*LayerNormalization", "no rule for LayerNorm") for m in RULES},
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
    if required_parameters(name) - set(offered):
        return None  # a method that needs what no kind can offer alike (the conductance family's layer / unit)
    return {k: v for k, v in offered.items() if k in accepted}


#: the feature-mask family's global-sensitivity methods: they attribute every input, as FEATURE_MASKS do
FEATURE_DESIGNS = ("sobol", "hsic")


def required_parameters(name: str) -> set[str]:
    """The method's keyword-only constructor parameters without a default."""
    signature = inspect.signature(get(name).__init__)
    return {p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty}


def run(kind: Kind, name: str, model: keras.Model, targets: Any = None) -> Outcome:
    params = parameters(kind, name)
    if params is None:  # the sweeps skip such cells; other tests reading outcome() see a refusal
        return Outcome(error=ValueError(f"Not applicable to this kind. Received: method={name!r}, kind={kind.name!r}."))
    try:
        method = build(name, model, params)
        return Outcome(method.explain(kind.inputs(), kind.targets if targets is None else targets))
    except ValueError as error:  # every kerascope refusal is a ValueError (UnsupportedModelError, LayoutError, ...)
        return Outcome(error=error)


_MODELS: dict[Any, keras.Model] = {}
_OUTCOMES: dict[tuple[str, str], Outcome] = {}


def model_of(kind: Kind) -> keras.Model:
    """Each model is built once per session and shared by every method (and test) that needs it."""
    if kind.build not in _MODELS:
        _MODELS[kind.build] = kind.build()
    return _MODELS[kind.build]


def outcome(kind: Kind, name: str) -> Outcome:
    key = (kind.name, name)
    if key not in _OUTCOMES:
        _OUTCOMES[key] = run(kind, name, model_of(kind))
    return _OUTCOMES[key]


def expected_shapes(kind: Kind, name: str) -> list[Any]:
    """The shapes a result may have: a CAM / RISE map, or one per attributed input."""
    if name in CAMS and name != "guided_gradcam" or name == "rise":
        return [kind.map_shape]
    if kind.name.startswith("image_") and name in (*FEATURE_MASKS, *RULES, *FEATURE_DESIGNS):  # every input, in order
        both = [kind.input_shape, (2, 3)]
        return [both if kind.name == "image_first" else both[::-1]]
    if name in KNOWN:
        return [kind.input_shape]
    return [kind.input_shape, kind.map_shape]  # a method this file does not know yet


def shape_of(attributions: Any) -> Any:
    if isinstance(attributions, (list, tuple)):
        return [tuple(np.shape(a)) for a in attributions]
    return tuple(np.shape(attributions))


def check(kind: Kind, name: str, got: Outcome) -> str | None:
    """None when the cell is right, else what is wrong."""
    refusal = REFUSALS.get((kind.name, name))
    if got.error is not None:
        message = str(got.error)
        if refusal is not None:
            return None if re.search(refusal[0], message, re.S) else f"refused, but not saying why: {message[:300]}"
        if name in KNOWN:
            return f"refused a kind it must explain: {type(got.error).__name__}: {message[:300]}"
        # a method this file does not know: a refusal must say what it received and what to do
        return None if "Received" in message else f"refusal without 'Received: ...': {message[:300]}"
    if refusal is not None:
        return f"returned a map where it must refuse ({refusal[1]})"
    e = got.explanation
    shape = shape_of(e.attributions)
    wanted = [s if isinstance(s, list) else tuple(s) for s in expected_shapes(kind, name)]
    if shape not in wanted:
        return f"attributions of shape {shape}, expected one of {wanted}"
    if not all(np.all(np.isfinite(a)) for a in (e.attributions if isinstance(shape, list) else [e.attributions])):
        return "non-finite attributions"
    if not np.all(np.isfinite(e.scores)) or len(e.targets) != len(e.scores):
        return "non-finite scores"
    return properties(kind, name, e)


def properties(kind: Kind, name: str, e: Any) -> str | None:
    """What holds exactly: summation-to-delta (DeepLIFT / DeepLiftShap), efficiency (exact Shapley, KernelSHAP)."""
    if name in ("deeplift", "deeplift_shap"):
        gap = np.abs(e.scores - e.extras["baseline_scores"]) if "baseline_scores" in e.extras else 1.0
        if np.any(np.abs(e.extras["completeness_error"]) > 1e-3 * np.maximum(gap, 1.0)):
            return f"summation-to-delta broken: {e.extras['completeness_error']}"
    if name in ("shapley_exact", "kernel_shap"):
        total = np.asarray(e.extras["feature_attributions"], np.float64)
        total = np.nansum(total, axis=1)
        if not np.allclose(total, e.scores - e.extras["base_scores"], rtol=1e-4, atol=1e-4):
            return f"efficiency broken: {total} vs {e.scores - e.extras['base_scores']}"
    return None


#: the part of each kind that also runs on JAX and PyTorch in the default run (scripts/test.sh): what the
#: kind is about (sequence / token CAMs, IG at the embedding, Occlusion and RISE on the chosen input, DeepLIFT
#: on every input, the refusals for token ids); every other method runs there under ``-m slow``. On
#: TensorFlow every cell runs by default.
LIGHT = {
    "text": ("gradcam", "integrated_gradients", "occlusion", "kernel_shap"),
    "text_embedding": ("gradcam", "integrated_gradients"),
    "series": ("gradcam", "integrated_gradients", "occlusion"),
    "tabular": ("gradcam", "integrated_gradients", "kernel_shap"),
    "vit": ("gradcam", "scorecam", "guided_gradcam"),
    "image_first": ("gradcam", "integrated_gradients", "occlusion", "rise", "deeplift"),
    "image_second": ("gradcam", "integrated_gradients", "occlusion", "rise", "deeplift"),
    "two_outputs": ("gradcam", "integrated_gradients", "rise"),
}
ON_TF = keras.backend.backend() == "tensorflow"


def methods(kind_name: str, part: str = "all") -> list[str]:
    """Registered methods: ``"light"`` (the kind's ``LIGHT`` part), ``"rest"`` (the others) or ``"all"``."""
    names, light = available(), LIGHT.get(kind_name, ())
    if part == "light":
        return [n for n in names if n in light]
    return [n for n in names if n not in light] if part == "rest" else names


def slow_off_tf(test: Callable[..., None]) -> Callable[..., None]:
    """Mark a test slow on JAX and PyTorch (their default run in scripts/test.sh keeps the light part)."""
    return test if ON_TF else pytest.mark.slow(test)


def default_methods(kind_name: str) -> list[str]:
    """What the default (not slow) run covers on this backend: everything on TensorFlow, LIGHT elsewhere."""
    return methods(kind_name, "all" if ON_TF else "light")


def kinds() -> list[Any]:
    cells = []
    for k in KINDS:
        for part in ("light", "rest") if k.name in LIGHT else ("all",):
            slow = k.slow or (part == "rest" and not ON_TF)
            cells.append(pytest.param(k, part, id=f"{k.name}-{part}", marks=[pytest.mark.slow] if slow else []))
    return cells


@pytest.mark.parametrize(("kind", "part"), kinds())
def test_every_registered_method(kind: Kind, part: str) -> None:
    """Every registered method on this kind: a finite map of the promised shape, or the expected refusal."""
    problems = {}
    for name in methods(kind.name, part):
        if parameters(kind, name) is None:
            continue
        problem = check(kind, name, outcome(kind, name))
        if problem:
            problems[name] = problem
    assert not problems, "\n".join(f"{kind.name} x {name}: {why}" for name, why in problems.items())


def kind(name: str) -> Kind:
    return next(k for k in KINDS if k.name == name)


def test_tabular_against_closed_forms() -> None:
    """One hidden ReLU layer, ``f_t(x) = relu(x W1 + b1) W2[:, t] + b2[t]``: every gradient rule by hand,
    DeepLIFT's rescale multiplier by hand, and per-feature ablation by a loop over ``model.predict``."""
    tab = kind("tabular")
    model = model_of(tab)
    w1, b1 = (keras.ops.convert_to_numpy(v).astype(np.float64) for v in model.get_layer("hidden").weights)
    w2, b2 = (keras.ops.convert_to_numpy(v).astype(np.float64) for v in model.get_layer("out").weights)
    x, t = TABLE.astype(np.float64), np.array(tab.targets)
    z, z0 = x @ w1 + b1, b1  # hidden pre-activations at x and at the zero baseline
    up = w2[:, t].T  # (N, 8): d f_t / d relu(z)
    gradient = ((z > 0) * up) @ w1.T
    expected = {
        "saliency": gradient,
        "gradient_x_input": x * gradient,
        "guided_backprop": ((z > 0) * np.maximum(up, 0)) @ w1.T,
        "deconvnet": np.maximum(up, 0) @ w1.T,
        "deeplift": x * (((np.maximum(z, 0) - np.maximum(z0, 0)) / np.where(np.abs(z - z0) < 1e-10, 1, z - z0)
                          * up) @ w1.T),
    }
    f = lambda v: model.predict(v, verbose=0)[np.arange(len(v)), t]  # noqa: E731
    ablated = np.stack([f(np.where(np.arange(5) == j, 0.0, TABLE).astype("float32")) for j in range(5)], axis=1)
    expected["feature_ablation"] = expected["occlusion"] = f(TABLE)[:, None] - ablated
    for name, want in expected.items():
        got = outcome(tab, name).explanation.attributions
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=name)
    # a CAM cannot be forced onto a Dense layer either: its (N, 8) output has no positions
    with pytest.raises(ValueError, match="hidden"):
        build("gradcam", model, {"layer": "hidden"}).explain(TABLE, 0)


def test_image_first_and_second_give_the_same_maps() -> None:
    """The image's position does not matter: every method gives the same maps with the image first or second."""
    first, second = kind("image_first"), kind("image_second")
    # the sampling feature-mask methods draw coalitions (Sobol / HSIC: design columns) over the features in input
    # order: another draw
    sampled = ("shapley_sampling", "kernel_shap", "lime", *FEATURE_DESIGNS)
    for name in (n for n in default_methods(first.name) if n not in sampled):
        a, b = outcome(first, name), outcome(second, name)
        assert (a.error is None) == (b.error is None), name
        if a.error is not None:
            continue
        one, two = a.explanation.attributions, b.explanation.attributions
        if isinstance(one, list):  # every input, in the model's order: reversed in the other model
            one, two = one, two[::-1]
        for p, q in zip(one if isinstance(one, list) else [one], two if isinstance(two, list) else [two], strict=True):
            np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5 * (np.abs(p).max() + 1e-12), err_msg=name)
    # the image chosen by name: ablating one image cell does not depend on the table's features being in the
    # game, so it equals the image's part of the default (every input) result
    chosen = build("feature_ablation", model_of(second), {"input_index": "image", "mask": GRID})  # one input: one mask
    whole = outcome(second, "feature_ablation").explanation.attributions[1]
    np.testing.assert_allclose(chosen.explain([SIDE, IMAGES], second.targets).attributions, whole, rtol=1e-5,
                               atol=1e-6)


def test_two_outputs_callable_target_equals_output_index() -> None:
    """A callable target on a dict-output model works on the first call and equals ``output_index="cls"``."""
    two = kind("two_outputs")
    model = two_outputs()  # a fresh model: the callable is the first thing its engine sees
    params_without = {k: v for k, v in two.params.items() if k != "output_index"}
    for name in default_methods(two.name):
        by_index = outcome(two, name)
        if by_index.error is not None or parameters(two, name) is None:
            continue
        params = {k: v for k, v in {**CHEAP, **params_without}.items() if k in accepted_parameters(get(name))}
        by_callable = build(name, model, params).explain(IMAGES, lambda outputs: outputs["cls"][:, 0])
        reference = build(name, model_of(two), parameters(two, name)).explain(IMAGES, [0, 0])
        got, want = by_callable.attributions, reference.attributions
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * (np.abs(want).max() + 1e-12), err_msg=name)


# --------------------------------------------------------------------------- the table in docs/models.md
def render_table() -> str:
    """Markdown: methods x kinds from ``REFUSALS`` (what the tests above check), reasons as footnotes."""
    shown = KINDS
    reasons: list[str] = []
    names = [f"{k.name}{' (slow)' if k.slow else ''}" for k in shown]
    lines = ["| method | " + " | ".join(names) + " |", "|" + " --- |" * (len(shown) + 1)]
    for name in sorted(KNOWN):
        cells = []
        for k in shown:
            if parameters(k, name) is None:
                cells.append("n/a")
            elif (k.name, name) in REFUSALS:
                why = REFUSALS[(k.name, name)][1]
                reasons += [] if why in reasons else [why]
                cells.append(f"no ({chr(ord('a') + reasons.index(why))})")
            else:
                cells.append("yes")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"({chr(ord('a') + i)}) {why}." for i, why in enumerate(reasons)]
    return "\n".join(lines)


def test_docs_table_is_the_tested_matrix() -> None:
    text = (ROOT / "docs" / "models.md").read_text()
    begin, end = "<!-- kinds-table: begin (python tests/test_model_kinds.py) -->", "<!-- kinds-table: end -->"
    assert begin in text and end in text, "docs/models.md lost its table markers"
    table = text[text.index(begin) + len(begin):text.index(end)].strip()
    assert table == render_table(), "docs/models.md is stale: run `python tests/test_model_kinds.py` and paste"
    assert all(k.name in text for k in KINDS)


@slow_off_tf
def test_docs_examples_run() -> None:
    """The examples of docs/models.md run as written (one namespace, in order); on JAX and PyTorch under
    ``-m slow`` (~20 s of compilation there; the same calls are covered by the light cells above)."""
    text = (ROOT / "docs" / "models.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 6
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(blocks), "docs/models.md", "exec"), namespace)  # noqa: S102
    assert abs(float(namespace["per_token"].sum() - (namespace["ig"].scores - namespace["ig"].extras["baseline_scores"]).sum())) < 0.05 * (
        abs(float(namespace["ig"].scores[0] - namespace["ig"].extras["baseline_scores"][0])) + 1e-3)


if __name__ == "__main__" and "--explore" in sys.argv:
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    for kind in KINDS:
        if wanted and kind.name not in wanted:
            continue
        model = model_of(kind)
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


if __name__ == "__main__" and "--explore" not in sys.argv:
    print(render_table())
