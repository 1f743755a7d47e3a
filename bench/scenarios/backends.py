"""kerascope vs a hand-written compiled baseline on each Keras backend.

``backends-METHOD-BACKEND``: the same model (MobileNetV2, alpha 0.5, ``weights=None``, 96 px) and
batch of 8 inputs explained with ``Saliency``, ``GradCAM``, ``SmoothGrad(samples=50)`` or
``IntegratedGradients(steps=50)`` and with a hand-written function on that backend:
``tf.function`` + ``GradientTape`` (TensorFlow), ``jax.jit(jax.grad(...))`` over ``stateless_call``
(JAX), eager autograd (PyTorch; ``--set torch_compile=1`` times a ``torch.compile`` baseline).
Both sides use the same chunk size and numpy noise / path points, warm up twice (compilation),
then alternate round by round (cheap cases get more rounds: about 2 s per side); the median
seconds, the median of the per-round ratios kerascope / baseline and their spread. The runner
starts one child process per backend (Keras reads ``KERAS_BACKEND`` at import).

    python -m bench 'backends-*'
    python -m bench 'backends-*-jax' --set size=128
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import numpy as np

from bench.scenario import Options, scenario, settings
from bench.timing import rotating_times

BATCH, SAMPLES, STEPS, NOISE, CHUNK = 8, 50, 50, 0.15, 64
METHODS = ("saliency", "gradcam", "smoothgrad", "integrated_gradients")


@dataclass(frozen=True)
class BackendSettings:
    size: int = 96
    torch_compile: bool = False


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
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": rounds}


@lru_cache(maxsize=1)
def _setup(backend: str, size: int, torch_compile: bool) -> tuple[Any, str, Any, Any, dict]:
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(f"Keras runs {keras.backend.backend()!r}, this scenario needs {backend!r}.")
    model, layer = build(size)
    x = np.random.default_rng(1).uniform(0, 1, (BATCH, size, size, 3)).astype(np.float32)
    t = (np.arange(BATCH) % 10).astype(np.int32)
    return model, layer, x, t, baselines(backend, model, layer, size, torch_compile)


def compare(method: str, backend: str, options: Options) -> list[dict]:
    """kerascope's ``method`` against the hand-written baseline on ``backend``."""
    import kerascope as ks

    args = settings(BackendSettings, options, **({"size": 32} if options.quick else {}))
    model, layer, x, t, base = _setup(backend, args.size, args.torch_compile)
    if method == "saliency":
        ours, theirs = (lambda: ks.Saliency(model, batch_size=CHUNK).explain(x, t)), (lambda: base["grad"](x, t))
    elif method == "gradcam":
        ours = lambda: ks.GradCAM(model, layer=layer, batch_size=CHUNK).explain(x, t)  # noqa: E731
        theirs = lambda: base["cam"](x, t)  # noqa: E731
    elif method == "smoothgrad":
        noisy, t_sg = noisy_rows(x), np.repeat(t, SAMPLES)
        ours = lambda: ks.SmoothGrad(model, samples=SAMPLES, batch_size=CHUNK).explain(x, t)  # noqa: E731
        theirs = lambda: chunked(base["grad"], noisy, t_sg).reshape(BATCH, SAMPLES, *x.shape[1:]).mean(1)  # noqa: E731
    else:
        (path, weights), t_ig = path_rows(x), np.repeat(t, STEPS)

        def theirs() -> np.ndarray:
            g = chunked(base["grad"], path, t_ig).reshape(BATCH, STEPS, *x.shape[1:])
            return x * np.tensordot(weights, g, axes=([0], [1]))

        ours = lambda: ks.IntegratedGradients(model, steps=STEPS, batch_size=CHUNK).explain(x, t)  # noqa: E731
    return [{"backend": backend, "method": method, "size": args.size, **paired_times(ours, theirs, options.repeats)}]


for _backend in ("tensorflow", "jax", "torch"):
    for _method in METHODS:
        scenario(f"backends-{_method}-{_backend}", f"{_method} vs a hand-written compiled baseline on {_backend}",
                 tags=("backends", _method, _backend), backend=_backend)(partial(compare, _method, _backend))
