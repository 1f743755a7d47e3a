"""Scoped model changes of one explanation are invisible to other threads, and results match sequential runs."""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.layers import iter_layers
from kerascope.core.probe import patched_attribute, probe


def _model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 2))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inputs)
    h = keras.layers.MaxPooling2D(2)(h)
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv2")(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Dense(6, activation="relu")(h)
    # a confident softmax head: the bypass matters (logits differ from probabilities by a lot)
    outputs = keras.layers.Dense(3, activation="softmax", name="head",
                                 kernel_initializer=keras.initializers.RandomNormal(stddev=4.0))(h)
    return keras.Model(inputs, outputs)


METHODS = [
    ("gradcam", {"layer": "conv2"}),
    ("lrp", {}),
    ("deeplift", {}),
    ("occlusion", {"window": 4, "stride": 4}),
    ("guided_backprop", {}),
    ("integrated_gradients", {"steps": 8}),
    ("scorecam", {"layer": "conv2"}),
]


def _run_threads(workers: list, timeout: float = 240.0) -> list[BaseException]:
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as error:  # noqa: BLE001 - reported by the test
                errors.append(error)
        return run

    threads = [threading.Thread(target=guard(fn)) for fn in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return errors


def test_patch_is_invisible_to_other_threads_and_undone():
    layer = keras.layers.Dense(2, activation="softmax")
    model = keras.Sequential([keras.Input((3,)), layer])
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32") * 5
    probabilities = keras.ops.convert_to_numpy(model(x))
    inside, outside, seen = threading.Event(), threading.Event(), {}

    def explaining():
        with patched_attribute(layer, "activation", keras.activations.linear), probe([layer]) as rec:
            seen["own"] = keras.ops.convert_to_numpy(model(x))
            inside.set()
            outside.wait(60)
            seen["calls"] = len(rec.outputs[id(layer)])

    def predicting():
        inside.wait(60)
        seen["other"] = keras.ops.convert_to_numpy(model(x))
        outside.set()

    assert not _run_threads([explaining, predicting])
    np.testing.assert_allclose(seen["other"], probabilities, rtol=1e-5, atol=1e-6)
    assert not np.allclose(seen["own"], probabilities, atol=1e-3)  # the patch did act in its own thread
    assert seen["calls"] == 1  # the other thread's call went past the probe
    assert "call" not in vars(layer) and layer.activation is keras.activations.softmax
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), probabilities, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,params", METHODS, ids=[m for m, _ in METHODS])
def test_concurrent_explain_and_predict_equal_sequential(name, params):
    x = np.random.default_rng(1).normal(size=(4, 8, 8, 2)).astype("float32")
    reference = _model()
    probabilities = keras.ops.convert_to_numpy(reference(x))
    expected = ks.explain(reference, x, method=name, targets=None, **params).attributions
    for _ in range(1):  # a fresh model: its first explanation traces (when the patches are open longest)
        model = _model()
        predictions: list[np.ndarray] = []
        explanations: list[np.ndarray] = []
        done = threading.Event()

        def explaining(model=model, explanations=explanations):
            explanations.append(ks.explain(model, x, method=name, targets=None, **params).attributions)

        def predicting(model=model, predictions=predictions, done=done):
            while not done.is_set():
                predictions.append(keras.ops.convert_to_numpy(model(x)))

        def both(model=model, explanations=explanations, done=done):
            try:
                explaining(model, explanations)
                explaining(model, explanations)
            finally:
                done.set()

        errors = _run_threads([both, predicting, explaining])
        assert not errors, errors
        predictions.append(model.predict(x, verbose=0))
        for p in predictions:
            np.testing.assert_allclose(p, probabilities, rtol=1e-4, atol=1e-6)
        for e in explanations:
            np.testing.assert_allclose(e, expected, rtol=1e-4, atol=1e-5 * float(np.abs(expected).max()))
        for _, layer in iter_layers(model):  # every scoped patch undone
            assert not {"call", "convolution_op"} & set(vars(layer)), layer.name
            assert getattr(getattr(layer, "activation", None), "_kerascope_slot", None) is None, layer.name
