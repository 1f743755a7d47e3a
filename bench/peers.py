"""kerascope side by side with tf-keras-vis, Xplique and tf-explain (same model, inputs, parameters).

The peers live in their own virtual environment, created by this script with
``--system-site-packages`` (so every library runs on the very same
TensorFlow / Keras / numpy as kerascope) and a constraints file pinning those
three to the installed versions, so that installing a peer cannot swap them.
Each peer is installed separately from PyPI; what installed (with its
version) and what did not (with pip's last error lines) is recorded in
``bench/peers-env.json``. The timing then runs in ONE process inside that
environment: for each shared method the libraries take turns, the order
rotating every round, after one warm-up call each; a peer that fails at
import or at call time is reported with its exception, not skipped silently.
A "floor" row times the hand-written compiled passes each method needs
(``bench/suite.py``'s baselines, same chunks), and every library's time is
also given as a multiple of it: a peer within 1.15x of the floor cannot be
beaten by much, and then being at the floor is what counts.

All images get the same target class (tf-explain explains one class index
per call). None of the peers returns the target scores, so kerascope runs with
``scores=False`` (no clean forward pass spent on ``Explanation.scores``; only
SmoothGrad, VarGrad and RISE spend one, ``SCORES_ONLY_FORWARD``) and
``--with-scores`` adds a ``kerascope+scores`` row with its default
(``scores=True``) for the cost of that pass. Parameters are matched: the same number of noise samples, IG
steps, occlusion window, Score-CAM layer (and its channel count).

Usage:
    python bench/peers.py --setup    # create ~/.cache/kerascope/peers-venv ($KERASCOPE_PEERS_VENV), install peers
    python bench/peers.py --model mobilenetv2 --images 8 --samples 16 --steps 16
    python bench/peers.py --model demo --images 8 --methods saliency gradcam smoothgrad
    python bench/peers.py --model mobilenetv2 --size 160 --images 4 --batch-size 32 --cpu-time
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("KERASCOPE_PEERS_VENV", Path.home() / ".cache" / "kerascope" / "peers-venv"))
RECORD = HERE / "peers-env.json"
PEERS = {"tf-keras-vis": "tf_keras_vis", "xplique": "xplique", "tf-explain": "tf_explain"}
#: methods whose clean forward pass (one row per input) serves only ``Explanation.scores`` (and
#: ``targets=None``), not the attribution: SmoothGrad / VarGrad average noisy rows, RISE masked rows
SCORES_ONLY_FORWARD = ("smoothgrad", "vargrad", "rise")
METHODS = ("saliency", "smoothgrad", "vargrad", "integrated_gradients", "gradcam", "gradcam_plusplus", "scorecam",
           "occlusion", "rise")


# ------------------------------------------------------------------ setup
def setup() -> None:
    import importlib.metadata as md

    python = VENV / "bin" / "python"
    if not python.exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
    pins = {name: md.version(name) for name in ("tensorflow", "keras", "numpy")}
    constraints = VENV / "constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in pins.items()))
    record: dict[str, Any] = {"pinned": pins, "python": sys.version.split()[0], "peers": {}}
    for package in PEERS:
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), package],
            capture_output=True, text=True,
        )
        if proc.returncode == 0:
            version = subprocess.run(
                [str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                capture_output=True, text=True,
            ).stdout.strip()
            record["peers"][package] = {"installed": True, "version": version}
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
            record["peers"][package] = {"installed": False, "pip_error": tail}
        print(package, record["peers"][package])
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RECORD}")


# ---------------------------------------------------------------- workers
def build_model(name: str, size: int = 224) -> tuple[Any, str, str]:
    """The model (``size`` x ``size`` RGB inputs), its Grad-CAM layer and the Score-CAM layer (<= 64 channels)."""
    import keras

    shape = (size, size, 3)
    if name == "mobilenetv2":
        model = keras.applications.MobileNetV2(input_shape=shape, weights=None, classifier_activation=None)
        return model, "out_relu", "block_9_project_BN"
    if name == "resnet50":
        model = keras.applications.ResNet50(input_shape=shape, weights=None, classifier_activation=None)
        return model, "conv5_block3_out", "conv1_relu"
    if name == "demo":
        import kerascope as ks
        from kerascope.data import demo_model_path

        return ks.load_model(demo_model_path()), "conv3b", "conv3b"
    raise SystemExit(f"Unknown model. Received: --model {name!r}.")


def kerascope_calls(model: Any, args: argparse.Namespace, cam: str, score: str,
                    scores: bool = False, fold: bool = True) -> dict[str, Callable]:
    """kerascope's calls; ``scores=False`` (the peers return no scores) for ``SCORES_ONLY_FORWARD``.

    ``fold=False``: ``fold_batchnorm=False``, the model's own graph (the floor's), for ``--with-unfolded``."""
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


def tf_keras_vis_calls(model: Any, args: argparse.Namespace, cam: str, score: str) -> dict[str, Callable]:
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


def xplique_calls(model: Any, args: argparse.Namespace, cam: str, score: str) -> dict[str, Callable]:
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


def tf_explain_calls(model: Any, args: argparse.Namespace, cam: str, score: str) -> dict[str, Callable]:
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


def floor_calls(model: Any, args: argparse.Namespace, cam: str, score: str, shape: tuple[int, ...],
                without_scores: bool = False) -> dict[str, Callable]:
    """The floor: hand-written compiled passes that each method needs (``bench/suite.py``'s baselines).

    Same chunks of ``--chunk`` rows as kerascope; fixed input tensors, so it pays nothing for
    building noisy copies, path points or occluded copies. ``without_scores``: for the methods of
    ``SCORES_ONLY_FORWARD``, the passes without the clean forward pass whose only use is the
    target scores kerascope returns (``Explanation.scores``; Xplique and tf-explain return none).
    """
    import numpy as np
    from suite import Baselines

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


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf
    from timing import rotating_times  # bench/timing.py

    if args.cpu_time:  # before any op runs: the thread pools are fixed at TensorFlow's first use
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    model, cam, score = build_model(args.model, args.size)
    shape = tuple(model.inputs[0].shape[1:])
    args.window = args.window or max(1, shape[0] // 4)
    x = np.random.default_rng(0).uniform(0, 1, (args.images, *shape)).astype(np.float32)
    t = np.zeros(args.images, np.int64)  # one class for all: tf-explain takes a single class index
    calls: dict[str, dict[str, Callable]] = {}
    status: dict[str, str] = {}
    calls["floor"] = floor_calls(model, args, cam, score, shape)
    status["floor"] = "hand-written tf.function passes (bench/suite.py Baselines)"
    if args.floor_without_scores:
        calls["floor-no-scores"] = floor_calls(model, args, cam, score, shape, without_scores=True)
        status["floor-no-scores"] = f"the floor without the clean forward pass ({', '.join(SCORES_ONLY_FORWARD)})"
    for library, make in LIBRARIES.items():
        try:
            calls[library] = make(model, args, cam, score)
            import importlib.metadata as md

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
    load = os.getloadavg()
    print(f"model={args.model} size={shape[0]} images={args.images} batch_size={args.chunk} samples={args.samples} "
          f"steps={args.steps} masks={args.masks} window={args.window}"
          f"{' clock=cpu-time, 1 thread' if args.cpu_time else ''} tf={tf.__version__} keras={keras.__version__} load_avg={load[0]:.1f},{load[1]:.1f}")
    for library, text in status.items():
        print(f"  {library}: {text}")
    print(f"{'method':<22}{'library':<14}{'median s':>10}{'speed-up':>10}{'/ floor':>9}  rounds min-max s; "
          "per-round peer/kerascope min-max")
    for method in args.methods:
        runners = {lib: c[method] for lib, c in calls.items() if method in c}
        errors: dict[str, str] = {}
        for lib, fn in list(runners.items()):  # warm-up; a failing peer is reported, not hidden
            try:
                fn(x, t)
            except Exception as error:
                errors[lib] = f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:160]}"
                if args.verbose:
                    traceback.print_exc()
                runners.pop(lib)
        clock = time.process_time if args.cpu_time else time.perf_counter
        times = rotating_times({lib: (lambda fn=fn: fn(x, t)) for lib, fn in runners.items()}, args.repeats, clock)
        medians = {lib: statistics.median(v) for lib, v in times.items()}
        ours, floor = medians.get("kerascope"), medians.get("floor")
        for lib, median in medians.items():
            speedup = "" if lib in ("kerascope", "floor") or ours is None else f"{median / ours:9.2f}x"
            to_floor = "" if floor is None else f"{median / floor:8.2f}x"
            spread = f"  {min(times[lib]):.3f}-{max(times[lib]):.3f}"
            if lib != "kerascope" and "kerascope" in times:  # same round: both saw the same load
                ratios = [a / b for a, b in zip(times[lib], times["kerascope"], strict=True)]
                spread += f"; {min(ratios):.2f}-{max(ratios):.2f}"
            print(f"{method:<22}{lib:<14}{median:10.3f}{speedup:>10}{to_floor:>9}{spread}")
        for lib, text in errors.items():
            print(f"{method:<22}{lib:<14}{'FAILED':>10}            {text}")
        for lib in LIBRARIES:
            if lib not in calls or lib == "floor":
                continue
            if method not in calls[lib]:
                print(f"{method:<22}{lib:<14}{'-':>10}            (not offered)")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="create the venv and install the peers, then stop")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--size", type=int, default=224, help="image side for mobilenetv2 / resnet50 (e.g. 160, 224)")
    parser.add_argument("--batch-size", "--chunk", dest="chunk", type=int, default=32,
                        help="rows per compiled call, for every library that takes one (tf-explain: all rows at once)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--masks", type=int, default=64, help="RISE masks")
    parser.add_argument("--grid", type=int, default=7, help="RISE grid cells per side")
    parser.add_argument("--window", type=int, default=None, help="occlusion window (default: side / 4)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--cpu-time", action="store_true",
                        help="one TensorFlow compute thread and CPU seconds (time.process_time) instead of wall "
                             "seconds: the work done, steady on a loaded shared machine")
    parser.add_argument("--floor-without-scores", action="store_true",
                        help="add a floor row without the clean forward pass that serves only the returned scores "
                             f"({', '.join(SCORES_ONLY_FORWARD)})")
    parser.add_argument("--with-scores", action="store_true",
                        help="add a kerascope+scores row: kerascope's default scores=True (the peers return no "
                             f"scores, so the kerascope row runs scores=False; {', '.join(SCORES_ONLY_FORWARD)})")
    parser.add_argument("--with-unfolded", action="store_true",
                        help="add a 'ks-unfolded' row: kerascope with fold_batchnorm=False (the model's own graph)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.setup:
        setup()
        return
    if args.worker:
        worker(args)
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        setup()
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), "--worker", *sys.argv[1:]])


if __name__ == "__main__":
    main()
