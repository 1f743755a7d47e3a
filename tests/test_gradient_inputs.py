"""``input_index=`` on gradient methods for multi-input models, the image first and second.

References: hand-written gradients w.r.t. the chosen input with the other input held fixed, by the
backend's own autodiff (``tests/_autodiff.py``: ``tf.GradientTape``, ``jax.grad`` or ``torch.autograd``)
for Saliency, Gradient x Input, a hand-written IG Riemann sum and Expected Gradients with the same draws;
for the noise wrappers and the guided rule, the same method on a one-input model that holds the other
input as a constant (so the noise and the rule see exactly one input). Runs on TensorFlow, JAX and
PyTorch (scripts/test.sh).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _autodiff import gradient  # noqa: E402

import kerascope as ks  # noqa: E402

L = keras.layers
RNG = np.random.default_rng(0)
IMAGE = RNG.uniform(size=(3, 8, 8, 2)).astype("float32")
TABLE = np.tile(RNG.normal(size=(1, 3)).astype("float32"), (3, 1))  # one row for all: see held_fixed()
TARGETS = [0, 2, 1]


@pytest.fixture(scope="module")
def models():
    """The same layers and weights with the image as first and as second input, plus the head's layers."""
    keras.utils.set_random_seed(1)
    image, table = keras.Input((8, 8, 2), name="image"), keras.Input((3,), name="table")
    conv = L.Conv2D(4, 3, activation="relu", name="conv")
    pool = L.GlobalAveragePooling2D(name="gap")
    tab = L.Dense(4, activation="tanh", name="tab")
    mix = L.Dense(5, activation="tanh", name="mix")
    out = L.Dense(3, name="out")

    def head(i, t):
        return out(mix(L.Concatenate()([pool(conv(i)), tab(t)])))

    first = keras.Model([image, table], head(image, table))
    second = keras.Model([table, image], head(image, table))
    return first, second, head


def tape_grads(head, image, table, targets, wrt: str):
    """d score_target / d (image or table), the other input held at its values."""
    t = np.asarray(targets)[:, None]

    def score(v):
        out = head(v, keras.ops.convert_to_tensor(table)) if wrt == "image" else head(
            keras.ops.convert_to_tensor(image), v)
        return keras.ops.take_along_axis(out, keras.ops.convert_to_tensor(t), axis=1)

    return gradient(score, image if wrt == "image" else table)


def held_fixed(head) -> keras.Model:
    """A one-input Functional model: the image in, the table a constant (the same row for every sample)."""
    row = TABLE[:1]

    class Constant(L.Layer):
        def call(self, x):
            return keras.ops.repeat(keras.ops.convert_to_tensor(row), keras.ops.shape(x)[0], axis=0)

    image = keras.Input((8, 8, 2))
    return keras.Model(image, head(image, Constant()(image)))


def close(actual, expected, rtol=1e-4):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def test_default_is_the_image_whatever_its_position(models):
    first, second, head = models
    grad_image = tape_grads(head, IMAGE, TABLE, TARGETS, "image")
    grad_table = tape_grads(head, IMAGE, TABLE, TARGETS, "table")
    for model, x in ((first, [IMAGE, TABLE]), (second, [TABLE, IMAGE])):
        e = ks.Saliency(model).explain(x, TARGETS)
        close(e.attributions, grad_image)
        assert e.extras["input_index"].tolist() == [model.input_names.index("image")] if hasattr(
            model, "input_names") else True
        close(ks.Saliency(model, input_index="image").explain(x, TARGETS).attributions, grad_image)
        close(ks.Saliency(model, input_index="table").explain(x, TARGETS).attributions, grad_table)
        close(ks.GradientXInput(model).explain(x, TARGETS).attributions, IMAGE * grad_image)
        both = ks.Saliency(model, input_index=["table", "image"]).explain(x, TARGETS).attributions
        assert isinstance(both, list)
        close(both[0], grad_table)
        close(both[1], grad_image)
    position = ks.Saliency(second, input_index=1).explain([TABLE, IMAGE], TARGETS).attributions
    close(position, grad_image)


def test_integrated_and_expected_gradients_hold_the_other_input(models):
    first, second, head = models
    steps = 8
    alphas = (np.arange(steps) + 0.5) / steps  # riemann_middle
    expected = sum(tape_grads(head, a * IMAGE, TABLE, TARGETS, "image") for a in alphas) / steps * IMAGE
    f = lambda img: np.take_along_axis(keras.ops.convert_to_numpy(head(img, TABLE)), np.array(TARGETS)[:, None], 1)[:, 0]  # noqa: E731
    background = RNG.uniform(size=(4, 8, 8, 2)).astype("float32")
    for model, x in ((first, [IMAGE, TABLE]), (second, [TABLE, IMAGE])):
        e = ks.IntegratedGradients(model, steps=steps, method="riemann_middle").explain(x, TARGETS)
        close(e.attributions, expected)
        # completeness at the image, the table kept at its values in f(baseline)
        np.testing.assert_allclose(e.extras["baseline_scores"], f(np.zeros_like(IMAGE)), rtol=1e-5, atol=1e-5)
        gap = f(IMAGE) - f(np.zeros_like(IMAGE))
        assert np.all(np.abs(e.extras["completeness_error"]) <= 0.02 * np.abs(gap) + 1e-4)
        # a baseline per model input is narrowed to the image's
        per_input = [np.full_like(IMAGE[0], 0.5), None] if model is first else [None, np.full_like(IMAGE[0], 0.5)]
        g = ks.IntegratedGradients(model, steps=steps, method="riemann_middle", baseline=per_input).explain(x, TARGETS)
        h = ks.IntegratedGradients(model, steps=steps, method="riemann_middle", baseline=0.5).explain(x, TARGETS)
        close(g.attributions, h.attributions)
        eg = ks.ExpectedGradients(model, samples=6, baseline=background, seed=3).explain(x, TARGETS)
        ref = np.zeros_like(IMAGE, dtype=np.float64)
        for b, a in zip(background[eg.extras["baseline_indices"]], eg.extras["alphas"], strict=True):
            point = b + a * (IMAGE - b)
            ref += tape_grads(head, point.astype("float32"), TABLE, TARGETS, "image") * (IMAGE - b) / 6
        close(eg.attributions, ref)


# ~13 s of compilation on JAX (three models x four methods): there under -m slow; on TensorFlow and PyTorch by default
@(pytest.mark.slow if keras.backend.backend() == "jax" else lambda test: test)
def test_noise_wrappers_and_guided_noise_only_the_chosen_input(models):
    first, second, head = models
    alone = held_fixed(head)
    for cls, params in ((ks.SmoothGrad, {"samples": 4, "noise": 0.2}), (ks.VarGrad, {"samples": 4, "noise": 0.2}),
                        (ks.SmoothGradSquared, {"samples": 3, "noise": 0.1, "base": "gradient_x_input"}),
                        (ks.GuidedBackprop, {})):
        reference = cls(alone, **params).explain(IMAGE, TARGETS).attributions
        for model, x in ((first, [IMAGE, TABLE]), (second, [TABLE, IMAGE])):
            close(cls(model, **params).explain(x, TARGETS).attributions, reference)


def test_refusals_say_what_to_do(models):
    first, _, _ = models
    keras.utils.set_random_seed(2)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    tabular = keras.Model([a, b], L.Dense(2)(L.Concatenate()([a, b])))
    with pytest.raises(ValueError, match=r"choose the input\(s\) to attribute with `input_index=`.*'a'"):
        ks.Saliency(tabular).explain([np.ones((1, 3)), np.ones((1, 2))])
    with pytest.raises(ValueError, match="Unknown input name.*'image'"):
        ks.IntegratedGradients(first, input_index="pixels").explain([IMAGE, TABLE], TARGETS)
    with pytest.raises(ValueError, match="with `layer=` the attributions are at that layer"):
        ks.Saliency(first, layer="conv", input_index="image")
    tokens, feats = keras.Input((4,), dtype="int32", name="tokens"), keras.Input((3,), name="feats")
    text = keras.Model(
        [tokens, feats], L.Dense(2)(L.Concatenate()([L.Flatten()(L.Embedding(9, 2)(tokens)), feats])))
    x = [np.array([[1, 2, 3, 4]], "int32"), np.ones((1, 3), "float32")]
    assert ks.Saliency(text).explain(x, 0).attributions.shape == (1, 3)  # the only float input, ids held fixed
    with pytest.raises(ValueError, match=r"integer inputs \(token ids\).*int32.*layer="):
        ks.Saliency(text, input_index="tokens").explain(x, 0)
