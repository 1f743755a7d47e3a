"""Cheaper convolution backward passes (``_backend/tf_conv.py``): time and error with and without, TensorFlow.

Times ``Engine.gradients`` (the input gradient of one class: the pass of Saliency, SmoothGrad and
IG) on two engines of the same model, one with the stem / 1x1 ``Conv2D`` layers given their cheaper
exact input gradient (the default on a machine without GPUs) and one with TensorFlow's own
(``conv_op`` switched off while its first pass traces), alternating (``bench/timing.py``), in CPU
seconds with one thread. Both fold BatchNormalization as by default. Prints the median ratio with
the range of the per-round ratios and the relative L2 difference of the two gradients. ``--layers``
also times each rewritten layer's input gradient alone (``tf.function``, random ``dy``) against
``tf.nn.conv2d_transpose``.

Examples:
    python bench/conv_backward.py --model resnet50 --size 160 --images 2
    python bench/conv_backward.py --model resnet50 --size 224 --images 16 --repeats 5 --layers
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from bn_fold import CONSTRUCTORS, build, one_thread, rel  # noqa: E402  (bench/bn_fold.py)
from timing import rotating_times  # noqa: E402

from kerascope._backend import tensorflow as tf_backend  # noqa: E402
from kerascope._backend import tf_conv  # noqa: E402
from kerascope.core.engine import Engine  # noqa: E402


def time_layer(layer: keras.Layer, rows: int, repeats: int) -> None:
    """One rewritten layer's input gradient alone against TensorFlow's, ms (median of ``repeats``)."""
    x_shape, y_shape = (rows, *layer.input.shape[1:]), (rows, *layer.output.shape[1:])
    if tuple(layer.strides) == (1, 1) and int(np.prod(y_shape[1:3])) > tf_conv.POINTWISE_POSITIONS:
        return  # a stride-1 1x1 convolution on a larger map: TensorFlow's own gradient at trace time
    kernel = tf.convert_to_tensor(layer.kernel)
    dy = tf.random.stateless_normal(y_shape, (0, 1))
    strides, padding = tuple(layer.strides), layer.padding.upper()
    theirs = tf.function(lambda d: tf.nn.conv2d_transpose(d, kernel, x_shape, strides, padding))
    if tf_conv._kind(layer) == "stem":
        ours = tf.function(lambda d: tf_conv.polyphase_input_gradient(d, kernel, strides, padding, x_shape[1:3]))
    else:
        ours = tf.function(lambda d: tf_conv.pointwise_input_gradient(d, kernel, strides, x_shape[1:3]))
    times = rotating_times({"ours": lambda: ours(dy).numpy(), "theirs": lambda: theirs(dy).numpy()},
                           repeats + 2, time.process_time)
    ms = {k: 1e3 * statistics.median(v[2:]) for k, v in times.items()}
    print(f"    {layer.name:24s} {tuple(layer.kernel.shape)} /{strides[0]} on {tuple(x_shape[1:])}: "
          f"TensorFlow {ms['theirs']:.2f} ms, ours {ms['ours']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(CONSTRUCTORS), default="resnet50")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--layers", action="store_true", help="also time each rewritten layer alone")
    args = parser.parse_args()
    one_thread()
    model = build(args.model, args.size)
    x = np.random.default_rng(0).random((args.images, args.size, args.size, 3), dtype=np.float32)
    cheaper, own = Engine(model), Engine(model)

    def grad(engine: Engine) -> np.ndarray:
        return engine.gradients(x, 0, batch_size=len(x)).input_grads[0]

    g_cheaper = grad(cheaper)
    saved = tf_backend.conv_op
    tf_backend.conv_op = None  # this engine's conv_ops memo is computed (empty) on its first pass
    try:
        g_own = grad(own)
    finally:
        tf_backend.conv_op = saved
    assert not own.conv_ops(), "the baseline engine must run TensorFlow's own convolution gradients"
    times = rotating_times({"cheaper": lambda: grad(cheaper), "own": lambda: grad(own)}, args.repeats,
                           time.process_time)
    ratios = [a / b for a, b in zip(times["cheaper"], times["own"], strict=True)]
    median = {k: statistics.median(v) for k, v in times.items()}
    kinds = [tf_conv._kind(layer) if tuple(layer.strides) != (1, 1) or tf_conv._kind(layer) == "stem"
             or int(np.prod(layer.output.shape[1:3])) <= tf_conv.POINTWISE_POSITIONS else "large"
             for layer, _ in cheaper.conv_ops()]
    print(f"model={args.model} size={args.size} images={args.images} rewritten: {kinds.count('stem')} stem, "
          f"{kinds.count('pointwise')} 1x1 ({kinds.count('large')} stride-1 1x1 on maps of more than "
          f"{tf_conv.POINTWISE_POSITIONS} positions keep TensorFlow's) clock=cpu-time, 1 thread "
          f"load_avg={os.getloadavg()[0]:.1f}")
    print(f"  own {median['own']:.3f} s  cheaper {median['cheaper']:.3f} s  cheaper/own "
          f"{median['cheaper'] / median['own']:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"  rel. L2 cheaper vs own: {rel(g_cheaper, g_own):.2e}")
    if args.layers:
        for layer, _ in cheaper.conv_ops():
            time_layer(layer, args.images, args.repeats)


if __name__ == "__main__":
    main()
