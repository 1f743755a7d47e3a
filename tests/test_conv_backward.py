"""Cheaper exact convolution backward passes (``_backend/tf_conv.py``, ``propagation/conv_backward.py``), TensorFlow.

The rewritten input gradients are checked against ``tf.GradientTape`` on TensorFlow's own
convolution (every kernel size / stride / padding / odd size combination below), the patched
layers against the model's own ops (forward bit for bit, input and kernel gradients), the
methods against a hand-written tape saliency, and the scoping: which layers are rewritten, which
never are, and the model unchanged after a call and after an exception.
"""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's convolution backward")

tf = pytest.importorskip("tensorflow")

from kerascope import IntegratedGradients, Saliency  # noqa: E402
from kerascope._backend import tf_conv  # noqa: E402
from kerascope.core.engine import Engine  # noqa: E402


@pytest.fixture(autouse=True)
def small_pointwise_kernels(monkeypatch):  # noqa: ANN001, ANN201
    """The tiny test models' stride-1 1x1 kernels are rewritten too (by default only >= 2**20 weights are)."""
    monkeypatch.setattr(tf_conv, "POINTWISE_WEIGHTS", 1)


def test_by_default_only_large_stride_one_pointwise_kernels_are_rewritten(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.undo()
    assert tf_conv.POINTWISE_WEIGHTS == 2**20
    small, large = built(keras.layers.Conv2D(320, 1), (5, 5, 160)), built(keras.layers.Conv2D(2048, 1), (5, 5, 512))
    strided = built(keras.layers.Conv2D(8, 1, strides=2), (10, 10, 4))
    assert tf_conv.conv_op(small) is None
    assert tf_conv.conv_op(large) is not None and tf_conv.conv_op(strided) is not None


def tape_input_gradient(x: np.ndarray, kernel: np.ndarray, strides: tuple[int, int], padding: str,
                        dy: np.ndarray) -> np.ndarray:
    """TensorFlow's own input gradient, in float64 (Eigen's kernels: see :func:`tape_saliency`)."""
    xt = tf.constant(x.astype("float64"))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = tf.nn.conv2d(xt, kernel.astype("float64"), [1, *strides, 1], padding)
    return tape.gradient(y, xt, output_gradients=dy.astype("float64")).numpy().astype("float32")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


CASES = [  # (height, width, kernel h, kernel w, stride h, stride w, padding)
    *[(h, w, k, k, s, s, p) for (h, w), k, s, p in itertools.product(
        [(9, 9), (10, 7), (5, 12)], [1, 2, 3, 4, 7], [1, 2, 3], ["SAME", "VALID"]) if k <= min(h, w)],
    (11, 13, 3, 5, 2, 3, "SAME"), (11, 13, 5, 3, 3, 2, "VALID"), (8, 8, 7, 7, 2, 2, "SAME"),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_polyphase_gradient_equals_tensorflow(case: tuple) -> None:
    h, w, kh, kw, sh, sw, padding = case
    rng = np.random.default_rng(sum(case[:6]))
    x = rng.normal(size=(2, h, w, 3)).astype("float32")
    kernel = rng.normal(size=(kh, kw, 3, 5)).astype("float32")
    y_shape = tf.nn.conv2d(x, kernel, [1, sh, sw, 1], padding).shape
    dy = rng.normal(size=y_shape).astype("float32")
    ours = tf_conv.polyphase_input_gradient(tf.constant(dy), tf.constant(kernel), (sh, sw), padding, (h, w)).numpy()
    assert ours.shape == x.shape
    assert rel(ours, tape_input_gradient(x, kernel, (sh, sw), padding, dy)) < 1e-6


@pytest.mark.parametrize("size,strides,padding", [((5, 5), (1, 1), "VALID"), ((5, 5), (2, 2), "VALID"),
                                                  ((6, 7), (2, 2), "SAME"), ((7, 6), (3, 2), "SAME"),
                                                  ((4, 4), (3, 3), "VALID"), ((8, 8), (2, 2), "SAME")])
def test_pointwise_gradient_equals_tensorflow(size: tuple[int, int], strides: tuple[int, int], padding: str) -> None:
    rng = np.random.default_rng(size[0] * 10 + strides[0])
    x = rng.normal(size=(3, *size, 6)).astype("float32")
    kernel = rng.normal(size=(1, 1, 6, 4)).astype("float32")
    dy = rng.normal(size=tf.nn.conv2d(x, kernel, [1, *strides, 1], padding).shape).astype("float32")
    ours = tf_conv.pointwise_input_gradient(tf.constant(dy), tf.constant(kernel), strides, size).numpy()
    assert rel(ours, tape_input_gradient(x, kernel, strides, padding, dy)) < 1e-6


def built(layer: keras.layers.Layer, shape: tuple[int, ...]) -> keras.layers.Layer:
    layer.build((None, *shape))
    return layer


@pytest.mark.parametrize("layer,shape", [
    (keras.layers.Conv2D(4, 7, strides=2, padding="same"), (12, 12, 3)),
    (keras.layers.Conv2D(4, 3, strides=(2, 1)), (9, 8, 1)),
    (keras.layers.Conv2D(6, 1), (5, 5, 8)),
    (keras.layers.Conv2D(6, 1, strides=2), (9, 9, 8)),
])
def test_patched_op_same_forward_and_gradients(layer: keras.layers.Layer, shape: tuple[int, ...]) -> None:
    layer = built(layer, shape)
    op = tf_conv.conv_op(layer)
    assert op is not None
    x = tf.random.stateless_normal((2, *shape), (1, 2))
    kernel = tf.convert_to_tensor(layer.kernel)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, kernel])
        ours, theirs = op(x, kernel), layer.convolution_op(x, kernel)
        loss_ours, loss_theirs = tf.reduce_sum(ours * ours), tf.reduce_sum(theirs * theirs)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())  # the forward is the layer's own op
    for wrt in (x, kernel):
        assert rel(tape.gradient(loss_ours, wrt).numpy(), tape.gradient(loss_theirs, wrt).numpy()) < 1e-6


@pytest.mark.parametrize("layer,shape", [
    (keras.layers.Conv2D(4, 3), (9, 9, 3)),  # stride 1, 3x3: TensorFlow's own is as fast
    (keras.layers.Conv2D(4, 3, strides=2), (9, 9, 8)),  # strided but not a stem (8 channels)
    (keras.layers.Conv2D(4, 3, strides=2, dilation_rate=1, groups=1, data_format="channels_first"), (3, 9, 9)),
    (keras.layers.Conv2D(4, 3, strides=2, dtype="float16"), (9, 9, 3)),
    (keras.layers.DepthwiseConv2D(3, strides=2), (9, 9, 3)),
    (keras.layers.SeparableConv2D(4, 3, strides=2), (9, 9, 3)),
    (keras.layers.Conv1D(4, 1), (9, 3)),
])
def test_other_layers_keep_their_own_op(layer: keras.layers.Layer, shape: tuple[int, ...]) -> None:
    assert tf_conv.conv_op(built(layer, shape)) is None


def test_subclassed_conv_keeps_its_own_op() -> None:
    class Scaled(keras.layers.Conv2D):
        def convolution_op(self, inputs, kernel):  # noqa: ANN001, ANN201
            return 2.0 * super().convolution_op(inputs, kernel)

    assert tf_conv.conv_op(built(Scaled(4, 3, strides=2), (9, 9, 3))) is None


def model_with_every_kind() -> keras.Model:
    """A stem, 1x1 convolutions (strided, small map, large map), a 3x3, BN pairs, a residual Add."""
    inputs = keras.Input((20, 20, 3))
    x = keras.layers.Conv2D(8, 5, strides=2, padding="same", name="stem")(inputs)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU()(x)
    big = keras.layers.Conv2D(8, 1, name="pw_big", activation="relu")(x)  # 10x10 map: TensorFlow's own at trace
    down = keras.layers.Conv2D(16, 1, strides=2, name="pw_stride")(big)
    down = keras.layers.BatchNormalization(name="pw_stride_bn")(down)
    y = keras.layers.Conv2D(16, 3, padding="same", name="c3", activation="relu")(down)
    y = keras.layers.Conv2D(16, 1, name="pw_small")(y)  # 5x5 map
    x = keras.layers.ReLU()(keras.layers.Add()([y, down]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(5, name="head")(x))


def random_statistics(model: keras.Model) -> None:
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.gamma.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, n), rng.normal(0, 0.1, n), rng.normal(0, 0.1, n),
                               rng.uniform(0.5, 2, n)])


def tape_saliency(model: keras.Model, x: np.ndarray, target: int) -> np.ndarray:
    """The input gradient of ``model``'s float64 twin (``tf.GradientTape``; float64 convolutions are Eigen's).

    Not the float32 model itself: TensorFlow 2.21's own eager oneDNN input gradient of a strided 1x1
    convolution on a 10x10x8 map corrupts the heap here ("corrupted double-linked list").
    """
    config = model.get_config()
    for layer in config["layers"]:
        layer["config"]["dtype"] = "float64"
    twin = keras.Model.from_config(config)
    assert all(w.dtype == "float64" for w in twin.weights)
    twin.set_weights([w.astype("float64") for w in model.get_weights()])
    xt = tf.constant(x.astype("float64"))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        score = tf.reduce_sum(twin(xt, training=False)[:, target])
    return tape.gradient(score, xt).numpy().astype("float32")


def test_engine_rewrites_the_stem_and_pointwise_convolutions_exactly() -> None:
    keras.utils.set_random_seed(3)
    model = model_with_every_kind()
    random_statistics(model)
    engine = Engine(model)
    assert sorted(layer.name for layer, _ in engine.conv_ops()) == ["pw_big", "pw_small", "pw_stride", "stem"]
    x = np.random.default_rng(1).random((3, 20, 20, 3), dtype=np.float32)
    ours = engine.gradients(x, 2, batch_size=3).input_grads[0]
    assert rel(ours, tape_saliency(model, x, 2)) < 1e-5
    assert all("convolution_op" not in vars(layer) for layer in model.layers)  # restored


def test_methods_match_a_tape_and_integrated_gradients_stays_complete() -> None:
    keras.utils.set_random_seed(4)
    model = model_with_every_kind()
    random_statistics(model)
    x = np.random.default_rng(2).random((2, 20, 20, 3), dtype=np.float32)
    saliency = Saliency(model).explain(x, targets=1).attributions
    assert rel(np.asarray(saliency), tape_saliency(model, x, 1)) < 1e-5
    ig = IntegratedGradients(model, steps=64).explain(x, targets=1)
    gap = keras.ops.convert_to_numpy(model(x) - model(np.zeros_like(x)))[:, 1]
    totals = np.asarray(ig.attributions).reshape(2, -1).sum(axis=1)
    np.testing.assert_allclose(totals, gap, rtol=2e-2, atol=2e-3)


def test_probed_layer_keeps_its_own_op() -> None:
    model = model_with_every_kind()
    engine = Engine(model)
    stem = model.get_layer("stem")
    assert "stem" not in [layer.name for layer, _ in engine.conv_ops([stem])]
    assert "stem" in [layer.name for layer, _ in engine.conv_ops()]


def test_model_unchanged_after_a_call_and_after_an_exception(unchanged) -> None:  # noqa: ANN001
    model = model_with_every_kind()
    check = unchanged(model)
    x = np.random.default_rng(4).random((1, 20, 20, 3), dtype=np.float32)
    Saliency(model).explain(x, targets=0)
    check()

    check()


def test_model_unchanged_after_an_exception_inside_the_patched_pass(unchanged) -> None:  # noqa: ANN001
    seen, armed = [], []
    inputs = keras.Input((12, 12, 3))
    stem = keras.layers.Conv2D(4, 3, strides=2, name="stem")

    def fail_while_traced(t):  # noqa: ANN001, ANN202
        if armed and not tf.executing_eagerly():  # the compiled pass (a first call's check pass is eager)
            seen.append("convolution_op" in vars(stem))
            raise RuntimeError("layer failed")
        return t

    h = keras.layers.Lambda(fail_while_traced, name="fails")(stem(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(h)))
    check = unchanged(model)
    armed.append(True)
    with pytest.raises(Exception, match="layer failed"):
        Engine(model).gradients(np.ones((1, 12, 12, 3), "float32"), 0)
    assert seen == [True]  # it was raised while the stem ran the rewritten op
    check()
    assert "convolution_op" not in vars(stem)


def test_passes_without_an_input_gradient_keep_the_layers_own_ops() -> None:
    """Grad-CAM / layer gradients, forward passes and weight gradients would only pay for tracing the rewrite."""
    seen = []
    inputs = keras.Input((12, 12, 3))
    stem = keras.layers.Conv2D(4, 3, strides=2, name="stem")

    def spy(t):  # noqa: ANN001, ANN202
        if not tf.executing_eagerly():
            seen.append("convolution_op" in vars(stem))
        return t

    h = keras.layers.Lambda(spy, output_shape=(5, 5, 4), name="spy")(stem(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling2D()(h)))
    x = np.random.default_rng(6).random((1, 12, 12, 3), dtype=np.float32)
    engine = Engine(model)
    seen.clear()
    engine.gradients(x, 0, layers=["spy"], wrt_inputs=False)
    engine.gradients(x, 0, weights=[model.get_layer("head").kernel])
    engine.forward(x)
    assert seen and not any(seen)
    seen.clear()
    engine.gradients(x, 0)
    assert seen == [True]


def test_unknown_spatial_size_runs_tensorflows_own_gradient() -> None:
    inputs = keras.Input((None, None, 3))
    x = keras.layers.Conv2D(4, 3, strides=2, name="stem")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(x)))
    x = np.random.default_rng(3).random((2, 11, 9, 3), dtype=np.float32)
    ours = Engine(model).gradients(x, 0, batch_size=2).input_grads[0]
    assert rel(ours, tape_saliency(model, x, 0)) < 1e-6


@pytest.mark.parametrize("name, params", [
    ("lrp", {"composite": "epsilon_plus"}),
    ("lrp", {"composite": "epsilon_gamma_box"}),
    ("lrp", {"composite": "epsilon_alpha2_beta1"}),
    ("deeplift", {}),
    ("guided_backprop", {}),
    ("integrated_gradients", {"steps": 8}),
])
def test_rule_based_methods_give_the_same_maps_with_and_without_the_rewrite(name: str, params: dict,
                                                                            monkeypatch) -> None:  # noqa: ANN001
    """LRP's terms, DeepLIFT's and guided backprop's passes differentiate the convolutions as they are, so the
    rewritten ones give the maps of TensorFlow's own gradients (those are cross-checked against zennit / Captum)."""
    import kerascope as ks
    from kerascope._backend import tensorflow as tf_backend

    keras.utils.set_random_seed(5)
    model = model_with_every_kind()
    random_statistics(model)
    x = np.random.default_rng(5).random((2, 20, 20, 3), dtype=np.float32)
    twin = model_with_every_kind()  # another model object: its own engine (engines are cached per model)
    twin.set_weights(model.get_weights())
    ours = ks.explain(model, x, method=name, targets=[1, 3], **params).attributions
    monkeypatch.setattr(tf_backend, "conv_op", None)  # the twin's engine finds no layer to rewrite
    theirs = ks.explain(twin, x, method=name, targets=[1, 3], **params).attributions
    assert np.abs(theirs).max() > 0
    assert rel(np.asarray(ours), np.asarray(theirs)) < 1e-5


def test_an_output_gradient_without_a_static_shape_is_handled() -> None:
    """A ``tf.py_function`` after the stem hands its gradient back without a static shape."""
    inputs = keras.Input((12, 12, 3))
    h = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="stem")(inputs)
    h = keras.layers.Conv2D(4, 1, strides=2, name="pw")(h)
    h = keras.layers.Lambda(lambda t: tf.ensure_shape(tf.py_function(lambda a: a * 2.0, [t], tf.float32),
                                                      [None, 3, 3, 4]), output_shape=(3, 3, 4))(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
    x = np.random.default_rng(7).random((2, 12, 12, 3), dtype=np.float32)
    engine = Engine(model)
    assert {layer.name for layer, _ in engine.conv_ops()} == {"stem", "pw"}
    assert rel(engine.gradients(x, 1).input_grads[0], tape_saliency_graph(model, x, 1)) < 1e-6


def tape_saliency_graph(model: keras.Model, x: np.ndarray, target: int) -> np.ndarray:
    """TensorFlow's own compiled input gradient (for models without a float64 twin)."""
    @tf.function
    def grad(xt):  # noqa: ANN001, ANN202
        with tf.GradientTape() as tape:
            tape.watch(xt)
            score = tf.reduce_sum(model(xt, training=False)[:, target])
        return tape.gradient(score, xt)

    return grad(tf.constant(x)).numpy()


def test_a_convolution_op_set_on_the_layer_object_is_kept() -> None:
    """An op the user set on this one object has its own gradient, not the plain convolution's."""
    stem = built(keras.layers.Conv2D(4, 3, strides=2), (9, 9, 3))
    plain = stem.convolution_op
    stem.convolution_op = lambda x, k: 2.0 * plain(x, k)
    assert tf_conv.conv_op(stem) is None
