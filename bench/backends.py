"""kerascope vs a hand-written compiled baseline, per Keras backend.

For each backend (one subprocess each: Keras reads ``KERAS_BACKEND`` at
import) the same model and batch of 8 inputs are explained with
``Saliency``, ``GradCAM``, ``SmoothGrad(samples=50)`` and
``IntegratedGradients(steps=50)`` and with a hand-written function on that
backend: ``tf.function`` + ``GradientTape`` (TensorFlow),
``jax.jit(jax.grad(...))`` over ``stateless_call`` (JAX), eager autograd
(PyTorch; ``--torch-compile`` also times a ``torch.compile`` baseline).
Both sides use the same chunk size and numpy noise / path points, warm up
twice (compilation), then alternate round by round; the median seconds,
the median of the per-round ratios kerascope / baseline and their spread
are printed as a Markdown table.

Usage:
    python bench/backends.py [--backends tensorflow,jax,torch] [--size 96] [--repeats 5] [--torch-compile]
    python bench/backends.py --worker jax ...   # one backend, in this process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from timing import rotating_times  # bench/timing.py

BATCH, SAMPLES, STEPS, NOISE, CHUNK = 8, 50, 50, 0.15, 64


def build(size: int) -> tuple[Any, str]:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(
        input_shape=(size, size, 3), weights=None, classifier_activation=None, alpha=0.5
    )
    return model, "Conv_1"


def noisy_rows(x: np.ndarray) -> np.ndarray:
    """SmoothGrad rows (sample-major): x + sigma * z, with numpy noise."""
    z = np.random.default_rng(0).normal(size=(SAMPLES, *x.shape[1:])).astype(np.float32)
    sigma = NOISE * (x.max(axis=tuple(range(1, x.ndim))) - x.min(axis=tuple(range(1, x.ndim))))
    return (x[:, None] + sigma.reshape(-1, 1, 1, 1, 1) * z[None]).reshape(-1, *x.shape[1:])


def path_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integrated-gradients rows (zero baseline, Gauss-Legendre points) and weights."""
    nodes, weights = np.polynomial.legendre.leggauss(STEPS)
    alphas, weights = ((nodes + 1) / 2).astype(np.float32), (weights / 2).astype(np.float32)
    return (alphas.reshape(1, -1, 1, 1, 1) * x[:, None]).reshape(-1, *x.shape[1:]), weights


def chunked(grad: Callable[[np.ndarray, np.ndarray], np.ndarray], rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.concatenate([grad(rows[i:i + CHUNK], t[i:i + CHUNK]) for i in range(0, len(rows), CHUNK)])


def baselines(backend: str, model: Any, layer: str, size: int, torch_compile: bool) -> dict[str, Callable]:
    """Hand-written (input-gradient, Grad-CAM) functions on ``backend``, numpy in and out."""
    import keras

    features = keras.Model(model.inputs, model.get_layer(layer).output)
    head = keras.Model(model.get_layer(layer).output, model.outputs[0])
    if backend == "tensorflow":
        import tensorflow as tf

        spec = [tf.TensorSpec((None, size, size, 3), tf.float32), tf.TensorSpec((None,), tf.int32)]

        @tf.function(input_signature=spec)
        def grad(x, t):
            with tf.GradientTape() as tape:
                tape.watch(x)
                score = tf.reduce_sum(tf.gather(model(x, training=False), t, axis=1, batch_dims=1))
            return tape.gradient(score, x)

        @tf.function(input_signature=spec)
        def cam(x, t):
            acts = features(x, training=False)
            with tf.GradientTape() as tape:
                tape.watch(acts)
                score = tf.reduce_sum(tf.gather(head(acts, training=False), t, axis=1, batch_dims=1))
            g = tape.gradient(score, acts)
            c = tf.nn.relu(tf.einsum("nhwc,nc->nhw", acts, tf.reduce_mean(g, axis=(1, 2))))
            return tf.image.resize(c[..., None], (size, size))[..., 0]

        return {"grad": lambda x, t: grad(x, t).numpy(), "cam": lambda x, t: cam(x, t).numpy()}
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        def score_of(m: Any, state: tuple, x: Any, t: Any) -> Any:
            out, _ = m.stateless_call(state[0], state[1], x)
            return jnp.sum(jnp.take_along_axis(out, t[:, None], axis=1))

        state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
        fstate = ([v.value for v in features.trainable_variables], [v.value for v in features.non_trainable_variables])
        hstate = ([v.value for v in head.trainable_variables], [v.value for v in head.non_trainable_variables])
        grad = jax.jit(lambda s, x, t: jax.grad(lambda v: score_of(model, s, v, t))(x))

        @jax.jit
        def cam(fs, hs, x, t):
            acts, _ = features.stateless_call(fs[0], fs[1], x)
            g = jax.grad(lambda a: score_of(head, hs, a, t))(acts)
            c = jax.nn.relu(jnp.einsum("nhwc,nc->nhw", acts, jnp.mean(g, axis=(1, 2))))
            return jax.image.resize(c, (c.shape[0], size, size), "bilinear")

        return {"grad": lambda x, t: np.asarray(grad(state, x, t)),
                "cam": lambda x, t: np.asarray(cam(fstate, hstate, x, t))}
    import torch
    import torch.nn.functional as F

    def grad_eager(x, t):
        x = torch.as_tensor(x).requires_grad_(True)
        out = model(x, training=False)
        return torch.autograd.grad(out.gather(1, torch.as_tensor(t, dtype=torch.int64)[:, None]).sum(), x)[0]

    def cam_eager(x, t):
        acts = features(torch.as_tensor(x), training=False).detach().requires_grad_(True)
        out = head(acts, training=False)
        g = torch.autograd.grad(out.gather(1, torch.as_tensor(t, dtype=torch.int64)[:, None]).sum(), acts)[0]
        c = torch.relu(torch.einsum("nhwc,nc->nhw", acts, g.mean(dim=(1, 2))))
        return F.interpolate(c[:, None], size=(size, size), mode="bilinear")[:, 0]

    grad_fn, cam_fn = grad_eager, cam_eager
    if torch_compile:
        grad_fn, cam_fn = torch.compile(grad_eager), torch.compile(cam_eager)
    return {"grad": lambda x, t: grad_fn(x, t).detach().numpy(), "cam": lambda x, t: cam_fn(x, t).detach().numpy()}


def paired_times(ours: Callable[[], Any], theirs: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median seconds of both sides and the median of the per-round ratios.

    Two warm-up calls each (compilation), then ``repeats`` rounds (more for
    cases that take tens of milliseconds: ~2 s per side) that run both,
    alternating which goes first, so that slow phases of a shared machine
    hit both sides alike.
    """
    for _ in range(2):
        ours()
        start = time.perf_counter()
        theirs()
        warm = time.perf_counter() - start
    # cheap cases (tens of ms) get more rounds: at least ~2 s per side, at most 50 rounds
    rounds = max(repeats, min(50, int(2.0 / max(warm, 1e-3))))
    times = rotating_times({"ours": ours, "base": theirs}, rounds)
    ratios = [a / b for a, b in zip(times["ours"], times["base"])]
    return {"kerascope_s": statistics.median(times["ours"]), "baseline_s": statistics.median(times["base"]),
            "ratio": statistics.median(ratios), "spread": f"{min(ratios):.2f}..{max(ratios):.2f}"}


def worker(backend: str, size: int, repeats: int, torch_compile: bool) -> dict[str, Any]:
    import keras

    import kerascope as ks

    assert keras.backend.backend() == backend, (keras.backend.backend(), backend)
    model, layer = build(size)
    x = np.random.default_rng(1).uniform(0, 1, (BATCH, size, size, 3)).astype(np.float32)
    t = (np.arange(BATCH) % 10).astype(np.int32)
    base = baselines(backend, model, layer, size, torch_compile)
    noisy, (path, weights) = noisy_rows(x), path_rows(x)
    t_sg, t_ig = np.repeat(t, SAMPLES), np.repeat(t, STEPS)

    def base_sg() -> np.ndarray:
        return chunked(base["grad"], noisy, t_sg).reshape(BATCH, SAMPLES, *x.shape[1:]).mean(1)

    def base_ig() -> np.ndarray:
        g = chunked(base["grad"], path, t_ig).reshape(BATCH, STEPS, *x.shape[1:])
        return x * np.tensordot(weights, g, axes=([0], [1]))

    cases = {
        "Saliency": (lambda: ks.Saliency(model, batch_size=CHUNK).explain(x, t), lambda: base["grad"](x, t)),
        "GradCAM": (lambda: ks.GradCAM(model, layer=layer, batch_size=CHUNK).explain(x, t),
                    lambda: base["cam"](x, t)),
        "SmoothGrad(50)": (lambda: ks.SmoothGrad(model, samples=SAMPLES, batch_size=CHUNK).explain(x, t), base_sg),
        "IntegratedGradients(50)": (
            lambda: ks.IntegratedGradients(model, steps=STEPS, batch_size=CHUNK).explain(x, t), base_ig),
    }
    return {name: paired_times(ours, theirs, repeats) for name, (ours, theirs) in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--size", type=int, default=96, help="input image side (MobileNetV2, alpha 0.5)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch-compile", action="store_true", help="torch baseline with torch.compile")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.size, args.repeats, args.torch_compile)))
        return
    print(f"MobileNetV2(alpha=0.5) {args.size}x{args.size}, batch {BATCH}, chunk {CHUNK}, median of {args.repeats}")
    print("| backend | method | kerascope (s) | baseline (s) | ratio | spread |\n|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        command = [sys.executable, __file__, "--worker", backend, "--size", str(args.size),
                   "--repeats", str(args.repeats)] + (["--torch-compile"] if args.torch_compile else [])
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {backend} | failed | {done.stderr.strip().splitlines()[-1] if done.stderr else ''} | | | |")
            continue
        for name, row in json.loads(done.stdout.strip().splitlines()[-1]).items():
            print(f"| {backend} | {name} | {row['kerascope_s']:.3f} | {row['baseline_s']:.3f} | {row['ratio']:.2f} "
                  f"| {row['spread']} |")


if __name__ == "__main__":
    main()
