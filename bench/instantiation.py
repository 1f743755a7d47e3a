"""What a compiled function's first execution costs under each set of Grappler options, in one process.

The first call of a kerascope method is trace + instantiation (Grappler rewrites the graph, the
executor is built) + run. The trace does not depend on the call options, the instantiation does:
TensorFlow instantiates a traced function once per distinct ``config_proto``. This script traces
each method once, then instantiates it again and again under each option set, alternating (a
distinct, otherwise unused ``meta_optimizer_timeout_ms`` forces a fresh instantiation each time),
and reports ``first call - second call`` in CPU seconds (one TF thread): the instantiation's cost,
with oneDNN's primitive caches already warm in every round, so only the option-dependent part.
The maps must be bit-identical between option sets.

Option sets: ``tensorflow`` (TensorFlow's own), ``one-pass`` (one Grappler pass, no layout / memory
optimiser: kerascope before the TFG change), ``kerascope`` (what kerascope now runs for a function
without loops: :func:`kerascope._backend.tensorflow._loop_free_options`).

Usage:
    python bench/instantiation.py --model MobileNetV2 --size 224 --images 4 --rounds 7
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERAS_BACKEND"] = "tensorflow"

import numpy as np  # noqa: E402
from call_options import options_parser, set_up  # noqa: E402  (bench/call_options.py)
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402
from timing import rotating_calls  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope._backend import tensorflow as backend  # noqa: E402

_FRESH = [600_000]  # a distinct meta_optimizer_timeout_ms (ten minutes and up: never reached) per option set


def option_sets(ours: Any) -> dict[str, Any]:
    """A fresh copy of each option set; ``ours``: kerascope's options for a function without loops."""
    base = context.context().function_call_options

    def fresh(options: Any, one_pass: bool = False) -> Any:
        config = config_pb2.ConfigProto.FromString((options or base).config_proto_serialized)
        rewrite = config.graph_options.rewrite_options
        if one_pass:
            rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
            rewrite.layout_optimizer = rewriter_config_pb2.RewriterConfig.OFF
            rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
        _FRESH[0] += 1
        rewrite.meta_optimizer_timeout_ms = _FRESH[0]
        return context.FunctionCallOptions(executor_type=base.executor_type, config_proto=config)

    return {"tensorflow": fresh(None), "one-pass": fresh(None, one_pass=True), "kerascope": fresh(ours)}


def main() -> None:
    args = options_parser(__doc__.split("\n\n")[0]).parse_args()
    ours, model, x = set_up(args)
    targets = np.arange(args.images) % 7
    layer = "out_relu" if args.model == "MobileNetV2" else "conv5_block3_out"
    methods = {"saliency": ks.Saliency(model), "gradcam": ks.GradCAM(model, layer=layer)}
    print(f"{args.model} {args.size}px {args.images} images, {args.rounds} rounds, one TF thread, "
          f"load_avg={os.getloadavg()[0]:.1f}; instantiation CPU s (first - second call), median (min-max)", flush=True)
    loop_free = backend._loop_free_options(ours)
    has_loops = backend._has_loops
    backend._has_loops = lambda concrete, nodes=None: True  # every function runs the option set as built
    try:
        for name, method in methods.items():
            method.explain(x, targets)  # the trace (and one instantiation under kerascope's options)
            maps: dict[str, np.ndarray] = {}

            def instantiate(label: str, method: ks.Method = method, maps: dict = maps) -> float:
                backend._CPU_OPTIONS[:] = [option_sets(loop_free)[label]]
                start = time.process_time()
                maps[label] = np.asarray(method.explain(x, targets).attributions)
                first = time.process_time() - start
                start = time.process_time()
                method.explain(x, targets)
                return first - (time.process_time() - start)

            costs = rotating_calls({label: (lambda label=label: instantiate(label))
                                    for label in ("tensorflow", "one-pass", "kerascope")}, args.rounds)
            cells = "  ".join(f"{k} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in costs.items())
            same = all(np.array_equal(m, maps["tensorflow"]) for m in maps.values())
            print(f"{name:<9} {cells}  identical maps: {same}", flush=True)
    finally:
        backend._CPU_OPTIONS[:] = [ours]
        backend._has_loops = has_loops
    print(f"load_avg at end={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
