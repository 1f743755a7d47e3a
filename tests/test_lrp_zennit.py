"""LRP against zennit 0.5 on identical weights: every composite, a conv -> relu -> maxpool -> conv -> BN ->
relu -> GAP -> dense model and a small residual network (BN canonised, residual Add split by zennit's
``Sum`` + ``Norm``). Max relative error (max |ours - zennit| / max |zennit|) <= 1e-4.

zennit's top-level ``__init__`` imports its torchvision helpers, and torchvision does not load beside
torch 2.13; the modules compared here (core, rules, composites, canonizers, layer) need only torch, so
they are imported from the installed package without running that ``__init__``
(``pip install --no-deps zennit`` in scripts/test.sh).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import keras
import numpy as np
import pytest

import kerascope as ks

torch = pytest.importorskip("torch")


def _zennit() -> types.SimpleNamespace:
    spec = importlib.util.find_spec("zennit")
    if spec is None or spec.origin is None:
        pytest.skip("zennit is not installed (scripts/test.sh installs it: pip install --no-deps zennit)")
    if "zennit" not in sys.modules:
        package = types.ModuleType("zennit")
        package.__path__ = [os.path.dirname(spec.origin)]
        sys.modules["zennit"] = package
    import zennit.canonizers
    import zennit.composites
    import zennit.layer

    return types.SimpleNamespace(composites=zennit.composites, canonizers=zennit.canonizers, layer=zennit.layer)


Z = _zennit()
RNG = np.random.default_rng(0)
# zennit's MergeBatchNorm keeps each BatchNorm as (x - 0) / sqrt(1 + eps) after folding it into the conv, so
# its canonised network is scaled by 1 / sqrt(1 + eps) per BN (5e-4 with Keras' default eps=1e-3); ours folds
# exactly. A small eps compares the rules themselves.
BN_EPS = 1e-6


def _randomise(model: keras.Model) -> None:
    rng = np.random.default_rng(3)
    weights = []
    for v in model.weights:
        if "moving_variance" in v.path:
            weights.append(rng.uniform(0.5, 1.5, v.shape))
        elif "gamma" in v.path:
            weights.append(rng.uniform(0.5, 1.5, v.shape))
        else:
            weights.append(rng.normal(0, 0.5, v.shape))
    for v, w in zip(model.weights, weights, strict=True):
        v.assign(w.astype(np.float32))


def _conv(layer: keras.layers.Conv2D) -> torch.nn.Conv2d:
    k, b = (np.asarray(w) for w in layer.get_weights())
    conv = torch.nn.Conv2d(k.shape[2], k.shape[3], k.shape[0], padding=k.shape[0] // 2)
    conv.weight.data = torch.tensor(k.transpose(3, 2, 0, 1).copy())
    conv.bias.data = torch.tensor(b)
    return conv


def _bn(layer: keras.layers.BatchNormalization) -> torch.nn.BatchNorm2d:
    gamma, beta, mean, var = (torch.tensor(np.asarray(w)) for w in layer.get_weights())
    bn = torch.nn.BatchNorm2d(len(gamma), eps=layer.epsilon)
    bn.weight.data, bn.bias.data, bn.running_mean.data, bn.running_var.data = gamma, beta, mean, var
    return bn.eval()


def _dense(layer: keras.layers.Dense) -> torch.nn.Linear:
    k, b = (np.asarray(w) for w in layer.get_weights())
    dense = torch.nn.Linear(k.shape[0], k.shape[1])
    dense.weight.data, dense.bias.data = torch.tensor(k.T.copy()), torch.tensor(b)
    return dense


def plain_model() -> tuple[keras.Model, torch.nn.Module]:
    """conv(relu) -> maxpool -> conv -> BN -> relu -> GAP -> dense, in Keras and in torch."""
    model = keras.Sequential([
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(6, 3, padding="same", name="c2"),
        keras.layers.BatchNormalization(epsilon=BN_EPS, name="bn"),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(5, name="out"),
    ])
    _randomise(model)
    g = model.get_layer
    net = torch.nn.Sequential(
        _conv(g("c1")), torch.nn.ReLU(), torch.nn.MaxPool2d(2), _conv(g("c2")), _bn(g("bn")), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), _dense(g("out")),
    )
    return model, net.eval()


class TorchResidual(torch.nn.Module):
    def __init__(self, model: keras.Model) -> None:
        super().__init__()
        g = model.get_layer
        self.stem = torch.nn.Sequential(_conv(g("c0")), _bn(g("bn0")), torch.nn.ReLU())
        self.branch = torch.nn.Sequential(_conv(g("c1")), _bn(g("bn1")), torch.nn.ReLU(), _conv(g("c2")))
        self.sum = Z.layer.Sum()
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1),
                                        torch.nn.Flatten(), _dense(g("out")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.stem(x)
        return self.head(self.sum(torch.stack([a, self.branch(a)], dim=-1)))


def residual_model() -> tuple[keras.Model, torch.nn.Module]:
    """conv -> BN -> relu -> [conv -> BN -> relu -> conv] + identity -> relu -> avgpool -> GAP -> dense."""
    inp = keras.Input((12, 12, 3))
    a = keras.layers.Conv2D(4, 3, padding="same", name="c0")(inp)
    a = keras.layers.ReLU()(keras.layers.BatchNormalization(epsilon=BN_EPS, name="bn0")(a))
    b = keras.layers.Conv2D(4, 3, padding="same", name="c1")(a)
    b = keras.layers.ReLU()(keras.layers.BatchNormalization(epsilon=BN_EPS, name="bn1")(b))
    b = keras.layers.Conv2D(4, 3, padding="same", name="c2")(b)
    h = keras.layers.ReLU()(keras.layers.Add()([a, b]))
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.AveragePooling2D(2)(h))
    model = keras.Model(inp, keras.layers.Dense(3, name="out")(h))
    _randomise(model)
    return model, TorchResidual(model).eval()


def zennit_relevance(net: torch.nn.Module, composite: str, x: np.ndarray, targets: np.ndarray) -> np.ndarray:
    canonizers = [Z.canonizers.SequentialMergeBatchNorm()]
    make = {
        "epsilon_plus": lambda: Z.composites.EpsilonPlus(canonizers=canonizers),
        "epsilon_plus_flat": lambda: Z.composites.EpsilonPlusFlat(canonizers=canonizers),
        "epsilon_alpha2_beta1": lambda: Z.composites.EpsilonAlpha2Beta1(canonizers=canonizers),
        "epsilon_gamma_box": lambda: Z.composites.EpsilonGammaBox(low=0.0, high=1.0, canonizers=canonizers),
    }[composite]
    inputs = torch.tensor(x.transpose(0, 3, 1, 2).copy(), requires_grad=True)
    with make().context(net) as modified:
        out = modified(inputs)
        one_hot = torch.nn.functional.one_hot(torch.tensor(targets), out.shape[1]).to(out)
        (relevance,) = torch.autograd.grad(out, inputs, one_hot)
    return relevance.detach().numpy().transpose(0, 2, 3, 1)


@pytest.mark.parametrize("build", [plain_model, residual_model], ids=["plain", "residual"])
@pytest.mark.parametrize("composite", ["epsilon_plus", "epsilon_plus_flat", "epsilon_alpha2_beta1",
                                       "epsilon_gamma_box"])
def test_composites_match_zennit(build, composite):
    model, net = build()
    x = RNG.uniform(0, 1, (3, 12, 12, 3)).astype(np.float32)
    targets = np.array([0, 2, 1])
    with torch.no_grad():  # same forward pass first
        logits = net(torch.tensor(x.transpose(0, 3, 1, 2).copy())).numpy()
    np.testing.assert_allclose(np.asarray(model(x)), logits, rtol=1e-4, atol=1e-5)
    ours = ks.LRP(model, composite=composite, init="one_hot").explain(x, targets).attributions
    ref = zennit_relevance(net, composite, x, targets)
    error = np.abs(ours - ref).max() / np.abs(ref).max()
    assert error <= 1e-4, f"{composite}: max relative error {error:.2e}"
