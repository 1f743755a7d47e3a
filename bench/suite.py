"""kerascope vs hand-written compiled TensorFlow: every registered method, one process.

For each (model, number of images, method) this times ``Method(...).explain``
and a hand-written baseline that performs exactly the passes the method needs
(forward+backward with ``tf.GradientTape`` inside ``tf.function``, or forward
only), in the same chunks of ``--chunk`` rows, and prints:

* the median seconds over ``--repeats`` runs after two warm-up runs, kerascope
  and baseline alternating (A B, then B A, ...) so that load from other
  processes hits both alike;
* the ratio kerascope / baseline, and the spread of the per-round ratios
  (min..max), which shows how noisy the machine was;
* peak memory: the process's resident-set high-water mark (``VmHWM`` from
  ``/proc/self/status``, reset before each measured call by writing ``5`` to
  ``/proc/self/clear_refs``), absolute and as the increase over the RSS just
  before the call. ``tracemalloc`` cannot see TensorFlow's allocations.

The baseline is the floor, not a competing implementation: its chunks are
fixed tensors built once, so it pays nothing for building noisy copies, path
points, masks or occluded copies, nor for moving results back to numpy
beyond one ``.numpy()`` per chunk.

``--memory`` additionally runs each chosen method on ``images`` and
``2 * images`` images at the same ``--chunk`` and reports the peak-memory
ratio (target: <= 1.10). ``--jit`` adds XLA (``jit_compile=True``) rows for
kerascope and the baseline.

Examples:
    python bench/suite.py --models demo --images 1 8 64
    python bench/suite.py --models mobilenetv2 --images 8 --methods saliency gradcam guided_backprop
    python bench/suite.py --models resnet50 --images 8 --methods smoothgrad integrated_gradients --samples 16
    python bench/suite.py --models demo --images 8 --memory --methods saliency smoothgrad occlusion scorecam
    python bench/suite.py --models demo --images 8 --cpu-time --methods saliency lrp deeplift deeplift_shap
    python bench/suite.py --models mobilenetv2 --size 160 --images 8 --cpu-time --methods deeplift deeplift_shap --fuse
    python bench/suite.py --models resnet50 --size 64 --images 8 --cpu-time --methods saliency lrp deeplift
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from timing import rotating_times  # noqa: E402  (bench/timing.py)

import kerascope as ks  # noqa: E402
from kerascope.core.inputs import Inputs  # noqa: E402
from kerascope.methods import registry  # noqa: E402
from kerascope.methods.cam import default_layer  # noqa: E402

GRADIENT = ("saliency", "gradient_x_input", "guided_backprop", "deconvnet")
CAM = ("gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "eigencam")
NOISE = ("smoothgrad", "smoothgrad_squared", "vargrad")
PERTURBATION_CAM = ("scorecam", "ablationcam")


# ----------------------------------------------------------------- memory
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> int:
    """Reset the RSS high-water mark (Linux >= 4.0); return the current RSS in KiB."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    return _rss_kib("VmRSS")


def peak_kib() -> int:
    """The RSS high-water mark since the last :func:`reset_peak`, in KiB."""
    return _rss_kib("VmHWM")


# ----------------------------------------------------------------- models
def build_model(name: str, size: int = 224) -> keras.Model:
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None, classifier_activation=None, input_shape=(size, size, 3))
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, classifier_activation=None, input_shape=(size, size, 3))
    if name == "vgg16":  # the first seed's model: five 2x2 max poolings (DeepLIFT's max-pool rule)
        return keras.applications.VGG16(weights=None, classifier_activation=None, input_shape=(size, size, 3))
    if name == "demo":
        from kerascope.data import demo_model_path

        return ks.load_model(demo_model_path())
    raise SystemExit(f"Unknown model. Received: --models {name!r}. Expected mobilenetv2, resnet50, vgg16 or demo.")


def few_channel_layer(model: keras.Model, limit: int) -> keras.Layer:
    """The last layer with a rank-4 output of at most ``limit`` channels (for Score-/Ablation-CAM)."""
    found = None
    for layer in model.layers:
        shape = getattr(layer, "output", None)
        shape = getattr(shape, "shape", None)
        if shape is not None and len(shape) == 4 and shape[-1] is not None and shape[-1] <= limit:
            found = layer
    if found is None:
        raise SystemExit(f"No rank-4 layer with at most {limit} channels in {model.name}.")
    return found


# --------------------------------------------------------------- baselines
class Baselines:
    """Hand-written compiled passes on one model: input gradient, layer gradient, forward."""

    def __init__(self, model: keras.Model, cam_layer: keras.Layer, jit: bool) -> None:
        shape = tuple(model.inputs[0].shape[1:])
        spec = [tf.TensorSpec((None, *shape), tf.float32), tf.TensorSpec((None,), tf.int32)]
        features = keras.Model(model.inputs, [cam_layer.output, model.outputs[0]])
        self.shape = shape

        @tf.function(input_signature=spec, jit_compile=jit)
        def grad(x: tf.Tensor, t: tf.Tensor) -> Any:
            with tf.GradientTape() as tape:
                tape.watch(x)
                score = tf.gather(model(x, training=False), t, axis=1, batch_dims=1)
                total = tf.reduce_sum(score)
            return tape.gradient(total, x), score

        @tf.function(input_signature=spec, jit_compile=jit)
        def layer_grad(x: tf.Tensor, t: tf.Tensor) -> Any:
            with tf.GradientTape() as tape:
                acts, out = features(x, training=False)
                tape.watch(acts)
                score = tf.gather(out, t, axis=1, batch_dims=1)
                total = tf.reduce_sum(score)
            return acts, tape.gradient(total, acts), score

        @tf.function(input_signature=spec, jit_compile=jit)
        def forward(x: tf.Tensor, t: tf.Tensor) -> Any:
            return tf.gather(model(x, training=False), t, axis=1, batch_dims=1)

        self.kinds = {"grad": grad, "layer_grad": layer_grad, "forward": forward}
        self._chunks: dict[int, tuple[tf.Tensor, tf.Tensor]] = {}

    def chunk(self, rows: int) -> tuple[tf.Tensor, tf.Tensor]:
        if rows not in self._chunks:
            x = np.random.default_rng(rows).uniform(0, 1, (rows, *self.shape)).astype(np.float32)
            self._chunks[rows] = (tf.constant(x), tf.zeros((rows,), tf.int32))
        return self._chunks[rows]

    def plan(self, passes: list[tuple[str, int]], chunk: int) -> Callable[[], None]:
        """A callable running ``passes`` = [(kind, rows), ...], each in chunks of ``chunk`` rows."""
        calls = []
        for kind, rows in passes:
            sizes = [chunk] * (rows // chunk) + ([rows % chunk] if rows % chunk else [])
            calls += [(self.kinds[kind], self.chunk(size)) for size in sizes]

        def run() -> None:
            for fn, (x, t) in calls:
                tf.nest.map_structure(lambda v: v.numpy(), fn(x, t))

        return run


# ------------------------------------------------------------------ cases
@dataclass
class Case:
    name: str
    make: Callable[[], Any]  # -> Method
    passes: list[tuple[str, int]]  # the baseline: [(kind, rows)]
    note: str = ""


def cases_for(
    model: keras.Model, n: int, args: argparse.Namespace, x: np.ndarray, cam_layer: keras.Layer
) -> list[Case]:
    """The cases for ``n`` images ``x``; the CAMs and the ``layer_grad`` floor both use ``cam_layer``."""
    common = {"batch_size": args.chunk, "jit_compile": args.jit_now}
    few = few_channel_layer(model, args.score_channels)
    channels = int(few.output.shape[-1])
    s, steps = args.samples, args.steps
    size = x.shape[1:3]
    window = args.occlusion_window
    positions = int(np.prod([len(ks.methods.perturbation.window_starts(length, min(window, length), window))
                             for length in size]))
    cases: list[Case] = []
    for name in registry.available():
        cls = registry.get(name)
        if name in GRADIENT:
            cases.append(Case(name, lambda c=cls: c(model, **common), [("grad", n)]))
        elif name in CAM:
            cases.append(Case(name, lambda c=cls: c(model, layer=cam_layer, **common), [("layer_grad", n)],
                              cam_layer.name))
        elif name == "guided_gradcam":
            cases.append(Case(name, lambda c=cls: c(model, layer=cam_layer, **common),
                              [("layer_grad", n), ("grad", n)], cam_layer.name))
        elif name in NOISE:
            cases.append(Case(name, lambda c=cls: c(model, samples=s, **common),
                              [("forward", n), ("grad", n * s)], f"samples={s}"))
        elif name == "integrated_gradients":
            cases.append(Case(name, lambda c=cls: c(model, steps=steps, **common),
                              [("forward", 2 * n), ("grad", n * steps)], f"steps={steps}"))
        elif name == "expected_gradients":
            background = np.random.default_rng(1).uniform(0, 1, (8, *x.shape[1:])).astype(np.float32)
            cases.append(Case(name, lambda c=cls, b=background: c(model, samples=s, baseline=b, **common),
                              [("forward", n), ("grad", n * s)], f"samples={s}"))
        elif name == "deeplift":
            # the floor: one forward + backward pass of the N inputs (ours: N + 1 rows, the
            # inputs and the one zeros reference they share)
            cases.append(Case(name, lambda c=cls: c(model, **common), [("grad", n)], "zeros reference"))
            if args.fuse:
                cases.append(Case(name, lambda c=cls: c(model, fuse_rules=True, **common), [("grad", n)],
                                  "zeros reference, fuse_rules=True"))
        elif name == "deeplift_shap":
            rows = args.background
            background = np.random.default_rng(2).uniform(0, 1, (rows, *x.shape[1:])).astype(np.float32)
            cases.append(Case(name, lambda c=cls, b=background: c(model, baseline=b, **common),
                              [("grad", n * rows)], f"{rows} background rows"))
            if args.fuse:
                cases.append(Case(name, lambda c=cls, b=background: c(model, baseline=b, fuse_rules=True, **common),
                                  [("grad", n * rows)], f"{rows} background rows, fuse_rules=True"))
        elif name == "lrp":  # one forward + backward per chunk; each rule term adds one evaluation of its layer
            for composite in args.lrp_composites:
                cases.append(Case(name, lambda c=cls, k=composite: c(model, composite=k, **common), [("grad", n)],
                                  composite))
        elif name == "scorecam":
            cases.append(Case(name, lambda c=cls: c(model, layer=few, **common),
                              [("layer_grad", n), ("forward", n * channels)], f"{few.name}: {channels} ch"))
        elif name == "ablationcam":
            cases.append(Case(name, lambda c=cls: c(model, layer=few, **common),
                              [("layer_grad", n), ("forward", n * (channels + 1))], f"{few.name}: {channels} ch"))
        elif name == "occlusion":
            cases.append(Case(name, lambda c=cls: c(model, window=window, **common),
                              [("forward", n), ("forward", n * positions)], f"window={window}: {positions} pos"))
        elif name == "rise":
            cases.append(Case(name, lambda c=cls: c(model, masks=args.masks, **common),
                              [("forward", n), ("forward", n * args.masks)], f"masks={args.masks}"))
        else:
            print(f"  (no baseline written for {name!r}; skipped)", file=sys.stderr)
    if args.methods:
        wanted = {registry.get(m).name for m in args.methods}
        cases = [c for c in cases if c.name in wanted]
    return cases


def run_case(case: Case, baselines: Baselines, x: np.ndarray, targets: np.ndarray, args: argparse.Namespace) -> dict:
    method = case.make()
    ours = lambda: method.explain(x, targets)  # noqa: E731
    floor = baselines.plan(case.passes, args.chunk)
    for _ in range(2):  # warm-up: trace and compile both
        ours()
        floor()
    before = reset_peak()
    ours()
    peak = peak_kib()
    clock = time.process_time if args.cpu_time else time.perf_counter
    times = rotating_times({"ours": ours, "base": floor}, args.repeats, clock)
    ratios = [a / b for a, b in zip(times["ours"], times["base"])]
    ours_med, base_med = statistics.median(times["ours"]), statistics.median(times["base"])
    return {
        "ours": ours_med, "base": base_med, "ratio": ours_med / base_med,
        "spread": (min(ratios), max(ratios)), "peak_mib": peak / 1024, "delta_mib": (peak - before) / 1024,
    }


def memory_check(case: Case, x: np.ndarray, targets: np.ndarray) -> tuple[float, float, float, float]:
    """Peak RSS (MiB) and its increase over the RSS before the call, for ``x`` and for ``x`` twice."""
    method = case.make()
    double_x, double_t = np.concatenate([x, x]), np.concatenate([targets, targets])
    method.explain(x, targets)
    method.explain(double_x, double_t)  # warm-up both shapes (last chunk sizes may differ)
    out = []
    for xs, ts in ((x, targets), (double_x, double_t)):
        before = reset_peak()
        method.explain(xs, ts)
        peak = peak_kib()
        out += [peak / 1024, (peak - before) / 1024]
    return out[0], out[1], out[2], out[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["demo", "mobilenetv2", "resnet50"])
    parser.add_argument("--images", nargs="+", type=int, default=None,
                        help="numbers of images (default: 1 8, plus 64 for the demo model)")
    parser.add_argument("--methods", nargs="*", default=None, help="registered names (default: all)")
    parser.add_argument("--chunk", type=int, default=32, help="rows per compiled call (batch_size)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side after 2 warm-ups")
    parser.add_argument("--samples", type=int, default=16, help="SmoothGrad/VarGrad/ExpectedGradients samples")
    parser.add_argument("--background", type=int, default=4, help="DeepLiftShap background rows")
    parser.add_argument("--steps", type=int, default=16, help="IntegratedGradients steps")
    parser.add_argument("--masks", type=int, default=64, help="RISE masks")
    parser.add_argument("--occlusion-window", type=int, default=None,
                        help="Occlusion window (default: a quarter of the image side)")
    parser.add_argument("--score-channels", type=int, default=64,
                        help="Score-/Ablation-CAM use the last layer with at most this many channels")
    parser.add_argument("--jit", action="store_true", help="also run everything with jit_compile=True (XLA)")
    parser.add_argument("--lrp-composites", nargs="+", default=["epsilon_plus"],
                        help="LRP composites, one row each (default: epsilon_plus)")
    parser.add_argument("--fuse", action="store_true",
                        help="also run DeepLIFT / DeepLiftShap with fuse_rules=True (one XLA kernel per rule)")
    parser.add_argument("--memory", action="store_true", help="peak memory for N and 2N images at fixed --chunk")
    parser.add_argument("--size", type=int, default=224, help="input side of mobilenetv2 / resnet50 (weights=None)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one TensorFlow compute thread and CPU seconds (time.process_time) instead of wall "
                             "time: the work done, steady on a loaded shared machine")
    args = parser.parse_args()
    if args.cpu_time:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)

    load = os.getloadavg()
    print(f"tf={tf.__version__} keras={keras.__version__} cpus={os.cpu_count()} "
          f"load_avg={load[0]:.1f},{load[1]:.1f},{load[2]:.1f} chunk={args.chunk} repeats={args.repeats}"
          f"{' clock=cpu-time, 1 thread' if args.cpu_time else ''}")
    header = (f"{'model':<12}{'imgs':>5} {'method':<20}{'jit':>4} {'ours s':>9} {'base s':>9} "
              f"{'ratio':>6} {'spread':>12} {'peak MiB':>9} {'+MiB':>7}  note")
    print(header)
    memory_rows = []
    for model_name in args.models:
        model = build_model(model_name, args.size)
        shape = tuple(model.inputs[0].shape[1:])
        classes = int(model.outputs[0].shape[-1])
        images = args.images or ([1, 8, 64] if model_name == "demo" else [1, 8])
        for jit in [False, True] if args.jit else [False]:
            args.jit_now = jit
            if args.occlusion_window is None:
                args.occlusion_window = max(1, shape[0] // 4)
            for n in images:
                x = np.random.default_rng(n).uniform(0, 1, (n, *shape)).astype(np.float32)
                targets = (np.arange(n) % classes).astype(np.int32)
                # one layer for the CAMs and their floor: found on these images (a layer found on other
                # inputs can differ: the demo model once got conv2b on random images and conv3b on zeros,
                # so Grad-CAM's gradient at conv2b was timed against a floor differentiating to conv3b)
                cam_layer = default_layer(model, Inputs(x[:1]))
                baselines = Baselines(model, cam_layer, jit)
                for case in cases_for(model, n, args, x, cam_layer):
                    try:
                        r = run_case(case, baselines, x, targets, args)
                    except Exception as error:  # report and carry on with the other methods
                        print(f"{model_name:<12}{n:>5} {case.name:<20}{'xla' if jit else '':>4} "
                              f"FAILED: {type(error).__name__}: {str(error)[:200]}")
                        continue
                    print(f"{model_name:<12}{n:>5} {case.name:<20}{'xla' if jit else '':>4} {r['ours']:9.3f} "
                          f"{r['base']:9.3f} {r['ratio']:6.3f} {r['spread'][0]:5.2f}..{r['spread'][1]:<5.2f} "
                          f"{r['peak_mib']:9.0f} {r['delta_mib']:7.0f}  {case.note}", flush=True)
                    if args.memory and not jit:
                        memory_rows.append((model_name, n, case.name, *memory_check(case, x, targets)))
    if memory_rows:
        print("\nPeak RSS, N vs 2N images at --chunk", args.chunk, "(VmHWM reset before each call)")
        print(f"{'model':<12}{'N':>5} {'method':<20}{'peak N':>9}{'+N':>7}{'peak 2N':>9}{'+2N':>7}{'ratio':>7}")
        for model_name, n, name, p1, d1, p2, d2 in memory_rows:
            print(f"{model_name:<12}{n:>5} {name:<20}{p1:9.0f}{d1:7.0f}{p2:9.0f}{d2:7.0f}{p2 / p1:7.3f}")
    print(f"load_avg at end={','.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
