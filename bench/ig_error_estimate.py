"""How good is IG's ``tolerance=`` error estimate? The map change between nested grids against the true error.

``IntegratedGradients(tolerance=)`` stops a sample when the relative L2 change of its map since the
previous nested grid (open trapezoid, 7, 15, 31, ... points) is <= tolerance (and the completeness
error too). This prints, per grid and image, the true relative L2 error against a 1024-interval
trapezoid reference, the change, and their ratio: below 1 the estimate is conservative.

    python bench/ig_error_estimate.py --model demo --images 4
    python bench/ig_error_estimate.py --model relu-bias
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def relu_bias_model(images: int) -> tuple[Any, Any]:
    """A random ReLU / max-pool CNN with biases: a piecewise-constant integrand, not the bias-free case."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(5)
    bias = {"bias_initializer": "random_normal"}
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(16, 3, activation="relu", **bias),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu", **bias),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, **bias),
    ])
    return model, np.random.default_rng(1).uniform(0, 1, (images, 32, 32, 3)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", choices=["demo", "relu-bias"],
                        help="the trained demo model, or a random ReLU CNN with biases (MobileNetV2 weights=None is "
                        "exact at 7 points: nothing to estimate)")
    parser.add_argument("--images", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, str(HERE))
    import numpy as np

    import kerascope as ks

    if args.model == "relu-bias":
        model, x = relu_bias_model(args.images)
    else:
        from accuracy import build

        model, x = build(args.model, args.images)
    n = len(x)
    t = np.asarray(model(x)).argmax(axis=1)
    ref = ks.IntegratedGradients(model, steps=1025, method="riemann_trapezoid", batch_size=128).explain(x, t)
    ref = ref.attributions.reshape(n, -1).astype(np.float64)
    previous = None
    print(f"model={args.model} images={n}: per image, true relative L2 error / change since the previous grid")
    for steps in (7, 15, 31, 63, 127, 255):
        m = ks.IntegratedGradients(model, steps=steps, method="open_trapezoid", batch_size=128).explain(x, t)
        m = m.attributions.reshape(n, -1).astype(np.float64)
        true = np.linalg.norm(m - ref, axis=1) / np.linalg.norm(ref, axis=1)
        if previous is not None:
            change = np.linalg.norm(m - previous, axis=1) / np.linalg.norm(m, axis=1)
            ratio = np.where(change > 1e-9, true / np.maximum(change, 1e-300), np.nan)  # no change: no estimate
            print(f"  {steps:>4} points: true {np.round(true, 4).tolist()}  change {np.round(change, 4).tolist()}  "
                  f"true/change {np.round(ratio, 2).tolist()}", flush=True)
        previous = m


if __name__ == "__main__":
    main()
