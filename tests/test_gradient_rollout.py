"""Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021) against a hand computation of the rule.

Reference: the attention blocks written out here with the layers' own projections, the attention
probabilities ``A`` made explicit, ``dScore/dA`` taken with ``tf.GradientTape`` / ``torch.autograd`` /
``jax.grad`` (w.r.t. a zero tensor added to ``A``), and the recurrence ``R <- R + mean_h((dA * A)^+) R``
(``R = I``) written in numpy from the paper, one sample at a time.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.methods.base import UnsupportedModelError
from tests.conftest import assert_unchanged, snapshot

#: compile-heavy on JAX: there it runs under -m slow (one lighter test per feature stays in the fast run)
heavy_on_jax = pytest.mark.slow if keras.backend.backend() == "jax" else (lambda test: test)

TOKENS, DIM, HEADS, KEY_DIM, CLASSES = 5, 4, 2, 3, 3


def vit_like():
    """Two attention blocks with residuals, then a class head on the flattened tokens."""
    keras.utils.set_random_seed(11)
    x = keras.Input((TOKENS, DIM))
    h = x
    for name in ("b1", "b2"):
        h = h + keras.layers.MultiHeadAttention(HEADS, KEY_DIM, name=name)(h, h)
    out = keras.layers.Dense(CLASSES, name="head")(keras.layers.Flatten()(h))
    return keras.Model(x, out)


def by_hand(model, x, deltas):
    """The model's forward with the attention probabilities explicit (``A + delta``): scores and each ``A``."""
    h, probabilities = keras.ops.convert_to_tensor(x), []
    for name, delta in zip(("b1", "b2"), deltas, strict=True):
        mha = model.get_layer(name)
        q, k, v = mha._query_dense(h), mha._key_dense(h), mha._value_dense(h)
        a = keras.ops.softmax(keras.ops.einsum("nthd,nshd->nhts", q, k) / np.sqrt(KEY_DIM), axis=-1)
        probabilities.append(a)
        context = keras.ops.einsum("nhts,nshd->nthd", keras.ops.add(a, delta), v)
        h = h + mha._output_dense(context)
    return model.get_layer("head")(keras.ops.reshape(h, (h.shape[0], -1))), probabilities


def attention_and_gradients(model, x, target):
    """``A`` and ``d score_target / dA`` per layer, with the backend's own autodiff."""
    n = len(x)
    zeros = [np.zeros((n, HEADS, TOKENS, TOKENS), "float32") for _ in range(2)]
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        deltas = [tf.Variable(z) for z in zeros]
        with tf.GradientTape() as tape:
            scores, probs = by_hand(model, x, deltas)
            total = tf.reduce_sum(scores[:, target])
        grads = tape.gradient(total, deltas)
    elif backend == "torch":
        import torch

        deltas = [torch.zeros(z.shape, requires_grad=True) for z in zeros]
        scores, probs = by_hand(model, x, deltas)
        grads = torch.autograd.grad(scores[:, target].sum(), deltas)
    else:
        import jax

        def total(ds):
            return by_hand(model, x, ds)[0][:, target].sum()

        grads = jax.grad(total)(zeros)
        probs = by_hand(model, x, zeros)[1]
    def to_np(t):
        return keras.ops.convert_to_numpy(keras.ops.stop_gradient(t))

    return [to_np(a) for a in probs], [to_np(g) for g in grads], to_np(by_hand(model, x, zeros)[0])


def numpy_gradient_rollout(maps, grads):
    n, _, t, _ = maps[0].shape
    out = np.zeros((n, t, t))
    for s in range(n):
        r = np.eye(t)
        for a, g in zip(maps, grads, strict=True):
            weighted = np.maximum(g[s] * a[s], 0.0).mean(0)
            r = r + weighted @ r
        out[s] = r
    return out


@pytest.fixture(scope="module")
def case():
    model = vit_like()
    x = np.random.RandomState(0).normal(size=(3, TOKENS, DIM)).astype("float32")
    return model, x


def test_equals_hand_autodiff_of_the_rule_and_model_unchanged(case):
    model, x = case
    before = snapshot(model)
    reference = keras.ops.convert_to_numpy(model(x))
    for target in (0, 2):
        maps, grads, scores = attention_and_gradients(model, x, target)
        np.testing.assert_allclose(scores, reference, rtol=1e-5, atol=1e-5)  # the hand forward is the model's
        np.testing.assert_allclose(maps[0], ks.attention_maps(model, x)["b1"], rtol=1e-5, atol=1e-6)
        want = numpy_gradient_rollout(maps, grads)
        row = ks.GradientRollout(model, class_token=True, batch_size=2).explain(x, target)
        np.testing.assert_allclose(row.attributions, want[:, 0, 1:], rtol=1e-4, atol=1e-6)
        mean = ks.GradientRollout(model, class_token=False).explain(x, target)
        np.testing.assert_allclose(mean.attributions, want.mean(1), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(mean.scores, reference[:, target], rtol=1e-5, atol=1e-6)
        assert list(mean.extras["layers"]) == ["b1", "b2"]
    assert_unchanged(model, before)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x)), reference)


def test_class_specific_and_batch_size_independent(case):
    model, x = case
    method = ks.GradientRollout(model, class_token=False, batch_size=1)
    one, other = method.explain(x, 0).attributions, method.explain(x, 1).attributions
    assert not np.allclose(one, other)  # unlike plain rollout, the map follows the target class
    whole = ks.explain(model, x, method="gradient_rollout", targets=0, class_token=False, batch_size=3)
    np.testing.assert_allclose(whole.attributions, one, rtol=1e-5, atol=1e-7)
    assert np.all(one >= 1.0 / TOKENS - 1e-6)  # R = I + non-negative terms: every row's mean is at least 1/T


@heavy_on_jax
def test_vit_map_is_an_image_or_the_patch_grid():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(5)
    backbone = keras_hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2,
                                            hidden_dim=8, mlp_dim=16)
    vit = keras_hub.models.ViTImageClassifier(backbone, num_classes=3, preprocessor=None)
    x = np.random.RandomState(2).rand(2, 16, 16, 3).astype("float32")
    grid = ks.GradientRollout(vit, upsample=False).explain(x, 1)
    assert grid.attributions.shape == (2, 4, 4) and np.all(grid.attributions >= 0)
    image = ks.GradientRollout(vit).explain(x, 1)
    assert image.attributions.shape == (2, 16, 16)


def test_refusals_name_what_to_do():
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(UnsupportedModelError, match="no attention layer"):
        ks.GradientRollout(plain).explain(np.ones((1, 3), "float32"), 0)
    x = keras.Input((TOKENS, DIM))
    shared = keras.layers.MultiHeadAttention(HEADS, KEY_DIM, name="shared")
    h = shared(x, x)
    h = shared(h, h)
    twice = keras.Model(x, keras.layers.Dense(2)(keras.layers.Flatten()(h)))
    with pytest.raises(ValueError, match="called once"):
        ks.GradientRollout(twice).explain(np.ones((1, TOKENS, DIM), "float32"), 0)
