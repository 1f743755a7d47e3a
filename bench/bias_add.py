"""Folded biases as TensorFlow ``BiasAdd`` ops (``core/lrp_walk.py::_add_bias``): time with and without.

A folded Conv / Dense + BatchNormalization pair adds its bias with the backend's ``bias_add``
(TensorFlow: ``BiasAdd``, which Grappler fuses into the convolution with the ReLU and the residual
Add after it); without it, an ``AddV2`` of the bias. Two copies of the same model (same weights),
one method object each; the copy "off" traces with the backend's ``bias_add`` removed. Calls
alternate (``bench/timing.py``), CPU seconds with one TF thread; prints the median ratio on / off
with the range of the per-round ratios and the largest difference of the two maps.

Examples:
    python bench/bias_add.py --model resnet50 --size 224 --images 2 --methods occlusion rise
    python bench/bias_add.py --model mobilenetv2 --size 160 --images 4 --methods occlusion saliency lrp
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
from bn_fold import CONSTRUCTORS, build, one_thread  # noqa: E402  (bench/bn_fold.py)
from timing import rotating_times  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope._backend import tensorflow as tf_backend  # noqa: E402

METHODS = {
    "occlusion": lambda m, size: ks.Occlusion(m, window=size // 4, batch_size=32),
    "rise": lambda m, size: ks.RISE(m, masks=16, p=0.5, batch_size=32, seed=0),
    "saliency": lambda m, size: ks.Saliency(m, batch_size=32),
    "lrp": lambda m, size: ks.LRP(m, batch_size=32),
    "deeplift": lambda m, size: ks.DeepLIFT(m, batch_size=32),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50", choices=sorted(CONSTRUCTORS))
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--methods", nargs="+", default=["occlusion", "rise"], choices=sorted(METHODS))
    args = parser.parse_args()
    one_thread()
    on_model = build(args.model, args.size)
    off_model = keras.models.clone_model(on_model)
    off_model.set_weights(on_model.get_weights())
    x = np.random.default_rng(0).uniform(0, 1, (args.images, args.size, args.size, 3)).astype(np.float32)
    targets = np.arange(args.images) % 5
    saved = tf_backend.bias_add
    for name in args.methods:
        on, off = METHODS[name](on_model, args.size), METHODS[name](off_model, args.size)
        got = on.explain(x, targets).attributions
        del tf_backend.bias_add  # the "off" copy traces without it (its compiled functions keep that)
        try:
            want = off.explain(x, targets).attributions
        finally:
            tf_backend.bias_add = saved

        def run(method: Any) -> Any:
            return lambda: method.explain(x, targets)

        times = rotating_times({"on": run(on), "off": run(off)}, args.rounds, clock=time.process_time)
        ratios = [a / b for a, b in zip(times["on"], times["off"], strict=True)]
        print(f"{args.model} {args.size}px {args.images} images {name}: on {statistics.median(times['on']):.4f} "
              f"off {statistics.median(times['off']):.4f} CPU s, ratio "
              f"{statistics.median(times['on']) / statistics.median(times['off']):.3f} "
              f"(per round {min(ratios):.3f}-{max(ratios):.3f}), max |diff| {float(np.abs(got - want).max()):.3g}",
              flush=True)


if __name__ == "__main__":
    main()
