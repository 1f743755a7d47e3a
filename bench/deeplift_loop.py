"""DeepLIFT over a data set: many calls of ``N`` images, the default ``fuse_rules`` against both fixed settings.

The default keeps the separate ops for a call of few inputs (no compilation) and
switches to the fused rules once the calls at that shape have cost, over the
fused rules, about what fusing costs (``kerascope.core.fuse_tier``, a
ski-rental rule). Here each setting (``fuse_rules=None`` / ``False`` /
``True``) runs ``--calls`` calls of ``N`` new images each (a loop over a data
set) in a fresh interpreter, settings rotating over ``--rounds``: the loop's
total (wall and CPU s, the first call included), the call at which the
default fused, and the median of the last ten calls.

Example::

    python bench/deeplift_loop.py --model demo --images 8 --calls 50 200 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {"default": None, "separate": False, "fused": True}


def child(model_name: str, size: int, images: int, calls: int, fuse: bool | None) -> None:
    """Runs in the fresh interpreter: prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    from suite import build_model  # bench/suite.py (its models: weights=None, no softmax head)

    import kerascope as ks

    model = build_model(model_name, size)
    if model_name == "demo":  # the shipped CNN, 64 px whatever --size says
        size = 64
    pool = np.random.default_rng(0).uniform(size=(4 * images, size, size, 3)).astype("float32")
    explainer = ks.DeepLIFT(model, fuse_rules=fuse)
    times, fused_at = [], None
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(calls):
        start = (i % 4) * images
        t = time.perf_counter()
        explainer.explain(pool[start : start + images], 1)
        times.append(time.perf_counter() - t)
        tier = explainer.engine.memo(("deeplift_fuse_tier",), lambda: None)
        if fused_at is None and tier is not None and tier._fused:
            fused_at = i + 1
    out = {"total": time.perf_counter() - wall, "total_cpu": time.process_time() - cpu,
           "fused_at": fused_at, "last10": statistics.median(times[-10:])}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", choices=["demo", "mobilenetv2", "resnet50", "vgg16"])
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--calls", nargs="+", type=int, default=[50, 200])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fuse = {"None": None, "True": True, "False": False}[args.child[1]]
        child(args.model, args.size, args.images, int(args.child[0]), fuse)
        return
    size = 64 if args.model == "demo" else args.size
    print(f"{args.model} {size} px, {args.images} images per call, median of {args.rounds} fresh processes "
          f"per cell; load_avg={','.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'calls':>5} {'setting':<9} {'total wall s':>12} {'total CPU s':>12} {'fused at call':>14} "
          f"{'last 10 calls, s':>17}")
    for calls in args.calls:
        results: dict[str, list[dict]] = {k: [] for k in SETTINGS}
        for r in range(args.rounds):
            order = list(SETTINGS.items())
            for name, fuse in order[r % 3:] + order[: r % 3]:
                command = [sys.executable, __file__, "--model", args.model, "--size", str(args.size),
                           "--images", str(args.images), "--child", str(calls), str(fuse)]
                line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()
                results[name].append(json.loads(line[-1]))
        for name, runs in results.items():
            def med(key: str, runs: list[dict] = runs) -> float:
                return statistics.median(r[key] for r in runs)
            fused_at = ",".join(str(r["fused_at"]) for r in runs)
            print(f"{calls:>5} {name:<9} {med('total'):12.2f} {med('total_cpu'):12.2f} {fused_at:>14} "
                  f"{med('last10'):17.4f}")


if __name__ == "__main__":
    main()
