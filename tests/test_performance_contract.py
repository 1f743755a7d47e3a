"""Performance contracts that are correctness properties, not timings.

* No retracing: after a first call, a second call with the same shapes runs
  no Python code of the model at all (no new trace of a compiled function, no
  eager pass), and a call with a different number of images or rows per
  chunk reuses the compiled functions (batch dimension ``None``). Counted two
  ways: ``Engine.trace_count`` (traces of the compiled gradient function) and
  a counting layer inside the model, whose Python ``call`` only runs when the
  model is traced or run eagerly.
* Mixed precision: models built under ``mixed_float16`` / ``mixed_bfloat16``
  give float32 attributions that match the float32 model with the same
  weights, within the precision of the compute dtype.

The speed targets themselves are measured by the ``floor-*`` scenarios of ``python -m bench`` (see
docs/performance.md), not here.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402

CALLS: list[int] = []


class CountCalls(keras.layers.Layer):
    """Identity layer that records every Python execution of ``call`` (traces and eager runs)."""

    def call(self, x):
        CALLS.append(1)
        return x


def build(policy: str | None = None, seed: int = 0) -> keras.Model:
    """16x16x3 -> conv(relu) -> count -> conv(relu) -> GAP -> Dense(3) (softmax last, as users ship)."""
    previous = keras.mixed_precision.global_policy()
    try:
        if policy is not None:
            keras.mixed_precision.set_global_policy(policy)
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((16, 16, 3))
        h = keras.layers.Conv2D(6, 3, activation="relu", padding="same", name="conv1")(inputs)
        h = CountCalls(name="count")(h)
        h = keras.layers.Conv2D(8, 3, activation="relu", padding="same", name="conv2")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        outputs = keras.layers.Dense(3, activation="softmax", dtype="float32" if policy else None, name="head")(h)
        return keras.Model(inputs, outputs)
    finally:
        keras.mixed_precision.set_global_policy(previous)


METHODS = {
    "saliency": lambda m: ks.Saliency(m, batch_size=4),
    "gradcam": lambda m: ks.GradCAM(m, layer="conv2", batch_size=4),
    "smoothgrad": lambda m: ks.SmoothGrad(m, samples=3, batch_size=4),
    "integrated_gradients": lambda m: ks.IntegratedGradients(m, steps=3, batch_size=4),
    "scorecam": lambda m: ks.ScoreCAM(m, layer="conv2", batch_size=4),
    "occlusion": lambda m: ks.Occlusion(m, window=8, batch_size=4),
}


@pytest.fixture(scope="module")
def model() -> keras.Model:
    return build()


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, 16, 16, 3)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_no_retrace_same_and_other_batch_sizes(model: keras.Model, name: str) -> None:
    method = METHODS[name](model)
    engine = method.engine
    first = method.explain(_images(5), targets=[0, 1, 2, 0, 1])
    traces, calls = engine.trace_count, len(CALLS)
    if name in ("saliency", "gradcam", "smoothgrad", "integrated_gradients", "scorecam"):
        assert traces >= 1  # these go through the compiled gradient function

    again = method.explain(_images(5), targets=[0, 1, 2, 0, 1])
    assert engine.trace_count == traces, "same shapes: the gradient function was traced again"
    assert len(CALLS) == calls, "same shapes: the model's Python code ran again (retrace or eager pass)"
    np.testing.assert_allclose(np.asarray(again.attributions), np.asarray(first.attributions), rtol=1e-5, atol=1e-6)

    # Other numbers of images (a different last-chunk size) and other chunk sizes reuse the functions.
    method.explain(_images(2, seed=1), targets=2)
    method.batch_size = 3
    method.explain(_images(7, seed=2), targets=None)
    assert engine.trace_count == traces, "another batch size retraced the gradient function"
    assert len(CALLS) == calls, "another batch size ran the model's Python code again"


def test_engine_gradients_reuse_across_batch_sizes(model: keras.Model) -> None:
    engine = ks.Saliency(model).engine
    layer = model.get_layer("conv1")
    engine.gradients(_images(4), 0, layers=[layer], batch_size=4)
    traces = engine.trace_count
    for n, batch_size in ((1, 4), (9, 4), (6, 5), (3, 1)):
        result = engine.gradients(_images(n, seed=n), 1, layers=[layer], batch_size=batch_size)
        assert result.layer_grads[0].shape == (n, 16, 16, 6)
    assert engine.trace_count == traces


@pytest.mark.parametrize("policy,rtol", [("mixed_float16", 2e-2), ("mixed_bfloat16", 6e-2)])
def test_mixed_precision_attributions_are_float32(policy: str, rtol: float) -> None:
    mixed = build(policy, seed=3)
    assert mixed.get_layer("conv1").compute_dtype == policy.split("_")[1]
    reference = build(None, seed=3)
    reference.set_weights([np.asarray(w, np.float32) for w in mixed.get_weights()])
    assert keras.mixed_precision.global_policy().name == "float32"  # build() restored the policy
    x = _images(3, seed=4)
    for make in (
        lambda m: ks.Saliency(m),
        lambda m: ks.GradCAM(m, layer="conv2"),
        lambda m: ks.IntegratedGradients(m, steps=8),
        lambda m: ks.SmoothGrad(m, samples=4, seed=0),
        lambda m: ks.Occlusion(m, window=8),
        lambda m: ks.ScoreCAM(m, layer="conv2"),
    ):
        got = make(mixed).explain(x, targets=[0, 1, 2])
        want = make(reference).explain(x, targets=[0, 1, 2])
        attributions = np.asarray(got.attributions)
        assert attributions.dtype == np.float32, f"{got.method}: {attributions.dtype}"
        assert np.asarray(got.scores).dtype == np.float32
        assert np.all(np.isfinite(attributions))
        expected = np.asarray(want.attributions)
        scale = np.abs(expected).max()
        assert scale > 0
        # Low-precision compute flips a few ReLUs whose input is near zero: compare in bulk, not per element.
        outside = np.mean(np.abs(attributions - expected) > rtol * scale)
        assert outside <= 0.03, f"{got.method}: {outside:.1%} of the values off by more than {rtol} x max"
        a, b = attributions.ravel().astype(np.float64), expected.ravel().astype(np.float64)
        cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        assert cosine >= 1 - rtol, f"{got.method}: cosine similarity {cosine:.4f} with the float32 model"


class Subclassed(keras.Model):
    """The same layers as ``build()`` in a subclassed ``call``: no graph to read, so the eager check pass runs."""

    def __init__(self, functional: keras.Model) -> None:
        super().__init__()
        self.inner = functional

    def call(self, x):
        return self.inner(x)


@pytest.mark.parametrize("kind,expected", [("functional", 1), ("subclassed", 4)])
@pytest.mark.parametrize("name", ["saliency", "gradcam"])
def test_first_call_runs_the_models_code_once_per_pass_and_traces_once(name: str, kind: str, expected: int) -> None:
    """First call: a functional model's first call only traces (its graph states the softmax to bypass and
    the probed layer's calls: ``core/graph_reading.py``); a subclassed model's first call makes one eager pass on
    one sample (input check, softmax detection and call counts in one) and a second one (the outputs must repeat:
    a model random at inference is refused), one symbolic pass (its output shape, for the class-range check) and
    one trace. Same maps either way."""
    model = build(seed=5)
    chosen = model if kind == "functional" else Subclassed(model)
    make = {"saliency": lambda m: ks.Saliency(m, batch_size=4),
            "gradcam": lambda m: ks.GradCAM(m, layer=model.get_layer("conv2"), batch_size=4)}[name]
    method = make(chosen)
    before = len(CALLS)
    got = method.explain(_images(3), targets=[0, 1, 2])
    assert len(CALLS) - before == expected, f"{name}: the first call ran the model's Python code {len(CALLS) - before} times"
    assert method.engine.trace_count == 1
    assert method.engine.bypassed_layers == (["head"] if kind == "functional" else [f"{model.name}/head"])
    if kind == "subclassed":  # the same weights, read against observed: identical maps
        want = make(model).explain(_images(3), targets=[0, 1, 2])
        np.testing.assert_allclose(np.asarray(got.attributions), np.asarray(want.attributions), rtol=1e-5, atol=1e-7)


def test_cpu_call_options_give_the_same_numbers_and_are_restored() -> None:
    """First call: on a machine without GPUs kerascope's compiled functions run one Grappler pass, without the
    GPU layout and memory optimisers (``_backend/tensorflow.py``): bit-identical maps to TensorFlow's default
    options on the same weights, and the thread's own call options are back after each call."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's call options")
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    from kerascope._backend import tensorflow as backend

    options = backend._cpu_call_options()
    if options is None:
        pytest.skip("a GPU is visible: TensorFlow's own options are kept")
    rewrite = config_pb2.ConfigProto.FromString(options.config_proto_serialized).graph_options.rewrite_options
    config = rewriter_config_pb2.RewriterConfig
    assert (rewrite.meta_optimizer_iterations, rewrite.layout_optimizer, rewrite.memory_optimization) == (
        config.ONE, config.OFF, config.NO_MEM_OPT)
    assert rewrite.disable_tfg_optimizer
    assert rewrite.constant_folding == rewrite.loop_optimization == config.DEFAULT  # kept for loops
    loop_free = config_pb2.ConfigProto.FromString(
        backend._loop_free_options(options).config_proto_serialized).graph_options.rewrite_options
    assert (loop_free.constant_folding, loop_free.shape_optimization, loop_free.loop_optimization) == (
        config.OFF, config.OFF, config.OFF)
    x = _images(3, seed=6)
    maps = []
    try:
        for chosen in (None, options):
            backend._CPU_OPTIONS[:] = [chosen]
            before = context.context().function_call_options
            maps.append(np.asarray(ks.Saliency(build(seed=7)).explain(x, targets=[0, 1, 2]).attributions))
            assert context.context().function_call_options is before
    finally:
        backend._CPU_OPTIONS[:] = [options]
    np.testing.assert_array_equal(maps[0], maps[1])
    assert np.abs(maps[0]).max() > 0


def test_functions_with_loops_keep_the_loop_optimisers_and_loop_free_ones_skip_them() -> None:
    """An RNN's compiled pass has a ``While`` loop: it keeps constant folding, shape and loop optimisation
    (each bought 7-13% of an LSTM's later calls); a CNN's has none and skips them (a cheaper first call).
    Same numbers as TensorFlow's own options either way."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's call options")
    from kerascope._backend import tensorflow as backend

    options = backend._cpu_call_options()
    if options is None:
        pytest.skip("a GPU is visible: TensorFlow's own options are kept")
    keras.utils.set_random_seed(0)
    seq = keras.Input((6, 3))
    rnn = keras.Model(seq, keras.layers.Dense(2)(keras.layers.LSTM(4)(seq)))
    image = keras.Input((8, 8, 3))
    cnn = keras.Model(image, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(
        keras.layers.Conv2D(4, 3, activation="relu")(image))))
    seen = []
    has_loops = backend._has_loops

    def recording(concrete, nodes=None):
        seen.append(has_loops(concrete, nodes))
        return seen[-1]

    rng = np.random.default_rng(0)
    cases = [(rnn, rng.normal(size=(3, 6, 3)).astype("float32")), (cnn, rng.random((3, 8, 8, 3), dtype=np.float32))]
    try:
        backend._has_loops = recording
        maps = [np.asarray(ks.Saliency(m).explain(v, [0, 1, 0]).attributions) for m, v in cases]
        backend._CPU_OPTIONS[:] = [None]  # TensorFlow's own options, fresh methods (new functions)
        own = [np.asarray(ks.Saliency(m).explain(v, [0, 1, 0]).attributions) for m, v in cases]
    finally:
        backend._has_loops = has_loops
        backend._CPU_OPTIONS[:] = [options]
    assert seen == [True, False]
    for got, want in zip(maps, own, strict=True):
        np.testing.assert_array_equal(got, want)


def test_nested_functions_are_traced_under_kerascopes_options() -> None:
    """A ``tf.function`` called inside a compiled pass (a user's, in a layer) records the call options
    current while it is traced: kerascope traces under its own, as it runs."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow's call options")
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

    from kerascope._backend import tensorflow as backend

    if backend._cpu_call_options() is None:
        pytest.skip("a GPU is visible: TensorFlow's own options are kept")
    inner = tf.function(lambda v: v * 2.0, autograph=False)
    outer = tf.function(lambda v: inner(v) + 1.0, input_signature=[tf.TensorSpec((None,), tf.float32)],
                        autograph=False)
    assert backend._direct(outer)(tf.constant([1.0])).numpy().tolist() == [3.0]
    calls = [op for op in outer.get_concrete_function().graph.get_operations()
             if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
    assert calls
    rewrite = config_pb2.ConfigProto.FromString(calls[0].get_attr("config_proto")).graph_options.rewrite_options
    assert rewrite.meta_optimizer_iterations == rewriter_config_pb2.RewriterConfig.ONE
    assert rewrite.disable_tfg_optimizer
