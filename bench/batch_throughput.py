"""Throughput of ``kerascope batch``: local engine vs Ray (N workers) on the bundled demo model.

Generates N shape images (64x64 PNG files, or one .npy), runs Grad-CAM over all
of them with each engine into a fresh folder, and prints images/s (compute phase:
after the model is loaded in the driver and, for Ray, after ``ray.init``), wall
time, and the Ray start-up time. Example::

    python bench/batch_throughput.py --n 20000 --workers 2 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=1024)
    parser.add_argument("--method", default="gradcam")
    parser.add_argument("--inputs", choices=["png", "npy"], default="png")
    parser.add_argument("--engines", default="local,ray")
    args = parser.parse_args()

    import kerascope as ks
    from kerascope.data import demo_model_path

    root = Path(tempfile.mkdtemp(prefix="kerascope-bench-"))
    try:
        start = time.perf_counter()
        source = make_inputs(root, args.n, args.inputs)
        print(f"generated {args.n} inputs ({args.inputs}) in {time.perf_counter() - start:.1f}s", flush=True)
        results = {}
        for engine in args.engines.split(","):
            wall = time.perf_counter()
            summary = ks.batch.run(
                demo_model_path(), source, root / f"out-{engine}", method=args.method, engine=engine,
                workers=args.workers, batch_size=args.batch_size, shard_size=args.shard_size, progress=False,
            )
            wall = time.perf_counter() - wall
            assert summary.processed == args.n, summary.as_dict()
            results[engine] = {
                "images_per_s": round(summary.images_per_s, 1),
                "compute_seconds": round(summary.compute_seconds, 1),
                "wall_seconds": round(wall, 1),
                "ray_init_seconds": round(summary.startup_seconds, 1),
                "wall_images_per_s": round(args.n / wall, 1),
                **{k: v for k, v in summary.details.items() if k in ("num_cpus", "num_gpus", "blocks", "first_result_seconds", "steady_images_per_s")},
            }
            print(engine, json.dumps(results[engine]), flush=True)
        if "local" in results and "ray" in results:
            ratio = results["ray"]["images_per_s"] / results["local"]["images_per_s"]
            print(f"ray/local images/s: {ratio:.2f}")
        print(json.dumps({"n": args.n, "workers": args.workers, "batch_size": args.batch_size,
                          "inputs": args.inputs, "cpus": os.cpu_count(), "results": results}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
