"""Time to the first explanation: import + model build + trace + compute, each in a fresh interpreter.

For every (library, method) a new Python process (the peers' venv, see
``python -m bench --setup-peers``) imports the backend and the library, builds
MobileNetV2 (``weights=None``, nothing downloaded), explains ``images``
images once, then once more (the second call shows what the first paid for
tracing and one-time checks), then ``calls`` - 2 more times (``calls_cpu``: the CPU
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
``.pyc`` files), and before the rounds this scenario byte-compiles the kerascope trees it times
(``compileall``), as an installed wheel would be. Without it, where ``PYTHONDONTWRITEBYTECODE``
is set (as on the development machines) every kerascope module was compiled from source in every
child: ~0.055 s of kerascope's first call that no user with an installed package pays. The
classes are imported in the library phase for every library (``from kerascope import Saliency``
as ``from tf_keras_vis.saliency import Saliency``), so the first call times the call alone.

Settings (``--set``): ``size`` (224), ``images`` (4), ``calls`` (4), ``one_thread``,
``libraries`` (comma-separated), ``before`` (another checkout: row ``kerascope-before``). The
rounds are ``--repeats``.

    python -m bench first-call-saliency first-call-gradcam --repeats 3 --set one_thread=1
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench import peer_env
from bench.scenario import Options, scenario, settings

HERE = Path(__file__).resolve().parent.parent
LIBRARIES = ("kerascope", "tf-keras-vis", "xplique", "tf-explain")
METHODS = ("saliency", "gradcam")
PHASES = ("process", "backend", "library", "model", "first", "second", "first_cpu", "second_cpu", "calls_cpu",
          "all_cpu")


@dataclass(frozen=True)
class FirstCallSettings:
    size: int = 224
    images: int = 4
    calls: int = 4
    one_thread: bool = False
    libraries: tuple[str, ...] = LIBRARIES
    before: str | None = None


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


def run_child(python: str, library: str, method: str, args: Any) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    prefix = ""
    if library == "kerascope-before":  # another checkout's kerascope (e.g. before a change), same child code
        # first on sys.path: `python -c` puts the working directory (this checkout) before PYTHONPATH
        prefix = f"import sys; sys.path.insert(0, {str(Path(args.before).resolve())!r})\n"
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


def first_call(method: str, options: Options) -> list[dict]:
    """Every library's first call of ``method``, fresh processes, rounds rotating: median and range per phase."""
    quick = {"size": 64, "images": 1, "calls": 2, "libraries": ("kerascope",)} if options.quick else {}
    args = settings(FirstCallSettings, options, **quick)
    if args.calls < 2:
        raise ValueError(f"calls must be at least 2 (a first and a second call). Received: calls={args.calls}.")
    python = str(peer_env.python()) if peer_env.python().exists() else sys.executable
    libraries = (["kerascope-before"] if args.before else []) + list(args.libraries)
    trees = [HERE] + ([Path(args.before)] if args.before else [])
    for tree in trees:  # as an installed wheel: the peers' .pyc files were written by pip
        compiled = subprocess.run([python, "-m", "compileall", "-q", str(tree.resolve() / "kerascope")],
                                  capture_output=True, text=True)
        if compiled.returncode != 0:
            raise RuntimeError(f"Could not byte-compile {tree / 'kerascope'}: {compiled.stdout}{compiled.stderr}")
    results: dict[str, list[dict]] = {lib: [] for lib in libraries}
    for round_ in range(options.repeats):
        shift = round_ % len(libraries)
        for lib in libraries[shift:] + libraries[:shift]:
            results[lib].append(run_child(python, lib, method, args))
    rows = []
    for lib, runs in results.items():
        good = [r for r in runs if "error" not in r]
        row: dict[str, Any] = {"method": method, "library": lib, "size": args.size, "images": args.images,
                               "python": python, "ok_rounds": len(good)}
        if not good:
            rows.append({**row, "error": runs[-1].get("error")})
            continue
        for p in PHASES:
            values = [r[p] for r in good]
            key = "import_library" if p == "library" else p  # "library" names the row's library
            row |= {key: statistics.median(values), f"{key}_min": min(values), f"{key}_max": max(values)}
        rows.append(row)
    rows.append({"load_avg": os.getloadavg()[0], "when": time.strftime("%H:%M:%S")})
    return rows


for _method in METHODS:
    scenario(f"first-call-{_method}", f"time to the first {_method} map, fresh process, kerascope vs peers "
             "(MobileNetV2)", tags=("first-call", "peers", _method, "mobilenetv2"), backend="tensorflow")(
        partial(first_call, _method))
