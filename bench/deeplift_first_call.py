"""DeepLIFT with and without fused rules (``fuse_rules``): first and second call, each in a fresh process.

XLA compiles a fused rule once per activation and shape, on the first call with
a new number of rows; the separate TensorFlow ops need no compilation but
allocate more temporaries. For each number of images ``N`` this starts one
fresh interpreter per setting (``fuse_rules=False`` / ``True`` / the default
``None``), rounds alternating, builds the model (``weights=None``), and times
``DeepLIFT(model, fuse_rules=...).explain(x, 1)`` twice: the first call (trace,
compile, run) and the second (run), wall and CPU seconds. A last column runs,
in one process, calls with changing ``N`` (``--changing``) after a first call:
the cost of each new number of rows.

Example::

    python bench/deeplift_first_call.py --model mobilenetv2 --size 160 --images 8 32 256 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {"separate": False, "fused": True, "default": None}


def child(model_name: str, size: int, images: int, fuse: bool | None, changing: list[int]) -> None:
    """Runs in the fresh interpreter: prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    from suite import build_model  # bench/suite.py (its models: weights=None, no softmax head)

    import kerascope as ks

    model = build_model(model_name, size)
    if model_name == "demo":  # the shipped CNN, 64 px whatever --size says
        size = 64
    x = np.random.default_rng(0).uniform(size=(max([images, *changing]), size, size, 3)).astype("float32")
    explainer = ks.DeepLIFT(model, fuse_rules=fuse)
    out: dict[str, float | list[float]] = {}
    for name in ("first", "second"):
        wall, cpu = time.perf_counter(), time.process_time()
        explainer.explain(x[:images], 1)
        out[name] = time.perf_counter() - wall
        out[name + "_cpu"] = time.process_time() - cpu
    later = []
    for n in changing:
        wall = time.perf_counter()
        explainer.explain(x[:n], 1)
        later.append(time.perf_counter() - wall)
    out["changing"] = later
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenetv2", choices=["demo", "mobilenetv2", "resnet50", "vgg16"])
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--images", nargs="+", type=int, default=[8, 32, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--changing", nargs="*", type=int, default=[1, 3, 5],
                        help="numbers of images of the calls after the second (each new: new shapes)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fuse = {"None": None, "True": True, "False": False}[args.child[2]]
        child(args.model, args.size, int(args.child[0]), fuse, [int(v) for v in args.child[1].split(",") if v])
        return
    size = 64 if args.model == "demo" else args.size  # the demo CNN takes 64 px
    print(f"{args.model} {size} px, wall s (CPU s), median of {args.rounds} fresh processes per cell; "
          f"load_avg={','.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'N':>5} {'setting':<9} {'first call':>16} {'second call':>16}   calls with N = {args.changing}")
    for images in args.images:
        results: dict[str, list[dict]] = {k: [] for k in SETTINGS}
        for _ in range(args.rounds):
            for name, fuse in SETTINGS.items():
                command = [sys.executable, __file__, "--model", args.model, "--size", str(args.size),
                           "--child", str(images), ",".join(map(str, args.changing)), str(fuse)]
                line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()
                results[name].append(json.loads(line[-1]))
        for name, runs in results.items():
            def med(key: str, runs: list[dict] = runs) -> float:
                return statistics.median(r[key] for r in runs)
            later = [statistics.median(r["changing"][i] for r in runs) for i in range(len(args.changing))]
            print(f"{images:>5} {name:<9} {med('first'):7.2f} ({med('first_cpu'):5.2f}) "
                  f"{med('second'):7.3f} ({med('second_cpu'):5.3f})   " + " ".join(f"{v:.2f}" for v in later))


if __name__ == "__main__":
    main()
