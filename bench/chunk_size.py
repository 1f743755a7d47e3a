"""Per-row cost of a compiled forward+backward pass against the chunk size (``batch_size``).

kerascope runs every multi-row explanation in chunks of ``batch_size`` rows (default 32); this
measures what a row costs at each chunk size, to decide that default. The pass is the floor of
``bench/suite.py`` (``Baselines``: ``tf.GradientTape`` inside one ``tf.function`` with a ``None``
batch dimension, fixed input tensors): input gradient of one class score per row. Every chunk size
does the same work per measurement (``--total-rows`` rows, or one chunk when the chunk is larger),
after one warm-up call per chunk size; the chunk sizes then take turns, the order rotating every
round (``bench/timing.py``), so that load from other processes hits all of them alike.

Printed per model, input size and chunk size: milliseconds per row of process CPU time and of wall
time (median of ``--repeats`` rounds, then the min-max), each relative to the current default
(32 rows), and the peak RSS increase of one chunk (``VmHWM`` over the RSS before the first pass, at the first
call of each chunk size; one process per model and size), which is what ``batch_size`` bounds.

``--threads 1`` runs TensorFlow on one compute thread (then CPU seconds measure the work done,
steady on a loaded machine); ``--threads 0`` keeps TensorFlow's default thread pools.

Examples::

    python bench/chunk_size.py --threads 1 --models mobilenetv2 resnet50 --sizes 160 224
    python bench/chunk_size.py --threads 0 --models mobilenetv2 --sizes 160 --rows 8 16 32 64 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DEFAULT = 32  # kerascope's default batch_size (kerascope/methods/base.py, kerascope/core/engine.py)


def timed(fn: Callable[[], None]) -> Callable[[], tuple[float, float]]:
    """``fn`` wrapped to return its (CPU seconds, wall seconds)."""

    def run() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        return time.process_time() - cpu, time.perf_counter() - wall

    return run


def measure(name: str, size: int, args: argparse.Namespace) -> None:
    """Print the table of one model at one input size (in a fresh process: see :func:`main`)."""
    import tensorflow as tf

    if args.threads:  # before any op runs: the thread pools are fixed at TensorFlow's first use
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from suite import Baselines, build_model, peak_kib, reset_peak  # bench/suite.py
    from timing import rotating_calls  # bench/timing.py

    model = build_model(name, size)
    base = Baselines(model, model.layers[-1], False)
    runs = {rows: base.plan([("grad", max(rows, args.total_rows))], rows) for rows in args.rows}
    for rows in args.rows:
        base.chunk(rows)  # the fixed inputs, built before the memory baseline
    base.kinds["grad"](*base.chunk(1))[0].numpy()  # trace once (batch dimension None)
    start = reset_peak()
    peaks = {}
    for rows in sorted(args.rows):  # first call of each chunk size
        reset_peak()
        base.kinds["grad"](*base.chunk(rows))[0].numpy()
        peaks[rows] = (peak_kib() - start) / 1024
    for run in runs.values():  # warm-up (oneDNN primitives for this shape)
        run()
    # bench/timing.py's rotation, with two clocks per call
    pairs = rotating_calls({rows: timed(runs[rows]) for rows in args.rows}, args.repeats)
    cpu = {rows: [c * 1000 / max(rows, args.total_rows) for c, _ in pairs[rows]] for rows in args.rows}
    wall = {rows: [w * 1000 / max(rows, args.total_rows) for _, w in pairs[rows]] for rows in args.rows}
    ref = DEFAULT if DEFAULT in args.rows else args.rows[0]
    ref_cpu, ref_wall = statistics.median(cpu[ref]), statistics.median(wall[ref])
    threads = f"{args.threads} thread(s)" if args.threads else "default threads"
    print(f"\n{name} {size}x{size}, {threads}, tf={tf.__version__}  (ms per row: median, min-max over "
          f"{args.repeats} rounds; x: / the {ref}-row median)")
    print(f"{'rows':>5}{'CPU ms/row':>12}{'min-max':>16}{'x':>7}{'wall ms/row':>13}{'min-max':>16}{'x':>7}"
          f"{'peak +MiB':>11}")
    for rows in args.rows:
        c, w = statistics.median(cpu[rows]), statistics.median(wall[rows])
        print(f"{rows:>5}{c:12.1f}{min(cpu[rows]):8.1f}-{max(cpu[rows]):<7.1f}{c / ref_cpu:7.2f}"
              f"{w:13.1f}{min(wall[rows]):8.1f}-{max(wall[rows]):<7.1f}{w / ref_wall:7.2f}{peaks[rows]:11.0f}")
    print(f"load_avg={','.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenetv2", "resnet50"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[160, 224])
    parser.add_argument("--rows", nargs="+", type=int, default=[8, 16, 32, 64, 128], help="chunk sizes")
    parser.add_argument("--total-rows", type=int, default=64,
                        help="rows per measurement (a chunk larger than this is measured on one chunk)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow compute threads; 0: TensorFlow's default")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        measure(args.one[0], int(args.one[1]), args)
        return
    print(f"rows={args.rows} total_rows={args.total_rows} repeats={args.repeats} threads={args.threads or 'default'} "
          f"load_avg={','.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    for name in args.models:  # one process per model and size: the peak memory starts from a fresh allocator
        for size in args.sizes:
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", name, str(size)], check=True)


if __name__ == "__main__":
    main()
