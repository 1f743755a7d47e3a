"""Per-row cost of a compiled forward+backward pass against the chunk size (``batch_size``).

kerascope runs every multi-row explanation in chunks of ``batch_size`` rows (default 32); this
measures what a row costs at each chunk size, to decide that default. The pass is the floor of
``bench/floor.py`` (``Baselines``: ``tf.GradientTape`` inside one ``tf.function`` with a ``None``
batch dimension, fixed input tensors): input gradient of one class score per row. Every chunk size
does the same work per measurement (``total_rows`` rows, or one chunk when the chunk is larger),
after one warm-up call per chunk size; the chunk sizes then take turns, the order rotating every
round , so that load from other processes hits all of them alike.

Printed per model, input size and chunk size: milliseconds per row of process CPU time and of wall
time (median of the rounds, then the min-max), each relative to the current default
(32 rows), and the peak RSS increase of one chunk (``VmHWM`` over the RSS before the first pass, at the first
call of each chunk size; one process per model and size), which is what ``batch_size`` bounds.

``chunk-size-MODEL-SIZE`` runs in a fresh process (the peak memory starts from a fresh
allocator). Settings: ``rows`` (comma-separated chunk sizes, ``8,16,32,64,128``), ``total_rows``
(64), ``threads`` (1: one TensorFlow thread, CPU seconds measure the work done; 0: TensorFlow's
default pools).

    python -m bench 'chunk-size-*' --repeats 3
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from bench.scenario import Options, scenario, settings

DEFAULT = 32  # kerascope's default batch_size


@dataclass(frozen=True)
class ChunkSettings:
    rows: tuple[str, ...] = ("8", "16", "32", "64", "128")
    total_rows: int = 64
    threads: int = 1


def timed(fn: Callable[[], None]) -> Callable[[], tuple[float, float]]:
    """``fn`` wrapped to return its (CPU seconds, wall seconds)."""

    def run() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        return time.process_time() - cpu, time.perf_counter() - wall

    return run


def measure(name: str, size: int, chunk_rows: list[int], total_rows: int, threads: int, repeats: int) -> list[dict]:
    """The rows of one model at one input size (run in a fresh process by :func:`chunk_size`)."""
    import tensorflow as tf

    if threads:  # before any op runs: the thread pools are fixed at TensorFlow's first use
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    from bench.floor import Baselines
    from bench.models import build_model
    from bench.timing import peak_kib, reset_peak, rotating_calls

    model = build_model(name, size)
    base = Baselines(model, model.layers[-1], False)
    runs = {rows: base.plan([("grad", max(rows, total_rows))], rows) for rows in chunk_rows}
    for rows in chunk_rows:
        base.chunk(rows)  # the fixed inputs, built before the memory baseline
    base.kinds["grad"](*base.chunk(1))[0].numpy()  # trace once (batch dimension None)
    start = reset_peak()
    peaks = {}
    for rows in sorted(chunk_rows):  # first call of each chunk size
        reset_peak()
        base.kinds["grad"](*base.chunk(rows))[0].numpy()
        peaks[rows] = (peak_kib() - start) / 1024
    for run in runs.values():  # warm-up (oneDNN primitives for this shape)
        run()
    pairs = rotating_calls({rows: timed(runs[rows]) for rows in chunk_rows}, repeats)  # two clocks per call
    cpu = {rows: [c * 1000 / max(rows, total_rows) for c, _ in pairs[rows]] for rows in chunk_rows}
    wall = {rows: [w * 1000 / max(rows, total_rows) for _, w in pairs[rows]] for rows in chunk_rows}
    ref = DEFAULT if DEFAULT in chunk_rows else chunk_rows[0]
    ref_cpu, ref_wall = statistics.median(cpu[ref]), statistics.median(wall[ref])
    out = []
    for rows in chunk_rows:
        c, w = statistics.median(cpu[rows]), statistics.median(wall[rows])
        out.append({"model": name, "size": size, "threads": threads or "default", "rows": rows,
                    "cpu_ms_per_row": c, "cpu_min": min(cpu[rows]), "cpu_max": max(cpu[rows]),
                    "cpu_vs_default": c / ref_cpu, "wall_ms_per_row": w, "wall_min": min(wall[rows]),
                    "wall_max": max(wall[rows]), "wall_vs_default": w / ref_wall, "peak_delta_mib": peaks[rows]})
    return out


def chunk_size(name: str, size: int, options: Options) -> list[dict]:
    """Per-row cost at each chunk size, in a fresh interpreter."""
    quick = {"rows": ("4", "8"), "total_rows": 8} if options.quick else {}
    args = settings(ChunkSettings, options, **quick)
    if options.quick:
        size = 64
    call = json.dumps({**asdict(args), "rows": [int(r) for r in args.rows], "repeats": options.repeats,
                       "name": name, "size": size})
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", "bench.scenarios.chunk_size", call], capture_output=True,
                          text=True, env=env, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"The chunk-size child failed: {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


for _name in ("mobilenetv2", "resnet50"):
    for _size in (160, 224):
        scenario(f"chunk-size-{_name}-{_size}", f"per-row cost of a forward+backward chunk vs its size, "
                 f"{_name} {_size} px", tags=("chunk-size", _name), backend="tensorflow")(
            partial(chunk_size, _name, _size))


if __name__ == "__main__":  # the child of chunk_size
    spec = json.loads(sys.argv[1])
    print(json.dumps(measure(spec["name"], spec["size"], spec["rows"], spec["total_rows"], spec["threads"],
                             spec["repeats"])))
