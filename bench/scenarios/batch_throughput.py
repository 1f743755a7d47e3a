"""Throughput of ``kerascope batch``: the local engine vs Ray (N workers) on the bundled demo model.

``batch-throughput-ENGINE`` generates ``n`` shape images (64x64 PNG files, or one ``.npy``), runs
Grad-CAM over all of them into a fresh folder, and reports images/s (compute phase: after the
model is loaded in the driver and, for Ray, after ``ray.init``), wall time, and Ray's start-up
time. Settings: ``n`` (20000), ``workers`` (2), ``batch_size`` (64), ``shard_size`` (1024),
``method`` (``gradcam``), ``inputs`` (``png`` or ``npy``).

    python -m bench batch-throughput-local batch-throughput-ray --repeats 1
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench.scenario import Options, scenario, settings


@dataclass(frozen=True)
class BatchSettings:
    n: int = 20000
    workers: int = 2
    batch_size: int = 64
    shard_size: int = 1024
    method: str = "gradcam"
    inputs: str = "png"


def make_inputs(root: Path, n: int, kind: str) -> Path:
    """Generate ``n`` demo-like images as PNG files in a folder, or one ``.npy`` file."""
    from PIL import Image

    from kerascope.data import generate_shapes

    if kind == "npy":
        x, _, _ = generate_shapes(n, size=64, seed=0)
        np.save(root / "inputs.npy", x)
        return root / "inputs.npy"
    folder = root / "images"
    for start in range(0, n, 1000):
        x, _, _ = generate_shapes(min(1000, n - start), size=64, seed=start)
        sub = folder / f"{start // 1000:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        for i, image in enumerate(x):
            Image.fromarray(np.round(image * 255).astype(np.uint8)).save(sub / f"{start + i:06d}.png")
    return folder


def throughput(engine: str, options: Options) -> list[dict]:
    """One ``kerascope batch`` run per round with ``engine`` over freshly generated inputs."""
    import kerascope as ks
    from kerascope.data import demo_model_path

    args = settings(BatchSettings, options, **({"n": 64, "shard_size": 32} if options.quick else {}))
    root = Path(tempfile.mkdtemp(prefix="kerascope-bench-"))
    rows = []
    try:
        source = make_inputs(root, args.n, args.inputs)
        for round_ in range(1 if options.quick else options.repeats):
            wall = time.perf_counter()
            summary = ks.batch.run(
                demo_model_path(), source, root / f"out-{engine}-{round_}", method=args.method, engine=engine,
                workers=args.workers, batch_size=args.batch_size, shard_size=args.shard_size, progress=False,
            )
            wall = time.perf_counter() - wall
            if summary.processed != args.n:
                raise RuntimeError(f"Processed {summary.processed} of {args.n} inputs: {summary.as_dict()}")
            rows.append({
                "engine": engine, "n": args.n, "workers": args.workers, "batch_size": args.batch_size,
                "inputs": args.inputs, "images_per_s": summary.images_per_s,
                "compute_seconds": summary.compute_seconds, "wall_seconds": wall,
                "ray_init_seconds": summary.startup_seconds, "wall_images_per_s": args.n / wall,
                **{k: v for k, v in summary.details.items()
                   if k in ("num_cpus", "num_gpus", "blocks", "first_result_seconds", "steady_images_per_s")},
            })
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


for _engine in ("local", "ray"):
    scenario(f"batch-throughput-{_engine}", f"kerascope batch, {_engine} engine: images/s over generated PNGs, demo",
             tags=("batch", _engine, "demo"))(partial(throughput, _engine))
