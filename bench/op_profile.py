"""Where a method's compiled pass spends its time: CPU time per TensorFlow op type, next to the floor's.

Runs one ``explain`` call (TensorFlow backend), keeps every ``tf.function`` kerascope
compiled for it, freezes each one's traced graph (variables as constants) and runs it
in a one-thread ``tf.compat.v1.Session`` with full tracing; the op times are summed by
op type (``_MklNativeConv2D``, ``SelectV2``, ``Sub``, ...) and averaged over the runs,
next to the same for the floor (``bench/suite.py``'s ``grad``: a hand-written compiled
forward + backward of the ``N`` inputs). Op counts are per run. The frozen graph is
what Grappler makes of the traced function, as in the ordinary call; the tracing
itself adds a little per op, so compare columns, not totals with ``bench/suite.py``.

Example::

    python bench/op_profile.py --model mobilenetv2 --size 160 --images 8 --method deeplift
    python bench/op_profile.py --model demo --images 8 --method lrp --top 20
    python bench/op_profile.py --model demo --images 8 --method deeplift --param fuse_rules=true
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERAS_BACKEND"] = "tensorflow"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from suite import build_model  # noqa: E402  (bench/suite.py)
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2  # noqa: E402

from kerascope._backend import tensorflow as tf_backend  # noqa: E402
from kerascope.methods import registry  # noqa: E402


def floor_gradient(model: Any, shape: tuple[int, ...]) -> Any:
    """The floor: a hand-written compiled forward + backward (``bench/suite.py``'s ``grad``), ``(x, targets)``."""
    spec = [tf.TensorSpec((None, *shape), tf.float32), tf.TensorSpec((None,), tf.int32)]

    @tf.function(input_signature=spec)
    def grad(inputs: tf.Tensor, t: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            total = tf.reduce_sum(tf.gather(model(inputs, training=False), t, axis=1, batch_dims=1))
        return tape.gradient(total, inputs)

    return grad


def traced_functions(method: Any, x: np.ndarray, targets: np.ndarray) -> list[Any]:
    """The concrete functions of the ``tf.function``s kerascope compiles during one ``explain`` call."""
    made: list[Any] = []
    original = tf_backend._function

    def recording(*args: Any, **kwargs: Any) -> Any:
        made.append(original(*args, **kwargs))
        return made[-1]

    tf_backend._function = recording
    try:
        method.explain(x, targets)
    finally:
        tf_backend._function = original
    return [f.get_concrete_function() for f in made]


def op_times(concrete: Any, rows: np.ndarray, targets: np.ndarray, runs: int) -> tuple[Any, Any] | None:
    """``(ms per op type, ops per op type)`` per run of ``concrete``'s frozen graph, one thread.

    ``None`` for a function that is not an ``(inputs, targets)`` pass (a forward-only one)."""
    frozen = convert_variables_to_constants_v2(concrete)
    if len(frozen.inputs) != 2:
        return None
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(frozen.graph.as_graph_def(), name="")
    kinds = {op.name: op.type for op in graph.get_operations()}
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    session = tf.compat.v1.Session(graph=graph, config=config)
    feed = dict(zip([t.name for t in frozen.inputs], [rows, targets[: len(rows)].astype(np.int32)]))
    fetch = [t.name for t in frozen.outputs]
    for _ in range(2):
        session.run(fetch, feed)
    times: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    for _ in range(runs):
        metadata = tf.compat.v1.RunMetadata()
        session.run(fetch, feed, options=options, run_metadata=metadata)
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                label = node.timeline_label  # "name = OpType(inputs)": the kernel Grappler chose
                kind = label.split(" = ")[1].split("(")[0] if " = " in label else kinds.get(node.node_name, "?")
                times[kind] += (node.op_end_rel_micros - node.op_start_rel_micros) / 1000 / runs
                counts[kind] += 1 / runs
    return times, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo | mobilenetv2 | resnet50 | ... (bench/suite.py)")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--method", default="deeplift", help="a registered method name (default parameters)")
    parser.add_argument("--param", nargs="*", default=[], metavar="NAME=VALUE",
                        help="method parameters, e.g. fuse_rules=true (Python literals; true / false / none too)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model = build_model(args.model, args.size)
    shape = tuple(model.inputs[0].shape[1:])
    x = np.random.default_rng(0).uniform(0, 1, (args.images, *shape)).astype(np.float32)
    targets = np.arange(args.images) % 4
    params = {}
    for item in args.param:
        name, _, text = item.partition("=")
        words = {"true": True, "false": False, "none": None}
        params[name] = words[text.lower()] if text.lower() in words else ast.literal_eval(text)
    functions = traced_functions(registry.get(args.method)(model, **params), x, targets)

    grad = floor_gradient(model, shape)
    columns = {"floor": op_times(grad.get_concrete_function(), x, targets, args.runs)}
    # DeepLIFT's shared layout: the inputs and, last, one zeros reference row
    rows = np.concatenate([x, np.zeros((1, *shape), np.float32)]) if "deeplift" in args.method else x
    for i, concrete in enumerate(functions):
        profiled = op_times(concrete, rows, np.append(targets, targets[0]), args.runs)
        if profiled is not None:
            columns[f"{args.method} #{i}"] = profiled
    print(f"{args.model} {shape[0]} px, {args.images} images, {args.method}: ms per run (ops per run), one thread, "
          f"load_avg={','.join(f'{v:.1f}' for v in os.getloadavg())}")
    kinds = sorted({k for times, _ in columns.values() for k in times},
                   key=lambda k: -max(times[k] for times, _ in columns.values()))
    print(f"{'op type':<44}" + "".join(f"{name:>18}" for name in columns))
    print(f"{'total':<44}" + "".join(f"{sum(t.values()):>18.2f}" for t, _ in columns.values()))
    for kind in kinds[: args.top]:
        print(f"{kind:<44}" + "".join(f"{t[kind]:>11.2f} ({c[kind]:>3.0f})" for t, c in columns.values()))


if __name__ == "__main__":
    main()
