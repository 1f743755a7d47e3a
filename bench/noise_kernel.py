"""How far can SmoothGrad's sample count fall for a given accuracy? The gradient-noise kernel.

Issue 18 (item 2) asks ``SmoothGrad(tolerance=0.05)`` to reach a Pearson correlation >= 0.95 with a
1024-sample reference twice as fast as the fastest peer. With i.i.d. noise, the number of samples it
needs is set by the ratio ``V / S`` of the gradient's sampling variance (summed over the map's
elements) to the spread of the exact map: the noise fraction after ``n`` draws is
``f = (V / n) / (S + V / n)``, Pearson ``sqrt(1 - f) >= 0.95`` asks ``f <= 0.0975``, so
``n ≈ 9.26 V / S`` for Pearson 0.95 with the exact map (a noisy reference asks somewhat more). Antithetic, quasi-random or control-variate noise can lower ``n`` only by the
share of ``V`` that is a low-order function of the noise.

This script measures that share on a model, in plain TensorFlow (no kerascope in the loop). For noise
draws ``z`` and ``z' = c z + sqrt(1 - c^2) w`` (``w`` independent), both standard normal, the kernel

    k(c) = sum_i Cov(g_i(x + s z), g_i(x + s z')) / sum_i Var(g_i(x + s z))

(``g`` the target logit's input gradient, ``s`` the noise std) is a power series
``k(c) = sum_m a_m c^m`` whose coefficients ``a_m >= 0``, summing to 1, are the shares of the variance
in the Hermite chaos of order ``m`` of ``z`` (Mehler's formula). Hence:

* antithetic pairs (``c = -1``) multiply the variance per sample by ``1 + k(-1) = 2 E``, ``E`` the
  share of the even orders: they cancel every odd order;
* a scheme that integrates the orders 1 and 2 exactly (e.g. a perfect control variate or a
  low-discrepancy design that cancels them) can lower it at best to ``1 - a1 - a2``: a speed-up of at
  most ``1 / (1 - a1 - a2)`` over i.i.d. noise, and of ``E / (E - a2)`` over the antithetic pairs
  kerascope already draws.

``a1`` and ``a2`` are read from the odd and even parts of ``k`` at the smallest ``c``:
``a1 ≈ (k(c) - k(-c)) / 2c``, ``a2 ≈ (k(c) + k(-c)) / 2c^2`` (higher orders bias both up by
``O(c^2)``; ``k(0)``, exactly 0 in expectation, shows the estimator's noise floor, which ``a2``
multiplies by ~11, printed as its error). Covariances use the unbiased sample (co)variance; ``S`` subtracts the mean map's own
noise ``V (1 + mean_c k(c)) / N`` (the draws of a pair are correlated).

Run (main environment, a few minutes on 2 cores):
    python bench/noise_kernel.py --model mobilenetv2
    python bench/noise_kernel.py --model demo
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORRELATIONS = (-1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenetv2", help="mobilenetv2 (issue 18's) or demo")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=192, help="correlated draw pairs per image and c")
    parser.add_argument("--noise", type=float, default=0.15, help="noise std relative to the image's range")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, str(HERE))
    import numpy as np
    import tensorflow as tf
    from accuracy import build

    model, x = build(args.model, args.images)
    targets = np.asarray(model(x)).argmax(axis=1)

    @tf.function(reduce_retracing=True)
    def grads(batch: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(batch)
            logit = tf.reduce_sum(tf.gather(model(batch, training=False), target, axis=1))
        return tape.gradient(logit, batch)

    def gradients(image: np.ndarray, target: int, z: np.ndarray, sigma: float) -> np.ndarray:
        out = []
        for start in range(0, len(z), args.chunk):
            batch = (image[None] + sigma * z[start: start + args.chunk]).astype(np.float32)
            out.append(np.asarray(grads(tf.constant(batch), tf.constant(int(target))), np.float64))
        return np.concatenate(out).reshape(len(z), -1)

    rng = np.random.default_rng(args.seed)
    print(f"model={args.model} images={len(x)} pairs={args.pairs} noise={args.noise} "
          f"correlations={list(CORRELATIONS)}", flush=True)
    summary = []
    for i, (image, target) in enumerate(zip(x, targets, strict=True)):
        sigma = args.noise * float(image.max() - image.min())
        cov, var, draws = {}, [], []
        for c in CORRELATIONS:
            z = rng.standard_normal((args.pairs, *image.shape), dtype=np.float32)
            w = rng.standard_normal((args.pairs, *image.shape), dtype=np.float32)
            g1 = gradients(image, target, z, sigma)
            g2 = gradients(image, target, c * z + np.sqrt(1.0 - c * c) * w, sigma)
            d1, d2 = g1 - g1.mean(axis=0), g2 - g2.mean(axis=0)
            cov[c] = float((d1 * d2).sum() / (args.pairs - 1))
            var.append(float(((d1**2).sum() + (d2**2).sum()) / (2 * (args.pairs - 1))))
            draws.append(g1.sum(axis=0))
            draws.append(g2.sum(axis=0))
        v = float(np.mean(var))
        total = 2 * args.pairs * len(CORRELATIONS)
        mean_map = np.sum(draws, axis=0) / total
        own_noise = (v + np.mean(list(cov.values()))) / total  # V (1 + mean_c k(c)) / N: a pair's draws correlate
        s = float(np.square(mean_map - mean_map.mean()).sum()) - own_noise
        k = {c: cov[c] / v for c in CORRELATIONS}
        small = min(c for c in CORRELATIONS if c > 0)
        a1 = (k[small] - k[-small]) / (2 * small)
        a2 = (k[small] + k[-small]) / (2 * small**2)
        antithetic = 1.0 + k[-1.0]
        bound = 1.0 / max(1e-9, 1.0 - a1 - a2)
        beyond = (antithetic / 2) / max(1e-9, antithetic / 2 - a2)  # over antithetic pairs: cancel order 2 too
        iid = 9.26 * v / s
        print(f"image {i} (target {int(target)}): V/S {v / s:.2f} -> i.i.d. samples for Pearson 0.95 ≈ {iid:.0f}")
        print("  k(c): " + ", ".join(f"{c:+.2f}: {k[c]:+.3f}" for c in CORRELATIONS)
              + f"  (k(0) = {k[0.0]:+.3f} is the noise floor)")
        print(f"  a1 ≈ {a1:.3f}, a2 ≈ {a2:.3f} (± {8 * np.sqrt(2) * abs(k[0.0]):.3f}); antithetic variance factor {antithetic:.3f}; "
              f"cancelling orders 1-2: ≤ {bound:.2f}x over i.i.d. (≈ {iid / bound:.0f} samples at best), "
              f"≤ {beyond:.2f}x over antithetic pairs", flush=True)
        summary.append((v / s, antithetic, bound, beyond))
    ratios = np.array(summary)
    print(f"worst image: V/S {ratios[:, 0].max():.2f}, i.i.d. samples ≈ {9.26 * ratios[:, 0].max():.0f}; "
          f"antithetic factor {ratios[:, 1].min():.3f}..{ratios[:, 1].max():.3f}; "
          f"low-order bound ≤ {ratios[:, 2].max():.2f}x over i.i.d., ≤ {ratios[:, 3].max():.2f}x over antithetic")


if __name__ == "__main__":
    main()
