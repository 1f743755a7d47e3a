"""Metrics against hand computations, closed forms and independent implementations (scipy)."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402
from scipy import ndimage, stats  # noqa: E402

from kerascope import metrics  # noqa: E402
from kerascope.metrics._features import ranks as feature_ranks  # noqa: E402
from kerascope.metrics.faithfulness import _pixel_ranks  # noqa: E402
from kerascope.metrics.sanity import _average_ranks  # noqa: E402


def linear_model(weights: np.ndarray, softmax: bool = False) -> keras.Model:
    """score = sum_p w_p * x_p for a (H, W, 1) image: deletion curves are known exactly."""
    h, w = weights.shape
    inputs = keras.Input((h, w, 1))
    x = keras.layers.Flatten()(inputs)
    out = keras.layers.Dense(1, use_bias=False, name="lin")(x)
    model = keras.Model(inputs, out)
    model.get_layer("lin").set_weights([weights.reshape(-1, 1).astype(np.float32)])
    return model


def tiny_cnn(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="c1")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Conv2D(6, 3, activation="relu", name="c2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(3, activation="softmax", name="head")(x)
    return keras.Model(inputs, out, name="tiny")


# ----------------------------------------------------------------------------- deletion / insertion
def test_deletion_curve_matches_hand_computation_on_linear_model():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 3))
    x = rng.uniform(0.5, 1.0, size=(2, 3, 3, 1)).astype(np.float32)
    model = linear_model(w)
    attr = rng.normal(size=(2, 3, 3))
    r = metrics.deletion(model, x, attr[..., None], 0, steps=9, output="logits", reduce="abs_sum", batch_size=5)
    signed = metrics.deletion(model, x, attr, 0, steps=9, output="logits", batch_size=5)
    # by hand: remove pixels in order of decreasing |attr| (channel reduction), one per step, zero baseline;
    # 2-D maps are ranked as they are (signed)
    for i in range(2):
        contrib = (w * x[i, ..., 0]).ravel()
        order_signed = np.argsort(-attr[i].ravel(), kind="stable")
        expected_signed = [contrib.sum() - contrib[order_signed[:k]].sum() for k in range(10)]
        np.testing.assert_allclose(signed.curves[i], expected_signed, rtol=1e-5, atol=1e-5)
        order = np.argsort(-np.abs(attr[i]).ravel(), kind="stable")
        expected = [contrib.sum() - contrib[order[:k]].sum() for k in range(10)]
        np.testing.assert_allclose(r.curves[i], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r.scores[i], np.trapezoid(expected, np.arange(10) / 9), rtol=1e-5)
    np.testing.assert_allclose(r.fractions, np.arange(10) / 9)
    assert not r.higher_is_better
    assert r.aggregate == pytest.approx(r.scores.mean())


def test_perfect_attribution_beats_reversed_one_on_deletion_and_insertion():
    # For a linear model with positive contributions, gradient x input is the exact contribution:
    # deleting by it gives the lowest possible deletion curve; the reversed ranking the highest.
    rng = np.random.default_rng(1)
    w = rng.uniform(0.1, 1.0, size=(4, 4))
    x = rng.uniform(0.1, 1.0, size=(3, 4, 4, 1)).astype(np.float32)
    model = linear_model(w)
    exact = w[None] * x[..., 0]
    kw = dict(steps=16, output="logits", perturbation="zero")
    good, bad = metrics.deletion(model, x, exact, 0, **kw), metrics.deletion(model, x, -exact, 0, reduce="sum", **kw)
    assert np.all(good.scores < bad.scores)
    good_i = metrics.insertion(model, x, exact, 0, **kw)
    bad_i = metrics.insertion(model, x, -exact, 0, reduce="sum", **kw)
    assert np.all(good_i.scores > bad_i.scores)
    # deletion of the top-k + insertion of the top-k (both against zero) = the full score, at every k
    np.testing.assert_allclose(good.curves + good_i.curves, np.repeat(good.curves[:, :1], 17, 1), rtol=1e-5)


def test_step_size_mean_and_blur_perturbations():
    w = np.ones((4, 4))
    model = linear_model(w)
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1) / 16
    attr = x[..., 0]
    r = metrics.deletion(model, x, attr, 0, step_size=5, perturbation="mean", output="logits")
    assert r.curves.shape == (1, 5)  # ceil(16 / 5) = 4 steps + the start
    np.testing.assert_allclose(r.fractions, [0, 5 / 16, 10 / 16, 15 / 16, 1.0])
    mean = x.mean()
    order = np.argsort(-attr.ravel(), kind="stable")
    flat = x.ravel()
    expected = [flat.sum() - flat[order[:k]].sum() + k * mean for k in (0, 5, 10, 15, 16)]
    np.testing.assert_allclose(r.curves[0], expected, rtol=1e-5)
    # blur: the end point of deletion is the score of the blurred image; blur of a constant is constant
    const = np.full((1, 4, 4, 1), 0.3, np.float32)
    rb = metrics.deletion(model, const, attr, 0, steps=4, perturbation="blur", output="logits")
    np.testing.assert_allclose(rb.curves[0], 0.3 * 16, rtol=1e-5)
    with pytest.raises(ValueError, match="perturbation"):
        metrics.deletion(model, x, attr, 0, perturbation="noise")


def test_curves_are_batch_size_invariant_and_accept_explanations():
    import kerascope as ks

    model = tiny_cnn()
    x = np.random.default_rng(2).uniform(0, 1, (3, 12, 12, 3)).astype(np.float32)
    e = ks.Saliency(model).explain(x, targets=[0, 1, 2])
    a = metrics.insertion(model, x, e, steps=6, batch_size=4)
    b = metrics.insertion(model, x, e.attributions, [0, 1, 2], steps=6, batch_size=64)
    np.testing.assert_allclose(a.curves, b.curves, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a.details["targets"], [0, 1, 2])
    # the first point of a deletion curve is the model's probability of the target on the image
    d = metrics.deletion(model, x, e, steps=3)
    np.testing.assert_allclose(d.curves[:, 0], model.predict(x, verbose=0)[np.arange(3), [0, 1, 2]], rtol=1e-5)


def test_ranks_tie_break_in_raster_order():
    ranks = _pixel_ranks(np.array([[[1.0, 2.0], [2.0, 0.0]]]))
    assert ranks.tolist() == [[2, 0, 1, 3]]


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 12)),
              elements=st.sampled_from([-1.0, -0.0, 0.0, 0.5, 2.0, np.nan, np.inf])),
       st.booleans())
def test_feature_ranks_are_the_stable_sort_positions(values, descending):
    # ties (0.0 and -0.0 too) and NaN keep index order, as a stable sort of the keys
    order = np.argsort(-values if descending else values, axis=1, kind="stable")
    expected = np.argsort(order, axis=1, kind="stable")
    np.testing.assert_array_equal(feature_ranks(values, descending=descending), expected)
    distinct = np.arange(values.size, dtype=np.float64)[::-1].reshape(values.shape)  # no ties: the fast path
    np.testing.assert_array_equal(feature_ranks(distinct, descending=descending),
                                  np.argsort(np.argsort(-distinct if descending else distinct, axis=1), axis=1))


# ----------------------------------------------------------------------------- average drop / increase
def test_average_drop_and_increase_hand_computed():
    w = np.array([[1.0, 2.0], [3.0, 4.0]])
    model = linear_model(w)
    x = np.ones((2, 2, 2, 1), np.float32)
    attr = np.array([[[0.0, 0.0], [0.0, 2.0]], [[2.0, 2.0], [2.0, 2.0]]])  # 2nd: constant -> unit map of ones
    drop = metrics.average_drop(model, x, attr, 0, output="logits")
    # sample 0: map -> [[0,0],[0,1]]: O = 4, Y = 10, drop = 60 %; sample 1: O = Y: 0 %
    np.testing.assert_allclose(drop.scores, [60.0, 0.0])
    assert drop.aggregate == pytest.approx(30.0)
    inc = metrics.average_increase(model, x * np.array([1, 1, 1, -1], np.float32).reshape(1, 2, 2, 1), attr, 0,
                                   output="logits")
    # sample 0 with x[1,1] = -1: Y = 1+2+3-4 = 2, O = -4 -> no increase; sample 1: O = Y -> no increase
    np.testing.assert_allclose(inc.scores, [0.0, 0.0])
    inc2 = metrics.average_increase(model, -x, np.array([[[0, 0], [0, 1.0]]] * 2), 0, output="logits")
    # Y = -10, O = -4 > Y for both samples
    np.testing.assert_allclose(inc2.scores, [100.0, 100.0])


# ----------------------------------------------------------------------------- MuFidelity
def test_mu_fidelity_is_one_for_exact_contributions_and_seeded():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 6))
    x = rng.uniform(0, 1, (2, 6, 6, 1)).astype(np.float32)
    model = linear_model(w)
    exact = w[None] * x[..., 0]
    r = metrics.mu_fidelity(model, x, exact, 0, samples=32, grid_size=3, output="logits", batch_size=16)
    np.testing.assert_allclose(r.scores, 1.0, atol=1e-5)
    noisy = rng.normal(size=exact.shape)
    a = metrics.mu_fidelity(model, x, noisy, 0, samples=32, grid_size=3, output="logits", seed=5)
    b = metrics.mu_fidelity(model, x, noisy, 0, samples=32, grid_size=3, output="logits", seed=5, batch_size=7)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)
    assert np.all(a.scores < 0.9)
    # independent check of the correlation for sample 0: rebuild subsets from the same seed
    g, s = 3, 32
    subsets = np.random.default_rng(5).random((2 * s, g * g)) < 0.2
    cell = ((np.arange(6) * g) // 6)[:, None] * g + ((np.arange(6) * g) // 6)[None, :]
    m0 = subsets[:s][:, cell.ravel()]  # (s, 36) pixels removed for sample 0
    attr_sums = (m0 * noisy[0].ravel()).sum(1)
    drops = (m0 * (w * x[0, ..., 0]).ravel()).sum(1)
    assert a.scores[0] == pytest.approx(stats.pearsonr(attr_sums, drops)[0], abs=1e-4)


# ----------------------------------------------------------------------------- localisation
def test_pointing_game_and_energy_on_synthetic_maps():
    masks = np.zeros((3, 8, 8), bool)
    masks[:, 2:5, 2:5] = True
    maps = np.zeros((3, 8, 8))
    maps[0, 3, 3] = 5.0  # inside
    maps[1, 7, 7] = 5.0  # outside
    maps[1, 3, 3] = 1.0
    maps[2] = 1.0  # constant: ties everywhere -> chance rate = mask area
    pg = metrics.pointing_game(maps, masks)
    np.testing.assert_allclose(pg.scores, [1.0, 0.0, 9 / 64])
    en = metrics.energy_pointing_game(maps, masks)
    np.testing.assert_allclose(en.scores, [1.0, 1 / 6, 9 / 64])
    # tolerance: the outside maximum at (7, 7) is 3 pixels from the box's corner (4, 4)
    assert metrics.pointing_game(maps, masks, tolerance=2).scores[1] == 0.0
    assert metrics.pointing_game(maps, masks, tolerance=3).scores[1] == 1.0


def test_boxes_equal_masks_and_low_resolution_maps_are_upsampled():
    boxes = np.array([[2, 2, 5, 5]])
    masks = metrics.boxes_to_masks(boxes, (8, 8))
    expected = np.zeros((1, 8, 8), bool)
    expected[0, 2:5, 2:5] = True
    np.testing.assert_array_equal(masks, expected)
    low = np.zeros((1, 2, 2))
    low[0, 0, 0] = 1.0  # top-left quadrant after upsampling
    assert metrics.pointing_game(low, boxes=[[0, 0, 3, 3]]).scores.tolist() == [1.0]
    assert metrics.pointing_game(low, boxes=[[5, 5, 8, 8]]).scores.tolist() == [0.0]
    with pytest.raises(ValueError, match="exactly one"):
        metrics.pointing_game(low)


# ----------------------------------------------------------------------------- similarity
def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 5, (4, 30)).astype(float)
    b = a + rng.integers(0, 3, (4, 30))
    np.testing.assert_allclose(_average_ranks(a)[0], stats.rankdata(a[0]))
    got = metrics.spearman(a, b)
    np.testing.assert_allclose(got, [stats.spearmanr(a[i], b[i])[0] for i in range(4)], rtol=1e-10)
    const = np.ones((1, 30))
    assert metrics.spearman(const, const).tolist() == [1.0]
    assert metrics.spearman(const, a[:1]).tolist() == [0.0]


def test_ssim_matches_scipy_filter_implementation():
    rng = np.random.default_rng(5)
    a = rng.random((2, 16, 16))
    b = a + 0.3 * rng.random((2, 16, 16))

    def reference(x, y):
        x = (x - x.min()) / (x.max() - x.min())
        y = (y - y.min()) / (y.max() - y.min())
        f = lambda z: ndimage.gaussian_filter(z, 1.5, mode="mirror", truncate=3.0)  # noqa: E731
        mx, my = f(x), f(y)
        sxx, syy, sxy = f(x * x) - mx**2, f(y * y) - my**2, f(x * y) - mx * my
        c1, c2 = 0.01**2, 0.03**2
        return (((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))).mean()

    np.testing.assert_allclose(metrics.ssim(a, b), [reference(a[i], b[i]) for i in range(2)], rtol=1e-4)
    np.testing.assert_allclose(metrics.ssim(a, a), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------- sanity checks
def test_sanity_checks_leave_the_users_model_unchanged(unchanged):
    model = tiny_cnn()
    x = np.random.default_rng(6).uniform(0, 1, (2, 12, 12, 3)).astype(np.float32)
    before_out = model.predict(x, verbose=0)
    check = unchanged(model)
    cascade = metrics.model_randomisation(model, "gradcam", x, seed=1)
    indep = metrics.model_randomisation(model, "saliency", x, mode="independent", layers=["c1", "head"])
    check()
    np.testing.assert_array_equal(model.predict(x, verbose=0), before_out)
    assert cascade.steps == ["head", "c2", "bn", "c1"]
    assert cascade.maps.shape == (5, 2, 12, 12)
    assert indep.steps == ["head", "c1"] and indep.spearman.shape == (2, 2)
    with pytest.raises(ValueError, match="Available layers with weights"):
        metrics.model_randomisation(model, "saliency", x, layers=["gap"])


def test_randomise_layer_uses_the_layers_initialisers_and_is_seeded():
    keras.utils.set_random_seed(0)
    a, b = keras.layers.Dense(8), keras.layers.Dense(8)
    a.build((None, 50)), b.build((None, 50))
    metrics.randomise_layer(a, seed=3)
    metrics.randomise_layer(b, seed=3)
    np.testing.assert_array_equal(a.get_weights()[0], b.get_weights()[0])
    limit = np.sqrt(6 / (50 + 8))  # glorot uniform
    assert np.abs(a.get_weights()[0]).max() <= limit and a.get_weights()[0].std() > limit / 3
    np.testing.assert_array_equal(a.get_weights()[1], 0.0)  # zeros bias initialiser


def test_copy_of_subclassed_and_nested_models_is_independent():
    @keras.saving.register_keras_serializable("kerascope_tests")
    class Sub(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = keras.layers.Conv2D(3, 3, name="conv")
            self.pool = keras.layers.GlobalAveragePooling2D()
            self.head = keras.layers.Dense(2, name="head")

        def call(self, x):
            return self.head(self.pool(self.conv(x)))

    x = np.random.default_rng(7).random((2, 8, 8, 1)).astype(np.float32)
    inner = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")], name="inner")
    nested = keras.Sequential([keras.Input((8, 8, 1)), inner, keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
    sub = Sub()
    sub(x)
    for model in (sub, nested):
        weights = [w.copy() for w in model.get_weights()]
        copy = metrics.copy_model(model, x)
        assert not {id(v) for v in copy.weights} & {id(v) for v in model.weights}
        np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(x)), keras.ops.convert_to_numpy(model(x)), rtol=1e-6)
        for path in metrics.weighted_layers(copy):
            from kerascope.core.layers import find_layer

            metrics.randomise_layer(find_layer(copy, path), seed=0)
        for w, w0 in zip(model.get_weights(), weights, strict=True):
            np.testing.assert_array_equal(w, w0)
    r = metrics.model_randomisation(nested, "saliency", x, 0)
    assert r.steps == ["d", "inner/c"]


def test_constant_explainer_is_unchanged_and_data_randomisation_compares_two_models():
    model = tiny_cnn()
    x = np.random.default_rng(8).uniform(0, 1, (2, 12, 12, 3)).astype(np.float32)

    def constant(m, inputs, targets):
        return np.ones(np.asarray(inputs).shape[:3])

    r = metrics.model_randomisation(model, constant, x)
    np.testing.assert_allclose(r.spearman, 1.0)
    np.testing.assert_allclose(r.ssim, 1.0, atol=1e-6)
    other = tiny_cnn(seed=9)
    d = metrics.data_randomisation(model, other, "saliency", x)
    same = metrics.data_randomisation(model, model, "saliency", x)
    np.testing.assert_allclose(same.spearman, 1.0, atol=1e-9)
    assert d.steps == ["labels"] and np.all(d.spearman < 0.9)
