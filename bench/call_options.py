"""Later calls with kerascope's CPU call options against TensorFlow's own, in one process (issue 18 item 4).

On a machine without GPUs kerascope's compiled functions run with one Grappler pass and no GPU
layout / memory optimiser (``kerascope/_backend/tensorflow.py::_cpu_call_options``), which makes
a function's first execution cheaper. This checks that later calls do not pay for it: each method
is explained once with each option set (TensorFlow instantiates the same compiled function once
per option set), then the calls alternate between the two, CPU seconds (one TF thread), medians.
The maps must be bit-identical.

Usage:
    python bench/call_options.py --model MobileNetV2 --size 224 --images 4 --rounds 21
    python bench/call_options.py --model ResNet50 --size 160 --images 2 --rounds 5
    python bench/call_options.py --model MobileNetV2 --size 160 --images 4 --methods deeplift lrp occlusion
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import rotating_times  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope._backend import tensorflow as backend  # noqa: E402


def options_parser(description: str) -> argparse.ArgumentParser:
    """The arguments this script and ``bench/instantiation.py`` share (model, size, images, rounds)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="MobileNetV2", choices=["MobileNetV2", "ResNet50"])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    return parser


def set_up(args: argparse.Namespace, **model_kwargs: object) -> tuple[object, keras.Model, np.ndarray]:
    """One TF thread; ``(kerascope's CPU call options, the model, the images)``; exits where a GPU is visible."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    ours = backend._cpu_call_options()
    if ours is None:
        raise SystemExit("A GPU is visible (or this TensorFlow lacks the call options): nothing to compare.")
    model = getattr(keras.applications, args.model)(input_shape=(args.size, args.size, 3), weights=None,
                                                    **model_kwargs)
    x = np.random.default_rng(0).uniform(0, 1, (args.images, args.size, args.size, 3)).astype(np.float32)
    return ours, model, x


def main() -> None:
    parser = options_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["saliency", "gradcam", "smoothgrad16"],
                        choices=["saliency", "gradcam", "smoothgrad16", "deeplift", "lrp", "occlusion"])
    args = parser.parse_args()
    ours, model, x = set_up(args, classifier_activation=None)
    targets = np.zeros(args.images, np.int64)
    made = {"saliency": lambda: ks.Saliency(model), "gradcam": lambda: ks.GradCAM(model),
            "smoothgrad16": lambda: ks.SmoothGrad(model, samples=16, seed=0, batch_size=32),
            "deeplift": lambda: ks.DeepLIFT(model), "lrp": lambda: ks.LRP(model),
            "occlusion": lambda: ks.Occlusion(model, window=args.size // 4, batch_size=32)}
    methods = {name: made[name]() for name in args.methods}
    print(f"{args.model} {args.size}px {args.images} images, {args.rounds} rounds, one TF thread, "
          f"load_avg={os.getloadavg()[0]:.1f}; CPU s per call, median (min-max)", flush=True)
    try:
        for name, method in methods.items():
            def run(options: object, method: ks.Method = method) -> np.ndarray:
                backend._CPU_OPTIONS[:] = [options]
                return np.asarray(method.explain(x, targets).attributions)

            maps = [run(None), run(ours)]  # one instantiation per option set, then timed calls
            times = rotating_times({"tf": lambda: run(None), "ks": lambda: run(ours)}, args.rounds,
                                   clock=time.process_time)
            cells = {k: f"{statistics.median(v):.4f} ({min(v):.4f}-{max(v):.4f})" for k, v in times.items()}
            ratio = statistics.median(times["ks"]) / statistics.median(times["tf"])
            print(f"{name:<13} TensorFlow's options {cells['tf']}  kerascope's {cells['ks']}  ratio {ratio:.3f}  "
                  f"max|diff| {float(np.abs(maps[0] - maps[1]).max()):.3g}", flush=True)
    finally:
        backend._CPU_OPTIONS[:] = [ours]
    print(f"load_avg at end={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
