"""Quantus 0.6.0 and a PyTorch twin of a tiny Keras CNN with identical weights, for the metric cross-checks.

Quantus imports zennit when it finds it, and zennit's package imports torchvision, which does not load beside
torch 2.13; Quantus only uses zennit for its own LRP explanations, so it is imported with zennit hidden.
Keras is channels-last, PyTorch channels-first: inputs and attributions are transposed between them.
"""

from __future__ import annotations

import sys

import keras
import numpy as np
import pytest

SIZE, CHANNELS, CLASSES = 8, 3, 3


def import_quantus():
    pytest.importorskip("torch")
    pytest.importorskip("cv2")
    # find_spec("zennit") -> None while Quantus is imported: it skips its zennit explainers. Whatever another test
    # left there (tests/test_lrp_zennit.py loads zennit's modules under a stand-in package) is put back after.
    saved = {name: module for name, module in sys.modules.items() if name == "zennit" or name.startswith("zennit.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["zennit"] = None
    try:
        return pytest.importorskip("quantus")
    finally:
        del sys.modules["zennit"]
        sys.modules.update(saved)


def build_pair(seed: int = 0, size: int = SIZE, channels: int = CHANNELS, padding: str = "same"):
    """A Keras CNN ending in softmax and its PyTorch twin returning the logits, with identical weights."""
    import torch

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    bias = lambda: keras.initializers.RandomNormal(0.0, 0.1, seed=int(rng.integers(1 << 30)))  # noqa: E731
    model = keras.Sequential([
        keras.Input((size, size, channels)),
        keras.layers.Conv2D(4, 3, padding=padding, activation="relu", bias_initializer=bias(), name="c1"),
        keras.layers.AveragePooling2D(2, name="pool"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(CLASSES, activation="softmax", bias_initializer=bias(), name="out"),
    ])
    half = (size if padding == "same" else size - 2) // 2
    net = torch.nn.Sequential(
        torch.nn.Conv2d(channels, 4, 3, padding=1 if padding == "same" else 0), torch.nn.ReLU(), torch.nn.AvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4 * half * half, CLASSES),
    )
    kernel, b = model.get_layer("c1").get_weights()
    dense, db = model.get_layer("out").get_weights()
    # Keras flattens (h, w, c), PyTorch (c, h, w): permute the dense rows to match
    dense = dense.reshape(half, half, 4, CLASSES).transpose(2, 0, 1, 3).reshape(-1, CLASSES)
    with torch.no_grad():
        net[0].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))))
        net[0].bias.copy_(torch.from_numpy(b))
        net[4].weight.copy_(torch.from_numpy(np.ascontiguousarray(dense.T)))
        net[4].bias.copy_(torch.from_numpy(db))
    net.eval()
    return model, net


def nchw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32).transpose(0, 3, 1, 2))


def images(n: int = 4, size: int = SIZE, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, size, size, CHANNELS)).astype(np.float32)


def torch_saliency(model, inputs, targets, **kwargs):
    """Quantus's explain_func: the signed gradient of the target logit (kerascope's Saliency bypasses the softmax)."""
    import torch

    x = torch.as_tensor(np.asarray(inputs, np.float32)).requires_grad_(True)
    model(x)[torch.arange(len(x)), torch.as_tensor(np.asarray(targets))].sum().backward()
    return x.grad.detach().numpy()
