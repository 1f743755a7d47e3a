"""A shared layer (called more than once) is read at the call ``call_index`` chooses.

References are hand-built forward passes through the model's own layer objects, with the
intermediate tensors of each call, differentiated by the backend's autodiff directly
(``tf.GradientTape`` on TensorFlow, ``jax.grad``, ``torch.autograd``): kerascope's probes
are not involved. Models: a Siamese functional model (one Conv2D applied to two inputs, built
so Keras runs the calls in the other order), a subclassed model calling one Dense twice, a
Sequential with one layer twice, and the Siamese model nested in another model.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.calls import SharedLayerError, build_ranks
from kerascope.core.engine import engine_for
from kerascope.core.inputs import Inputs
from tests._autodiff import gradient
from tests.conftest import assert_unchanged, snapshot

BACKEND = keras.backend.backend()
T = 1  # the explained class
# the JAX / PyTorch CI runs keep the checks of how a backend intercepts a call (JAX adds a zero
# delta at the chosen call, PyTorch and TensorFlow watch its tensor); the rest is backend-independent
tf_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="backend-independent logic, run on TensorFlow (CI time)")


def numpy(t) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(t))


def randomise(model: keras.Model, seed: int) -> keras.Model:
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()])
    return model


# ---------------------------------------------------------------------- models
def siamese() -> keras.Model:
    """One Conv2D ``shared`` applied to input ``a`` (first) and to ``pre(b)`` (second)."""
    conv = keras.layers.Conv2D(2, 3, activation="tanh", name="shared")
    a, b = keras.Input((8, 8, 1), name="a"), keras.Input((8, 8, 1), name="b")
    ya = conv(a)
    yb = conv(keras.layers.Conv2D(1, 1, name="pre")(b))
    flat = keras.layers.Concatenate(name="cat")([keras.layers.Flatten(name="fa")(ya), keras.layers.Flatten(name="fb")(yb)])
    return randomise(keras.Model([a, b], keras.layers.Dense(3, name="head")(flat), name="siamese"), 0)


def siamese_calls(m: keras.Model, xa: np.ndarray, xb: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Outputs of the two calls of ``shared`` and the gradients of score T at each, by hand."""
    conv, pre = m.get_layer("shared"), m.get_layer("pre")
    ya, yb = conv(xa), conv(pre(xb))

    def score(u, v):
        cat = m.get_layer("cat")([m.get_layer("fa")(u), m.get_layer("fb")(v)])
        return m.get_layer("head")(cat)[:, T]

    ga = gradient(lambda u: score(u, yb), numpy(ya))
    gb = gradient(lambda v: score(ya, v), numpy(yb))
    return [numpy(ya), numpy(yb)], [ga, gb]


class TwiceDense(keras.Model):
    """``h1 = shared(x)``, ``h2 = shared(tanh(h1))``, ``out = head([h1, h2])``: one Dense called twice."""

    def __init__(self) -> None:
        super().__init__(name="twice")
        self.shared = keras.layers.Dense(4, name="shared")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x):
        h1 = self.shared(x)
        h2 = self.shared(keras.ops.tanh(h1))
        return self.head(keras.ops.concatenate([h1, h2], axis=-1))


def twice() -> keras.Model:
    model = TwiceDense()
    model(np.zeros((1, 4), "float32"))
    return randomise(model, 1)


def twice_forward(m: TwiceDense, h1=None, h2=None, x=None):
    """Score T with the first call's output ``h1`` (and the second's ``h2``) given, the rest recomputed."""
    if h1 is None:
        h1 = m.shared(x)
    if h2 is None:
        h2 = m.shared(keras.ops.tanh(h1))
    return m.head(keras.ops.concatenate([h1, h2], axis=-1))[:, T]


def twice_calls(m: TwiceDense, x: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    h1 = numpy(m.shared(x))
    h2 = numpy(m.shared(keras.ops.tanh(h1)))
    g1 = gradient(lambda u: twice_forward(m, h1=u), h1)  # through the head and through the second call
    g2 = gradient(lambda v: twice_forward(m, h1=h1, h2=v), h2)
    return [h1, h2], [g1, g2]


RNG = np.random.default_rng(7)
XA, XB = RNG.normal(size=(2, 8, 8, 1)).astype("float32"), RNG.normal(size=(2, 8, 8, 1)).astype("float32")
X4 = RNG.normal(size=(3, 4)).astype("float32")


# ------------------------------------------------------------------------ tests
@tf_only
def test_siamese_layer_gradients_and_gradcam_at_each_call_equal_the_hand_computation():
    m = siamese()
    before = snapshot(m)
    # Keras runs the node applied second (b's, deeper through `pre`) first: call_index follows the
    # order the layer was applied when the model was built, not the run order
    assert build_ranks(m, m.get_layer("shared")) == [1, 0]
    acts, grads = siamese_calls(m, XA, XB)
    for k in (0, 1):
        got = ks.layer_gradients(m, [XA, XB], "shared", targets=T, call_index=k)
        np.testing.assert_allclose(got.activations, acts[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.gradients, grads[k], rtol=1e-4, atol=1e-6)
        cam = ks.GradCAM(m, layer="shared", call_index=k, input_index=k, upsample=False).explain([XA, XB], T)
        weights = grads[k].mean(axis=(1, 2))
        np.testing.assert_allclose(cam.attributions, np.maximum(np.einsum("nhwc,nc->nhw", acts[k], weights), 0),
                                   rtol=1e-4, atol=1e-6)
        assert cam.params["call_index"] == k
    neg = ks.layer_gradients(m, [XA, XB], "shared", targets=T, call_index=-2)  # Python indexing
    np.testing.assert_allclose(neg.gradients, grads[0], rtol=1e-4, atol=1e-6)
    assert_unchanged(m, before)


@tf_only
def test_subclassed_layer_gradients_at_each_call_equal_the_hand_computation():
    m = twice()
    before = snapshot(m)
    acts, grads = twice_calls(m, X4)
    for k in (0, 1):
        got = ks.layer_gradients(m, X4, "shared", targets=T, call_index=k)
        np.testing.assert_allclose(got.activations, acts[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.gradients, grads[k], rtol=1e-4, atol=1e-6)
        saliency = ks.Saliency(m, layer="shared", call_index=k).explain(X4, T).attributions
        np.testing.assert_allclose(saliency, grads[k], rtol=1e-4, atol=1e-6)
    assert_unchanged(m, before)


def test_replacing_a_call_changes_only_that_call_and_recomputes_what_follows():
    """Layer IG / SmoothGrad replace the layer's output: only the chosen call, the later calls see it."""
    m = twice()
    v = RNG.normal(size=(3, 4)).astype("float32")
    for k in (0, 1):
        result = engine_for(m, call_index=k).gradients(X4, T, layers=["shared"], wrt_inputs=False, replace=[v])
        h1 = v if k == 0 else None
        h2 = v if k == 1 else None
        expected = numpy(twice_forward(m, h1=h1, h2=h2, x=X4))
        np.testing.assert_allclose(result.scores, expected, rtol=1e-5, atol=1e-6)
        if k == 0:
            grad = gradient(lambda u: twice_forward(m, h1=u), v)
        else:
            h1_fixed = numpy(m.shared(X4))  # the first call's output, a constant here
            grad = gradient(lambda u, h1_fixed=h1_fixed: twice_forward(m, h1=h1_fixed, h2=u), v)
        np.testing.assert_allclose(result.layer_grads[0], grad, rtol=1e-4, atol=1e-6)


@tf_only
def test_layer_ig_at_a_call_is_complete_for_that_call():
    """IG at call 0: the attributions sum to the score drop when that call's output is at the baseline (0)."""
    m = twice()
    v = np.zeros((3, 4), "float32")
    ig = ks.IntegratedGradients(m, layer="shared", call_index=0, steps=64).explain(X4, T)
    drop = numpy(twice_forward(m, x=X4)) - numpy(twice_forward(m, h1=np.zeros_like(v)))
    np.testing.assert_allclose(ig.attributions.sum(axis=1), drop, rtol=2e-2, atol=2e-3)


def test_an_intervention_hits_only_the_chosen_call():
    """The scorer behind AblationCAM / ScoreCAM-style methods: the transform replaces one call's output."""
    m = twice()

    def scale(output, factor):
        return output * keras.ops.expand_dims(factor, -1)

    zero = np.zeros(3, "float32")
    for k in (0, 1):
        fn = engine_for(m, call_index=k).scorer(Inputs(X4), layer=m.shared, transform=scale,
                                                extra_spec=((None,), "float32"))
        scores = fn([X4], np.full(3, T, "int32"), zero)[0]
        h1 = np.zeros((3, 4), "float32") if k == 0 else None
        h2 = np.zeros((3, 4), "float32") if k == 1 else None
        np.testing.assert_allclose(scores, numpy(twice_forward(m, h1=h1, h2=h2, x=X4)), rtol=1e-5, atol=1e-6)


@tf_only
def test_sequential_and_nested_models_count_calls_the_same_way():
    d = keras.layers.Dense(3, activation="tanh", name="shared")
    seq = randomise(keras.Sequential([keras.Input((3,)), d, d, keras.layers.Dense(2, name="o")]), 2)
    x = X4[:, :3]
    first = numpy(d(x))
    np.testing.assert_allclose(ks.layer_gradients(seq, x, "shared", targets=0, call_index=0).activations, first,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ks.layer_gradients(seq, x, "shared", targets=0, call_index=1).activations,
                               numpy(d(first)), rtol=1e-5, atol=1e-6)
    inner = siamese()
    a, b = keras.Input((8, 8, 1), name="a"), keras.Input((8, 8, 1), name="b")
    outer = keras.Model([a, b], keras.layers.Activation("linear", name="id")(inner([a, b])), name="outer")
    for k in (0, 1):
        flat = ks.layer_gradients(inner, [XA, XB], "shared", targets=T, call_index=k)
        nested = ks.layer_gradients(outer, [XA, XB], "siamese/shared", targets=T, call_index=k)
        np.testing.assert_allclose(nested.gradients, flat.gradients, rtol=1e-5, atol=1e-7)
    # the usual Siamese: one encoder MODEL applied twice, here to pre(b) first; Keras runs a's first
    encoder = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="conv"),
                                keras.layers.Flatten()], name="encoder")
    pre = keras.layers.Conv2D(1, 1, name="pre")
    eb = encoder(pre(b))
    ea = encoder(a)
    twin = randomise(keras.Model([a, b], keras.layers.Dense(2)(keras.layers.Concatenate()([ea, eb]))), 4)
    conv = encoder.get_layer("conv")
    for k, expected in enumerate([conv(pre(XB)), conv(XA)]):
        got = ks.layer_gradients(twin, [XA, XB], "encoder/conv", targets=0, call_index=k).activations
        np.testing.assert_allclose(got, numpy(expected), rtol=1e-5, atol=1e-6)


@tf_only
def test_a_shared_layer_without_call_index_is_refused_and_the_model_is_unchanged():
    m = twice()
    before = snapshot(m)
    reference = numpy(m(X4))
    attempts = [
        lambda: ks.layer_gradients(m, X4, "shared", targets=T),
        lambda: ks.Saliency(m, layer="shared").explain(X4, T),
        lambda: ks.IntegratedGradients(m, layer="shared", steps=4).explain(X4, T),
        lambda: ks.Saliency(m, output_layer="shared").explain(X4, 0),
    ]
    for attempt in attempts:
        with pytest.raises(SharedLayerError, match=r"called 2 times .* call_index=None\. Choose the call with "
                                                   r"`call_index=0\.\.1`"):
            attempt()
        assert_unchanged(m, before)
    for bad in (2, -3):
        with pytest.raises(SharedLayerError, match=rf"out of range.*called 2 times.*call_index={bad}\..*\[-2, 1\]"):
            ks.Saliency(m, layer="shared", call_index=bad).explain(X4, T)
    with pytest.raises(SharedLayerError, match="must be None or an int"):
        ks.Saliency(m, layer="shared", call_index="first")
    with pytest.raises(SharedLayerError, match="reads none here"):  # nothing for call_index to choose in
        ks.Saliency(m, call_index=0).explain(X4, T)
    assert_unchanged(m, before)
    np.testing.assert_array_equal(numpy(m(X4)), reference)
    # output_layer of a shared layer: its chosen call's output is explained
    out = ks.Saliency(m, output_layer="shared", call_index=1).explain(X4, 0)
    expected = gradient(lambda x: m.shared(keras.ops.tanh(m.shared(x)))[:, 0], X4)
    np.testing.assert_allclose(out.attributions, expected, rtol=1e-4, atol=1e-6)


@tf_only
def test_a_layer_called_once_takes_none_0_or_minus_1_only():
    m = twice()
    maps = [ks.Saliency(m, layer="head", call_index=k).explain(X4, T).attributions for k in (None, 0, -1)]
    np.testing.assert_array_equal(maps[0], maps[1])
    np.testing.assert_array_equal(maps[0], maps[2])
    with pytest.raises(SharedLayerError, match=r"layer 'head' is called 1 time .* call_index=1\. Expected None, 0 or -1"):
        ks.Saliency(m, layer="head", call_index=1).explain(X4, T)


@tf_only
def test_cli_param_call_index(tmp_path, capsys):
    from kerascope.cli import main
    from kerascope.data import demo_images

    conv = keras.layers.Conv2D(3, 3, padding="same", activation="tanh", name="shared")
    x = keras.Input((16, 16, 3))  # functional: a Sequential listing one layer twice loses it when saved (Keras)
    pooled = keras.layers.GlobalAveragePooling2D()(conv(conv(x)))
    model = randomise(keras.Model(x, keras.layers.Dense(2, name="o")(pooled), name="chain_shared"), 3)
    path = tmp_path / "m.keras"
    model.save(path)
    image = str(demo_images()[0])
    common = ["explain", str(path), image, "--method", "gradcam", "--layer", "shared", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "none")]) != 0
    assert "call_index=0..1" in capsys.readouterr().err
    # Saliency beside Grad-CAM stays on the pixels: the call_index goes with the layer, to Grad-CAM only
    assert main([*common, "--method", "saliency", "--param", "call_index=1", "--out", str(tmp_path / "one")]) == 0
    saved = ks.Explanation.load(tmp_path / "one" / "gradcam.npz")
    assert saved.params["call_index"] == 1 and saved.params["layer"] == "shared"
    assert ks.Explanation.load(tmp_path / "one" / "saliency.npz").params["call_index"] is None


@tf_only
def test_a_cell_called_in_a_loop_is_refused_not_matched_to_the_wrong_step():
    """Eagerly an RNN cell is called once per step, compiled once per loop body: no call can be matched."""
    x = keras.Input((3, 2))
    rnn = keras.Model(x, keras.layers.Dense(2)(keras.layers.LSTM(3, name="lstm", use_cudnn=False)(x)))
    data = np.ones((2, 3, 2), "float32")
    rnn(data)  # the LSTM sets its own (dropout mask) attributes on its first call
    before = snapshot(rnn)
    with pytest.raises(SharedLayerError, match="lstm/lstm_cell' is called .* times"):
        ks.layer_gradients(rnn, data, "lstm/lstm_cell", targets=0)
    with pytest.raises(ValueError, match=r"times in the compiled one .* Probe the layer that contains the loop") as info:
        ks.layer_gradients(rnn, data, "lstm/lstm_cell", targets=0, call_index=1)
    assert str(info.value).startswith("Layer 'lstm/lstm_cell' is called ")  # the message once, no "ValueError: " prefix
    assert ks.layer_gradients(rnn, data, "lstm", targets=0).gradients.shape == (2, 3)
    assert_unchanged(rnn, before)
