"""kerascope side by side with tf-keras-vis, Xplique and tf-explain (same model, inputs, parameters).

``peers-METHOD-MODEL`` runs in the peers' environment (``bench/peer_env.py``; the runner starts
it): for the method, every library takes its turn each round, the order rotating, after one
warm-up call each; a peer that fails at import or at call time is reported with its exception,
not skipped silently. A ``floor`` row times the hand-written compiled passes the method needs
(``bench/floor.py``, same chunks), and every library's time is also given as a multiple of it:
a peer within 1.15x of the floor cannot be beaten by much, and then being at the floor is what
counts.

All images get the same target class (tf-explain explains one class index per call). None of
the peers returns the target scores, so kerascope runs with ``scores=False`` (only SmoothGrad,
VarGrad and RISE spend a clean forward pass on ``Explanation.scores``: ``SCORES_ONLY_FORWARD``);
``--set with_scores=1`` adds a ``kerascope+scores`` row with its default. Parameters are matched:
the same number of noise samples, IG steps, occlusion window, Score-CAM layer.

Settings (``--set``): ``images`` (8), ``size`` (224), ``chunk`` (32), ``samples`` (16), ``steps``
(16), ``masks`` (64), ``grid`` (7), ``window`` (side / 4), ``cpu_time``, ``floor_without_scores``,
``with_scores``, ``with_unfolded``.

    python -m bench --setup-peers        # once: ~/.cache/kerascope/peers-venv ($KERASCOPE_PEERS_VENV)
    python -m bench 'peers-*-mobilenetv2' --set images=4 --set size=160 --set cpu_time=1
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.models import PEER_LAYERS, build_model
from bench.scenario import Options, scenario, settings
from bench.timing import cpu_clock, one_tf_thread, rotating_times, summary

#: methods whose clean forward pass (one row per input) serves only ``Explanation.scores`` (and
#: ``targets=None``), not the attribution: SmoothGrad / VarGrad average noisy rows, RISE masked rows
SCORES_ONLY_FORWARD = ("smoothgrad", "vargrad", "rise")
METHODS = ("saliency", "smoothgrad", "vargrad", "integrated_gradients", "gradcam", "gradcam_plusplus", "scorecam",
           "occlusion", "rise")


@dataclass(frozen=True)
class PeerSettings:
    """The matched parameters of every library."""

    images: int = 8
    size: int = 224
    chunk: int = 32
    samples: int = 16
    steps: int = 16
    masks: int = 64
    grid: int = 7
    window: int | None = None
    cpu_time: bool = False
    floor_without_scores: bool = False
    with_scores: bool = False
    with_unfolded: bool = False
    verbose: bool = False


def kerascope_calls(model: Any, args: Any, cam: str, score: str,
                    scores: bool = False, fold: bool = True) -> dict[str, Callable]:
    """kerascope's calls; ``scores=False`` (the peers return no scores) for ``SCORES_ONLY_FORWARD``.

    ``fold=False``: ``fold_batchnorm=False``, the model's own graph (the floor's), for ``with_unfolded``."""
    import kerascope as ks

    b = {"batch_size": args.chunk, "fold_batchnorm": fold}
    s = {**b, "scores": scores}  # the methods whose clean forward pass serves only Explanation.scores
    return {
        "saliency": lambda x, t: ks.Saliency(model, **b).explain(x, t),
        "smoothgrad": lambda x, t: ks.SmoothGrad(model, samples=args.samples, noise=0.2, **s).explain(x, t),
        "vargrad": lambda x, t: ks.VarGrad(model, samples=args.samples, noise=0.2, **s).explain(x, t),
        "integrated_gradients": lambda x, t: ks.IntegratedGradients(
            model, steps=args.steps, method="riemann_trapezoid", **b).explain(x, t),
        "gradcam": lambda x, t: ks.GradCAM(model, layer=cam, **b).explain(x, t),
        "gradcam_plusplus": lambda x, t: ks.GradCAMPlusPlus(model, layer=cam, **b).explain(x, t),
        "scorecam": lambda x, t: ks.ScoreCAM(model, layer=score, **b).explain(x, t),
        "occlusion": lambda x, t: ks.Occlusion(model, window=args.window, **b).explain(x, t),
        "rise": lambda x, t: ks.RISE(model, masks=args.masks, cell=args.grid, p=0.5, **s).explain(x, t),
    }


def tf_keras_vis_calls(model: Any, args: Any, cam: str, score: str) -> dict[str, Callable]:
    from tf_keras_vis.gradcam import Gradcam
    from tf_keras_vis.gradcam_plus_plus import GradcamPlusPlus
    from tf_keras_vis.saliency import Saliency
    from tf_keras_vis.scorecam import Scorecam
    from tf_keras_vis.utils.scores import CategoricalScore

    return {
        "saliency": lambda x, t: Saliency(model, clone=False)(CategoricalScore(list(t)), x),
        "smoothgrad": lambda x, t: Saliency(model, clone=False)(
            CategoricalScore(list(t)), x, smooth_samples=args.samples, smooth_noise=0.2),
        "gradcam": lambda x, t: Gradcam(model, clone=False)(CategoricalScore(list(t)), x, penultimate_layer=cam),
        "gradcam_plusplus": lambda x, t: GradcamPlusPlus(model, clone=False)(
            CategoricalScore(list(t)), x, penultimate_layer=cam),
        "scorecam": lambda x, t: Scorecam(model, clone=False)(
            CategoricalScore(list(t)), x, penultimate_layer=score, batch_size=args.chunk),
    }


def xplique_calls(model: Any, args: Any, cam: str, score: str) -> dict[str, Callable]:
    import numpy as np
    from xplique.attributions import (
        GradCAM,
        GradCAMPP,
        IntegratedGradients,
        Occlusion,
        Rise,
        Saliency,
        SmoothGrad,
        VarGrad,
    )

    def onehot(t: Any) -> Any:
        return np.eye(int(model.outputs[0].shape[-1]), dtype=np.float32)[t]

    b = args.chunk
    return {
        "saliency": lambda x, t: Saliency(model, batch_size=b)(x, onehot(t)),
        "smoothgrad": lambda x, t: SmoothGrad(model, nb_samples=args.samples, noise=0.2, batch_size=b)(x, onehot(t)),
        "vargrad": lambda x, t: VarGrad(model, nb_samples=args.samples, noise=0.2, batch_size=b)(x, onehot(t)),
        "integrated_gradients": lambda x, t: IntegratedGradients(model, steps=args.steps, batch_size=b)(x, onehot(t)),
        "gradcam": lambda x, t: GradCAM(model, conv_layer=cam, batch_size=b)(x, onehot(t)),
        "gradcam_plusplus": lambda x, t: GradCAMPP(model, conv_layer=cam, batch_size=b)(x, onehot(t)),
        "occlusion": lambda x, t: Occlusion(model, patch_size=args.window, patch_stride=args.window,
                                            batch_size=b)(x, onehot(t)),
        "rise": lambda x, t: Rise(model, nb_samples=args.masks, grid_size=args.grid, preservation_probability=0.5,
                                  batch_size=b)(x, onehot(t)),
    }


def tf_explain_calls(model: Any, args: Any, cam: str, score: str) -> dict[str, Callable]:
    from tf_explain.core.grad_cam import GradCAM
    from tf_explain.core.integrated_gradients import IntegratedGradients
    from tf_explain.core.occlusion_sensitivity import OcclusionSensitivity
    from tf_explain.core.smoothgrad import SmoothGrad
    from tf_explain.core.vanilla_gradients import VanillaGradients

    return {
        "saliency": lambda x, t: VanillaGradients().explain((x, None), model, int(t[0])),
        "smoothgrad": lambda x, t: SmoothGrad().explain((x, None), model, int(t[0]), num_samples=args.samples,
                                                        noise=0.2),
        "integrated_gradients": lambda x, t: IntegratedGradients().explain((x, None), model, int(t[0]),
                                                                           n_steps=args.steps),
        "gradcam": lambda x, t: GradCAM().explain((x, None), model, int(t[0]), layer_name=cam),
        "occlusion": lambda x, t: OcclusionSensitivity().explain((x, None), model, int(t[0]),
                                                                 patch_size=args.window),
    }


def floor_calls(model: Any, args: Any, cam: str, score: str, shape: tuple[int, ...],
                without_scores: bool = False) -> dict[str, Callable]:
    """The floor: hand-written compiled passes that each method needs (``bench/floor.py``'s baselines).

    Same chunks of ``chunk`` rows as kerascope; fixed input tensors, so it pays nothing for
    building noisy copies, path points or occluded copies. ``without_scores``: for the methods of
    ``SCORES_ONLY_FORWARD``, the passes without the clean forward pass whose only use is the
    target scores kerascope returns (``Explanation.scores``; Xplique and tf-explain return none).
    """
    import numpy as np

    from bench.floor import Baselines
    from kerascope.methods.perturbation import window_starts

    n = args.images
    cam_base = Baselines(model, model.get_layer(cam), False)
    score_base = Baselines(model, model.get_layer(score), False)
    channels = int(model.get_layer(score).output.shape[-1])
    positions = int(np.prod([len(window_starts(side, min(args.window, side), args.window)) for side in shape[:2]]))
    plans = {
        "saliency": (cam_base, [("grad", n)]),
        "smoothgrad": (cam_base, [("forward", n), ("grad", n * args.samples)]),
        "vargrad": (cam_base, [("forward", n), ("grad", n * args.samples)]),
        # riemann_trapezoid with explicit targets: f(x), f(baseline) come from the end-point rows
        "integrated_gradients": (cam_base, [("grad", n * args.steps)]),
        "gradcam": (cam_base, [("layer_grad", n)]),
        "gradcam_plusplus": (cam_base, [("layer_grad", n)]),
        "scorecam": (score_base, [("layer_grad", n), ("forward", n * channels)]),
        "occlusion": (cam_base, [("forward", n), ("forward", n * positions)]),
        "rise": (cam_base, [("forward", n), ("forward", n * args.masks)]),
    }
    if without_scores:  # only where the clean forward serves Explanation.scores alone, not the attribution
        plans = {method: (base, passes[1:]) for method, (base, passes) in plans.items()
                 if method in SCORES_ONLY_FORWARD}
    calls = {}
    for method, (base, passes) in plans.items():
        run = base.plan(passes, args.chunk)
        calls[method] = lambda x, t, run=run: run()
    return calls


LIBRARIES = {"kerascope": kerascope_calls, "tf-keras-vis": tf_keras_vis_calls, "xplique": xplique_calls,
             "tf-explain": tf_explain_calls}


def compare(method: str, model_name: str, options: Options) -> list[dict]:
    """Every library's ``method`` on the same model and images, alternating; one row per library."""
    import importlib.metadata as md

    import numpy as np

    quick = {"images": 2, "size": 96, "samples": 4, "steps": 4, "masks": 8} if options.quick else {}
    args = settings(PeerSettings, options, **quick)
    if args.cpu_time:  # before any op runs: the thread pools are fixed at TensorFlow's first use
        one_tf_thread()
    model = build_model(model_name, args.size)
    cam, score = PEER_LAYERS[model_name]
    shape = tuple(model.inputs[0].shape[1:])
    args = settings(PeerSettings, options, **{**quick, "window": args.window or max(1, shape[0] // 4)})
    x = np.random.default_rng(0).uniform(0, 1, (args.images, *shape)).astype(np.float32)
    t = np.zeros(args.images, np.int64)  # one class for all: tf-explain takes a single class index
    calls: dict[str, dict[str, Callable]] = {"floor": floor_calls(model, args, cam, score, shape)}
    status: dict[str, str] = {"floor": "hand-written tf.function passes (bench/floor.py)"}
    if args.floor_without_scores:
        calls["floor-no-scores"] = floor_calls(model, args, cam, score, shape, without_scores=True)
        status["floor-no-scores"] = f"the floor without the clean forward pass ({', '.join(SCORES_ONLY_FORWARD)})"
    for library, make in LIBRARIES.items():
        try:
            calls[library] = make(model, args, cam, score)
            if library == "kerascope":  # which checkout: PYTHONPATH=$PWD, else the installed one
                import kerascope

                status[library] = f"ok {Path(kerascope.__file__).parent.parent}"
            else:
                status[library] = f"ok {md.version(library)}"
        except Exception as error:
            status[library] = f"import failed: {type(error).__name__}: {error}"
    if args.with_scores and "kerascope" in calls:
        calls["kerascope+scores"] = {m: fn for m, fn in kerascope_calls(model, args, cam, score, scores=True).items()
                                     if m in SCORES_ONLY_FORWARD}
        status["kerascope+scores"] = "kerascope's default scores=True (one clean forward pass more)"
    if args.with_unfolded and "kerascope" in calls:
        calls["ks-unfolded"] = kerascope_calls(model, args, cam, score, fold=False)
        status["ks-unfolded"] = "kerascope with fold_batchnorm=False (BatchNormalization not folded, as the floor)"
    runners = {lib: c[method] for lib, c in calls.items() if method in c}
    rows: list[dict] = []
    for lib, fn in list(runners.items()):  # warm-up; a failing peer is reported, not hidden
        try:
            fn(x, t)
        except Exception as error:
            rows.append({"method": method, "library": lib, "status": "failed",
                         "error": f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:160]}"})
            if args.verbose:
                traceback.print_exc()
            runners.pop(lib)
    times = rotating_times({lib: (lambda fn=fn: fn(x, t)) for lib, fn in runners.items()}, options.repeats,
                           cpu_clock(args.cpu_time))
    base = "kerascope" if "kerascope" in times else next(iter(times))
    stats = summary(times, base)
    floor = stats.get("floor", {}).get("median_s")
    for lib, row in stats.items():
        rows.append({"method": method, "library": lib, "status": status.get(lib, ""), "model": model_name,
                     "size": shape[0], "images": args.images, "median_s": row["median_s"],
                     "vs_kerascope": row["ratio"], "vs_kerascope_min": row["ratio_min"],
                     "vs_kerascope_max": row["ratio_max"],
                     "vs_floor": row["median_s"] / floor if floor else None,
                     "min_s": min(times[lib]), "max_s": max(times[lib])})
    for lib in LIBRARIES:
        if lib in calls and method not in calls[lib]:
            rows.append({"method": method, "library": lib, "status": "not offered"})
        elif lib not in calls:
            rows.append({"method": method, "library": lib, "status": status[lib]})
    rows.append({"load_avg": os.getloadavg()[0], "when": time.strftime("%H:%M:%S")})
    return rows


for _model_name in ("mobilenetv2", "resnet50", "demo"):
    for _method in METHODS:
        scenario(f"peers-{_method}-{_model_name}",
                 f"{_method}: kerascope vs tf-keras-vis, Xplique, tf-explain and the floor, {_model_name}",
                 tags=("peers", _method, _model_name), backend="tensorflow", venv="peers")(
            partial(compare, _method, _model_name))
