"""Layer / neuron conductance and internal influence: closed forms, the chain-rule identities, errors.

Backend-independent: the references are closed forms on linear / ReLU models, Integrated Gradients
(the identities: conductance summed over a layer is IG's total, neuron conductance summed over the
units of a layer that cuts the graph is IG exactly) and the backend's own autodiff.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from tests.conftest import assert_unchanged, snapshot  # noqa: E402


def mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(6, activation="tanh", name="h1"),
        keras.layers.Dense(5, activation="relu", name="h2"),
        keras.layers.Dense(3, name="out"),
    ])


@pytest.fixture(scope="module")
def model():
    return mlp()


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)


def test_internal_influence_closed_form():
    """h = W x, F = v . relu(h): dF/dh_j = v_j [alpha (W x)_j > 0], the same at every alpha > 0."""
    keras.utils.set_random_seed(2)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, use_bias=False, name="h"),
                          keras.layers.ReLU(), keras.layers.Dense(1, use_bias=False, name="v")])
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    w, v = m.get_layer("h").get_weights()[0], m.get_layer("v").get_weights()[0][:, 0]
    expected = v * ((x @ w) > 0)
    got = ks.InternalInfluence(m, layer="h", steps=7, method="riemann_middle").explain(x, 0).attributions
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_layer_conductance_linear_closed_form():
    """Linear layers: conductance of unit j is v_j (W (x - b))_j for any quadrature's nodes spanning [0, 1]."""
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="h"), keras.layers.Dense(2, name="o")])
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    b = np.float32(0.5)
    w = m.get_layer("h").get_weights()[0]
    v = m.get_layer("o").get_weights()[0][:, 1]
    expected = v * ((x - b) @ w)
    got = ks.LayerConductance(m, layer="h", steps=5, method="riemann_trapezoid", baseline=0.5, batch_size=7)
    np.testing.assert_allclose(got.explain(x, 1).attributions, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_size", [3, 64])
def test_layer_conductance_sums_to_ig_total(model, x, batch_size):
    """Summed over the layer, conductance is f(x) - f(b) (IG's total), up to the discrete chain rule."""
    cond = ks.LayerConductance(model, layer="h2", steps=256, method="riemann_trapezoid", batch_size=batch_size)
    got = cond.explain(x, [0, 1, 2])
    ig = ks.IntegratedGradients(model, steps=64).explain(x, [0, 1, 2])
    total = ig.attributions.sum(axis=1)
    np.testing.assert_allclose(got.attributions.sum(axis=1), total, rtol=2e-3, atol=2e-3)
    gap = got.scores - ig.extras["baseline_scores"]
    np.testing.assert_allclose(got.attributions.sum(axis=1), gap, rtol=2e-3, atol=2e-3)


def test_layer_conductance_chunking_invariant(model, x):
    """Rows of one sample split over chunks (the carried last row) give the same map as one chunk."""
    one = ks.LayerConductance(model, layer="h1", steps=9, batch_size=64).explain(x, 0).attributions
    split = ks.LayerConductance(model, layer="h1", steps=9, batch_size=4).explain(x, 0).attributions
    np.testing.assert_allclose(split, one, rtol=1e-5, atol=1e-6)


def test_neuron_conductance_sums_to_ig(model, x):
    """Every path runs through h1, so summing neuron conductance over its units is IG exactly."""
    ig = ks.IntegratedGradients(model, steps=8, method="riemann_middle").explain(x, 2).attributions
    total = sum(
        ks.NeuronConductance(model, layer="h1", neuron=j, steps=8, method="riemann_middle").explain(x, 2).attributions
        for j in range(6)
    )
    np.testing.assert_allclose(total, ig, rtol=1e-4, atol=1e-5)


def test_neuron_conductance_is_the_units_layer_conductance(model, x):
    cond = ks.LayerConductance(model, layer="h2", steps=200, method="riemann_trapezoid").explain(x, 1).attributions
    neuron = ks.NeuronConductance(model, layer="h2", neuron=(3,), steps=200).explain(x, 1).attributions
    np.testing.assert_allclose(neuron.sum(axis=1), cond[:, 3], rtol=1e-2, atol=1e-3)


def test_neuron_index_in_the_layers_layout():
    """A conv unit (row, col, channel): the gate passes gradient through that position only."""
    keras.utils.set_random_seed(4)
    m = keras.Sequential([keras.Input((5, 5, 2)), keras.layers.Conv2D(3, 3, padding="same", name="c"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    x = np.random.default_rng(0).normal(size=(2, 5, 5, 2)).astype(np.float32)
    got = ks.NeuronConductance(m, layer="c", neuron=(0, 0, 1), steps=3).explain(x, 0).attributions
    # linear model: the unit at (0, 0) sees only the 2x2 corner of the input (a 3x3 'same' kernel)
    assert np.all(got[:, 2:, :, :] == 0) and np.all(got[:, :, 2:, :] == 0)
    kernel = m.get_layer("c").get_weights()[0]  # (3, 3, in, out)
    v = m.layers[-1].get_weights()[0][1, 0] / 25.0
    expected = v * kernel[1:, 1:, :, 1] * x[:, :2, :2, :]
    np.testing.assert_allclose(got[:, :2, :2, :], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neuron", [6, (0, 1), (-1,), (2, 9)])
def test_neuron_out_of_range(model, x, neuron):
    before = snapshot(model)
    with pytest.raises(ValueError, match="out of range for layer 'h1'.*shape \\(6,\\)"):
        ks.NeuronConductance(model, layer="h1", neuron=neuron).explain(x, 0)
    assert_unchanged(model, before)


@pytest.mark.parametrize("neuron", [1.5, "a", (), None, True])
def test_neuron_type(model, neuron):
    with pytest.raises(TypeError, match="`neuron` must be an int"):
        ks.NeuronConductance(model, layer="h1", neuron=neuron)


def test_layer_errors(model):
    with pytest.raises(ValueError, match="needs the layer"):
        ks.LayerConductance(model, layer=None)
    with pytest.raises(ValueError, match="h9"):
        ks.InternalInfluence(model, layer="h9")
    with pytest.raises(ValueError, match="steps"):
        ks.LayerConductance(model, layer="h1", steps=0, method="riemann_trapezoid")
    with pytest.raises(ValueError, match="trapezoid rule needs steps"):
        ks.InternalInfluence(model, layer="h1", steps=1, method="riemann_trapezoid")


def test_model_unchanged_and_registry(model, x):
    before = snapshot(model)
    ks.explain(model, x, method="neuron_conductance", layer="h2", neuron=1, steps=4)
    ks.explain(model, x, method="layer_conductance", layer="h2", steps=4)
    ks.explain(model, x, method="internal_influence", layer="h2", steps=4)
    assert_unchanged(model, before)
    assert "call" not in vars(model.get_layer("h2"))
