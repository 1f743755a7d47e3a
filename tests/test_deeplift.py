"""DeepLIFT (rescale rule) and DeepLiftShap: closed forms, summation-to-delta on real architectures,
refusals, and the model left unchanged. Backend-independent (runs on TensorFlow, JAX and PyTorch);
the cross-checks against Captum on identical weights are in tests/test_captum_crosscheck.py."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.probe import attribute
from kerascope.methods.base import UnsupportedModelError
from kerascope.propagation import bn_fold
from kerascope.propagation.bn_fold import FOLD_BACKENDS

RNG = np.random.default_rng(0)
_TF_ONLY = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the rules fuse on TensorFlow only")
#: fuse_rules settings: the separate ops, and (TensorFlow) one XLA kernel per rule
OPS_AND_FUSED = [pytest.param(False, id="ops"), pytest.param(True, id="fused", marks=_TF_ONLY)]
DEFAULT_AND_FUSED = [pytest.param(None, id="default"), pytest.param(True, id="fused", marks=_TF_ONLY)]


def dense_model(units: list[int], activations: list[str | None], inputs: int) -> keras.Model:
    layers = [keras.Input((inputs,))]
    layers += [keras.layers.Dense(u, activation=a, name=f"d{i}") for i, (u, a) in enumerate(zip(units, activations))]
    model = keras.Sequential(layers)
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(0, 1, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def summation_ok(e: ks.Explanation, rtol: float = 1e-4) -> bool:
    """Attributions sum to f(x) - f(baseline) up to float32 rounding of the scores themselves."""
    scores, base = e.scores, e.extras["baseline_scores"]
    tolerance = rtol * np.abs(scores - base) + 1e-6 * (np.abs(scores) + np.abs(base)) + 1e-7
    return bool(np.all(np.abs(e.extras["completeness_error"]) <= tolerance))


# ------------------------------------------------------------------ closed forms
def test_linear_model_is_weight_times_difference():
    model = dense_model([3], [None], 5)
    w, b = model.get_weights()
    x = RNG.normal(size=(4, 5)).astype(np.float32)
    ref = RNG.normal(size=5).astype(np.float32)
    e = ks.DeepLIFT(model, baseline=ref).explain(x, [0, 1, 2, 1])
    np.testing.assert_allclose(e.attributions, w[:, [0, 1, 2, 1]].T * (x - ref), rtol=1e-5, atol=1e-6)
    background = RNG.normal(size=(3, 5)).astype(np.float32)
    s = ks.DeepLiftShap(model, baseline=background).explain(x, 2)
    np.testing.assert_allclose(s.attributions, w[:, 2] * (x - background.mean(axis=0)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act, f", [("tanh", np.tanh), ("sigmoid", lambda z: 1 / (1 + np.exp(-z))),
                                    ("elu", lambda z: np.where(z > 0, z, np.exp(z) - 1)),
                                    ("softplus", lambda z: np.log1p(np.exp(z)))])
@pytest.mark.parametrize("fuse", OPS_AND_FUSED)
def test_rescale_rule_closed_form(act, f, fuse):
    assert_rescale_closed_form(dense_model([6, 2], [act, None], 4), f, 1, fuse, rtol=1e-3)


def assert_rescale_closed_form(model: keras.Model, f, target: int, fuse, rtol: float) -> None:
    """Dense -> f -> Dense: DeepLIFT equals ``(x - x') ((m w2[:, target]) @ w1.T)``, ``m = Δf(z) / Δz``."""
    w1, b1, w2, _ = model.get_weights()
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    ref = RNG.normal(size=4).astype(np.float32)
    z, z0 = x @ w1 + b1, ref @ w1 + b1
    m = (f(z) - f(z0)) / (z - z0)
    expected = (x - ref) * ((m * w2[:, target]) @ w1.T)
    e = ks.DeepLIFT(model, baseline=ref, fuse_rules=fuse).explain(x, target)
    np.testing.assert_allclose(e.attributions, expected, rtol=rtol, atol=1e-5)
    assert summation_ok(e)


@pytest.mark.parametrize("layer, f", [
    (lambda: keras.layers.ReLU(max_value=1.0), lambda z: np.clip(z, 0.0, 1.0)),
    (lambda: keras.layers.ReLU(max_value=2.0, negative_slope=0.1, threshold=0.3),
     lambda z: np.clip(np.where(z > 0.3, z, 0.0), 0.0, 2.0) - 0.1 * np.maximum(0.3 - z, 0.0)),
    (lambda: keras.layers.LeakyReLU(negative_slope=0.2), lambda z: np.where(z > 0, z, 0.2 * z)),
    (lambda: keras.layers.ELU(alpha=0.5), lambda z: np.where(z > 0, z, 0.5 * (np.exp(z) - 1))),
], ids=["relu_max1", "relu_threshold", "leaky", "elu"])
@pytest.mark.parametrize("fuse", OPS_AND_FUSED)
def test_rescale_rule_closed_form_on_activation_layers(layer, f, fuse):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6, name="d0")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="d1")(layer()(hidden)))
    rng = np.random.default_rng(3)
    model.set_weights([rng.normal(0, 1, w.shape).astype(np.float32) for w in model.get_weights()])
    assert_rescale_closed_form(model, f, 0, fuse, rtol=1e-4)


@pytest.mark.parametrize("fuse", OPS_AND_FUSED)
def test_rescale_rule_falls_back_to_the_gradient_where_the_input_difference_is_zero(fuse):
    # unit 0 sees x0 + x1, which is the same for x = (1, -1) and the reference (0, 0): its multiplier is
    # tanh'(b), so the inputs get +-tanh'(b) * v although their contributions through it cancel.
    model = dense_model([1, 1], ["tanh", None], 2)
    b, v = 0.3, 2.0
    model.set_weights([np.ones((2, 1), np.float32), np.array([b], np.float32), np.array([[v]], np.float32),
                       np.zeros(1, np.float32)])
    e = ks.DeepLIFT(model, fuse_rules=fuse).explain(np.array([[1.0, -1.0]], np.float32), 0)
    slope = 1 - np.tanh(b) ** 2
    np.testing.assert_allclose(e.attributions, [[v * slope, -v * slope]], rtol=1e-5)


@pytest.mark.parametrize("fuse", OPS_AND_FUSED)
def test_max_pool_rule_closed_form(fuse):
    # windows [3, 0] vs reference [3, 4]: y - y' = -1 goes to the reference's argmax (index 1);
    # windows [1, 5] vs [2, 0]: y - y' = 3 goes to the input's argmax (index 3).
    model = keras.Sequential([keras.Input((4, 1)), keras.layers.MaxPooling1D(2), keras.layers.Flatten(),
                              keras.layers.Dense(1, use_bias=False, name="w")])
    model.get_layer("w").set_weights([np.array([[2.0], [-1.5]], np.float32)])
    x = np.array([3.0, 0.0, 1.0, 5.0], np.float32).reshape(1, 4, 1)
    ref = np.array([3.0, 4.0, 2.0, 0.0], np.float32).reshape(4, 1)
    e = ks.DeepLIFT(model, baseline=ref, fuse_rules=fuse).explain(x, 0)
    np.testing.assert_allclose(e.attributions[0, :, 0], [0.0, 2.0 * -1.0, 0.0, -1.5 * 3.0], atol=1e-6)


def captum_max_pool_multipliers(x, ref, dy, pool, padding):
    """Captum's max-pool rule, window by window in numpy: ``x`` (N, *spatial, C), ``ref`` (*spatial, C).

    The padding formula is TensorFlow's documented "same" padding; the model-level tests in
    tests/test_deeplift_fused.py compare with the pooling's real gradient as well.

    Non-overlapping windows (``pool`` per axis; ``padding`` as Keras: "same" centres the windows, the
    odd padding after); each window's first maximum (row-major) of the input gets ``dy * (max(y, y') - y')``
    and its gradient, the reference's first maximum ``dy * (y - max(y, y'))``; divided by ``x - x'``.
    """
    spatial = x.shape[1:-1]
    numerator, gradient = np.zeros_like(x, np.float64), np.zeros_like(x, np.float64)
    starts = []
    for n, p in zip(spatial, pool):
        count = -(-n // p) if padding == "same" else n // p
        before = (count * p - n) // 2 if padding == "same" else 0
        starts.append([o * p - before for o in range(count)])
    for i in range(x.shape[0]):
        for out in np.ndindex(*(len(s) for s in starts)):
            window = tuple(slice(max(s[o], 0), min(s[o] + p, n)) for s, o, p, n in zip(starts, out, pool, spatial))
            for c in range(x.shape[-1]):
                xw, rw = x[(i, *window, c)], ref[(*window, c)]
                ix = np.unravel_index(np.argmax(xw), xw.shape)
                ir = np.unravel_index(np.argmax(rw), rw.shape)
                y, yr, g = xw.max(), rw.max(), dy[(i, *out, c)]
                top = max(y, yr)
                at_x, at_r = ((i, *(w.start + k for w, k in zip(window, idx)), c) for idx in (ix, ir))
                numerator[at_x] += g * (top - yr)
                numerator[at_r] += g * (y - top)
                gradient[at_x] += g
    delta = x - ref
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(delta) < 1e-10, gradient, numerator / delta)


@pytest.mark.parametrize("shape, pool, padding", [
    ((7, 3), (2,), "valid"),  # the last position is in no window
    ((7, 8, 2), (3, 3), "same"),  # padded: one before and one after on the first axis, one after on the second
    ((6, 7, 2), (2, 3), "valid"),
])
@pytest.mark.parametrize("group", [None, 3])
def test_max_pool_rule_on_tiling_windows_is_captums(shape, pool, padding, group):
    from kerascope.propagation.deeplift_multipliers import Shared, maxpool_windows_backward

    rng = np.random.default_rng(len(shape) + (group or 0))
    # integer values: windows with tied maxima, inputs equal to their reference at some positions
    x = np.round(rng.normal(0, 1.2, (6, *shape))).astype(np.float32)
    out_shape = [-(-n // p) if padding == "same" else n // p for n, p in zip(shape[:-1], pool)]
    dy = rng.normal(size=(6, *out_shape, shape[-1])).astype(np.float32)
    layout = Shared(group)
    got = maxpool_windows_backward([keras.ops.convert_to_tensor(x)], None, keras.ops.convert_to_tensor(dy), None,
                                   layout, pool, padding)[0]
    got = keras.ops.convert_to_numpy(got)
    rows = [list(range(5)) + [5]] if group is None else [[0, 1, 2], [3, 4, 5]]
    for *inputs, reference in rows:
        want = captum_max_pool_multipliers(x[inputs], x[reference], dy[inputs], pool, padding)
        np.testing.assert_allclose(got[inputs], want, rtol=1e-6, atol=1e-6)
        # a reference row keeps its ordinary gradient (its difference with itself is 0)
        own = captum_max_pool_multipliers(x[[reference]], x[reference], dy[[reference]], pool, padding)
        np.testing.assert_allclose(got[[reference]], own, rtol=1e-6, atol=1e-6)


def test_product_rule_closed_form():
    inputs = keras.Input((2,))
    a = keras.layers.Dense(1, use_bias=False, name="a")(inputs)
    b = keras.layers.Dense(1, use_bias=False, name="b")(inputs)
    model = keras.Model(inputs, keras.layers.Multiply()([a, b]))
    model.get_layer("a").set_weights([np.array([[1.0], [0.0]], np.float32)])
    model.get_layer("b").set_weights([np.array([[0.0], [1.0]], np.float32)])
    x = np.array([[2.0, 3.0], [-1.0, 4.0]], np.float32)
    ref = np.array([0.5, -1.0], np.float32)
    e = ks.DeepLIFT(model, baseline=ref).explain(x, 0)
    expected = np.stack([(x[:, 0] - ref[0]) * (x[:, 1] + ref[1]) / 2, (x[:, 1] - ref[1]) * (x[:, 0] + ref[0]) / 2], 1)
    np.testing.assert_allclose(e.attributions, expected, rtol=1e-5)


# ------------------------------------------------------- every supported layer
def mixed_model(seed: int = 0) -> keras.Model:
    """Every kind of non-linearity DeepLIFT handles: fused and separate activations, max pooling, a
    squeeze-and-excitation product, residual Add, Concatenate, BatchNorm, keras.ops nodes, nested model."""
    keras.utils.set_random_seed(seed)
    inner = keras.Sequential([keras.Input((4, 4, 6)), keras.layers.Conv2D(6, 1, activation="gelu"),
                              keras.layers.LeakyReLU(0.1)], name="inner")
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Rescaling(2.0, offset=-1.0)(inputs)
    x = keras.layers.ZeroPadding2D(1)(x)
    x = keras.layers.Conv2D(6, 3, activation="elu", name="c1")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Activation("swish")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool")(x)  # overlapping windows
    gate = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    gate = keras.layers.Conv2D(6, 1, activation="sigmoid")(gate)
    x = keras.layers.Multiply(name="se")([x, gate])
    y = inner(x)
    x = keras.layers.Add()([x, y])
    x = keras.ops.tanh(x) * 1.5
    x = keras.layers.Concatenate()([x, keras.layers.ReLU()(x)])
    x = keras.layers.Dropout(0.5)(x)
    x = keras.layers.GlobalMaxPooling2D()(x)
    x = keras.layers.Dense(8, activation="softplus")(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.7, w.shape).astype(np.float32) for w in model.get_weights()])
    bn = model.get_layer("bn")
    gamma, beta, mean, var = bn.get_weights()
    bn.set_weights([gamma, beta, mean, np.abs(var) + 0.5])
    return model


@pytest.mark.parametrize("fuse", DEFAULT_AND_FUSED)
def test_summation_to_delta_on_every_supported_layer(unchanged, fuse):
    model = mixed_model()
    check = unchanged(model)
    x = RNG.uniform(0, 1, (4, 8, 8, 3)).astype(np.float32)
    e = ks.DeepLIFT(model, baseline=0.25, batch_size=4, fuse_rules=fuse).explain(x)
    assert summation_ok(e) and np.all(np.abs(e.scores - e.extras["baseline_scores"]) > 1e-3)
    # batching does not change anything beyond float32 rounding: the convolutions round differently for 1 and
    # 5 rows, and on an AVX2-only CPU one position of one sample here moved by 8e-5 of the map's scale (its
    # sum unchanged, most likely a near tie decided by rounding), past the earlier atol=1e-6
    alone = ks.DeepLIFT(model, baseline=0.25, fuse_rules=fuse).explain(x[2:3])
    scale = np.abs(e.attributions[2]).max()
    np.testing.assert_allclose(alone.attributions[0], e.attributions[2], rtol=1e-4, atol=5e-4 * scale)
    assert np.mean(np.abs(alone.attributions[0] - e.attributions[2]) <= 1e-4 * scale) > 0.99
    check()
    ops = [op for op in model.operations if not isinstance(op, keras.Layer)]
    assert ops and all("call" not in vars(op) for op in ops)


@pytest.mark.parametrize("targets", [1, [0, 2, 1, 0], None], ids=["one class", "per sample", "predicted"])
def test_baseline_scores_are_the_model_at_the_baseline(targets):
    # one class for all: the reference's score comes from the attribution pass itself; other targets:
    # from a forward pass of the reference row; both must be the model's output at the baseline
    model = dense_model([6, 3], ["tanh", None], 4)
    x = RNG.uniform(-1, 1, (4, 4)).astype(np.float32)
    e = ks.DeepLIFT(model, baseline=0.5, batch_size=3).explain(x, targets)  # 2 inputs per pass: 2 chunks
    at_baseline = keras.ops.convert_to_numpy(model(np.full((1, 4), 0.5, np.float32)))[0]
    np.testing.assert_allclose(e.extras["baseline_scores"], at_baseline[e.targets], rtol=1e-5, atol=1e-6)
    assert summation_ok(e)


@pytest.mark.skipif(keras.backend.backend() not in FOLD_BACKENDS, reason="the engine folds on TF / PyTorch only")
def test_batchnorm_pairs_are_folded_in_deeplift_passes(monkeypatch):
    # conv + BN pairs between the rules are affine: the engine runs each as one layer in DeepLIFT's passes,
    # the same numbers as the model's own graph to float32 rounding
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", name="c1")(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization(name="bn1")(x))
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization(name="bn2")(x))
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))
    rng = np.random.default_rng(2)
    for layer in (model.get_layer("bn1"), model.get_layer("bn2")):
        gamma, beta, mean, var = layer.get_weights()
        layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.3, beta.shape),
                           rng.normal(0, 0.3, mean.shape), rng.uniform(0.5, 2.0, var.shape)])
    folded_in_passes = []
    fold = bn_fold.fold_batchnorm
    monkeypatch.setattr(bn_fold, "fold_batchnorm",
                        lambda pairs: folded_in_passes.append([(a.name, b.name) for a, b in pairs]) or fold(pairs))
    x = RNG.uniform(0, 1, (3, 8, 8, 3)).astype(np.float32)
    background = RNG.uniform(0, 1, (2, 8, 8, 3)).astype(np.float32)
    for method in (ks.DeepLIFT, ks.DeepLiftShap):
        kwargs = {"baseline": background} if method is ks.DeepLiftShap else {}
        folded_in_passes.clear()
        folded = method(model, **kwargs).explain(x, [0, 1, 2])
        assert [("c1", "bn1"), ("dw", "bn2")] in folded_in_passes
        plain = method(model, fold_batchnorm=False, **kwargs).explain(x, [0, 1, 2])
        np.testing.assert_allclose(folded.attributions, plain.attributions, rtol=1e-4, atol=1e-6)
        assert summation_ok(folded)
    monkeypatch.undo()


def test_deeplift_shap_averages_deeplift_over_the_background(monkeypatch):
    model = mixed_model(1)
    x = RNG.uniform(0, 1, (2, 8, 8, 3)).astype(np.float32)
    background = RNG.uniform(0, 1, (3, 8, 8, 3)).astype(np.float32)
    singles = [ks.DeepLIFT(model, baseline=b).explain(x, [0, 2]).attributions for b in background]
    rows = []  # rows of every compiled pass: several background rows share one, never over batch_size
    gradients = ks.core.engine.Engine.gradients
    monkeypatch.setattr(ks.core.engine.Engine, "gradients",
                        lambda self, inputs, *a, **k: rows.append(inputs.num_samples) or gradients(self, inputs, *a, **k))
    # batch_size 4: one background row per pass (3 rows); 7: two groups of (2 inputs + 1 background row)
    # then one (the default 32 below: all in one pass). Max pooling, the product rule and keras.ops nodes.
    for batch_size, passes in [(4, [3, 3, 3]), (7, [6, 3])]:
        rows.clear()
        shap = ks.DeepLiftShap(model, baseline=background, batch_size=batch_size).explain(x, [0, 2])
        assert rows == passes
        np.testing.assert_allclose(shap.attributions, np.mean(singles, axis=0), rtol=1e-4, atol=1e-6)
        assert summation_ok(shap)
    np.testing.assert_array_equal(shap.extras["baseline_indices"], [0, 1, 2])
    rows.clear()
    drawn = ks.DeepLiftShap(model, baseline=background, samples=2, seed=3).explain(x, [0, 2])
    assert rows == [6]  # both drawn rows in one pass
    monkeypatch.undo()
    again = ks.DeepLiftShap(model, baseline=background, samples=2, seed=3).explain(x[1:], 2)
    picked = drawn.extras["baseline_indices"]
    assert len(set(picked.tolist())) == 2
    np.testing.assert_allclose(drawn.attributions, np.mean([singles[i] for i in picked], axis=0), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(again.attributions[0], drawn.attributions[1], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="samples"):
        ks.DeepLiftShap(model, samples=0)


# ----------------------------------------------------- real architectures
@pytest.mark.parametrize("name", [
    "ResNet50",
    "VGG16",  # the first seed's model: five 2x2 max poolings
    pytest.param("DenseNet121", marks=pytest.mark.slow),
    pytest.param("EfficientNetB0", marks=pytest.mark.slow),
])
@pytest.mark.parametrize("fuse", DEFAULT_AND_FUSED)
def test_summation_to_delta_on_keras_applications(name, unchanged, fuse):
    if name in ("ResNet50", "VGG16") and keras.backend.backend() != "tensorflow":
        pytest.skip("one architecture per CI run is enough; tests/test_backend_parity.py covers the backends")
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3), classes=5)
    check = unchanged(model)
    x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    e = ks.DeepLIFT(model, baseline=np.full((32, 32, 3), 127.0, np.float32), fuse_rules=fuse).explain(x)
    gap = np.abs(e.scores - e.extras["baseline_scores"])
    assert np.all(gap > 0)
    np.testing.assert_array_less(np.abs(e.extras["completeness_error"]), 1e-3 * gap)
    check()


# ------------------------------------------------------------------ refusals
def lstm_model() -> keras.Model:
    inputs = keras.Input((5, 4))
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.LSTM(3, name="rnn")(inputs)))


def attention_model() -> keras.Model:
    inputs = keras.Input((5, 4))
    x = keras.layers.MultiHeadAttention(2, 4, name="mha")(inputs, inputs)
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))


@pytest.mark.parametrize("build, needle", [
    (lstm_model, "['rnn' (LSTM)]"),
    (attention_model, "['mha' (MultiHeadAttention)]"),
    (lambda: keras.Sequential([keras.Input((5, 4)), keras.layers.LayerNormalization(name="ln"),
                               keras.layers.Flatten(), keras.layers.Dense(2)]), "'ln' (LayerNormalization)"),
    (lambda: keras.Sequential([keras.Input((5, 4)), keras.layers.Flatten(), keras.layers.Dense(3, name="mid"),
                               keras.layers.Softmax(name="sm"), keras.layers.Dense(2)]), "'sm' (Softmax)"),
])
def test_refuses_layers_it_cannot_handle(build, needle, unchanged):
    model = build()
    check = unchanged(model)
    for method in (ks.DeepLIFT(model), ks.DeepLiftShap(model, baseline=np.zeros((2, 5, 4), np.float32))):
        with pytest.raises(UnsupportedModelError) as info:
            method.explain(RNG.normal(size=(2, 5, 4)).astype(np.float32), 0)
        assert needle in str(info.value) and "IntegratedGradients" in str(info.value)
    check()


def test_refuses_a_product_of_tensors_it_cannot_split():
    inputs = keras.Input((3,))
    a, b = keras.layers.Dense(3)(inputs), keras.layers.Dense(3)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.ops.divide(a, b)))
    with pytest.raises(UnsupportedModelError, match="Divide of two tensors"):
        ks.DeepLIFT(model).explain(np.ones((1, 3), np.float32))


class HiddenTanh(keras.Model):
    """A subclassed model with a non-linearity DeepLIFT cannot see (an op inside `call`)."""

    def __init__(self) -> None:
        super().__init__()
        self.d1, self.d2 = keras.layers.Dense(8), keras.layers.Dense(2)

    def call(self, x):
        return self.d2(keras.ops.tanh(3.0 * self.d1(x)))


def test_refuses_when_a_hidden_op_breaks_summation_to_delta():
    keras.utils.set_random_seed(0)
    model = HiddenTanh()
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    model(x)
    with pytest.raises(UnsupportedModelError, match="do not sum to f\\(x\\) - f\\(baseline\\)"):
        ks.DeepLIFT(model).explain(x, 0)


class Tripwire(keras.layers.Layer):
    """A container layer that raises while DeepLIFT's rules are installed on its child."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(4, activation="tanh")

    def call(self, x):
        # the value this thread sees (the instance attribute is a dispatcher shared with other threads)
        if getattr(attribute(self.inner, "activation"), "__name__", "").startswith("deeplift"):
            raise RuntimeError("tripwire")
        return self.inner(x)


def test_model_unchanged_after_an_exception(unchanged):
    inputs = keras.Input((3,))
    x = keras.layers.Dense(4, activation="sigmoid")(inputs)
    x = keras.ops.tanh(Tripwire(name="trip")(x))
    x = keras.layers.MaxPooling1D(2)(keras.layers.Reshape((4, 1))(x))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(x)))
    check = unchanged(model)
    with pytest.raises(RuntimeError, match="tripwire"):
        ks.DeepLIFT(model).explain(np.ones((2, 3), np.float32), 0)
    check()
    assert all("call" not in vars(op) for op in model.operations if not isinstance(op, keras.Layer))
    assert model.get_layer("trip").inner.activation.__name__ == "tanh"
