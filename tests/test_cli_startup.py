"""The command line is quiet, starts without a backend where none is needed, and spells options one way.

Every check here runs the CLI in a fresh Python process, as a user's shell does:
which modules a command imports and what reaches standard error can only be
seen from outside the test process (which has TensorFlow loaded already).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from kerascope.catalog import METHODS
from kerascope.cli import COMMANDS, build_parser
from kerascope.cli.quiet import is_noise

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("keras", "tensorflow", "jax", "torch")
# what a progress bar line looks like once \r-separated: "gradcam (1/2):  50%|#####     | 1.5/3 [00:05<00:05, ...]"
NO_MODEL = [["--help"], ["--version"], ["methods"], ["methods", "--json"], ["explain", "--help"],
            ["report", "--help"], ["batch", "--help"], ["evaluate", "--help"], ["evaluate-data", "--help"]]
PROGRESS = re.compile(r"^[\w .()/:-]*:\s+\d+%\|.*\|\s*[\d.]+/\d+ \[")


def run_cli(*argv: str, env: dict[str, str] | None = None, probe: bool = False) -> subprocess.CompletedProcess:
    """Run ``kerascope ARGV`` in a fresh interpreter; with ``probe`` print the loaded backends as JSON last."""
    code = (
        "import sys, json\n"
        "from kerascope.cli import main\n"
        f"try:\n    rc = main({list(argv)!r})\nexcept SystemExit as e:\n    rc = e.code or 0\n"
        + (f"print(json.dumps(sorted(m for m in {BACKENDS!r} if m in sys.modules)))\n" if probe else "")
        + "sys.exit(rc)\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=ROOT, timeout=600)


def test_commands_without_a_model_never_import_a_backend():
    code = (
        "import contextlib, io, json, sys\n"
        "from kerascope.cli import main\n"
        f"for argv in {NO_MODEL!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n            rc = main(argv)\n        except SystemExit as e:\n            rc = e.code or 0\n"
        "    assert rc == 0, argv\n"
        f"print(json.dumps(sorted(m for m in {BACKENDS!r} if m in sys.modules)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], "a command without a model imported a backend"
    assert result.stderr == ""


def test_healthy_run_prints_only_progress_and_quiet_prints_nothing(tmp_path):
    out = tmp_path / "demo"
    loud = run_cli("demo", "--out", str(out), "--method", "gradcam,saliency")
    assert loud.returncode == 0, loud.stderr
    assert (out / "index.html").exists()
    lines = [part.strip() for part in re.split(r"[\r\n]+", loud.stderr) if part.strip()]
    assert lines, "a run with progress bars shows them on stderr"
    strangers = [line for line in lines if not PROGRESS.match(line)]
    assert strangers == [], f"stderr holds more than kerascope's progress bars: {strangers}"

    quiet = run_cli("demo", "--out", str(tmp_path / "quiet"), "--method", "saliency", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""

    # `report` rebuilds the page from saved files: no backend, nothing on stderr
    report = run_cli("report", str(out), "--quiet", probe=True)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout.strip().splitlines()[-1]) == []
    assert report.stderr == ""


def test_verbose_lets_backend_logs_through(tmp_path):
    result = run_cli("--verbose", "demo", "--out", str(tmp_path / "v"), "--method", "saliency", "--quiet")
    assert result.returncode == 0
    # TensorFlow's C++ start-up lines (oneDNN, CPU features, CUDA probes) are printed when asked for
    assert any(is_noise(line) for line in result.stderr.splitlines()), result.stderr


def test_missing_backend_names_the_extra_to_install(tmp_path):
    # `sys.modules[name] = None` makes `import jax` fail exactly like an uninstalled package
    code = ("import sys; sys.modules['jax'] = None\nfrom kerascope.cli import main\n"
            f"sys.exit(main(['demo', '--out', {str(tmp_path / 'x')!r}, '--quiet']))\n")
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "the Keras backend 'jax' is not installed" in result.stderr
    assert 'pip install -e ".[jax]"' in result.stderr and "KERAS_BACKEND=tensorflow" in result.stderr


def test_catalogue_lists_exactly_the_registered_methods():
    from kerascope.methods import registry

    registered = {cls.name: cls for cls in registry._REGISTRY.values()}
    assert sorted(e.name for e in METHODS) == sorted(registered)
    for entry in METHODS:
        cls = registered[entry.name]
        assert (cls.__name__, cls.__module__, cls.description) == (entry.class_name, entry.module,
                                                                   entry.description)


def test_every_subcommand_spells_shared_options_one_way():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for module in COMMANDS:
        name = module.__name__.rsplit(".", 1)[-1].replace("_", "-")
        command = sub.choices[name]
        assert "example" in (command.epilog or ""), f"`kerascope {name} --help` shows no example line"
        options = {o: a for a in command._actions for o in a.option_strings}
        if "--method" in options:
            assert options["--methods"] is options["--method"], name
        if "--target" in options:
            assert options["--targets"] is options["--target"], name
        if "--param" in options:
            assert options["--param"].metavar == "KEY=VALUE", name
    for argv in (["evaluate", "--methods", "gradcam,saliency", "--method", "rise"],
                 ["explain", "m.keras", "a.png", "--methods", "gradcam,saliency", "--method", "rise"],
                 ["demo", "--method", "gradcam", "saliency", "--methods", "rise"]):
        assert parser.parse_args(argv).method == ["gradcam", "saliency", "rise"], argv
    assert parser.parse_args(["batch", "m.keras", "d", "--out", "o", "--targets", "t.csv"]).target == "t.csv"
    assert parser.parse_args(["explain", "m.keras", "a.png", "--targets", "3"]).target == 3


def test_batch_refuses_several_methods(tmp_path, capsys):
    from kerascope.cli import main
    from kerascope.data import demo_model_path

    code = main(["batch", str(demo_model_path()), str(tmp_path), "--out", str(tmp_path / "o"),
                 "--method", "gradcam,saliency"])
    assert code == 2
    assert "one method per run" in capsys.readouterr().err


def test_backends_doc_install_lines_and_missing_backend_message(monkeypatch):
    from kerascope.cli import missing_backend_message

    doc = (ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
    assert 'pip install -e ".[jax]"\nexport KERAS_BACKEND=jax\n' in doc  # verbatim from a fresh clone
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    message = missing_backend_message(ModuleNotFoundError("No module named 'jax'", name="jax"))
    assert f"kerascope demo: error: {message}\n" in doc  # the documented message is the real one
