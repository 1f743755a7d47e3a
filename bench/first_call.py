"""Time to the first explanation: import + model build + trace + compute, each in a fresh interpreter.

For every (library, method) a new Python process (the peers' venv, see
``bench/peers.py --setup``) imports the backend and the library, builds
MobileNetV2 (``weights=None``, nothing downloaded), explains ``--images``
images once, then once more (the second call shows what the first paid for
tracing and one-time checks), then ``--calls`` - 2 more times (``calls_cpu``: the CPU
seconds of all of them, for a library that trades a cheap first call for dearer later
ones). The parent times the whole process from its
start to its exit; the child reports its phases in wall seconds, and the CPU
seconds (``time.process_time``, all threads) of the first call
(``first_cpu``) and of everything up to the end of it (``all_cpu``): on a
loaded shared machine the wall times swing with the other processes, the CPU
seconds much less. Processes run one at a
time, the (library, method) order rotating every round, so a busy phase of a
shared machine hits every library alike.

Each library loads from compiled bytecode: the peers are pip-installed (pip writes their
``.pyc`` files), and before the rounds this script byte-compiles the kerascope trees it times
(``compileall``), as an installed wheel would be. Without it, where ``PYTHONDONTWRITEBYTECODE``
is set (as on the development machines) every kerascope module was compiled from source in every
child: ~0.055 s of kerascope's first call that no user with an installed package pays. The
classes are imported in the library phase for every library (``from kerascope import Saliency``
as ``from tf_keras_vis.saliency import Saliency``), so the first call times the call alone.

Usage:
    python bench/first_call.py --rounds 3
    python bench/first_call.py --rounds 3 --one-thread   # one TF thread: CPU seconds steadier on a loaded machine
    python bench/first_call.py --methods saliency gradcam --libraries kerascope xplique --size 160
    python bench/first_call.py --before /tmp/old-checkout   # adds that tree's kerascope as "kerascope-before"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("KERASCOPE_PEERS_VENV", Path.home() / ".cache" / "kerascope" / "peers-venv"))
LIBRARIES = ("kerascope", "tf-keras-vis", "xplique", "tf-explain")
METHODS = ("saliency", "gradcam")

# The child: one library, one method. ``{...}`` fields are filled in by the parent.
CHILD = r'''
import time
start, cpu_start = time.perf_counter(), time.process_time()
import os, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras
import tensorflow as tf
if {one_thread}:  # before any op runs: one TF thread, so CPU seconds are work, not idle pool threads spinning
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
backend = time.perf_counter()
library, method, size, images, calls = {library!r}, {method!r}, {size}, {images}, {calls}
cam = "out_relu"
if library == "kerascope":
    from kerascope import GradCAM, Saliency
    make = {{"saliency": lambda m: Saliency(m), "gradcam": lambda m: GradCAM(m, layer=cam)}}[method]
    call = lambda e, x, t: e.explain(x, t).attributions
elif library == "tf-keras-vis":
    from tf_keras_vis.gradcam import Gradcam
    from tf_keras_vis.saliency import Saliency
    from tf_keras_vis.utils.scores import CategoricalScore
    make = {{"saliency": lambda m: Saliency(m, clone=False), "gradcam": lambda m: Gradcam(m, clone=False)}}[method]
    kw = {{"penultimate_layer": cam}} if method == "gradcam" else {{}}
    call = lambda e, x, t: e(CategoricalScore(list(t)), x, **kw)
elif library == "xplique":
    from xplique.attributions import GradCAM, Saliency
    make = {{"saliency": lambda m: Saliency(m, batch_size=32),
             "gradcam": lambda m: GradCAM(m, conv_layer=cam, batch_size=32)}}[method]
    call = lambda e, x, t: e(x, np.eye(1000, dtype=np.float32)[t])
else:
    from tf_explain.core.grad_cam import GradCAM
    from tf_explain.core.vanilla_gradients import VanillaGradients
    make = {{"saliency": lambda m: VanillaGradients(), "gradcam": lambda m: GradCAM()}}[method]
    kw = {{"layer_name": cam}} if method == "gradcam" else {{}}
    call = lambda e, x, t: e.explain((x, None), model, int(t[0]), **kw)
imported = time.perf_counter()
model = keras.applications.MobileNetV2(input_shape=(size, size, 3), weights=None, classifier_activation=None)
x = np.random.default_rng(0).uniform(0, 1, (images, size, size, 3)).astype(np.float32)
t = np.zeros(images, np.int64)
built = time.perf_counter()
cpu_built = time.process_time()
explainer = make(model)
np.asarray(call(explainer, x, t))
first, cpu_first = time.perf_counter(), time.process_time()
np.asarray(call(explainer, x, t))
second, cpu_second = time.perf_counter(), time.process_time()
for _ in range(calls - 2):
    np.asarray(call(explainer, x, t))
print("RESULT " + json.dumps({{"backend": backend - start, "library": imported - backend, "model": built - imported,
                               "first": first - built, "second": second - first,
                               "first_cpu": cpu_first - cpu_built, "second_cpu": cpu_second - cpu_first,
                               "calls_cpu": time.process_time() - cpu_built, "all_cpu": cpu_first - cpu_start}}))
'''


def run_child(python: str, library: str, method: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    prefix = ""
    if library == "kerascope-before":  # another checkout's kerascope (e.g. before a change), same child code
        # first on sys.path: `python -c` puts the working directory (this checkout) before PYTHONPATH
        prefix = f"import sys; sys.path.insert(0, {str(args.before.resolve())!r})\n"
        library = "kerascope"
    code = prefix + CHILD.format(library=library, method=method, size=args.size, images=args.images, calls=args.calls,
                        one_thread=args.one_thread)
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)[:300]}
    return {**json.loads(lines[-1][len("RESULT "):]), "process": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--calls", type=int, default=4,
                        help="explanations per process; calls_cpu: their CPU seconds in total (first included)")
    parser.add_argument("--one-thread", action="store_true",
                        help="one TensorFlow thread in every child (CPU seconds without idle threads spinning)")
    parser.add_argument("--before", type=Path, default=None,
                        help="also time the kerascope package found in this folder (row 'kerascope-before')")
    args = parser.parse_args()
    if args.before is not None:
        args.libraries = ["kerascope-before", *args.libraries]
    python = VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"No peers venv at {VENV}. Run `python bench/peers.py --setup` first.")
    for tree in [HERE.parent, args.before] if args.before is not None else [HERE.parent]:
        compiled = subprocess.run([str(python), "-m", "compileall", "-q", str(tree.resolve() / "kerascope")],
                                  capture_output=True, text=True)
        if compiled.returncode != 0:
            raise SystemExit(f"Could not byte-compile {tree / 'kerascope'}: {compiled.stdout}{compiled.stderr}")
    pairs = [(lib, m) for m in args.methods for lib in args.libraries]
    results: dict[tuple[str, str], list[dict]] = {pair: [] for pair in pairs}
    load = os.getloadavg()
    if args.calls < 2:
        parser.error(f"--calls must be at least 2 (a first and a second call). Received: --calls {args.calls}.")
    print(f"MobileNetV2 weights=None size={args.size} images={args.images} rounds={args.rounds} calls={args.calls} "
          f"{'one TF thread ' if args.one_thread else ''}"
          f"load_avg={load[0]:.1f},{load[1]:.1f}", flush=True)
    for round_ in range(args.rounds):
        shift = round_ % len(pairs)
        for pair in pairs[shift:] + pairs[:shift]:
            results[pair].append(run_child(str(python), *pair, args))
            print(f"  round {round_ + 1} {pair[0]:<13}{pair[1]:<9} {results[pair][-1]}", flush=True)
    phases = ("process", "backend", "library", "model", "first", "second", "first_cpu", "second_cpu", "calls_cpu",
              "all_cpu")
    print(f"\n{'method':<9}{'library':<14}" + "".join(f"{p:>18}" for p in phases) + "   (median (min-max) s)")
    for (lib, method), runs in results.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            print(f"{method:<9}{lib:<14} FAILED: {runs[-1].get('error')}")
            continue
        cells = []
        for p in phases:
            values = [r[p] for r in good]
            cells.append(f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"{method:<9}{lib:<14}" + "".join(f"{c:>18}" for c in cells))
    print(f"load_avg at end={','.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
