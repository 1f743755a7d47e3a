"""The compiled floor: hand-written TensorFlow passes that each method needs, and kerascope timed against them.

For a method on ``n`` images the floor performs exactly the passes the method needs
(forward + backward with ``tf.GradientTape`` inside ``tf.function``, a layer gradient, or
forward only), in the same chunks of ``chunk`` rows. It is the floor, not a competing
implementation: its chunks are fixed tensors built once, so it pays nothing for building
noisy copies, path points, masks or occluded copies, nor for moving results back to numpy
beyond one ``.numpy()`` per chunk.

Example::

    base = Baselines(model, cam_layer, jit=False)
    run = base.plan([("forward", 8), ("grad", 8 * 16)], chunk=32)  # SmoothGrad(samples=16) on 8 images
    run()
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.models import few_channel_layer
from bench.timing import cpu_clock, peak_kib, reset_peak, rotating_times

GRADIENT = ("saliency", "gradient_x_input", "guided_backprop", "deconvnet")
CAM = ("gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "eigencam")
NOISE = ("smoothgrad", "smoothgrad_squared", "vargrad")
#: every method with a floor written for it, in the order of the tables
METHODS = (*GRADIENT, *CAM, "guided_gradcam", *NOISE, "integrated_gradients", "expected_gradients", "deeplift",
           "deeplift_shap", "lrp", "scorecam", "ablationcam", "occlusion", "rise")


@dataclass(frozen=True)
class Settings:
    """The parameters of the floor comparison (``python -m bench ... --set samples=32``)."""

    chunk: int = 32
    samples: int = 16
    steps: int = 16
    background: int = 4
    masks: int = 64
    occlusion_window: int | None = None  # default: a quarter of the image side
    score_channels: int = 64
    lrp_composites: tuple[str, ...] = ("epsilon_plus",)
    fuse: bool = False
    jit: bool = False
    cpu_time: bool = False  # one TensorFlow thread and CPU seconds: the work done, steady on a loaded machine
    size: int = 224  # input side of the Keras applications (the demo model is 64 px)


class Baselines:
    """Hand-written compiled passes on one model: input gradient, layer gradient, forward."""

    def __init__(self, model: Any, cam_layer: Any, jit: bool) -> None:
        import keras
        import tensorflow as tf

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
        self._chunks: dict[int, tuple[Any, Any]] = {}

    def chunk(self, rows: int) -> tuple[Any, Any]:
        """The fixed input tensors of a chunk of ``rows`` rows (built once)."""
        import numpy as np
        import tensorflow as tf

        if rows not in self._chunks:
            x = np.random.default_rng(rows).uniform(0, 1, (rows, *self.shape)).astype(np.float32)
            self._chunks[rows] = (tf.constant(x), tf.zeros((rows,), tf.int32))
        return self._chunks[rows]

    def plan(self, passes: list[tuple[str, int]], chunk: int) -> Callable[[], None]:
        """A callable running ``passes`` = [(kind, rows), ...], each in chunks of ``chunk`` rows."""
        import tensorflow as tf

        calls = []
        for kind, rows in passes:
            sizes = [chunk] * (rows // chunk) + ([rows % chunk] if rows % chunk else [])
            calls += [(self.kinds[kind], self.chunk(size)) for size in sizes]

        def run() -> None:
            for fn, (x, t) in calls:
                tf.nest.map_structure(lambda v: v.numpy(), fn(x, t))

        return run


@dataclass
class Case:
    """One method set-up and the floor's passes for it: ``[(kind, rows)]``."""

    name: str
    make: Callable[[], Any]  # -> Method
    passes: list[tuple[str, int]]
    note: str = ""


def cases_for(method: str, model: Any, x: Any, cam_layer: Any, settings: Settings) -> list[Case]:
    """The cases of ``method`` on images ``x``; the CAMs and the ``layer_grad`` floor both use ``cam_layer``."""
    import numpy as np

    from kerascope.methods import registry
    from kerascope.methods.perturbation import window_starts

    n = len(x)
    common = {"batch_size": settings.chunk, "jit_compile": settings.jit}
    cls = registry.get(method)
    s, steps = settings.samples, settings.steps
    window = settings.occlusion_window or max(1, x.shape[1] // 4)
    if method in GRADIENT:
        return [Case(method, lambda: cls(model, **common), [("grad", n)])]
    if method in CAM:
        return [Case(method, lambda: cls(model, layer=cam_layer, **common), [("layer_grad", n)], cam_layer.name)]
    if method == "guided_gradcam":
        return [Case(method, lambda: cls(model, layer=cam_layer, **common), [("layer_grad", n), ("grad", n)],
                     cam_layer.name)]
    if method in NOISE:
        return [Case(method, lambda: cls(model, samples=s, **common), [("forward", n), ("grad", n * s)],
                     f"samples={s}")]
    if method == "integrated_gradients":
        return [Case(method, lambda: cls(model, steps=steps, **common), [("forward", 2 * n), ("grad", n * steps)],
                     f"steps={steps}")]
    if method == "expected_gradients":
        background = np.random.default_rng(1).uniform(0, 1, (8, *x.shape[1:])).astype(np.float32)
        return [Case(method, lambda: cls(model, samples=s, baseline=background, **common),
                     [("forward", n), ("grad", n * s)], f"samples={s}")]
    if method == "deeplift":  # one forward + backward of the N inputs (ours: N + 1 rows, with the reference)
        cases = [Case(method, lambda: cls(model, **common), [("grad", n)], "zeros reference")]
        if settings.fuse:
            cases.append(Case(method, lambda: cls(model, fuse_rules=True, **common), [("grad", n)],
                              "zeros reference, fuse_rules=True"))
        return cases
    if method == "deeplift_shap":
        rows = settings.background
        background = np.random.default_rng(2).uniform(0, 1, (rows, *x.shape[1:])).astype(np.float32)
        cases = [Case(method, lambda: cls(model, baseline=background, **common), [("grad", n * rows)],
                      f"{rows} background rows")]
        if settings.fuse:
            cases.append(Case(method, lambda: cls(model, baseline=background, fuse_rules=True, **common),
                              [("grad", n * rows)], f"{rows} background rows, fuse_rules=True"))
        return cases
    if method == "lrp":  # one forward + backward per chunk; each rule term adds one evaluation of its layer
        return [Case(method, lambda k=k: cls(model, composite=k, **common), [("grad", n)], k)
                for k in settings.lrp_composites]
    if method in ("scorecam", "ablationcam"):
        few = few_channel_layer(model, settings.score_channels)
        channels = int(few.output.shape[-1])
        masked = channels if method == "scorecam" else channels + 1
        return [Case(method, lambda: cls(model, layer=few, **common), [("layer_grad", n), ("forward", n * masked)],
                     f"{few.name}: {channels} ch")]
    if method == "occlusion":
        positions = int(np.prod([len(window_starts(side, min(window, side), window)) for side in x.shape[1:3]]))
        return [Case(method, lambda: cls(model, window=window, **common), [("forward", n), ("forward", n * positions)],
                     f"window={window}: {positions} pos")]
    if method == "rise":
        return [Case(method, lambda: cls(model, masks=settings.masks, **common),
                     [("forward", n), ("forward", n * settings.masks)], f"masks={settings.masks}")]
    raise ValueError(f"No floor written for this method. Received: method={method!r}. Available: {METHODS}.")


def run_case(case: Case, baselines: Baselines, x: Any, targets: Any, settings: Settings, repeats: int) -> dict:
    """kerascope and its floor alternating: medians, the ratio and its spread, and kerascope's peak RSS."""
    method = case.make()
    ours = lambda: method.explain(x, targets)  # noqa: E731
    floor = baselines.plan(case.passes, settings.chunk)
    for _ in range(2):  # warm-up: trace and compile both
        ours()
        floor()
    before = reset_peak()
    ours()
    peak = peak_kib()
    times = rotating_times({"ours": ours, "base": floor}, repeats, cpu_clock(settings.cpu_time))
    ratios = [a / b for a, b in zip(times["ours"], times["base"], strict=True)]
    ours_med, base_med = statistics.median(times["ours"]), statistics.median(times["base"])
    return {"ours_s": ours_med, "floor_s": base_med, "ratio": ours_med / base_med, "ratio_min": min(ratios),
            "ratio_max": max(ratios), "peak_mib": peak / 1024, "delta_mib": (peak - before) / 1024}


def memory_check(case: Case, x: Any, targets: Any) -> dict:
    """Peak RSS (MiB) and its increase over the RSS before the call, for ``x`` and for ``x`` twice."""
    import numpy as np

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
    return {"peak_n_mib": out[0], "delta_n_mib": out[1], "peak_2n_mib": out[2], "delta_2n_mib": out[3],
            "peak_ratio": out[2] / out[0]}
