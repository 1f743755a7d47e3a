"""Property-based fuzzing of the public API: a correct result or kerascope's own error.

Hypothesis draws inputs (dtype, rank, shape, NaN / Inf, empty, lists / tuples /
dicts with right, wrong and missing keys), targets (ints incl. huge and
negative, floats, bools, arrays of every shape, lists, callables returning
every shape) and the parameters of every registered method (valid and invalid
values), on a tiny model of each kind: functional, nested, subclassed,
multi-input and multi-output (8 x 8 inputs, 4 channels, built once per module).

Every case must end in one of two ways:

* a correct result: finite attributions of the right shape, one finite score
  and one target per sample (the requested class when one was given), and
  agreement with an independent computation where one exists (a callable
  target ``o[:, k]`` equals ``targets=k``; a dict of inputs in any key order
  equals the list in the model's order; ``batch_size`` does not change the
  result);
* a ``ValueError`` / ``TypeError`` raised by kerascope's own code (the
  innermost frame is in the ``kerascope`` package) whose message names the
  argument at fault.

Anything else fails: another exception type (``IndexError``, ``KeyError``,
TensorFlow's ``InvalidArgumentError``, ``FloatingPointError`` ...), an error
raised from inside NumPy / Keras / a backend, NaN or Inf in a result, or a
change to the model (weights, config, any layer's attributes).

Profiles (registered in ``tests/conftest.py``): ``ci`` (default, bounded and
derandomized) and ``long``::

    KERAS_BACKEND=tensorflow python -m pytest -q tests/test_fuzz.py --hypothesis-profile=long
"""

from __future__ import annotations

import functools
import os
import traceback
import warnings
from typing import Any

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from keras import ops

import kerascope
from kerascope.catalog import METHODS
from kerascope.methods import registry
from kerascope.methods.base import UnsupportedModelError
from tests.conftest import assert_unchanged, snapshot

N = 2  # samples per explained batch
SIZE = 8  # image side
CLASSES = {"functional": 3, "nested": 3, "subclassed": 3, "multi_input": 3, "multi_output": 3}
KINDS = tuple(CLASSES)
PACKAGE = os.path.dirname(kerascope.__file__)


def examples(factor: float) -> int:
    """This test's example count: ``factor`` times the active profile's ``max_examples``."""
    return max(1, int(settings.default.max_examples * factor))


# --------------------------------------------------------------------------- models
def _functional() -> keras.Model:
    x_in = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv1")(x_in)
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(x_in, keras.layers.Dense(3, activation="softmax", name="head")(x), name="functional")


def _nested() -> keras.Model:
    backbone = keras.Sequential(
        [keras.Input((SIZE, SIZE, 3)), keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv")],
        name="backbone",
    )
    x_in = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.GlobalAveragePooling2D(name="gap")(backbone(x_in))
    return keras.Model(x_in, keras.layers.Dense(3, name="head")(x), name="nested")


class _Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__(name="subclassed")
        self.conv = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv")
        self.gap = keras.layers.GlobalAveragePooling2D(name="gap")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x: Any) -> Any:
        return self.head(self.gap(self.conv(x)))


def _subclassed() -> keras.Model:
    model = _Subclassed()
    model(np.zeros((1, SIZE, SIZE, 3), "float32"))
    return model


def _multi_input() -> keras.Model:
    # two inputs of the SAME shape: a dict matched by position instead of by name would go unnoticed
    p = keras.Input((SIZE, SIZE, 3), name="p")
    q = keras.Input((SIZE, SIZE, 3), name="q")
    a = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv")(p))
    b = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(2, 3, activation="tanh", padding="same", name="qconv")(q))
    x = keras.layers.Concatenate()([a, b])
    return keras.Model({"p": p, "q": q}, keras.layers.Dense(3, name="head")(x), name="multi_input")


def _multi_output() -> keras.Model:
    x_in = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv")(x_in))
    outputs = {"a": keras.layers.Dense(3, name="a")(x), "b": keras.layers.Dense(2, name="b")(x)}
    return keras.Model(x_in, outputs, name="multi_output")


@functools.cache
def zoo() -> dict[str, keras.Model]:
    """One tiny model of each kind, built once per test module (and backend)."""
    keras.utils.set_random_seed(0)
    return {
        "functional": _functional(),
        "nested": _nested(),
        "subclassed": _subclassed(),
        "multi_input": _multi_input(),
        "multi_output": _multi_output(),
    }


@functools.cache
def other_model() -> keras.Model:
    """A model that is not being explained (its layers and methods are wrong arguments)."""
    return _functional()


def images(n: int = N, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def good_inputs(kind: str, n: int = N) -> Any:
    if kind == "multi_input":
        return {"p": images(n, 1), "q": images(n, 2)}
    return images(n)


def common_for(kind: str) -> dict[str, Any]:
    """What a model of this kind needs to be explainable at all."""
    return {"output_index": "a"} if kind == "multi_output" else {}


# --------------------------------------------------------------------------- outcome checks
def assert_own_error(error: BaseException, names: tuple[str, ...]) -> None:
    """``error`` is a ValueError / TypeError raised by kerascope's code, naming one of ``names``."""
    frames = traceback.extract_tb(error.__traceback__)
    where = frames[-1].filename if frames else "?"
    message = str(error)
    assert isinstance(error, (ValueError, TypeError)), f"{type(error).__name__}: {message}"
    if isinstance(error, UnsupportedModelError):
        names = (*names, "Received")  # the method does not apply to this model: it names the layers at fault
    assert os.path.abspath(where).startswith(PACKAGE), (
        f"{type(error).__name__} raised outside kerascope ({where}:{frames[-1].lineno}), not checked "
        f"before it: {message}"
    )
    lowered = message.lower()
    assert any(name.lower() in lowered for name in names), f"the message names none of {names}: {message}"


def run_case(models: list[keras.Model], call: Any, names: tuple[str, ...]) -> Any:
    """``call()``: its result, or None after checking that it raised kerascope's own error.

    The models are checked unchanged in every case.
    """
    before = [snapshot(m) for m in models]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    except (ValueError, TypeError) as error:
        note(f"refused: {type(error).__name__}: {error}")
        assert_own_error(error, names)
        return None
    finally:
        for model, state in zip(models, before, strict=True):
            assert_unchanged(model, state)


def flat(attributions: Any) -> list[np.ndarray]:
    if isinstance(attributions, dict):
        return [np.asarray(v) for v in attributions.values()]
    if isinstance(attributions, (list, tuple)):
        return [np.asarray(v) for v in attributions]
    return [np.asarray(attributions)]


def check_explanation(explanation: Any, n: int, targets: Any = None, num_classes: int | None = None) -> None:
    """Finite attributions with a batch axis of ``n``, finite scores, one valid target per sample."""
    assert isinstance(explanation, kerascope.Explanation)
    for array in flat(explanation.attributions):
        assert array.ndim >= 2 and array.shape[0] == n, array.shape
        assert np.issubdtype(array.dtype, np.floating), array.dtype
        assert np.all(np.isfinite(array)), "NaN or Inf in the attributions"
    scores = np.asarray(explanation.scores)
    assert scores.shape == (n,), scores.shape
    assert np.all(np.isfinite(scores)), "NaN or Inf in the scores"
    resolved = np.asarray(explanation.targets)
    assert resolved.shape == (n,), resolved.shape
    if num_classes is not None:
        assert np.all((resolved >= 0) & (resolved < num_classes)), resolved
    if isinstance(targets, (int, np.integer)) and not isinstance(targets, bool):
        assert resolved.tolist() == [int(targets)] * n


def expected_shapes(name: str, kind: str, inputs: Any, params: dict[str, Any]) -> list[tuple[int, ...]] | None:
    """The attribution shapes a method must return for ``inputs`` (None: not predicted here)."""
    arrays = list(inputs.values()) if isinstance(inputs, dict) else [inputs]
    if params.get("layer") is not None:
        return None  # layer attributions: the layer's shape (checked by the layer tests)
    cls = registry.get(name)
    cam = issubclass(cls, kerascope.methods.cam.CAM)
    if name == "guided_gradcam":
        return [arrays[_position(params.get("input_index"), len(arrays))].shape]
    if cam:
        if params.get("upsample", True) is False:
            return None
        return [arrays[0].shape[:-1]]
    if name in ("rise", "fullgrad"):  # one map per image
        return [arrays[0].shape[:-1]]
    if name == "xrai":
        return [arrays[_position(params.get("input_index"), len(arrays))].shape[:-1]]
    index = params.get("input_index")
    if index is None:
        return [arrays[0].shape] if name == "occlusion" else [a.shape for a in arrays]
    picks = index if isinstance(index, list) else [index]
    return [arrays[_position(i, len(arrays))].shape for i in picks]


def _position(index: Any, count: int) -> int:
    """The position an accepted ``input_index`` (None, a position, an input name) stands for."""
    if index is None:
        return 0
    if isinstance(index, str):
        return {"p": 0, "q": 1, "image": 0}[index]
    return int(index) % count


FEATURE_METHODS = {"feature_ablation", "kernel_shap", "lime", "shapley_exact", "shapley_sampling"}


# --------------------------------------------------------------------------- inputs
DTYPES = ("float32", "float16", "float64", "int32", "int64", "uint8", "bool", "object", "str", "complex64")
RIGHT_SHAPE = (SIZE, SIZE, 3)


@st.composite
def arrays(draw: Any, n: int | None = None) -> np.ndarray:
    """One input array: any dtype, the right shape most of the time, else any rank and size; NaN / Inf."""
    batch = draw(st.sampled_from([1, 2, 3, 0])) if n is None else n
    if draw(st.booleans()):  # half of the arrays are clean: the valid paths are fuzzed too
        return images(max(batch, 1), draw(st.integers(0, 3)))
    dtype = draw(st.sampled_from(DTYPES))
    if draw(st.integers(0, 3)):
        shape = (batch, *RIGHT_SHAPE)
    else:
        rank = draw(st.integers(0, 5))
        shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 8, 9]), min_size=rank, max_size=rank)))
    values = np.random.default_rng(draw(st.integers(0, 3))).uniform(0, 255 if dtype == "uint8" else 1, shape)
    if dtype in ("float32", "float16", "float64", "complex64") and values.size and draw(st.integers(0, 3)) == 0:
        values.flat[draw(st.integers(0, values.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    if dtype == "str":
        return values.astype(str)
    if dtype == "object":
        return values.astype(object)
    if dtype == "float16":
        # float16 overflows to inf above 65504: a huge value is the user's NaN / Inf case too
        values = values * draw(st.sampled_from([1.0, 1e6]))
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def structured(kind: str) -> st.SearchStrategy:
    """Inputs as users pass them: an array, a list / tuple, a dict with right / wrong / missing keys, junk."""
    one = arrays()
    junk = st.sampled_from([None, [], {}, (), "image.png", 3.0, [[0.5] * 3] * 2, [np.zeros((2, 8, 8, 3)), None]])
    if kind != "multi_input":
        return st.one_of(one, one, one, st.lists(one, min_size=1, max_size=2), st.tuples(one),
                         st.dictionaries(st.sampled_from(["image", "x"]), one, max_size=2), junk)
    def clean_or_fuzzed(n: int) -> st.SearchStrategy:
        return st.one_of(st.integers(0, 3).map(lambda seed: images(n, seed)), arrays(n))

    pair = st.integers(1, 3).flatmap(lambda n: st.tuples(clean_or_fuzzed(n), clean_or_fuzzed(n)))
    right = pair.map(lambda ab: {"p": ab[0], "q": ab[1]})
    reordered = pair.map(lambda ab: {"q": ab[1], "p": ab[0]})
    keyed = st.dictionaries(st.sampled_from(["p", "q", "r", "image"]), one, max_size=3)
    return st.one_of(right, reordered, reordered, keyed, pair.map(list), pair.map(tuple), one, st.lists(one, max_size=3),
                     junk)


def fast_method_names() -> list[str]:
    return ["saliency", "gradcam", "integrated_gradients", "occlusion", "feature_ablation"]


def fast_params(name: str, kind: str) -> dict[str, Any]:
    return base_params(name, kind)


@settings(max_examples=examples(3), suppress_health_check=list(HealthCheck))
@given(data=st.data(), kind=st.sampled_from(KINDS), name=st.sampled_from(fast_method_names()))
def test_fuzzed_inputs_give_a_correct_result_or_a_clear_error(data: Any, kind: str, name: str) -> None:
    model = zoo()[kind]
    inputs = data.draw(structured(kind), label="inputs")
    params = fast_params(name, kind)
    method = registry.build(name, model, params)
    result = run_case([model], lambda: method.explain(inputs, 0), ("input", "shape", "sample", "dtype"))
    if result is None:
        return
    n = len(flat(inputs)[0])
    check_explanation(result, n, 0, CLASSES[kind])
    if isinstance(inputs, dict) and kind == "multi_input":
        # matched by name, whatever the key order: the same as the list in the model's order
        reference = method.explain([np.asarray(inputs["p"], np.float32), np.asarray(inputs["q"], np.float32)], 0)
        got, want = result.attributions, reference.attributions
        if isinstance(got, dict):  # per-input attributions come back in the user's structure
            got, want = [got["p"], got["q"]], list(want)
        for a, b in zip(flat(got), flat(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- targets
def _named(function: Any, name: str) -> Any:
    function.__name__ = function.__qualname__ = name
    return function


# callables written with keras.ops, every output shape; defined once so compiled functions are reused
CALLABLES = {
    "class1": _named(lambda o: o[:, 1], "class1"),  # one score per sample: valid
    "sum": _named(lambda o: ops.sum(o, axis=1), "sum"),  # valid
    "column": _named(lambda o: o[:, 1:2], "column"),  # (N, 1)
    "identity": _named(lambda o: o, "identity"),  # (N, classes): several scores per sample
    "total": _named(lambda o: ops.sum(o), "total"),  # one score for the whole batch
    "first_row": _named(lambda o: o[0], "first_row"),  # (classes,): sample 0's scores
    "empty": _named(lambda o: o[:, 0:0], "empty"),  # (N, 0)
    "constant": _named(lambda o: 1.0, "constant"),  # not a function of the outputs
}
HUGE = [2**31, 2**32 + 2, 2**40, -(2**40), 2**63 - 1, 2**64, 2**70, -(2**70)]
TARGET_DTYPES = ("int64", "int32", "uint8", "uint64", "float32", "float64", "bool", "object", "str")


@st.composite
def target_arrays(draw: Any, n: int) -> np.ndarray:
    shape = draw(st.sampled_from([(n,), (n,), (n, 1), (1,), (n + 1,), (), (n, 2), (0,)]))
    dtype = draw(st.sampled_from(TARGET_DTYPES))
    values = draw(st.lists(st.one_of(st.integers(-2, 4), st.sampled_from(HUGE[:4])), min_size=1, max_size=1))[0]
    array = np.full(shape, values, dtype=object)
    if array.size:
        array.flat[0] = draw(st.integers(0, 3))
    if dtype == "object":
        return array
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return array.astype(np.float64).astype(dtype)
        except OverflowError:
            return array


def targets_strategy(n: int) -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.integers(-3, 4),
        st.integers(0, 2),
        st.sampled_from(HUGE),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, 1.0, 2.0, 1.5, -1.0]),
        st.booleans(),
        st.sampled_from([np.int64(1), np.int8(2), np.uint64(2**63), np.float32(2.0), np.bool_(True), np.int64(2**40)]),
        target_arrays(n),
        st.lists(st.one_of(st.integers(-1, 3), st.sampled_from(HUGE)), max_size=n + 1),
        st.lists(st.integers(0, 2), min_size=n, max_size=n).map(tuple),
        st.sampled_from(["1", "cat", b"1", {"a": 0}, {0, 1}, [[0], [1]], [0.5, 1.0], [None, 1]]),
        st.sampled_from(sorted(CALLABLES)).map(CALLABLES.get),
    )


def on_output(kind: str, function: Any) -> Any:
    """For the multi-output model the callable gets the dict of outputs: apply it to output 'a'."""
    if kind != "multi_output":
        return function
    return _named(lambda o: function(o["a"]), f"{function.__name__}_of_a")


MULTI_OUTPUT_CALLABLES = {name: on_output("multi_output", f) for name, f in CALLABLES.items()}


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@settings(max_examples=examples(3), suppress_health_check=list(HealthCheck))
@given(data=st.data(), kind=st.sampled_from(KINDS), name=st.sampled_from(fast_method_names()))
def test_fuzzed_targets_give_a_correct_result_or_a_clear_error(data: Any, kind: str, name: str) -> None:
    model = zoo()[kind]
    x = good_inputs(kind)
    targets = data.draw(targets_strategy(N), label="targets")
    if callable(targets) and kind == "multi_output":
        targets = MULTI_OUTPUT_CALLABLES[targets.__name__]
    method = registry.build(name, model, fast_params(name, kind))
    result = run_case([model], lambda: method.explain(x, targets), ("target",))
    if result is None:
        assert not (_integer(targets) and 0 <= targets < CLASSES[kind]), f"a valid class was refused: {targets!r}"
        return
    check_explanation(result, N, targets, None if callable(targets) else CLASSES[kind])
    if _integer(targets):
        assert 0 <= int(targets) < CLASSES[kind]
    elif not callable(targets) and targets is not None:
        resolved = np.asarray(result.targets)
        given_ = np.broadcast_to(np.asarray(targets, dtype=np.float64).reshape(-1), (N,))
        np.testing.assert_array_equal(resolved, given_)  # the classes asked for, not wrapped or rounded
    if getattr(targets, "__name__", "").startswith(("class1", "column")):
        # a callable picking column 1 explains what targets=1 explains
        reference = method.explain(x, 1)
        for got, want in zip(flat(result.attributions), flat(reference.attributions), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- parameters of every method
COARSE = np.repeat(np.repeat(np.arange(4).reshape(2, 2), 4, axis=0), 4, axis=1)  # (8, 8): 4 features
LAYERS = {
    "functional": ["conv1", "conv2", "gap", "head"],
    "nested": ["backbone", "backbone/conv", "conv", "gap", "head"],
    "subclassed": ["conv", "gap", "head"],
    "multi_input": ["conv", "qconv", "head"],
    "multi_output": ["conv", "a", "b"],
}
SAME_MODEL_INSTANCE = "<a Saliency instance on the explained model>"
OTHER_MODEL_INSTANCE = "<a Saliency instance on another model>"
OTHER_MODEL_LAYER = "<a layer of another model>"
NAN, INF = float("nan"), float("inf")


def pool(name: str, kind: str) -> list[Any]:
    """Values to try for one parameter: valid ones first (and more of them), then invalid ones."""
    layers = LAYERS[kind]
    multi = kind == "multi_input"
    pools: dict[str, list[Any]] = {
        "batch_size": [1, 2, 3, 64, 2**40, 0, -1, 2.5, "8", None, True],
        "output": ["logits", "probabilities", "probability", None, 1],
        "output_index": ["a", "b", 0, 1, 2, -1, "c", None, 1.5, True] if kind == "multi_output"
        else [None, 0, "head", 1, "x", -1],
        "output_layer": [None, layers[-1], "gap" if "gap" in layers else layers[0], "nosuch", 3],
        "progress": [False, True],
        "jit_compile": [False],
        "precision": [None, "float32", "bfloat16", "half", 16],
        "layer": [None, *layers, "nosuch", 3, OTHER_MODEL_LAYER],
        "upsample": [True, False, "no", None],
        "input_index": [0, 1, "p", "q", None, 2, -1, "r", 1.5, [0, 1], [0]] if multi
        else [None, 0, "image", 1, -1, 0.5, [0]],
        "reshape": [None, "not a function", _named(lambda a: a, "same")],
        "absolute": [False, True, "yes", None],
        "baseline": [None, 0.0, 0.5, np.zeros((SIZE, SIZE, 3), "float32"), np.zeros((N, SIZE, SIZE, 3), "float32"),
                     np.zeros((SIZE, SIZE, 1), "float32"), "blur", "mean", np.zeros((3, 3)), NAN, INF, "zeros",
                     [0.0, 0.0], np.full((SIZE, SIZE, 3), NAN)],
        "samples": [1, 2, 3, 0, -1, 2.5, "3", None, True],
        "steps": [1, 2, 4, 0, -2, 3.0, "4", None, True],
        "method": ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid",
                   "simpson", None, 3],
        "blur_sigma": [0.5, 4.0, 0.0, -1.0, NAN, INF, "x", None],
        "seed": [0, 1, None, -1, 2**40, 2**70, "s", 1.5],
        "noise": [0.0, 0.1, 1.0, -0.5, NAN, INF, "x", None, np.array([0.1, 0.2])],
        "base": ["saliency", "gradient_x_input", "integrated_gradients", "guided_backprop", SAME_MODEL_INSTANCE,
                 "smoothgrad", "gradcam", "nosuch", 3, None, OTHER_MODEL_INSTANCE],
        "mask": [None, COARSE, np.broadcast_to(COARSE, (N, SIZE, SIZE)), "grid", "slic", "quickshift", "nosuch",
                 COARSE.astype(float), COARSE[:5, :5], np.zeros((SIZE, SIZE, 3), int), COARSE > 1,
                 _named(lambda x: np.broadcast_to(COARSE, x.shape[:3]), "coarse"),
                 _named(lambda x: COARSE[:3], "wrong_shape"), 3],
        "window": [1, 2, 4, 8, 9, (2, 4), 0, -1, (2,), (2, 2, 2), 2.5, "4", None],
        "stride": [None, 1, 2, 4, 0, -1, (2, 2), 1.5],
        "masks": [1, 4, 8, 0, -1, 2.5, "8"],
        "cell": [1, 2, 4, 7, 9, (2, 3), 0, (2,), (2, 2, 2), 2.5],
        "p": [0.1, 0.5, 1.0, 0.0, -0.1, 1.5, NAN, "0.5"],
        "kernel_width": [None, 0.25, 1.0, 0.0, -1.0, NAN, "w"],
        "distance": ["cosine", "euclidean", "l2", "manhattan", None],
        "alpha": [0.0, 1.0, 10.0, -1.0, NAN, "a"],
        "max_features": [1, 2, 4, 6, 0, -1, 2.5, True],
        # LRP
        "composite": ["epsilon_plus", "epsilon", "epsilon_gamma_box", "epsilon_alpha2_beta1", "epsilon_plus_flat",
                      None, "nosuch", 3],
        "rules": [None, {"Dense": "epsilon"}, {"Conv2D": "gamma"}, {layers[-1]: "zplus"}, {"nosuch": "epsilon"},
                  {"Dense": "nosuch"}, "epsilon", 3],
        "epsilon": [1e-6, 0.25, 0.0, -1.0, NAN, "e"],
        "gamma": [0.25, 1.0, 0.0, -0.5, NAN],
        "low": [0.0, -1.0, np.zeros((SIZE, SIZE, 3), "float32"), NAN, "x"],
        "high": [1.0, 2.0, NAN, np.ones((3, 3))],
        "stabilizer": [1e-6, 0.0, -1.0, NAN],
        "init": ["logit", "one_hot", "softmax", None],
        # convergence (IntegratedGradients, ExpectedGradients, noise wrappers)
        "tolerance": [None, 0.5, 0.1, 0.0, -1.0, NAN, "x"],
        "max_steps": [63, 127, 1, 0, -1, 2.5],
        "max_samples": [16, 64, 1, 0, -1, 2.5],
    }
    # a parameter added later is still fuzzed, with values of every kind, until it gets its own pool
    return pools.get(name, [None, 0, 1, -1, 2.5, NAN, "x", True])


SMALL = {  # what keeps each method tiny unless the fuzzer overrides it
    "integrated_gradients": {"steps": 4}, "expected_gradients": {"samples": 3}, "deeplift_shap": {"samples": 2},
    "smoothgrad": {"samples": 3}, "smoothgrad_squared": {"samples": 3}, "vargrad": {"samples": 3},
    "lime": {"samples": 16}, "kernel_shap": {"samples": 16}, "shapley_sampling": {"samples": 2},
    "shapley_exact": {"mask": COARSE}, "rise": {"masks": 8, "cell": 2}, "occlusion": {"window": 4},
}
PER_INPUT = {"occlusion", "rise", "blur_ig", "guided_ig", "xrai", "fullgrad"} | {e.name for e in METHODS if "cam" in e.name}
READS_A_LAYER = {"layer_conductance", "internal_influence", "neuron_conductance"}  # `layer=` is required
SMALL.update({
    "layer_conductance": {"steps": 2}, "internal_influence": {"steps": 2}, "blur_ig": {"steps": 3, "max_sigma": 2},
    "neuron_conductance": {"steps": 2, "neuron": (0, 0, 0)}, "guided_ig": {"steps": 3},
    "xrai": {"steps": 2, "min_pixel_diff": 4},
})
# Guided IG's path moves the features of lowest |gradient| first: where gradients tie (a conv net's interior at a
# constant baseline) float rounding, which the chunk size changes, decides the path (see docs/methods.md)
TIE_SENSITIVE = {"guided_ig"}


def base_params(name: str, kind: str) -> dict[str, Any]:
    params = {**SMALL.get(name, {}), **common_for(kind)}
    if name in READS_A_LAYER:
        params["layer"] = LAYERS[kind][0]
    if kind == "multi_input" and "input_index" in registry.accepted_parameters(registry.get(name)):
        # two inputs of the same shape: the maps are for one of them, other methods attribute both
        params["input_index"] = 0 if name in PER_INPUT else [0, 1]
    return params


@st.composite
def parameters(draw: Any, name: str, kind: str) -> dict[str, Any]:
    """Some of the method's parameters (each from its pool); the rest keep small defaults."""
    accepted = sorted(registry.accepted_parameters(registry.get(name)) - {"jit_compile"})
    chosen = draw(st.lists(st.sampled_from(accepted), max_size=3, unique=True))
    params = base_params(name, kind)
    for key in chosen:
        params[key] = draw(st.sampled_from(pool(key, kind)), label=key)
    if name == "shapley_exact" and params.get("mask") is None:
        params["mask"] = COARSE  # the default 16 features would mean 65,536 rows per sample
    return params


def materialise(params: dict[str, Any], model: keras.Model) -> dict[str, Any]:
    """Replace the placeholders that need a model."""
    out = dict(params)
    for key, value in params.items():
        if isinstance(value, str) and value == SAME_MODEL_INSTANCE:
            out[key] = kerascope.Saliency(model, **common_for(model.name))
        elif isinstance(value, str) and value == OTHER_MODEL_INSTANCE:
            out[key] = kerascope.Saliency(other_model())
        elif isinstance(value, str) and value == OTHER_MODEL_LAYER:
            out[key] = other_model().get_layer("conv1")
    return out


def _deterministic(name: str, params: dict[str, Any]) -> bool:
    return "seed" not in registry.accepted_parameters(registry.get(name)) or params.get("seed", 0) is not None


@pytest.mark.parametrize("name", [e.name for e in METHODS])
@settings(max_examples=examples(1), suppress_health_check=list(HealthCheck))
@given(data=st.data(), kind=st.sampled_from(KINDS))
def test_fuzzed_parameters_of_every_method(name: str, data: Any, kind: str) -> None:
    model = zoo()[kind]
    drawn = data.draw(parameters(name, kind), label="params")
    targets = data.draw(st.sampled_from([None, 0, 2]), label="targets")
    x = good_inputs(kind)
    params = materialise(drawn, model)
    names = (*params, "method", "target")

    def call() -> Any:
        return registry.build(name, model, params).explain(x, targets)

    result = run_case([model, other_model()], call, names)
    if result is None:
        return
    classes = None if params.get("output_layer") not in (None, "head") else CLASSES[kind]
    if kind == "multi_output" and params.get("output_index") in ("b", 1):
        classes = 2
    check_explanation(result, N, targets, classes)
    shapes = expected_shapes(name, kind, x, params)
    if shapes is not None:
        assert [a.shape for a in flat(result.attributions)] == shapes
    if "batch_size" in drawn and _deterministic(name, params) and name not in TIE_SENSITIVE:
        # the chunk size never changes the result
        rest = {k: v for k, v in params.items() if k != "batch_size"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = registry.build(name, model, rest).explain(x, targets)
        for got, want in zip(flat(result.attributions), flat(reference.attributions), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------------------- regressions found by the fuzzer
def _uint8_images() -> np.ndarray:
    return (images() * 255).astype(np.uint8)


REGRESSIONS = [
    # (method, model kind, parameters, inputs (None: good ones), what the message must say)
    ("saliency", "subclassed", {}, lambda: [images()], r"cannot be called on these inputs"),
    ("gradcam", "subclassed", {}, lambda: np.zeros((1, 8, 8, 2), "float32"), r"cannot be called on these inputs"),
    ("saliency", "functional", {}, lambda: images().astype(str), r"not real-valued numeric data.*dtype=str"),
    ("saliency", "functional", {}, lambda: images().astype(np.complex64), r"not real-valued numeric data"),
    ("saliency", "functional", {}, _uint8_images, r"uint8"),
    ("expected_gradients", "functional", {"samples": 2, "seed": 1.5}, None, r"`seed` must be None or a non-negative"),
    ("vargrad", "functional", {"samples": 2, "seed": -1}, None, r"Received: seed=-1"),
    ("saliency", "functional", {"output_index": 1}, None, r"Unknown output. Received: output_index=1"),
    ("saliency", "functional", {"output_index": "x"}, None, r"Received: output_index='x'"),
    ("saliency", "multi_output", {"output_index": True}, None, r"output_index=True"),
    ("gradcam", "nested", {"output_layer": "nosuch"}, None, r"Received: output_layer='nosuch'"),
    ("smoothgrad_squared", "nested", {"samples": 3, "noise": NAN}, None, r"`noise` must be a finite number"),
    ("smoothgrad", "functional", {"samples": 3, "noise": "x"}, None, r"Received: noise='x'"),
    ("smoothgrad", "nested", {"samples": 3, "base": "gradcam"}, None, r"base='gradcam'"),
    ("occlusion", "functional", {"window": 4, "baseline": None}, None, r"Received: baseline=None"),
    ("occlusion", "nested", {"window": 2, "baseline": "blur"}, None, r"Received: baseline='blur'"),
    ("occlusion", "functional", {"window": 4, "baseline": NAN}, None, r"`baseline` must be finite"),
    ("occlusion", "functional", {"window": None}, None, r"Received: window=None"),
    ("shapley_exact", "functional", {"mask": COARSE, "baseline": INF}, None, r"baseline of input 0 contains NaN"),
    ("integrated_gradients", "nested", {"steps": True}, None, r"`steps` must be a positive int"),
    ("integrated_gradients", "functional", {"steps": 2, "baseline": NAN}, None, r"`baseline` contains NaN"),
    ("deeplift_shap", "multi_input", {"samples": 2, "baseline": np.zeros((3, 3))}, None, r"one `baseline`"),
    ("expected_gradients", "multi_input", {"samples": 2, "baseline": {"p": images()}, "input_index": [0, 1]}, None,
     r"baseline"),
    ("lime", "functional", {"samples": 16, "kernel_width": "w"}, None, r"Received: kernel_width='w'"),
    ("kernel_shap", "functional", {"samples": 16, "input_index": 0.5}, None, r"Received: input_index=0.5"),
    ("gradcam_plusplus", "functional", {"upsample": None}, None, r"`upsample` must be True or False"),
    ("rise", "functional", {"masks": 8, "p": "0.5"}, None, r"Received: p='0.5'"),
    ("xgradcam", "multi_output", {"output_index": "a", "layer": "b"}, None, r"does not depend on the output of layer 'b'"),
    ("lrp", "functional", {"rules": 3}, None, r"Received: rules=3"),
    ("lrp", "subclassed", {"stabilizer": NAN}, None, r"`stabilizer` must be a finite number"),
]


@pytest.mark.parametrize(("name", "kind", "params", "inputs", "message"), REGRESSIONS)
def test_fuzzer_findings_are_refused_with_kerascope_errors(name: str, kind: str, params: dict, inputs: Any,
                                                           message: str) -> None:
    model = zoo()[kind]
    x = good_inputs(kind) if inputs is None else inputs()
    before = snapshot(model)
    with pytest.raises((ValueError, TypeError), match=message) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        registry.build(name, model, params).explain(x, 0)
    assert_unchanged(model, before)
    assert_own_error(caught.value, (*params, "input"))


TARGET_REGRESSIONS = [
    # (method, model kind, targets, what the message must say)
    ("occlusion", "functional", -INF, r"`targets` must be an int"),
    ("saliency", "functional", np.float64(1.4611060931528442e16), r"Target class out of range"),
    ("feature_ablation", "functional", np.array(2**40), r"Target class out of range"),
    # sample 0's scores have one value per class: 3 values for 3 classes must not pass for 3 samples
    ("saliency", "subclassed", CALLABLES["first_row"], r"one score per sample"),
    ("integrated_gradients", "multi_output", MULTI_OUTPUT_CALLABLES["total"], r"one score per sample"),
    ("occlusion", "multi_input", CALLABLES["identity"], r"one score per sample"),
]


@pytest.mark.parametrize(("name", "kind", "targets", "message"), TARGET_REGRESSIONS)
def test_fuzzer_target_findings_are_refused(name: str, kind: str, targets: Any, message: str) -> None:
    model = zoo()[kind]
    before = snapshot(model)
    method = registry.build(name, model, base_params(name, kind))
    with pytest.raises((ValueError, TypeError), match=message) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        method.explain(good_inputs(kind, 3), targets)
    assert_unchanged(model, before)
    assert_own_error(caught.value, ("target",))
