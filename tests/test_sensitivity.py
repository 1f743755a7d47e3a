"""Sobol and HSIC: closed forms (Ishigami, linear models), the driving feature, and Xplique 2.0 on identical designs.

Xplique is installed with ``pip install --no-deps xplique==2.0.2`` plus the light modules it imports
(deprecated, einops, tensorflow-probability with tf-keras; see scripts/test.sh); its cross-checks run on
the TensorFlow backend only. Xplique draws its own designs; a ``ReplicatedSampler`` / ``Sampler`` subclass
below hands it kerascope's, so both score the same perturbed inputs and the estimators are compared.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import math  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from keras import ops  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods.sensitivity import hsic_scores, jansen_total_indices, sobol_design  # noqa: E402

ON_TF = keras.backend.backend() == "tensorflow"


def ishigami_model(a: float = 7.0, b: float = 0.1) -> keras.Model:
    inputs = keras.Input((3,))
    x1, x2, x3 = inputs[:, 0], inputs[:, 1], inputs[:, 2]
    out = ops.sin(x1) + a * ops.square(ops.sin(x2)) + b * x3**4 * ops.sin(x1)
    return keras.Model(inputs, ops.expand_dims(out, -1))


def linear_model(w: np.ndarray, bias: float = 0.3) -> keras.Model:
    model = keras.Sequential([keras.Input((len(w),)), keras.layers.Dense(1)])
    model.layers[0].set_weights([w.reshape(-1, 1).astype(np.float32), np.array([bias], np.float32)])
    return model


def image_model(seed: int = 0, size: int = 8) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="tanh"),
        keras.layers.Flatten(),
        keras.layers.Dense(3),  # logits: Xplique scores model(x) . one_hot(y), kerascope the same logit
    ])


def test_ishigami_total_indices() -> None:
    """With x = pi and baseline -pi, baseline + m (x - baseline) is uniform on [-pi, pi]: Ishigami's inputs."""
    model = ishigami_model()
    method = ks.Sobol(model, samples=2**13, baseline=-math.pi, batch_size=8192)
    e = method.explain(np.full((1, 3), math.pi, np.float32), 0)
    np.testing.assert_allclose(e.extras["feature_attributions"][0], [0.5576, 0.4424, 0.2437], atol=0.01)
    assert e.attributions.shape == (1, 3)


def test_linear_model_indices_are_w2_var() -> None:
    """Additive f: S_T,i = w_i^2 Var(m_i (x_i - b_i)) / Var f = w_i^2 (x_i - b_i)^2 / sum_j (...)."""
    rng = np.random.default_rng(0)
    w = np.array([1.0, -2.0, 0.5, 3.0, 0.0])
    x = rng.normal(size=(3, 5)).astype(np.float32)
    baseline = rng.normal(size=5).astype(np.float32)
    e = ks.Sobol(linear_model(w), samples=1024, baseline=baseline).explain(x, 0)
    share = w**2 * (x - baseline) ** 2
    np.testing.assert_allclose(e.attributions, share / share.sum(axis=1, keepdims=True), atol=0.005)
    assert np.all(e.attributions[:, 4] == 0)


def test_jansen_estimator_by_hand() -> None:
    rng = np.random.default_rng(1)
    f_a, f_c = rng.normal(size=8), rng.normal(size=(3, 8))
    expected = [((f_a - c) ** 2).sum() / (2 * 8 * f_a.var(ddof=1)) for c in f_c]
    np.testing.assert_allclose(jansen_total_indices(f_a, f_c), expected, rtol=1e-12)


def test_hsic_ranks_the_driving_feature_first() -> None:
    w = np.array([0.2, 0.0, 4.0, -0.5])
    e = ks.HSIC(linear_model(w), samples=256).explain(np.ones((2, 4), np.float32), 0)
    assert np.all(np.argmax(e.attributions, axis=1) == 2)
    assert np.all(e.attributions[:, 1] < e.attributions[:, 0])
    # on an image: the score reads one 4 x 4 corner only; that cell of the 2 x 2 grid comes first
    corner = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Cropping2D(((0, 4), (4, 0))),
                               keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1, kernel_initializer="ones")])
    image = ks.HSIC(corner, grid_size=2, samples=64).explain(np.ones((1, 8, 8, 1), np.float32), 0)
    values = image.extras["feature_attributions"][0]
    assert np.argmax(values) == 1 and values[1] > 10 * np.abs(np.delete(values, 1)).max()


def test_hsic_estimator_by_hand() -> None:
    """Xplique's double-centred formula, written out with the centring matrix H."""
    rng = np.random.default_rng(2)
    z = (rng.random((12, 3)) > 0.5).astype(np.float64)
    y = 2.0 + z[:, 0] - 0.5 * z[:, 2] + 0.1 * rng.normal(size=12)
    h = np.eye(12) - 1.0 / 12
    width = np.median(y)
    gram_l = np.exp(-((y[:, None] - y[None, :]) ** 2) / (2 * width**2))
    expected = []
    for d in range(3):
        gram_k = 1.0 + (0.5 - (z[:, d][:, None] - z[:, d][None, :]) ** 2)
        expected.append(np.sum((h @ gram_k @ h) * (h @ gram_l @ h).T) / 12)
    np.testing.assert_allclose(hsic_scores(z, y), expected, rtol=1e-10, atol=1e-14)


def test_designs_do_not_depend_on_batch_size_and_images_get_the_grid() -> None:
    model = image_model()
    x = np.random.default_rng(3).uniform(size=(2, 8, 8, 3)).astype(np.float32)
    for cls, params in ((ks.Sobol, {"samples": 8}), (ks.HSIC, {"samples": 16})):
        full = cls(model, grid_size=4, **params).explain(x, [0, 2])
        chunked = cls(model, grid_size=4, batch_size=5, **params).explain(x, [0, 2])
        np.testing.assert_allclose(chunked.attributions, full.attributions, rtol=1e-5, atol=1e-7)
        assert full.extras["feature_attributions"].shape == (2, 16)
        assert full.attributions.shape == x.shape
    design = sobol_design(3, 8, seed=0)
    assert design.shape == (40, 3) and design.min() >= 0 and design.max() < 1


def test_clear_errors() -> None:
    one = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="one input feature"):
        ks.Sobol(one, samples=4).explain(np.ones((2, 1), np.float32), 0)
    with pytest.raises(ValueError, match="one input feature"):
        ks.HSIC(one, samples=4).explain(np.ones((2, 1), np.float32), 0)
    with pytest.raises(ValueError, match="power of two.*Received: samples=12"):
        ks.Sobol(one, samples=12)
    with pytest.raises(ValueError, match="Received: perturbation='amplitude'. Available"):
        ks.Sobol(one, perturbation="amplitude")
    tokens = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(10, 2),
                               keras.layers.Flatten(), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="integer ids"):
        ks.Sobol(tokens, samples=4).explain(np.ones((1, 4), np.int32), 0)
    assert ks.HSIC(tokens, samples=8).explain(np.ones((1, 4), np.int32), 0).attributions.shape == (1, 4)


# ----------------------------------------------------------------- Xplique on identical designs
@pytest.fixture(scope="module")
def xplique_gsa():
    if not ON_TF:
        pytest.skip("Xplique cross-check: TensorFlow run only")
    return pytest.importorskip("xplique.attributions.global_sensitivity_analysis")


def test_sobol_equals_xplique_on_identical_designs(xplique_gsa) -> None:
    from xplique.attributions.global_sensitivity_analysis.replicated_designs import ReplicatedSampler

    size, samples = 8, 16
    model = image_model(1, size)
    x = np.random.default_rng(4).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
    targets = [0, 2, 1]
    method = ks.Sobol(model, samples=samples, grid_size=size, seed=5)  # one feature per pixel

    class Same(ReplicatedSampler):
        def __call__(self, dimension, nb_design):
            return method.design(dimension)

    ours = method.explain(x, targets).extras["feature_attributions"]
    theirs = xplique_gsa.SobolAttributionMethod(
        model, grid_size=size, nb_design=samples, sampler=Same(), perturbation_function="inpainting"
    ).explain(x, np.eye(3, dtype=np.float32)[targets])
    theirs = np.asarray(theirs).reshape(3, -1)  # a bicubic resize from 8 x 8 to 8 x 8 changes nothing
    assert ours.shape == theirs.shape == (3, size * size)
    assert theirs.max() > 0.01 and np.all(np.argmax(ours, axis=1) == np.argmax(theirs, axis=1))
    np.testing.assert_allclose(ours, theirs, rtol=2e-3, atol=2e-4 * np.abs(theirs).max())


def test_hsic_equals_xplique_on_identical_designs(xplique_gsa) -> None:
    from xplique.attributions.global_sensitivity_analysis.samplers import Sampler

    size, samples = 8, 64
    model = image_model(2, size)
    x = np.random.default_rng(6).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
    targets = [1, 0]
    method = ks.HSIC(model, samples=samples, grid_size=size, seed=7)

    class Same(Sampler):
        def __call__(self, dimension, nb_design):
            return method.design(dimension).astype(np.float32)

    ours = method.explain(x, targets).extras["feature_attributions"]
    theirs = xplique_gsa.HsicAttributionMethod(
        model, grid_size=size, nb_design=samples, sampler=Same(binary=True), perturbation_function="inpainting"
    ).explain(x, np.eye(3, dtype=np.float32)[targets])
    theirs = np.asarray(theirs).reshape(2, -1)
    assert np.abs(theirs).max() > 1e-3
    np.testing.assert_allclose(ours, theirs, rtol=2e-3, atol=2e-4 * np.abs(theirs).max())
