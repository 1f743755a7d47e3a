"""Layer / neuron conductance and internal influence against Captum 0.9 on a torch twin (identical weights).

The twin is tests/test_captum_crosscheck.py's CNN (channels-last Keras, channels-first PyTorch: inputs
and conv-layer attributions are transposed). Run on TensorFlow only (one reference run is enough; the
method-level identities in tests/test_conductance.py run on every backend).
Agreement: ``max |kerascope - captum| <= 1e-4 * max |captum|`` (float32 on both sides).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

captum_attr = pytest.importorskip("captum.attr")
torch = pytest.importorskip("torch")

import kerascope as ks  # noqa: E402
from tests.test_captum_crosscheck import build_pair, from_torch, to_torch  # noqa: E402

pytestmark = [
    pytest.mark.captum,
    pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                       reason="the Captum reference runs once, on TensorFlow (tests/test_conductance.py covers all)"),
]

# keras layer -> index of the torch module with the same output (c1 and fc have their ReLU fused in Keras)
LAYERS = {"c1": 1, "c2": 2, "fc": 8}


@pytest.fixture(scope="module")
def pair():
    return build_pair()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (3, 8, 8, 3)).astype(np.float32)
    return x, np.array([0, 2, 1])


def close(ours: np.ndarray, theirs: np.ndarray) -> None:
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * float(np.abs(theirs).max()))


def layer_layout(a: torch.Tensor) -> np.ndarray:
    return from_torch(a) if a.ndim == 4 else a.detach().numpy()


@pytest.mark.parametrize("layer,method,steps,baseline", [
    ("c2", "gausslegendre", 20, 0.0),
    ("c1", "riemann_trapezoid", 12, 0.3),
    ("fc", "riemann_middle", 9, 0.0),
])
def test_layer_conductance(pair, data, layer, method, steps, baseline):
    model, net = pair
    x, t = data
    ours = ks.LayerConductance(model, layer=layer, steps=steps, method=method, baseline=baseline, batch_size=16)
    theirs = captum_attr.LayerConductance(net, net[LAYERS[layer]]).attribute(
        to_torch(x), baselines=baseline, target=torch.tensor(t), n_steps=steps, method=method)
    close(ours.explain(x, t).attributions, layer_layout(theirs))


@pytest.mark.parametrize("layer,method", [("c2", "gausslegendre"), ("fc", "riemann_left")])
def test_internal_influence(pair, data, layer, method):
    model, net = pair
    x, t = data
    ours = ks.InternalInfluence(model, layer=layer, steps=10, method=method, batch_size=8)
    theirs = captum_attr.InternalInfluence(net, net[LAYERS[layer]]).attribute(
        to_torch(x), target=torch.tensor(t), n_steps=10, method=method)
    close(ours.explain(x, t).attributions, layer_layout(theirs))


@pytest.mark.parametrize("layer,neuron,torch_neuron,method", [
    ("c2", (2, 3, 4), (4, 2, 3), "gausslegendre"),  # (Captum's NeuronConductance defaults to riemann_trapezoid)
    ("fc", 3, 3, "riemann_middle"),
])
def test_neuron_conductance(pair, data, layer, neuron, torch_neuron, method):
    model, net = pair
    x, t = data
    ours = ks.NeuronConductance(model, layer=layer, neuron=neuron, steps=16, method=method, baseline=0.1, batch_size=16)
    theirs = captum_attr.NeuronConductance(net, net[LAYERS[layer]]).attribute(
        to_torch(x), neuron_selector=torch_neuron, baselines=0.1, target=torch.tensor(t), n_steps=16, method=method)
    close(ours.explain(x, t).attributions, from_torch(theirs))
