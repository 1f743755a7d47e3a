"""DeepLIFT's rescale rule on one activation: unfused TensorFlow ops vs the rule alone compiled with XLA.

The rule (as ``kerascope.core.deeplift_rules.rescale_backward`` with a shared
reference row, for a ReLU) is ``where(|dx| < 1e-10, relu'(x) dy, dy (y - y_ref) / dx)``
with ``dx = x - x_ref``: ~7 element-wise kernels on TensorFlow's CPU. Called
as a ``jit_compile=True`` function inside an ordinary graph, XLA fuses them
into one loop. This prints, for each activation shape, the median CPU
seconds of the plain ReLU gradient (the floor's share), the unfused rule with
``tf.where`` (``SelectV2``) and with the same-shape ``Select`` kernel (what kerascope
runs: ``_backend.tensorflow.select``), and the XLA-fused rule (one TensorFlow thread, rounds alternating), and the first
call's wall time of each (the fused rule compiles once per shape).

Example::

    python bench/rule_fusion.py --rounds 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import rotating_times  # noqa: E402  (bench/timing.py)

EPS = 1e-10


def rule(x: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    y = tf.nn.relu(x)
    fallback = tf.raw_ops.ReluGrad(gradients=dy, features=x)
    dx, dyy = x - x[-1:], y - y[-1:]
    return tf.where(tf.abs(dx) < EPS, fallback, dy * dyy / dx)


def rule_select(x: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    """The rule as kerascope runs it: TensorFlow's same-shape ``Select`` kernel instead of ``SelectV2``."""
    y = tf.nn.relu(x)
    fallback = tf.raw_ops.ReluGrad(gradients=dy, features=x)
    dx, dyy = x - x[-1:], y - y[-1:]
    return tf.raw_ops.Select(condition=tf.abs(dx) < EPS, x=fallback, y=dy * dyy / dx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--shapes", nargs="+", default=["9,64,64,16", "9,32,32,32", "9,16,16,64"])
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    fused_rule = tf.function(rule, jit_compile=True)
    runners = {
        "relu_grad": tf.function(lambda x, dy: tf.reduce_sum(tf.raw_ops.ReluGrad(gradients=dy, features=x))),
        "rule_where": tf.function(lambda x, dy: tf.reduce_sum(rule(x, dy))),
        "rule_select": tf.function(lambda x, dy: tf.reduce_sum(rule_select(x, dy))),
        "rule_xla": tf.function(lambda x, dy: tf.reduce_sum(fused_rule(x, dy))),
    }
    print(f"tf={tf.__version__} load_avg={','.join(f'{v:.1f}' for v in os.getloadavg())} one thread, CPU ms")
    print(f"{'shape':<16}" + "".join(f"{k:>12}" for k in runners) + "   first call (wall ms): rule_where / rule_xla")
    rng = np.random.default_rng(0)
    for text in args.shapes:
        shape = tuple(int(v) for v in text.split(","))
        x = tf.constant(rng.normal(size=shape).astype(np.float32))
        dy = tf.constant(rng.normal(size=shape).astype(np.float32))
        first = {}
        for name, fn in runners.items():
            start = time.perf_counter()
            fn(x, dy).numpy()
            first[name] = (time.perf_counter() - start) * 1000
        times = rotating_times({k: (lambda f=f, x=x, dy=dy: f(x, dy).numpy()) for k, f in runners.items()},
                               args.rounds,
                               time.process_time)
        medians = "".join(f"{statistics.median(v) * 1000:12.3f}" for v in times.values())
        print(f"{text:<16}{medians}   {first['rule_where']:.0f} / {first['rule_xla']:.0f}")


if __name__ == "__main__":
    main()
