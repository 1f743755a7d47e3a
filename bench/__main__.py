"""``python -m bench --list`` / ``python -m bench SCENARIO... [--repeats N] [--quick] [--out DIR]``."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench.scenario import Options, scenarios  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="scenario names or glob patterns (e.g. 'lm-*')")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per scenario (default 5)")
    parser.add_argument("--quick", action="store_true", help="small sizes and 2 rounds: a smoke run")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="folder for the JSON results")
    args = parser.parse_args(argv)
    found = scenarios()
    if args.list or not args.names:
        for item in found.values():
            tags = f" [{', '.join(item.tags)}]" if item.tags else ""
            print(f"{item.name:40s} {item.description}{tags}")
        return 0
    chosen = [name for name in found if any(fnmatch.fnmatch(name, pattern) for pattern in args.names)]
    unknown = [p for p in args.names if not any(fnmatch.fnmatch(n, p) for n in found)]
    if unknown:
        print(f"Unknown scenario(s): {unknown}. Run `python -m bench --list`.", file=sys.stderr)
        return 2
    options = Options(repeats=2 if args.quick else args.repeats, quick=args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        started = time.time()
        rows = found[name].run(options)
        record = {
            "scenario": name, "description": found[name].description, "rows": rows,
            "repeats": options.repeats, "quick": options.quick, "seconds": round(time.time() - started, 1),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(record, indent=1, default=float))
        print(f"== {name} ({record['seconds']} s) -> {path}")
        for row in rows:
            print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
