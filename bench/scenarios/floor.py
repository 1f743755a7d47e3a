"""kerascope vs the compiled floor (hand-written ``tf.function`` + ``GradientTape`` passes), and memory.

``floor-METHOD-MODEL-N``: ``METHOD(...).explain`` on ``N`` images against the floor's passes for
it (``bench/floor.py``), alternating, median seconds, the ratio and its per-round spread, and
the peak RSS of one call. ``memory-METHOD-MODEL-N``: the peak RSS for ``N`` and ``2N`` images at
the same ``batch_size`` (bounded memory: the ratio stays near 1). Settings with ``--set``:
``chunk``, ``samples``, ``steps``, ``background``, ``masks``, ``occlusion_window``,
``score_channels``, ``lrp_composites`` (comma-separated), ``fuse``, ``jit``, ``cpu_time``, ``size``.

    python -m bench 'floor-*-demo-8'
    python -m bench 'floor-*-mobilenetv2-8' --set cpu_time=1 --set size=160
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any

from bench.floor import METHODS, Baselines, Settings, cases_for, memory_check, run_case
from bench.models import build_model, random_images
from bench.scenario import Options, scenario, settings
from bench.timing import one_tf_thread

#: the numbers of images of each model's rows
IMAGES = {"demo": (1, 8, 64), "mobilenetv2": (1, 8), "resnet50": (1, 8), "vgg16": (8,)}
QUICK = {"samples": 4, "steps": 4, "masks": 8, "background": 2}


@lru_cache(maxsize=2)
def _model(name: str, size: int) -> Any:
    return build_model(name, size)


def _setup(model_name: str, n: int, options: Options) -> tuple[Settings, Any, Any, Any, Any]:
    import numpy as np

    from kerascope.core.inputs import Inputs
    from kerascope.methods.cam import default_layer

    chosen = settings(Settings, options, **(QUICK if options.quick else {}))
    if chosen.cpu_time:
        one_tf_thread()
    model = _model(model_name, chosen.size)
    x = random_images(model, n)
    targets = (np.arange(n) % int(model.outputs[0].shape[-1])).astype(np.int32)
    # one layer for the CAMs and their floor, found on these images (another input can give another layer)
    cam_layer = default_layer(model, Inputs(x[:1]))
    return chosen, model, x, targets, cam_layer


def floor(method: str, model_name: str, n: int, options: Options) -> list[dict]:
    """kerascope's ``method`` against its compiled floor on ``n`` images of ``model_name``."""
    chosen, model, x, targets, cam_layer = _setup(model_name, n, options)
    base = Baselines(model, cam_layer, chosen.jit)
    rows = []
    for case in cases_for(method, model, x, cam_layer, chosen):
        result = run_case(case, base, x, targets, chosen, options.repeats)
        rows.append({"method": case.name, "model": model_name, "images": n, "jit": chosen.jit, **result,
                     "note": case.note})
    return rows


def memory(method: str, model_name: str, n: int, options: Options) -> list[dict]:
    """Peak RSS of ``method`` on ``n`` and ``2n`` images at the same ``batch_size``."""
    chosen, model, x, targets, cam_layer = _setup(model_name, n, options)
    return [{"method": case.name, "model": model_name, "images": n, "chunk": chosen.chunk,
             **memory_check(case, x, targets), "note": case.note}
            for case in cases_for(method, model, x, cam_layer, chosen)]


for _model_name, _counts in IMAGES.items():
    for _method in METHODS:
        for _n in _counts:
            scenario(f"floor-{_method}-{_model_name}-{_n}",
                     f"{_method} vs the compiled floor, {_model_name}, {_n} images",
                     tags=("floor", _method, _model_name), backend="tensorflow")(
                partial(floor, _method, _model_name, _n))
        scenario(f"memory-{_method}-{_model_name}-8", f"{_method} peak RSS, 8 vs 16 images, {_model_name}",
                 tags=("memory", _method, _model_name), backend="tensorflow")(
            partial(memory, _method, _model_name, 8))
