"""Gradient methods at inner layers: ``layer=``, ``output_layer=``, saturation warning, multi-output
callable targets and honest guided methods.

Backend-independent: runs on TensorFlow, JAX and PyTorch (scripts/test.sh). References are
closed forms (a linear head after the Embedding), hand-written sub-model computations with
``keras.ops`` and, on TensorFlow, hand-written ``tf.GradientTape`` code.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import kerascope as ks

BACKEND = keras.backend.backend()
VOCAB, T, E = 12, 6, 4


def text_model(seed: int = 0, lstm: bool = True) -> keras.Model:
    keras.utils.set_random_seed(seed)
    body = [keras.layers.LSTM(5, name="lstm")] if lstm else [keras.layers.Flatten(name="flatten")]
    return keras.Sequential(
        [keras.Input((T,), dtype="int32"), keras.layers.Embedding(VOCAB, E, name="embedding"), *body,
         keras.layers.Dense(3, activation="softmax", name="head")],
        name="text",
    )


TOKENS = np.array([[1, 2, 3, 4, 0, 0], [5, 6, 7, 8, 9, 11]], "int32")


def _head(model: keras.Model):
    """The model after the embedding, as a function of the embedding's output, returning logits."""
    layers = model.layers[1:]

    def run(z):
        for layer in layers[:-1]:
            z = layer(z)
        out = layers[-1]
        return keras.ops.matmul(z, out.kernel) + out.bias

    return run


def _grad_at(model: keras.Model, z: np.ndarray, target: int) -> np.ndarray:
    """d logit_target / d embedding-output, by hand on the current backend (no kerascope code)."""
    head = _head(model)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        zz = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(zz)
            s = tf.reduce_sum(head(zz)[:, target])
        return tape.gradient(s, zz).numpy()
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.grad(lambda v: head(v)[:, target].sum())(z))
    import torch

    zz = torch.tensor(z, requires_grad=True)
    head(zz)[:, target].sum().backward()
    return zz.grad.numpy()


def _logits_at(model: keras.Model, z: np.ndarray, target: int) -> np.ndarray:
    return keras.ops.convert_to_numpy(_head(model)(z))[:, target]


def test_linear_head_closed_form_on_every_method():
    """Embedding -> Flatten -> Dense: the logit is linear in the embedding, so the gradient at the
    embedding is the Dense kernel, IG (zero baseline) is emb * kernel exactly, SmoothGrad is the gradient."""
    model = text_model(lstm=False)
    emb = model.get_layer("embedding").get_weights()[0][TOKENS]  # (2, T, E)
    kernel = model.get_layer("head").get_weights()[0][:, 2].reshape(T, E)
    for method, params in [(ks.Saliency, {}), (ks.SmoothGrad, {"samples": 3}),
                           (ks.IntegratedGradients, {"steps": 4}), (ks.GradientXInput, {}),
                           (ks.ExpectedGradients, {"samples": 5})]:
        e = method(model, layer="embedding", **params).explain(TOKENS, targets=2)
        assert e.attributions.shape == (2, T, E) and e.layer == "embedding"
        expected = kernel[None] * (1 if method in (ks.Saliency, ks.SmoothGrad) else emb)
        if method is ks.ExpectedGradients:  # (x - 0) * grad at random alphas: same for a linear head
            expected = emb * kernel[None]
        np.testing.assert_allclose(e.attributions, np.broadcast_to(expected, (2, T, E)), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(e.per_position(), e.attributions.sum(-1), rtol=1e-6)


def test_saliency_and_gradient_x_input_at_embedding_equal_hand_gradient():
    model = text_model()
    z = model.get_layer("embedding").get_weights()[0][TOKENS].astype("float32")
    sal = ks.Saliency(model, layer="embedding").explain(TOKENS, targets=1)
    gxi = ks.GradientXInput(model, layer="embedding").explain(TOKENS, targets=1)
    ref = _grad_at(model, z, 1)
    np.testing.assert_allclose(sal.attributions, ref, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gxi.attributions, ref * z, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(sal.scores, _logits_at(model, z, 1), rtol=1e-5)


@pytest.mark.parametrize("baseline", [None, "pad"])
def test_integrated_gradients_at_embedding_complete_and_equal_hand_riemann(baseline):
    model = text_model()
    table = model.get_layer("embedding").get_weights()[0]
    z = table[TOKENS].astype("float32")
    given = None if baseline is None else np.zeros((1, T), "int32")  # all-padding tokens: pad embedding
    b = np.zeros_like(z) if baseline is None else np.broadcast_to(table[0], z.shape).astype("float32")
    steps = 24
    e = ks.IntegratedGradients(model, layer="embedding", steps=steps, method="riemann_middle",
                               baseline=given).explain(TOKENS, targets=1)
    # completeness at the layer: sum = f(x) - f(baseline applied at the layer)
    gap = _logits_at(model, z, 1) - _logits_at(model, b, 1)
    np.testing.assert_allclose(e.attributions.reshape(2, -1).sum(1), gap, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(e.per_position().sum(1), gap, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(e.extras["baseline_scores"], _logits_at(model, b, 1), rtol=1e-4, atol=1e-5)
    # equal to a hand-written midpoint rule with hand-written gradients
    alphas = (np.arange(steps) + 0.5) / steps
    points = np.concatenate([b + a * (z - b) for a in alphas]).astype("float32")  # one batched hand gradient
    ref = _grad_at(model, points, 1).reshape(steps, *z.shape).sum(0) * (z - b) / steps
    np.testing.assert_allclose(e.attributions, ref, rtol=1e-3, atol=1e-6)


def test_smoothgrad_at_layer_noises_the_activation():
    """SmoothGrad at a layer = mean of hand gradients at activation + sigma z_j (same numpy noise)."""
    model = text_model()
    z = model.get_layer("embedding").get_weights()[0][TOKENS].astype("float32")
    samples, noise = 4, 0.2
    e = ks.SmoothGrad(model, layer="embedding", samples=samples, noise=noise, seed=3).explain(TOKENS, targets=0)
    draws = np.random.default_rng(3).standard_normal((samples * 2, T * E), dtype=np.float32)
    sigma = noise * (z.reshape(2, -1).max(1) - z.reshape(2, -1).min(1))
    # rows are noise-sample major: draw j of every input, in order
    noisy = np.concatenate([z + sigma[:, None, None] * draws[j].reshape(1, T, E) for j in range(samples)])
    ref = _grad_at(model, noisy.astype("float32"), 0).reshape(samples, *z.shape).mean(0)
    np.testing.assert_allclose(e.attributions, ref, rtol=1e-3, atol=1e-6)
    var = ks.VarGrad(model, layer="embedding", samples=3).explain(TOKENS, targets=0).attributions
    sq = ks.SmoothGradSquared(model, layer="embedding", samples=3).explain(TOKENS, targets=0).attributions
    assert var.shape == sq.shape == (2, T, E) and np.all(var >= 0) and np.all(sq >= var - 1e-7)


def test_layer_attribution_on_inner_image_layer_and_input_error_points_to_layer(unchanged):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv1")(inputs)
    h = keras.layers.Conv2D(6, 3, activation="relu", padding="same", name="conv2")(h)
    out = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inputs, out)
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
    check = unchanged(model)
    e = ks.IntegratedGradients(model, layer="conv1", steps=16).explain(x, targets=1)
    assert e.attributions.shape == (2, 8, 8, 4) and e.per_position().shape == (2, 8, 8)
    assert np.max(np.abs(e.extras["completeness_error"])) < 5e-3 * max(1.0, float(np.abs(e.scores).max()))
    check()
    with pytest.raises(ValueError, match="integer|token|differentiable"):
        ks.Saliency(text_model()).explain(TOKENS, targets=0)
    with pytest.raises(ValueError, match="Received: layer='nope'"):
        ks.Saliency(model, layer="nope")


def test_trained_text_model_ranks_the_key_token_first():
    """Class 1 iff the key token 3 occurs; IG at the embedding must put the key token first."""
    rng = np.random.default_rng(0)
    n, key = 384, 3
    tokens = rng.integers(4, VOCAB, size=(n, T)).astype("int32")
    labels = rng.integers(0, 2, size=n)
    where = rng.integers(0, T, size=n)
    tokens[labels == 1, where[labels == 1]] = key
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((T,), dtype="int32"), keras.layers.Embedding(VOCAB, 8, name="embedding"),
                              keras.layers.Conv1D(8, 3, padding="same", activation="relu"),
                              keras.layers.GlobalMaxPooling1D(), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.03),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(tokens, labels, epochs=6, batch_size=32, verbose=0)
    test = rng.integers(4, VOCAB, size=(6, T)).astype("int32")
    spots = np.array([0, 2, 5, 1, 4, 3])
    test[np.arange(6), spots] = key
    assert np.all(np.argmax(keras.ops.convert_to_numpy(model(test)), -1) == 1), "the model did not learn the rule"
    e = ks.IntegratedGradients(model, layer="embedding", steps=32,
                               baseline=np.zeros((1, T), "int32")).explain(test, targets=1)
    np.testing.assert_array_equal(np.argmax(e.per_position(), axis=1), spots)


class SoftmaxInCall(keras.Model):
    """Seed case 1 shape: the softmax applied as a function in call(), invisible to bypassing."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.logits = keras.layers.Dense(3, name="logits")

    def call(self, x):
        return keras.ops.softmax(self.logits(self.hidden(x)))


def _saturated_model():
    keras.utils.set_random_seed(1)
    model = SoftmaxInCall()
    x = np.abs(np.random.default_rng(0).normal(size=(2, 4))).astype("float32")
    model(x)
    kernel = np.zeros((8, 3), "float32")
    kernel[:, 0], kernel[:, 2] = 1.0, -1.0
    model.logits.set_weights([kernel, np.array([30.0, 0.0, -27.0], "float32")])
    return model, x


def test_saturation_warning_fires_below_1e_30_threshold_and_names_output_layer(unchanged):
    model, x = _saturated_model()
    probs = keras.ops.convert_to_numpy(model(x))
    assert np.all(probs[:, 2] > 1e-30) and np.all(probs[:, 2] < 1e-20)  # the 1.8e-25 regime of the issue
    with pytest.warns(RuntimeWarning, match="output_layer='logits'"):
        ks.Saliency(model).explain(x, targets=2)
    check = unchanged(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        e = ks.Saliency(model, output_layer="logits").explain(x, targets=2)
    check()
    w = model.logits.get_weights()[0][:, 2]
    h = keras.ops.convert_to_numpy(model.hidden(x))
    wh = model.hidden.get_weights()[0]
    ref = ((h > 0) * w[None]) @ wh.T  # d logit_2 / dx through the ReLU hidden layer, by hand
    np.testing.assert_allclose(e.attributions, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e.scores, keras.ops.convert_to_numpy(model.logits(model.hidden(x)))[:, 2], rtol=1e-5)
    ig = ks.IntegratedGradients(model, output_layer="logits", steps=8).explain(x, targets=2)
    assert np.max(np.abs(ig.extras["completeness_error"])) < 1e-2
    with pytest.raises(ValueError, match="Received: layer='logitz'"):
        ks.Saliency(model, output_layer="logitz")


def test_output_layer_explains_any_inner_neuron():
    model = text_model()
    z = model.get_layer("embedding").get_weights()[0][TOKENS].astype("float32")
    e = ks.Saliency(model, layer="embedding", output_layer="lstm").explain(TOKENS, targets=4)
    lstm = model.get_layer("lstm")
    if BACKEND == "tensorflow":
        import tensorflow as tf

        zz = tf.constant(z)
        with tf.GradientTape() as tape:
            tape.watch(zz)
            s = tf.reduce_sum(lstm(zz)[:, 4])
        np.testing.assert_allclose(e.attributions, tape.gradient(s, zz).numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(e.scores, keras.ops.convert_to_numpy(lstm(z))[:, 4], rtol=1e-5)


def _two_headed():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,), name="x")
    h = keras.layers.Dense(6, activation="tanh")(inputs)
    return keras.Model(inputs, {"cls": keras.layers.Dense(3, name="cls")(h), "reg": keras.layers.Dense(2, name="reg")(h)})


@pytest.mark.parametrize("name", ["saliency", "gradient_x_input", "smoothgrad", "integrated_gradients",
                                  "expected_gradients", "vargrad"])
def test_multi_output_callable_target_works_on_the_first_call(name):
    model = _two_headed()  # a fresh model: nothing cached from an earlier call
    x = np.random.default_rng(1).normal(size=(2, 5)).astype("float32")
    params = {"samples": 3} if "grad" in name and "integrated" not in name and "input" not in name else {}
    e = ks.explain(model, x, method=name, targets=lambda o: o["reg"][:, 0], **params)
    assert e.attributions.shape == (2, 5) and np.all(np.isfinite(e.attributions))
    np.testing.assert_allclose(e.scores, keras.ops.convert_to_numpy(model(x)["reg"])[:, 0], rtol=1e-5)


def test_output_index_by_name_and_index():
    model = _two_headed()
    x = np.random.default_rng(1).normal(size=(2, 5)).astype("float32")
    by_name = ks.Saliency(model, output_index="reg").explain(x, targets=1)
    by_callable = ks.Saliency(model).explain(x, targets=lambda o: o["reg"][:, 1])
    np.testing.assert_allclose(by_name.attributions, by_callable.attributions, rtol=1e-6)
    with pytest.raises(ValueError, match="Available outputs"):
        ks.Saliency(model, output_index="nope").explain(x, targets=0)


def test_guided_methods_warn_on_a_model_without_relu():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="gelu"),
                              keras.layers.Dense(4, activation="swish"), keras.layers.Dense(2)])
    x = np.random.default_rng(0).normal(size=(2, 6)).astype("float32")
    for method in (ks.GuidedBackprop, ks.Deconvnet):
        with pytest.warns(UserWarning, match="EQUALS the plain gradient") as record:
            e = method(model).explain(x, targets=0)
        # the guided warning among all recorded (PyTorch + NumPy 2 add a DeprecationWarning from Keras' convert_to_numpy)
        message = next(str(r.message) for r in record if "EQUALS the plain gradient" in str(r.message))
        assert "gelu" in message and "swish" in message
        np.testing.assert_allclose(e.attributions, ks.Saliency(model).explain(x, targets=0).attributions, rtol=1e-6)
    relu = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)])
    with warnings.catch_warnings():
        # the guided warning must not fire on a ReLU model (a zero map for an input whose ReLU path is dead may
        # still be said, by ExplanationWarning: with 5 random hidden units that depends on the backend's init)
        warnings.filterwarnings("error", message=".*EQUALS the plain gradient", category=UserWarning)
        ks.GuidedBackprop(relu).explain(x, targets=0)
