"""Reduced precision (issue 18, item 3): speed and attribution error of ``precision="bfloat16"`` vs float32.

For Saliency, Grad-CAM, Integrated Gradients and SmoothGrad by default (any registered method with
``--methods``; methods with a ``seed`` get seed 0 on both sides, so noise and masks are identical and
only the arithmetic differs) on the trained demo model (64 px, its own images),
MobileNetV2 and ResNet50 (``weights=None``, 160 px, images uniform in [0, 1]):

* error: each image's relative L2 distance ``|m_r - m_32| / |m_32|`` to the float32 map and the
  Spearman rank correlation of the two maps; the worst image of each is printed;
* speed: float32 and reduced-precision runs alternate in one process (``bench/timing.py``, order
  rotating each round) after one warm-up each (tracing); ``ratio`` is the median of the per-round
  ``reduced / float32`` times (< 1: reduced precision is faster), ``spread`` their min..max.

``recommend`` says ``yes`` only where the worst relative L2 is <= 1% (``--threshold``).

    python bench/precision.py --models demo mobilenetv2 resnet50 --images 4 --repeats 3
    python bench/precision.py --models demo --precision float16   # float16: meant for GPUs
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from timing import rotating_times  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods import registry  # noqa: E402


def build(name: str, images: int, size: int) -> tuple[keras.Model, np.ndarray]:
    """The model and ``images`` inputs: the trained demo model with its images, or a ``weights=None`` network."""
    if name == "demo":
        from kerascope.data import demo_images, demo_model_path
        from kerascope.io.images import load_images

        model = ks.load_model(demo_model_path())
        files = demo_images()
        files = [files[i % len(files)] for i in range(images)]
        return model, np.asarray(load_images(files, size=(64, 64)).inputs, np.float32)
    keras.utils.set_random_seed(0)
    shape = (size, size, 3)
    if name == "mobilenetv2":
        model = keras.applications.MobileNetV2(input_shape=shape, weights=None, classifier_activation=None)
    elif name == "resnet50":
        model = keras.applications.ResNet50(input_shape=shape, weights=None, classifier_activation=None)
    else:
        raise SystemExit(f"Unknown model. Received: --models {name!r}. Expected demo, mobilenetv2 or resnet50.")
    return model, np.random.default_rng(0).uniform(0, 1, (images, *shape)).astype(np.float32)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks of each row's values (ties broken by position; continuous maps have almost none)."""
    order = np.argsort(values, axis=1)
    out = np.empty_like(order, dtype=np.float64)
    np.put_along_axis(out, order, np.arange(values.shape[1], dtype=np.float64)[None], axis=1)
    return out


def errors(reference: np.ndarray, reduced: np.ndarray) -> tuple[float, float]:
    """(worst relative L2, worst Spearman rank correlation) over the images."""
    a = np.asarray(reference, np.float64).reshape(len(reference), -1)
    b = np.asarray(reduced, np.float64).reshape(len(reduced), -1)
    rel = np.linalg.norm(b - a, axis=1) / np.maximum(np.linalg.norm(a, axis=1), 1e-30)
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean(axis=1, keepdims=True)
    rb -= rb.mean(axis=1, keepdims=True)
    rho = (ra * rb).sum(axis=1) / np.sqrt((ra**2).sum(axis=1) * (rb**2).sum(axis=1))
    return float(rel.max()), float(rho.min())


def runner(out: dict[str, Any], label: str, explainer: Any, x: np.ndarray, targets: np.ndarray) -> Any:
    """A timed run: explain and keep the attributions in ``out[label]``."""

    def run() -> None:
        out[label] = explainer.explain(x, targets).attributions

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["demo", "mobilenetv2", "resnet50"])
    parser.add_argument("--methods", nargs="+", default=["saliency", "gradcam", "integrated_gradients", "smoothgrad"])
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--size", type=int, default=160, help="input side of MobileNetV2 / ResNet50")
    parser.add_argument("--steps", type=int, default=16, help="IntegratedGradients steps")
    parser.add_argument("--samples", type=int, default=16, help="SmoothGrad samples")
    parser.add_argument("--chunk", type=int, default=32, help="batch_size (rows per compiled call)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per side after one warm-up")
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--threshold", type=float, default=0.01, help="recommend where worst rel. L2 <= this")
    args = parser.parse_args()

    import tensorflow as tf  # versions only

    load = os.getloadavg()
    print(f"backend={keras.backend.backend()} tf={tf.__version__} keras={keras.__version__} cpus={os.cpu_count()} "
          f"load_avg={load[0]:.1f},{load[1]:.1f},{load[2]:.1f} images={args.images} chunk={args.chunk} "
          f"repeats={args.repeats} precision={args.precision}", flush=True)
    print(f"{'model':<12} {'method':<22}{'f32 s':>8}{'red s':>8}{'ratio':>7} {'spread':>12}"
          f"{'rel L2':>9}{'rank rho':>10}  recommend", flush=True)
    params = {"integrated_gradients": {"steps": args.steps}, "smoothgrad": {"samples": args.samples}}
    for model_name in args.models:
        model, x = build(model_name, args.images, args.size)
        targets = keras.ops.convert_to_numpy(keras.ops.argmax(model(x), axis=-1)).astype(int)  # predicted classes
        for method in args.methods:
            common = {**params.get(method, {}), "batch_size": args.chunk}
            if "seed" in registry.accepted_parameters(registry.get(method)):
                common["seed"] = 0  # the same noise / masks on both sides: only the arithmetic differs
            full = registry.build(method, model, common)
            reduced = registry.build(method, model, {**common, "precision": args.precision})
            out: dict[str, Any] = {}
            runners = {"float32": runner(out, "float32", full, x, targets),
                       "reduced": runner(out, "reduced", reduced, x, targets)}
            for run in runners.values():  # warm-up: tracing, first-call costs
                run()
            rel, rho = errors(out["float32"], out["reduced"])
            times = rotating_times(runners, args.repeats)
            ratios = [r / f for r, f in zip(times["reduced"], times["float32"])]
            verdict = "yes" if rel <= args.threshold else "no"
            print(f"{model_name:<12} {method:<22}{statistics.median(times['float32']):>8.3f}"
                  f"{statistics.median(times['reduced']):>8.3f}{statistics.median(ratios):>7.2f} "
                  f"{min(ratios):>5.2f}..{max(ratios):<5.2f}{100 * rel:>8.2f}%{rho:>10.4f}  {verdict}", flush=True)
    load = os.getloadavg()
    print(f"load_avg at the end={load[0]:.1f},{load[1]:.1f},{load[2]:.1f}")


if __name__ == "__main__":
    main()
