"""BatchNormalization folding (``fold_batchnorm``): folded / unfolded time and error, per backend.

Times ``Engine.gradients`` (the input gradient of one class, the pass Saliency, SmoothGrad and IG
run) with ``fold_batchnorm=True`` and ``False`` on the same engine inputs, alternating
(``bench/timing.py``), in CPU seconds with one compute thread. The BN statistics are randomised
(``weights=None`` leaves them at mean 0, variance 1, where folding is nearly the identity). Prints
the median ratio folded / unfolded with the range of the per-round ratios, and the relative L2
differences: folded vs unfolded, and the unfolded pass on the whole batch vs one row at a time (the
float32 noise of a mere change of batch size, for scale). ``--float64`` (TensorFlow) also compares
both to the same model evaluated in float64.

Examples:
    KERAS_BACKEND=tensorflow python bench/bn_fold.py --model mobilenetv2 --size 160 --images 8
    KERAS_BACKEND=torch python bench/bn_fold.py --model resnet50 --size 160 --images 8 --repeats 5
    KERAS_BACKEND=tensorflow python bench/bn_fold.py --model resnet50 --size 160 --images 2 --float64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from timing import rotating_times  # noqa: E402

CONSTRUCTORS = {"mobilenetv2": "MobileNetV2", "resnet50": "ResNet50"}


def one_thread() -> None:
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)
    # JAX: XLA's CPU thread pool is set by XLA_FLAGS before import; CPU seconds count every thread anyway


def build(name: str, size: int, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)  # the same random network in every run (its conditioning varies by draw)
    model = getattr(keras.applications, CONSTRUCTORS[name])(weights=None, input_shape=(size, size, 3),
                                                            classifier_activation=None)
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 2.0, var.shape)])
    return model


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def float64_gradient(model: keras.Model, name: str, size: int, x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    keras.config.set_dtype_policy("float64")
    try:
        twin = getattr(keras.applications, CONSTRUCTORS[name])(weights=None, input_shape=(size, size, 3),
                                                               classifier_activation=None)
    finally:
        keras.config.set_dtype_policy("float32")
    twin.set_weights([w.astype("float64") for w in model.get_weights()])
    x64 = tf.constant(x.astype("float64"))
    with tf.GradientTape() as tape:
        tape.watch(x64)
        score = tf.reduce_sum(twin(x64, training=False)[:, 0])
    return tape.gradient(score, x64).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(CONSTRUCTORS), default="mobilenetv2")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--float64", action="store_true", help="TensorFlow: also compare to a float64 twin")
    parser.add_argument("--seed", type=int, default=0, help="weights and BN statistics of the random network")
    args = parser.parse_args()
    one_thread()
    from kerascope.core.engine import Engine

    model = build(args.model, args.size, args.seed)
    x = np.random.default_rng(0).random((args.images, args.size, args.size, 3), dtype=np.float32)
    folded, unfolded = Engine(model, fold_batchnorm=True), Engine(model, fold_batchnorm=False)
    pairs = len(folded.folded_pairs())
    bns = sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers)

    def grad(engine: Engine, rows: np.ndarray) -> np.ndarray:
        return engine.gradients(rows, 0, batch_size=len(rows)).input_grads[0]

    g_folded, g_unfolded = grad(folded, x), grad(unfolded, x)
    one_by_one = np.concatenate([grad(unfolded, x[i:i + 1]) for i in range(len(x))])
    times = rotating_times({"folded": lambda: grad(folded, x), "unfolded": lambda: grad(unfolded, x)},
                           args.repeats, time.process_time)
    ratios = [a / b for a, b in zip(times["folded"], times["unfolded"], strict=True)]
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"backend={keras.backend.backend()} model={args.model} size={args.size} images={args.images} "
          f"pairs folded={pairs}/{bns} BN clock=cpu-time, 1 thread load_avg={os.getloadavg()[0]:.1f}")
    print(f"  unfolded {median['unfolded']:.3f} s  folded {median['folded']:.3f} s  "
          f"folded/unfolded {median['folded'] / median['unfolded']:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"  rel. L2: folded vs unfolded {rel(g_folded, g_unfolded):.2e}; "
          f"unfolded batch {len(x)} vs 1 row at a time {rel(g_unfolded, one_by_one):.2e}")
    if args.float64:
        ref = float64_gradient(model, args.model, args.size, x)
        print(f"  rel. L2 vs float64: unfolded {rel(g_unfolded, ref):.2e}, folded {rel(g_folded, ref):.2e}")


if __name__ == "__main__":
    main()
