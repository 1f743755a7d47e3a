"""Command-line start-up: commands without a model, and the time to ``explain``'s first progress bar.

``cli-startup``: each command runs in a fresh interpreter (as a shell runs it), in rotating order,
one round per ``--repeats``; the baselines are a bare interpreter (``python -c pass``) and
``import keras`` (the backend import every model command pays). ``explain`` is timed until its
first progress-bar frame appears on standard error. One row per command: median and min-max s.

    python -m bench cli-startup --repeats 5
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.scenario import Options, scenario

ROOT = Path(__file__).resolve().parents[2]
CLI = "import sys\nfrom kerascope.cli import main\nsys.exit(main(sys.argv[1:]))"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_to_end(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def run_to_first_bar(argv: list[str]) -> tuple[float, float]:
    """Seconds until the first progress-bar frame (a '%|' on stderr), and until the process ends."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = float("nan")
    seen = b""
    assert process.stderr is not None
    while True:
        chunk = process.stderr.read1(4096)  # type: ignore[attr-defined]
        if not chunk:
            break
        seen += chunk
        if first != first and b"%|" in seen:
            first = time.perf_counter() - start
    process.wait()
    return first, time.perf_counter() - start


@scenario("cli-startup", "CLI start-up: --help, --version, methods, and explain's first progress bar",
          tags=("first-call", "cli", "demo"))
def cli_startup(options: Options) -> list[dict]:
    """Fresh-interpreter seconds of each command, rotating; ``explain`` until its first progress bar."""
    from kerascope.data import demo_images, demo_model_path

    out = tempfile.mkdtemp(prefix="ks-bench-")
    py = sys.executable
    commands = {
        "python -c pass (baseline)": [py, "-c", "pass"],
        "import keras (backend import)": [py, "-c", "import keras"],
        "kerascope --help": [py, "-c", CLI, "--help"],
        "kerascope --version": [py, "-c", CLI, "--version"],
        "kerascope methods": [py, "-c", CLI, "methods"],
        "kerascope report --help": [py, "-c", CLI, "report", "--help"],
    }
    if options.quick:
        commands = {k: commands[k] for k in ("python -c pass (baseline)", "kerascope --version")}
    explain = [py, "-c", CLI, "explain", str(demo_model_path()), *map(str, demo_images()[:4]), "--method",
               "smoothgrad", "--out", out]
    times: dict[str, list[float]] = {name: [] for name in commands}
    first_bar: list[float] = []
    explain_total: list[float] = []
    for round_ in range(options.repeats):
        names = list(commands)
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(run_to_end(commands[name]))
        if not options.quick:
            bar, total = run_to_first_bar(explain)
            first_bar.append(bar)
            explain_total.append(total)
    if first_bar:
        times["explain: first progress bar"] = first_bar
        times["explain: first bar minus import keras (same round)"] = [
            b - k for b, k in zip(first_bar, times["import keras (backend import)"], strict=True)]
        times["explain: whole run (4 images, smoothgrad)"] = explain_total
    rows: list[dict] = [{"command": name, "median_s": statistics.median(values), "min_s": min(values),
                         "max_s": max(values)} for name, values in times.items()]
    return rows + [{"load_avg": os.getloadavg()[0], "cpus": os.cpu_count()}]
