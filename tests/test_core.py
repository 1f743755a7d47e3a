"""Foundation: primitives, targets, output space, batching, compilation, errors, model unchanged."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerascope as ks
from tests.conftest import small_cnn


def _tape_logit_grad(model, x, targets):
    """Hand-written gradient of the pre-softmax logit of small_cnn."""
    head = model.get_layer("head")
    body = keras.Model(model.inputs, model.get_layer("gap").output)
    x = tf.convert_to_tensor(x, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = tf.matmul(body(x), head.kernel) + head.bias
        score = tf.reduce_sum(tf.gather(logits, targets, axis=1, batch_dims=1))
    return tape.gradient(score, x).numpy(), logits.numpy()


def test_input_gradients_match_tape_and_float64_works(cnn, images):
    x64 = images.astype(np.float64)
    grads = ks.input_gradients(cnn, x64, targets=[0, 1, 2, 0])
    expected, _ = _tape_logit_grad(cnn, images, [0, 1, 2, 0])
    assert grads.shape == x64.shape
    np.testing.assert_allclose(grads, expected, rtol=1e-5, atol=1e-7)


def test_predicted_class_targets(cnn, images):
    _, logits = _tape_logit_grad(cnn, images, [0] * 4)
    explanation = ks.Saliency(cnn).explain(images)
    np.testing.assert_array_equal(explanation.targets, logits.argmax(-1))
    np.testing.assert_allclose(explanation.scores, logits.max(-1), rtol=1e-5)


def test_callable_target_regression_score(cnn, images):
    explanation = ks.Saliency(cnn).explain(images, targets=lambda out: out[:, 0] - out[:, 1])
    g0, logits = _tape_logit_grad(cnn, images, [0] * 4)
    g1, _ = _tape_logit_grad(cnn, images, [1] * 4)
    np.testing.assert_allclose(explanation.attributions, g0 - g1, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(explanation.scores, logits[:, 0] - logits[:, 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["saliency", "gradient_x_input", "guided_backprop", "gradcam", "guided_gradcam"])
def test_batch_invariance_and_model_unchanged(method, cnn, images, unchanged):
    check = unchanged(cnn)
    together = ks.explain(cnn, images, method=method, targets=[0, 1, 2, 1], batch_size=4).attributions
    one_by_one = np.concatenate(
        [ks.explain(cnn, images[i : i + 1], method=method, targets=[t], batch_size=1).attributions
         for i, t in enumerate([0, 1, 2, 1])]
    )
    np.testing.assert_allclose(together, one_by_one, rtol=1e-4, atol=1e-6)
    check()


def test_gradient_x_input_closed_form():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, use_bias=False, name="lin")])
    w = np.array([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]], np.float32)
    model.get_layer("lin").set_weights([w])
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 2.0]], np.float32)
    attr = ks.GradientXInput(model).explain(x, targets=[0, 1]).attributions
    np.testing.assert_allclose(attr, x * w[:, [0, 1]].T, rtol=1e-6)
    np.testing.assert_allclose(attr.sum(-1), (x @ w)[[0, 1], [0, 1]], rtol=1e-6)  # completeness for linear


def test_guided_backprop_matches_hand_rule():
    keras.utils.set_random_seed(4)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(7, activation="relu", name="h"), keras.layers.Dense(2, name="o")]
    )
    x = np.random.default_rng(2).normal(size=(3, 5)).astype(np.float32)
    attr = ks.GuidedBackprop(model).explain(x, targets=1).attributions
    w1, b1 = model.get_layer("h").get_weights()
    w2, _ = model.get_layer("o").get_weights()
    pre = x @ w1 + b1
    dy = np.tile(w2[:, 1], (3, 1))  # gradient arriving at the ReLU output
    expected = ((pre > 0) * np.maximum(dy, 0)) @ w1.T
    np.testing.assert_allclose(attr, expected, rtol=1e-5, atol=1e-6)
    plain = ks.Saliency(model).explain(x, targets=1).attributions
    np.testing.assert_allclose(plain, ((pre > 0) * dy) @ w1.T, rtol=1e-5, atol=1e-6)


def test_gradcam_upsampling_and_layer_resolution(cnn, images):
    small = ks.GradCAM(cnn, layer="conv2", upsample=False).explain(images, targets=0)
    big = ks.GradCAM(cnn, layer="conv2").explain(images, targets=0)
    assert small.attributions.shape == (4, 14, 14)
    assert big.attributions.shape == (4, 16, 16)
    assert np.all(big.attributions >= 0)
    expected = tf.image.resize(small.attributions[..., None], (16, 16), method="bilinear").numpy()[..., 0]
    np.testing.assert_allclose(big.attributions, expected, rtol=1e-5, atol=1e-6)
    assert big.layer == "conv2"
    assert ks.GradCAM(cnn).explain(images[:1]).layer == "conv2"  # default: last spatial layer


def test_no_retracing_for_same_shapes_and_other_batch_sizes(images):
    model = small_cnn(name="retrace")
    method = ks.Saliency(model)
    method.explain(images, targets=0)
    traces = method.engine.trace_count
    method.explain(images + 0.1, targets=1)
    method.explain(images[:3], targets=[0, 1, 2])
    method.explain(images[:1])
    assert method.engine.trace_count == traces == 1


def test_chunks_match_single_batch(cnn):
    x = np.random.default_rng(5).uniform(size=(10, 16, 16, 3)).astype(np.float32)
    a = ks.Saliency(cnn, batch_size=3).explain(x, targets=1).attributions
    b = ks.Saliency(cnn, batch_size=10).explain(x, targets=1).attributions
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_multi_input_model_returns_one_attribution_per_input():
    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    out = keras.layers.Dense(2, use_bias=False, name="d")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], out)
    w = np.arange(10, dtype=np.float32).reshape(5, 2)
    model.get_layer("d").set_weights([w])
    xa, xb = np.ones((2, 3), np.float32), np.ones((2, 2), np.float32)
    grads = ks.Saliency(model, input_index=[0, 1]).explain([xa, xb], targets=1).attributions
    assert isinstance(grads, list) and len(grads) == 2
    np.testing.assert_allclose(grads[0], np.tile(w[:3, 1], (2, 1)))
    np.testing.assert_allclose(grads[1], np.tile(w[3:, 1], (2, 1)))


def test_layers_listing_with_paths_and_shapes():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1")], name="inner")
    model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2, name="top")])
    listing = {info.path: info.output_shape for info in ks.layers(model)}
    assert listing == {"inner": "(None, 3)", "inner/d1": "(None, 3)", "top": "(None, 2)"}
    assert ks.find_layer(model, "d1") is inner.get_layer("d1")  # a unique bare name is accepted


def test_errors_say_what_was_received(cnn, images):
    with pytest.raises(ValueError, match=r"Received: layer='conv3'.*conv1"):
        ks.GradCAM(cnn, layer="conv3")
    with pytest.raises(ValueError, match=r"Received: shape=\(4, 8, 8, 3\)"):
        ks.Saliency(cnn).explain(images[:, :8, :8])
    with pytest.raises(ValueError, match="out of range"):
        ks.Saliency(cnn).explain(images, targets=7)
    with pytest.raises(ValueError, match="one entry per sample"):
        ks.Saliency(cnn).explain(images, targets=[0, 1])
    with pytest.raises(ValueError, match="NaN"):
        bad = images.copy()
        bad[0, 0, 0, 0] = np.nan
        ks.Saliency(cnn).explain(bad)
    with pytest.raises(ValueError, match="Unknown method.*gradcam"):
        ks.explain(cnn, images, method="gradcamm")
    with pytest.raises(TypeError, match="Keras 3 model"):
        ks.Saliency(object())
    with pytest.raises(ValueError, match="CAM methods need a layer with positions"):
        ks.GradCAM(cnn, layer="head").explain(images)


def test_disconnected_layer_raises_clearly():
    a = keras.Input((3,))
    used = keras.layers.Dense(2, name="used")(a)
    unused = keras.layers.Dense(2, name="unused")(a)
    model = keras.Model(a, [used, unused])
    with pytest.raises(ValueError, match="does not depend on the output of layer 'unused'"):
        ks.layer_gradients(model, np.ones((1, 3)), "unused", targets=0, output_index=0)


class Exploding(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(3, 3, activation="relu", name="conv")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(2, activation="softmax", name="head")
        self.explode = False

    def call(self, x):
        h = self.conv(x)
        if self.explode:
            raise RuntimeError("boom inside the forward pass")
        return self.head(self.pool(h))


def test_model_unchanged_after_an_exception(unchanged):
    model = Exploding()
    x = np.ones((2, 8, 8, 3), np.float32)
    model(x)
    check = unchanged(model)
    object.__setattr__(model, "explode", True)
    try:
        for method in ("gradcam", "guided_backprop", "saliency"):
            with pytest.raises(Exception, match="boom"):
                ks.explain(model, x, method=method, layer="conv") if method == "gradcam" else ks.explain(
                    model, x, method=method
                )
    finally:
        object.__setattr__(model, "explode", False)
    check()
    assert "call" not in vars(model.get_layer("conv"))


def test_explanation_save_and_load(cnn, images, tmp_path):
    explanation = ks.GradCAM(cnn, layer="conv2").explain(images, targets=[0, 1, 2, 0])
    path = explanation.save(tmp_path / "gradcam.npz")
    loaded = ks.Explanation.load(path)
    np.testing.assert_array_equal(loaded.attributions, explanation.attributions)
    np.testing.assert_array_equal(loaded.targets, explanation.targets)
    assert loaded.method == "gradcam" and loaded.layer == "conv2" and loaded.params["layer"] == "conv2"
    assert "<table>" in explanation._repr_html_()


def test_dense_softmax_activation_and_softmax_layer_are_bypassed():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    for tail in ([keras.layers.Activation("softmax", name="sm")], [keras.layers.Softmax(name="sm")]):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="logits"), *tail])
        grads = ks.input_gradients(model, x, targets=2)
        w = model.get_layer("logits").get_weights()[0]
        np.testing.assert_allclose(grads, np.tile(w[:, 2], (2, 1)), rtol=1e-6)
