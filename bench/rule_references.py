"""DeepLIFT and LRP: what the reference libraries pay over their own floor, next to what kerascope pays over its own.

Issue 15 asks DeepLIFT and LRP to "cost about one forward + one backward pass". This
times, in ONE process and on identical weights, Captum's ``DeepLift`` and zennit's
``EpsilonPlus`` / epsilon-everywhere composites against a hand-written torch forward +
backward of the same inputs (the torch floor), and kerascope's ``DeepLIFT`` and ``LRP``
(``epsilon_plus``, ``epsilon``) against a hand-written compiled TensorFlow forward +
backward (the TensorFlow floor, ``bench/suite.py``'s ``grad``). Every runner takes its
turn each round, the order rotating (``bench/timing.py``); one compute thread for both
torch and TensorFlow; CPU seconds of the process by default (the shared machine's load
moves wall-clock ratios far more). Each library's ratio is the median over the rounds
of its seconds / its own floor's (per-round ratios give the spread).

Models, built by hand on both sides (torchvision does not load next to torch 2.13):

* ``demo``: the shipped demo CNN (conv-relu x2, max pool, x2, x2, GAP, dense; 64 px), its
  trained weights; the final softmax left out of the torch net (logits: Captum, zennit and
  kerascope all explain the logit);
* ``resblock``: stem conv-BN-ReLU, a residual block (conv-BN-ReLU-conv-BN + identity,
  ReLU), max pool, conv-BN-ReLU, a second residual block, GAP, dense (64 px, 16 / 32
  channels, random weights and BatchNormalization statistics). zennit merges each
  BatchNormalization into its convolution (``SequentialMergeBatchNorm``) and splits the
  residual sum with its ``Sum`` layer; Captum's DeepLift treats BN as linear, as kerascope.

zennit's composite is registered once per model (``with composite.context(net)``, as in
its ``Gradient`` attributor used over many batches); Captum's ``DeepLift.attribute``
registers its hooks on every call (its API). Captum runs the inputs and the zeros
baselines as one ``2 N`` batch; kerascope the ``N`` inputs and one shared zeros row.

The maps are compared too (max difference / max of the reference's), to show the same
thing is timed. Where a ``MaxPool2d`` module directly follows a ``ReLU`` module (both nets)
Captum's hooks apply only one of the two rules and its DeepLift does not sum to
``f(x) - f(baseline)`` (docs/methods.md, "Conventions versus Captum"; on ``resblock`` its
convergence delta reaches 0.6% of the logit, also in float64), so its map differs from
kerascope's there (2e-3 on ``demo``, 0.4 on ``resblock``); the tests put an ``x * 1``
module between the two for the cross-check. The cost is the same either way.

Example::

    python bench/rule_references.py --models demo resblock --images 8 --rounds 15
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from timing import rotating_times  # noqa: E402  (bench/timing.py)


def zennit() -> types.SimpleNamespace:
    """zennit's core modules without its ``__init__`` (which imports torchvision; see tests/test_lrp_zennit.py)."""
    spec = importlib.util.find_spec("zennit")
    if spec is None or spec.origin is None:
        raise SystemExit("zennit is not installed: pip install --no-deps zennit==0.5.1 (as scripts/test.sh does)")
    if "zennit" not in sys.modules:
        package = types.ModuleType("zennit")
        package.__path__ = [os.path.dirname(spec.origin)]
        sys.modules["zennit"] = package
    import zennit.canonizers
    import zennit.composites
    import zennit.layer
    import zennit.rules

    return types.SimpleNamespace(composites=zennit.composites, canonizers=zennit.canonizers, layer=zennit.layer,
                                 rules=zennit.rules)


# ------------------------------------------------------------------ models (Keras and torch, same weights)
def _conv(torch: Any, layer: Any) -> Any:
    k, b = (np.asarray(w) for w in layer.get_weights())
    conv = torch.nn.Conv2d(k.shape[2], k.shape[3], k.shape[0], padding=k.shape[0] // 2)
    conv.weight.data = torch.tensor(k.transpose(3, 2, 0, 1).copy())
    conv.bias.data = torch.tensor(b)
    return conv


def _bn(torch: Any, layer: Any) -> Any:
    gamma, beta, mean, var = (torch.tensor(np.asarray(w)) for w in layer.get_weights())
    bn = torch.nn.BatchNorm2d(len(gamma), eps=layer.epsilon)
    bn.weight.data, bn.bias.data, bn.running_mean.data, bn.running_var.data = gamma, beta, mean, var
    return bn.eval()


def _dense(torch: Any, layer: Any) -> Any:
    k, b = (np.asarray(w) for w in layer.get_weights())
    dense = torch.nn.Linear(k.shape[0], k.shape[1])
    dense.weight.data, dense.bias.data = torch.tensor(k.T.copy()), torch.tensor(b)
    return dense


def demo_pair(torch: Any) -> tuple[Any, Any]:
    """The shipped demo CNN and the same network in torch (ReLUs as modules; no final softmax)."""
    import keras

    from kerascope.data import demo_model_path

    model = keras.saving.load_model(demo_model_path())
    g = model.get_layer
    layers: list[Any] = []
    for block in ("1", "2", "3"):
        for half in "ab":
            layers += [_conv(torch, g(f"conv{block}{half}")), torch.nn.ReLU()]
        if block != "3":
            layers.append(torch.nn.MaxPool2d(2))
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), _dense(torch, g("predictions"))]
    return model, torch.nn.Sequential(*layers).eval()


def resblock_pair(torch: Any, z: types.SimpleNamespace, size: int = 64) -> tuple[Any, Any]:
    """A small ResNet-style network with BatchNormalization, in Keras and in torch (zennit's ``Sum``)."""
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((size, size, 3))

    def conv_bn(x: Any, channels: int, name: str, relu: bool = True) -> Any:
        # a small epsilon: zennit's merged BatchNorm keeps a 1 / sqrt(1 + eps) factor (tests/test_lrp_zennit.py)
        x = L.BatchNormalization(epsilon=1e-6, name=f"{name}_bn")(L.Conv2D(channels, 3, padding="same", name=name)(x))
        return L.ReLU()(x) if relu else x

    def block(x: Any, channels: int, name: str) -> Any:
        y = conv_bn(conv_bn(x, channels, f"{name}a"), channels, f"{name}b", relu=False)
        return L.ReLU()(L.Add()([x, y]))

    x = block(conv_bn(inp, 16, "stem"), 16, "r1")
    x = block(conv_bn(L.MaxPooling2D(2)(x), 32, "mid"), 32, "r2")
    model = keras.Model(inp, L.Dense(4, name="out")(L.GlobalAveragePooling2D()(x)))
    rng = np.random.default_rng(3)
    for v in model.weights:
        if "moving_variance" in v.path or "gamma" in v.path:
            v.assign(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
        else:
            v.assign(rng.normal(0, 0.3, v.shape).astype(np.float32))
    g = model.get_layer

    def seq(name: str, relu: bool = True) -> Any:
        parts = [_conv(torch, g(name)), _bn(torch, g(f"{name}_bn"))]
        return torch.nn.Sequential(*parts, *([torch.nn.ReLU()] if relu else []))

    class Block(torch.nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.a, self.b = seq(f"{name}a"), seq(f"{name}b", relu=False)
            self.sum, self.relu = z.layer.Sum(), torch.nn.ReLU()

        def forward(self, x: Any) -> Any:
            return self.relu(self.sum(torch.stack([x, self.b(self.a(x))], dim=-1)))

    net = torch.nn.Sequential(
        seq("stem"), Block("r1"), torch.nn.MaxPool2d(2), seq("mid"), Block("r2"),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), _dense(torch, g("out")),
    )
    return model, net.eval()


# ------------------------------------------------------------------ runners
def torch_runners(torch: Any, z: types.SimpleNamespace, net: Any, x: np.ndarray, targets: np.ndarray) -> dict:
    """The torch floor, Captum's DeepLift and zennit's composites, each a no-argument callable."""
    from captum.attr import DeepLift

    xt = torch.tensor(x.transpose(0, 3, 1, 2).copy())
    tt = torch.tensor(targets)

    def floor() -> Any:
        inputs = xt.clone().requires_grad_(True)
        score = net(inputs).gather(1, tt[:, None]).sum()
        return torch.autograd.grad(score, inputs)[0].numpy()

    captum_net = copy.deepcopy(net)
    deeplift = DeepLift(captum_net)

    def captum() -> Any:
        return deeplift.attribute(xt, baselines=torch.zeros_like(xt), target=tt).detach().numpy()

    def composite(make: Callable[[], Any]) -> Callable[[], Any]:
        modified = copy.deepcopy(net)
        make().context(modified).__enter__()  # registered once, kept for every call (hooks on this copy only)

        def run() -> Any:
            inputs = xt.clone().requires_grad_(True)
            out = modified(inputs)
            one_hot = torch.nn.functional.one_hot(tt, out.shape[1]).to(out)
            return torch.autograd.grad(out, inputs, one_hot)[0].numpy()
        return run

    canonizers = lambda: [z.canonizers.SequentialMergeBatchNorm()]  # noqa: E731
    plus = composite(lambda: z.composites.EpsilonPlus(canonizers=canonizers()))
    epsilon = composite(lambda: z.composites.EpsilonPlus(
        layer_map=[(z.composites.Convolution, z.rules.Epsilon(epsilon=1e-6))], canonizers=canonizers()))
    return {"torch floor": floor, "captum deeplift": captum, "zennit epsilon_plus": plus, "zennit epsilon": epsilon}


def keras_runners(model: Any, x: np.ndarray, targets: np.ndarray, batch_size: int) -> dict:
    """The TensorFlow floor (``bench/suite.py``'s ``grad``) and kerascope's DeepLIFT / LRP."""
    import tensorflow as tf
    from op_profile import floor_gradient  # bench/op_profile.py

    import kerascope as ks

    grad = floor_gradient(model, x.shape[1:])
    xs, ts = tf.constant(x), tf.constant(targets.astype(np.int32))
    deeplift = ks.DeepLIFT(model, batch_size=batch_size)
    plus = ks.LRP(model, composite="epsilon_plus", init="one_hot", batch_size=batch_size)  # zennit's init
    epsilon = ks.LRP(model, composite="epsilon", init="one_hot", batch_size=batch_size)
    return {
        "tf floor": lambda: grad(xs, ts).numpy(),
        "kerascope deeplift": lambda: deeplift.explain(x, targets).attributions,
        "kerascope epsilon_plus": lambda: plus.explain(x, targets).attributions,
        "kerascope epsilon": lambda: epsilon.explain(x, targets).attributions,
    }


def agreement(outputs: dict) -> str:
    """Max relative difference between the libraries' maps (a check that the same thing is timed)."""
    pairs = [("captum deeplift", "kerascope deeplift"), ("zennit epsilon_plus", "kerascope epsilon_plus"),
             ("zennit epsilon", "kerascope epsilon")]
    parts = []
    for theirs, ours in pairs:
        ref = outputs[theirs].transpose(0, 2, 3, 1)
        parts.append(f"{ours.split()[1]} {np.abs(outputs[ours] - ref).max() / np.abs(ref).max():.1e}")
    return "max |kerascope - reference| / max |reference|: " + ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["demo", "resblock"], choices=["demo", "resblock"])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--wall", action="store_true", help="wall-clock seconds instead of CPU seconds")
    args = parser.parse_args()
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    z = zennit()
    import captum

    clock = time.perf_counter if args.wall else time.process_time
    print(f"torch={torch.__version__} captum={captum.__version__} tf={tf.__version__} one thread each, "
          f"{'wall' if args.wall else 'CPU'} seconds, {args.rounds} rounds, load_avg="
          f"{','.join(f'{v:.1f}' for v in os.getloadavg())}")
    for name in args.models:
        model, net = demo_pair(torch) if name == "demo" else resblock_pair(torch, z)
        size = model.inputs[0].shape[1]
        x = np.random.default_rng(0).uniform(0, 1, (args.images, size, size, 3)).astype(np.float32)
        targets = np.arange(args.images) % 4
        runners = {**torch_runners(torch, z, net, x, targets), **keras_runners(model, x, targets, args.batch_size)}
        outputs = {k: f() for k, f in runners.items()}  # warm-up (traces) and the agreement check
        for f in runners.values():
            f()
        times = rotating_times(runners, args.rounds, clock)
        print(f"\n{name} {size} px, {args.images} images  ({agreement(outputs)})")
        print(f"{'runner':<24}{'s (median)':>12}{'/ floor':>9}  spread")
        for key, values in times.items():
            floor = times["torch floor" if key.split()[0] in ("torch", "captum", "zennit") else "tf floor"]
            ratios = [a / b for a, b in zip(values, floor, strict=True)]
            ratio = statistics.median(values) / statistics.median(floor)
            print(f"{key:<24}{statistics.median(values):12.4f}{ratio:9.2f}  {min(ratios):.2f}..{max(ratios):.2f}")
    print(f"\nload_avg at end={','.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
