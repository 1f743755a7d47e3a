"""Conv / Dense + BatchNormalization folding in the compiled passes (propagation/bn_fold.py).

Folded results must equal the model's own graph (``fold_batchnorm=False``) and a hand-written gradient
to float32 rounding; pairs that do not fold exactly (another reader, a shared layer, a probed layer, an
activation, a training-mode call, a subclassed model) must not be folded; the model is never changed;
a change of the weights between two calls gives the new numbers.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.engine import Engine
from kerascope.propagation.bn_fold import FOLD_BACKENDS, _scale_kernel, fold_batchnorm, foldable_pairs

L = keras.layers
TOL = {"rtol": 2e-4, "atol": 2e-5}


def randomise_bn(model: keras.Layer, seed: int = 1) -> None:
    """Non-trivial BN statistics (the initial ones make every BN almost the identity)."""
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, L.BatchNormalization):
            values = {"gamma": rng.uniform(0.5, 1.5, layer.moving_mean.shape),
                      "beta": rng.normal(0, 0.3, layer.moving_mean.shape),
                      "moving_mean": rng.normal(0, 0.3, layer.moving_mean.shape),
                      "moving_variance": rng.uniform(0.5, 2.0, layer.moving_mean.shape)}
            for variable in layer.weights:
                variable.assign(values[variable.path.split("/")[-1]].astype("float32"))


def bn_cnn(seed: int = 0, size: int = 16) -> keras.Model:
    """Conv (no bias) + BN, depthwise (multiplier 2) + BN, 1x1 conv (bias) + BN, Dense + BN."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((size, size, 3))
    h = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(4, 3, padding="same", use_bias=False, name="c1")(x)))
    h = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="dw")(h)
    h = L.ReLU(name="r2")(L.BatchNormalization(name="bn2")(h))
    h = L.ReLU(name="r3")(L.BatchNormalization(name="bn3")(L.Conv2D(6, 1, name="c3")(h)))
    h = L.GlobalAveragePooling2D(name="gap")(h)
    h = L.ReLU(name="r4")(L.BatchNormalization(name="bn4")(L.Dense(8, name="d1")(h)))
    model = keras.Model(x, L.Dense(3, name="head")(h), name="bn_cnn")
    randomise_bn(model)
    return model


@pytest.fixture(scope="module")
def model():
    return bn_cnn()


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).random((3, 16, 16, 3), dtype=np.float32)


def names(pairs):
    return [(a.name, b.name) for a, b in pairs]


FOLDS = keras.backend.backend() in FOLD_BACKENDS  # JAX: not folded (XLA fuses the normalisation already)


def test_every_pair_of_the_model_is_folded(model):
    expected = [("c1", "bn1"), ("dw", "bn2"), ("c3", "bn3"), ("d1", "bn4")]
    assert names(foldable_pairs(model)) == expected
    assert names(Engine(model).folded_pairs()) == (expected if FOLDS else [])
    assert Engine(model, fold_batchnorm=False).folded_pairs() == []


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the hand-written reference uses tf.GradientTape")
def test_saliency_equals_a_hand_written_gradient(model, x):
    import tensorflow as tf

    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        score = tf.reduce_sum(model(xt, training=False)[:, 1])
    expected = tape.gradient(score, xt).numpy()
    folded = ks.Saliency(model).explain(x, targets=1).attributions
    np.testing.assert_allclose(folded, expected, **TOL)


@pytest.mark.parametrize("method, params", [
    ("saliency", {}),
    ("integrated_gradients", {"steps": 8}),
    ("smoothgrad", {"samples": 4, "seed": 3}),
])
def test_folded_equals_unfolded(model, x, method, params):
    folded = ks.explain(model, x, method=method, targets=[0, 1, 2], **params)
    plain = ks.explain(model, x, method=method, targets=[0, 1, 2], fold_batchnorm=False, **params)
    assert np.abs(plain.attributions).max() > 0
    np.testing.assert_allclose(folded.attributions, plain.attributions, **TOL)
    np.testing.assert_allclose(folded.scores, plain.scores, **TOL)


@pytest.mark.parametrize("layer", ["r1", "dw", "bn2", "r2"])  # before, inside (conv, BN) and after a pair
def test_gradcam_at_layers_around_a_pair(model, x, layer):
    folded = ks.GradCAM(model, layer=layer).explain(x, targets=[0, 1, 2])
    plain = ks.GradCAM(model, layer=layer, fold_batchnorm=False).explain(x, targets=[0, 1, 2])
    np.testing.assert_allclose(folded.attributions, plain.attributions, **TOL)
    probed = Engine(model).folded_pairs(Engine(model).resolve_layers([layer]))
    assert ("dw", "bn2") in names(probed) or layer in ("dw", "bn2") or not FOLDS
    assert ("dw", "bn2") not in names(probed) or layer not in ("dw", "bn2")
    assert len(probed) == ((3 if layer in ("dw", "bn2") else 4) if FOLDS else 0)


def test_model_unchanged_after_a_call_and_after_an_exception(model, x, unchanged):
    check = unchanged(model)
    ks.Saliency(model).explain(x, targets=0)
    check()
    engine = Engine(model)

    def broken(activations, gradients):
        raise RuntimeError("reduce failed")

    with pytest.raises(Exception, match="reduce failed"):  # raised while tracing, inside the folded pass
        engine.gradients(x, 0, layers=["r3"], wrt_inputs=False, reduce=broken)
    check()
    with pytest.raises(RuntimeError), fold_batchnorm(foldable_pairs(model)):
        raise RuntimeError("inside")
    check()


def test_new_weights_between_two_calls_give_new_numbers(x):
    model = bn_cnn(seed=2)
    method = ks.Saliency(model)
    first = method.explain(x, targets=0).attributions
    bn, conv = model.get_layer("bn2"), model.get_layer("dw")
    gamma, beta, mean, var = bn.get_weights()
    bn.set_weights([gamma * 2.0, beta + 0.5, mean - 0.2, var * 3.0])
    conv.set_weights([w * 0.5 for w in conv.get_weights()])
    second = method.explain(x, targets=0).attributions
    plain = ks.Saliency(model, fold_batchnorm=False).explain(x, targets=0).attributions
    assert not np.allclose(first, second, **TOL)
    np.testing.assert_allclose(second, plain, **TOL)


# ------------------------------------------------------------------------------------- which pairs fold
def _model(build):
    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 3))
    return keras.Model(x, build(x))


def _other_reader(x):
    c = L.Conv2D(3, 3, padding="same", name="c")(x)
    return L.Add()([L.BatchNormalization(name="bn")(c), c])


def _shared_conv(x):
    conv = L.Conv2D(3, 3, padding="same", name="c")
    return conv(L.BatchNormalization(name="bn")(conv(x)))


def _shared_bn(x):
    bn = L.BatchNormalization(name="bn")
    return L.Add()([bn(L.Conv2D(3, 1, name="c")(x)), bn(L.Conv2D(3, 1, name="c2")(x))])


def _activation(x):
    return L.BatchNormalization(name="bn")(L.Conv2D(3, 3, activation="relu", name="c")(x))


def _activation_layer(x):  # an activation with no __name__: still an activation, not the identity
    return L.BatchNormalization(name="bn")(L.Conv2D(3, 3, activation=L.ReLU(), name="c")(x))


def _activation_partial(x):
    leaky = functools.partial(keras.activations.leaky_relu, negative_slope=0.1)
    return L.BatchNormalization(name="bn")(L.Conv2D(3, 3, activation=leaky, name="c")(x))


def _training(x):
    return L.BatchNormalization(name="bn")(L.Conv2D(3, 3, name="c")(x), training=True)


def _conv_is_an_output(x):
    c = L.Conv2D(3, 3, name="c")(x)
    return [L.BatchNormalization(name="bn")(c), c]


def _wrong_axis(x):
    return L.BatchNormalization(axis=1, name="bn")(L.Conv2D(3, 3, padding="same", name="c")(x))


class MyConv(L.Conv2D):
    pass


def _subclassed_conv(x):
    return L.BatchNormalization(name="bn")(MyConv(3, 3, name="c")(x))


@pytest.mark.parametrize("build", [_other_reader, _shared_conv, _shared_bn, _activation, _activation_layer,
                                   _activation_partial, _training,
                                   _conv_is_an_output, _wrong_axis, _subclassed_conv],
                         ids=lambda f: f.__name__.strip("_"))
def test_pairs_that_would_not_fold_exactly_are_left_alone(build):
    assert foldable_pairs(_model(build)) == []


class Block(keras.Model):  # subclassed: its call() is not a known graph
    def __init__(self):
        super().__init__()
        self.conv = L.Conv2D(3, 3, padding="same")
        self.bn = L.BatchNormalization()

    def call(self, x):
        return self.bn(self.conv(x)) + self.conv(x)


def test_subclassed_models_are_not_folded_nested_functional_ones_are():
    assert foldable_pairs(_model(lambda x: Block()(x))) == []
    inner = keras.Sequential([keras.Input((8, 8, 3)), L.Conv2D(3, 3, name="ic"), L.BatchNormalization(name="ib")],
                             name="inner")
    outer = _model(lambda x: L.ReLU()(inner(x)))
    assert names(foldable_pairs(outer)) == [("ic", "ib")]


@pytest.mark.parametrize("shape, build, on_kernel", [
    ((12, 2), lambda x: L.BatchNormalization()(L.Conv1D(3, 3, padding="same", dilation_rate=2)(x)), True),
    ((4, 4, 4, 2), lambda x: L.BatchNormalization()(L.Conv3D(3, 2, strides=2)(x)), True),
    ((6, 6, 2), lambda x: L.BatchNormalization()(L.DepthwiseConv2D(3, strides=2, depth_multiplier=3)(x)), True),
    ((5, 4), lambda x: L.BatchNormalization()(L.Dense(3)(x)), True),  # a rank-3 Dense
    # kernels larger than KERNEL_ROWS rows of the output: the output is scaled instead of the kernel
    ((8, 8, 4), lambda x: L.BatchNormalization()(L.Conv2D(8, 4, strides=4, use_bias=False)(x)), False),
    ((64,), lambda x: L.BatchNormalization(center=False)(L.Dense(2)(x)), False),
])
def test_each_layer_kind_folds_to_the_same_outputs(shape, build, on_kernel):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape)
    model = keras.Model(inputs, build(inputs))
    randomise_bn(model)
    v = np.random.default_rng(0).normal(size=(2, *shape)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(v, training=False))
    pairs = foldable_pairs(model)
    assert [_scale_kernel(affine) for affine, _ in pairs] == [on_kernel]
    with fold_batchnorm(pairs) as count:
        folded = keras.ops.convert_to_numpy(model(v, training=False))
    assert count == 1
    np.testing.assert_allclose(folded, expected, **TOL)


def test_the_option_is_a_flag():
    with pytest.raises((TypeError, ValueError), match="fold_batchnorm"):
        ks.Saliency(bn_cnn(), fold_batchnorm="no")


# ------------------------------------------------------------------------- calls the graph does not show
class OverridingModel(keras.Model):
    """A Functional subclass whose ``call`` reads the conv once more: its graph is not what runs."""

    def __init__(self):
        x = keras.Input((4,))
        conv = L.Dense(3, name="c")
        super().__init__(x, L.BatchNormalization(name="bn")(conv(x)))
        self.conv = conv

    def call(self, x, training=None):
        return super().call(x, training=training) + self.conv(x)


def test_a_functional_subclass_that_overrides_call_is_not_folded():
    model = OverridingModel()
    randomise_bn(model)
    assert foldable_pairs(model) == []
    v = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    folded = ks.Saliency(model).explain(v, targets=0).attributions
    plain = ks.Saliency(model, fold_batchnorm=False).explain(v, targets=0).attributions
    np.testing.assert_allclose(folded, plain, **TOL)


def _closure_model():
    """``c`` runs once in the graph (before a BN) and once inside a Lambda that closes over it."""
    keras.utils.set_random_seed(0)
    conv = L.Conv2D(3, 1, name="c")
    x = keras.Input((6, 6, 3))
    h = L.ReLU()(L.BatchNormalization(name="bn")(conv(x)))
    h = L.Lambda(lambda t: conv(t), name="closure")(h)
    model = keras.Model(x, L.Dense(3)(L.Flatten()(h)))
    randomise_bn(model)
    return model


def test_a_layer_called_outside_the_graph_reruns_the_pass_unfolded():
    model = _closure_model()
    v = np.random.default_rng(0).random((2, 6, 6, 3), dtype=np.float32)
    method = ks.Saliency(model)
    folded = method.explain(v, targets=0).attributions
    plain = ks.Saliency(model, fold_batchnorm=False).explain(v, targets=0).attributions
    np.testing.assert_allclose(folded, plain, **TOL)
    if FOLDS:  # the pair looked foldable from the graph; the pass showed otherwise
        assert names(foldable_pairs(model)) == [("c", "bn")]
        assert method.engine.folded_pairs() == []


def test_a_probed_layer_called_outside_the_graph_is_refused():
    model = _closure_model()
    v = np.random.default_rng(0).random((2, 6, 6, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="called 2 times"):
        ks.GradCAM(model, layer="c", fold_batchnorm=False).explain(v, targets=0)


# ------------------------------------------------------------------------- the fused bias (TensorFlow)
def residual_bn_cnn() -> keras.Model:
    """Conv + BN + ReLU, then a bottleneck whose Conv + BN joins the shortcut in Add + ReLU (ResNet's pattern)."""
    keras.utils.set_random_seed(3)
    x = keras.Input((12, 12, 3))
    h = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, padding="same")(x)))
    r = L.ReLU()(L.BatchNormalization()(L.Conv2D(4, 1)(h)))
    r = L.BatchNormalization()(L.Conv2D(8, 3, padding="same")(r))
    h = L.ReLU()(L.Add()([h, r]))
    model = keras.Model(x, L.Dense(3)(L.GlobalAveragePooling2D()(h)))
    randomise_bn(model)
    return model


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's BiasAdd op")
def test_folded_biases_are_bias_add_ops_with_the_same_numbers(monkeypatch):
    """The folded layers add their bias with ``BiasAdd`` (which Grappler fuses into the convolution, with
    the ReLU and the residual Add after it); without the backend's ``bias_add`` (a plain addition) the
    maps are the same up to float32 rounding, and equal the unfolded model's."""
    import tensorflow as tf

    from kerascope._backend import tensorflow as tf_backend

    model = residual_bn_cnn()
    v = np.random.default_rng(4).random((2, 12, 12, 3), dtype=np.float32)
    pairs = foldable_pairs(model)
    assert len(pairs) == 3

    @tf.function(autograph=False)
    def forward(inputs):
        with fold_batchnorm(pairs):
            return model(inputs, training=False)

    ops = [op.type for op in forward.get_concrete_function(tf.TensorSpec((None, 12, 12, 3))).graph.get_operations()]
    assert ops.count("BiasAdd") == 3 + 1  # the three folded convolutions, and the Dense head (Keras adds its own biases with BiasAdd too)

    def maps(m, fold):
        return [ks.Occlusion(m, window=4, fold_batchnorm=fold).explain(v, [0, 2]).attributions,
                ks.Saliency(m, fold_batchnorm=fold).explain(v, [0, 2]).attributions]

    with_bias_add = maps(model, True)
    unfolded = maps(model, False)
    monkeypatch.delattr(tf_backend, "bias_add")
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    without = maps(plain, True)
    for a, b, c in zip(with_bias_add, without, unfolded, strict=True):
        np.testing.assert_allclose(a, b, **TOL)  # float32 rounding: oneDNN adds a fused bias inside the op
        np.testing.assert_allclose(a, c, **TOL)
