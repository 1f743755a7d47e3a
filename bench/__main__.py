"""``python -m bench [--list] [SCENARIO...] [--tag TAG] [--backend B] [--quick] [--repeats N] [--set K=V]``.

Scenarios are chosen by name or glob pattern (``'floor-*-demo-8'``) and / or by tag
(``--tag peers``). A scenario that needs another Keras backend, or the peers' environment,
runs in a child ``python -m bench`` with that backend / interpreter; its results land in the
same folder. ``--set key=value`` passes settings to the scenarios (each family documents its
keys; an unknown key is an error).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench import peer_env  # noqa: E402
from bench.scenario import USED_KEYS, Options, Scenario, scenarios  # noqa: E402

CHILD = "KERASCOPE_BENCH_CHILD"  # set in the children the runner starts


def _value(text: str) -> object:
    """``--set`` values: int, float, true / false, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="scenario names or glob patterns (e.g. 'floor-*-demo-8')")
    parser.add_argument("--list", action="store_true", help="list the (chosen) scenarios and exit")
    parser.add_argument("--tag", action="append", default=[], help="only scenarios with this tag (repeatable)")
    parser.add_argument("--backend", choices=["tensorflow", "jax", "torch"], default=None,
                        help="Keras backend for the scenarios that run on any (default: $KERAS_BACKEND)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds per scenario (default 5)")
    parser.add_argument("--quick", action="store_true", help="small sizes and 2 rounds: a smoke run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario setting, e.g. --set samples=32 (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="folder for the JSON results")
    parser.add_argument("--setup-peers", action="store_true",
                        help="create the peers' venv and install tf-keras-vis, Xplique, tf-explain, then stop")
    return parser


def choose(found: dict[str, Scenario], names: list[str], tags: list[str]) -> tuple[list[str], list[str]]:
    """The chosen scenario names (by pattern, then tag) and the patterns that matched none."""
    chosen = [n for n in found if not names or any(fnmatch.fnmatch(n, p) for p in names)]
    chosen = [n for n in chosen if all(t in found[n].tags for t in tags)]
    unknown = [p for p in names if not any(fnmatch.fnmatch(n, p) for n in found)]
    return chosen, unknown


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.setup_peers:
        peer_env.setup()
        return 0
    if args.backend:  # before any scenario imports Keras
        os.environ["KERAS_BACKEND"] = args.backend
    found = scenarios()
    chosen, unknown = choose(found, args.names, args.tag)
    if unknown:
        print(f"Unknown scenario(s): {unknown}. Run `python -m bench --list`.", file=sys.stderr)
        return 2
    if args.list or not (args.names or args.tag):
        for name in chosen:
            item = found[name]
            tags = f" [{', '.join(item.tags)}]" if item.tags else ""
            print(f"{item.name:44s} {item.description}{tags}")
        print(f"{len(chosen)} scenario(s)")
        return 0
    extra = {}
    for pair in args.set:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"--set takes KEY=VALUE. Received: --set {pair!r}.", file=sys.stderr)
            return 2
        extra[key.strip()] = _value(value.strip())
    options = Options(repeats=2 if args.quick else args.repeats, quick=args.quick, extra=extra)
    args.out.mkdir(parents=True, exist_ok=True)
    here = os.environ.get("KERAS_BACKEND", "tensorflow")
    groups: dict[tuple[str, bool], list[str]] = {}
    for name in chosen:  # (backend, peers venv) -> names, in order
        item = found[name]
        groups.setdefault((item.backend or here, item.venv == "peers"), []).append(name)
    status, spawned = 0, False
    for (backend, peers), names in groups.items():
        if backend == here and (peer_env.inside() or not peers):  # the peers' venv also runs the others
            for name in names:
                status |= run_one(found[name], options, args.out, backend)
        elif os.environ.get(CHILD):  # a child that still cannot run them: say so, never start another
            print(f"Cannot run {names} here (backend {here}, peers venv: {peer_env.inside()}; needs backend "
                  f"{backend}{', the peers venv' if peers else ''}).", file=sys.stderr)
            status |= 1
        else:
            status |= child(names, backend, peers, args)
            spawned = True
    if not spawned and not os.environ.get(CHILD):
        unused = sorted(set(extra) - USED_KEYS)  # every scenario ran here: a key none read is a typo
        if unused:
            print(f"--set key(s) that no chosen scenario reads: {unused}. Each family lists its keys in "
                  "its module's docstring (bench/scenarios/).", file=sys.stderr)
            status |= 2
    return status


def child(names: list[str], backend: str, peers: bool, args: argparse.Namespace) -> int:
    """Run ``names`` in a child ``python -m bench`` with ``backend`` (and the peers' interpreter)."""
    python = str(peer_env.python()) if peers else sys.executable
    if peers and not peer_env.python().exists():
        print(f"No peers venv at {peer_env.VENV}: run `python -m bench --setup-peers` first "
              f"(skipped: {', '.join(names)}).", file=sys.stderr)
        return 1
    options = ["--repeats", str(args.repeats), "--out", str(args.out.resolve())]
    options += ["--quick"] if args.quick else []
    for pair in args.set:
        options += ["--set", pair]
    env = {**os.environ, "KERAS_BACKEND": backend, CHILD: "1"}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    print(f"-- {len(names)} scenario(s) in a child process: backend={backend}{', peers venv' if peers else ''}",
          flush=True)
    return subprocess.run([python, "-m", "bench", *names, *options], env=env, cwd=root).returncode


def run_one(item: Scenario, options: Options, out: Path, backend: str) -> int:
    """Run one scenario in this process and write ``out/NAME.json``; 1 if it raised."""
    started = time.time()
    try:
        rows = item.run(options)
        error = None
    except Exception as failure:  # report and carry on with the other scenarios
        rows, error = [], f"{type(failure).__name__}: {failure}"
        traceback.print_exc()
    record = {
        "scenario": item.name, "description": item.description, "rows": rows, "error": error,
        "backend": backend, "repeats": options.repeats, "quick": options.quick, "settings": options.extra,
        "seconds": round(time.time() - started, 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_avg": [round(v, 2) for v in os.getloadavg()]},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path = out / f"{item.name}.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    print(f"== {item.name} ({record['seconds']} s) -> {path}" + (f"  FAILED: {error}" if error else ""), flush=True)
    for row in rows:
        print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())
