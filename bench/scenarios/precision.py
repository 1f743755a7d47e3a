"""Reduced precision: speed and attribution error of ``precision="bfloat16"`` against float32.

``precision-METHOD-MODEL`` (Grad-CAM++, Score-CAM, RISE and KernelSHAP on the demo model only;
``--set method=NAME`` times any registered method instead): methods with a ``seed`` get seed 0 on both sides, so noise and masks
are identical and only the arithmetic differs. Models: the trained demo model (64 px, its own
images), MobileNetV2 and ResNet50 (``weights=None``, 160 px, images uniform in [0, 1]); targets
are the predicted classes.

* error: each image's relative L2 distance ``|m_r - m_32| / |m_32|`` to the float32 map and the
  Spearman rank correlation of the two maps; the worst image of each;
* speed: float32 and reduced-precision runs alternate in one process (order rotating each round)
  after one warm-up each; ``ratio`` is the median of the per-round ``reduced / float32`` times
  (< 1: reduced precision is faster), ``ratio_min`` / ``ratio_max`` their spread.

``recommend`` is true only where the worst relative L2 is <= 1% (``threshold``). Settings
(``--set``): ``images`` (4), ``size`` (160), ``steps`` (16), ``samples`` (16), ``chunk`` (32),
``precision`` (``bfloat16``; ``float16`` is meant for GPUs), ``threshold`` (0.01).

    python -m bench 'precision-*' --repeats 3
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.scenario import Options, scenario, settings
from bench.timing import rotating_times, summary

METHODS = ("saliency", "gradcam", "integrated_gradients", "smoothgrad")
#: the forward-only methods, on the demo model only (their default mask counts take minutes per call on
#: the larger networks on 2 cores)
FORWARD_ONLY = ("gradcam_plusplus", "scorecam", "rise", "kernel_shap")


@dataclass(frozen=True)
class PrecisionSettings:
    images: int = 4
    size: int = 160
    steps: int = 16
    samples: int = 16
    chunk: int = 32
    precision: str = "bfloat16"
    threshold: float = 0.01
    method: str | None = None  # another registered method in this scenario's place


def build(name: str, images: int, size: int) -> tuple[Any, Any]:
    """The model and ``images`` inputs: the trained demo model with its images, or a ``weights=None`` network."""
    import keras

    from bench.models import build_model, demo_images, random_images

    if name == "demo":
        return build_model("demo"), demo_images(images)
    keras.utils.set_random_seed(0)
    model = build_model(name, size)
    return model, random_images(model, images, seed=0)


def ranks(values: Any) -> Any:
    """Ranks of each row's values (ties broken by position; continuous maps have almost none)."""
    import numpy as np

    order = np.argsort(values, axis=1)
    out = np.empty_like(order, dtype=np.float64)
    np.put_along_axis(out, order, np.arange(values.shape[1], dtype=np.float64)[None], axis=1)
    return out


def errors(reference: Any, reduced: Any) -> tuple[float, float]:
    """(worst relative L2, worst Spearman rank correlation) over the images."""
    import numpy as np

    a = np.asarray(reference, np.float64).reshape(len(reference), -1)
    b = np.asarray(reduced, np.float64).reshape(len(reduced), -1)
    rel = np.linalg.norm(b - a, axis=1) / np.maximum(np.linalg.norm(a, axis=1), 1e-30)
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean(axis=1, keepdims=True)
    rb -= rb.mean(axis=1, keepdims=True)
    rho = (ra * rb).sum(axis=1) / np.sqrt((ra**2).sum(axis=1) * (rb**2).sum(axis=1))
    return float(rel.max()), float(rho.min())


def compare(method: str, model_name: str, options: Options) -> list[dict]:
    """float32 vs reduced precision for ``method`` on ``model_name``: one row."""
    import keras

    from kerascope.methods import registry

    quick = {"images": 2, "size": 64, "steps": 4, "samples": 4} if options.quick else {}
    args = settings(PrecisionSettings, options, **quick)
    method = args.method or method
    model, x = build(model_name, args.images, args.size)
    targets = keras.ops.convert_to_numpy(keras.ops.argmax(model(x), axis=-1)).astype(int)
    params = {"integrated_gradients": {"steps": args.steps}, "smoothgrad": {"samples": args.samples}}
    common = {**params.get(method, {}), "batch_size": args.chunk}
    if "seed" in registry.accepted_parameters(registry.get(method)):
        common["seed"] = 0  # the same noise / masks on both sides: only the arithmetic differs
    explainers = {"float32": registry.build(method, model, common),
                  "reduced": registry.build(method, model, {**common, "precision": args.precision})}
    out: dict[str, Any] = {}

    def runner(label: str) -> Any:
        def run() -> None:
            out[label] = explainers[label].explain(x, targets).attributions

        return run

    runners = {label: runner(label) for label in explainers}
    for run in runners.values():  # warm-up: tracing, first-call costs
        run()
    rel, rho = errors(out["float32"], out["reduced"])
    stats = summary(rotating_times(runners, options.repeats), "float32")
    return [{"model": model_name, "method": method, "precision": args.precision,
             "float32_s": stats["float32"]["median_s"], "reduced_s": stats["reduced"]["median_s"],
             "ratio": stats["reduced"]["ratio"], "ratio_min": stats["reduced"]["ratio_min"],
             "ratio_max": stats["reduced"]["ratio_max"], "worst_rel_l2": rel, "worst_spearman": rho,
             "recommend": rel <= args.threshold}]


for _model_name in ("demo", "mobilenetv2", "resnet50"):
    for _method in METHODS + (FORWARD_ONLY if _model_name == "demo" else ()):
        scenario(f"precision-{_method}-{_model_name}", f"{_method}: bfloat16 vs float32 speed and error, {_model_name}",
                 tags=("precision", _method, _model_name))(partial(compare, _method, _model_name))
