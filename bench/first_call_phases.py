"""Where kerascope's first call goes: CPU seconds of each phase, in a fresh interpreter per run.

Complements ``bench/first_call.py`` (which times whole libraries): each run starts a new
process that builds MobileNetV2 (``weights=None``), explains ``--images`` images once and
reports the CPU seconds (``time.process_time``) spent in

* ``check``: the eager one-sample pass that validates the inputs, detects a final softmax and
  counts the probed layer's calls (``Engine._check_call``);
* ``count``: a separate call-count pass (``Engine._calls``; 0 when the check pass counted);
* ``trace``: tracing the compiled forward+backward function (``get_concrete_function``);
* ``execute``: its first execution (graph optimisation, kernel set-up, the computation);
* ``rest``: everything else (host work, result assembly).

TensorFlow only (the phases are TensorFlow's). ``--tree DIR`` times another checkout's kerascope.

Usage:
    python bench/first_call_phases.py --rounds 2 --one-thread
    python bench/first_call_phases.py --methods gradcam --tree /tmp/old-checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("total", "check", "count", "trace", "execute", "rest")

CHILD = r'''
import contextlib, json, os, sys, time
sys.path.insert(0, {tree!r})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np, keras, tensorflow as tf
if {one_thread}:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
import kerascope as ks
from kerascope._backend import tensorflow as backend
from kerascope.core import engine

spent = dict.fromkeys({phases!r}, 0.0)

def timed(owner, name, phase):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[phase] += time.process_time() - start
    setattr(owner, name, wrapper)

timed(engine.Engine, "_check_call", "check")
timed(engine.Engine, "_calls", "count")

def direct(compiled):  # backend._direct, with the trace and the first execution timed apart
    concrete = []
    options = getattr(backend, "_call_options", None)  # the call options of the tree timed (absent before)
    def call(*args):
        with options() if options is not None else contextlib.nullcontext():
            if not concrete:
                start = time.process_time()
                concrete.append(compiled.get_concrete_function(*args))
                spent["trace"] += time.process_time() - start
                start = time.process_time()
                result = concrete[0](*args)
                spent["execute"] += time.process_time() - start
                return result
            return concrete[0](*args)
    return call

backend._direct = direct
model = keras.applications.MobileNetV2(input_shape=({size}, {size}, 3), weights=None, classifier_activation=None)
x = np.random.default_rng(0).uniform(0, 1, ({images}, {size}, {size}, 3)).astype(np.float32)
method = ks.Saliency(model) if {method!r} == "saliency" else ks.GradCAM(model, layer="out_relu")
start = time.process_time()
np.asarray(method.explain(x, np.zeros({images}, np.int64)).attributions)
spent["total"] = time.process_time() - start
spent["rest"] = spent["total"] - sum(spent[p] for p in ("check", "count", "trace", "execute"))
print("RESULT " + json.dumps(spent))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=["saliency", "gradcam"], choices=["saliency", "gradcam"])
    parser.add_argument("--one-thread", action="store_true", help="one TensorFlow thread (steadier CPU seconds)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose kerascope is timed")
    args = parser.parse_args()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    print(f"tree={args.tree} size={args.size} images={args.images} rounds={args.rounds} "
          f"{'one TF thread ' if args.one_thread else ''}load_avg={os.getloadavg()[0]:.1f}", flush=True)
    for round_ in range(args.rounds):
        for method in args.methods if round_ % 2 == 0 else args.methods[::-1]:
            code = CHILD.format(tree=str(args.tree.resolve()), one_thread=args.one_thread, phases=PHASES,
                                size=args.size, images=args.images, method=method)
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                print(f"  {method}: FAILED {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}", flush=True)
                continue
            results[method].append(json.loads(lines[-1][len("RESULT "):]))
            print(f"  round {round_ + 1} {method:<9}" + " ".join(
                f"{p} {results[method][-1][p]:.2f}" for p in PHASES), flush=True)
    print(f"\n{'method':<10}" + "".join(f"{p:>18}" for p in PHASES) + "   (CPU s, median (min-max))")
    for method, runs in results.items():
        if runs:
            cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
                     for v in ([r[p] for r in runs] for p in PHASES)]
            print(f"{method:<10}" + "".join(f"{c:>18}" for c in cells))
    print(f"load_avg at end={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
