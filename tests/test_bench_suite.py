"""The benchmark runner ``python -m bench``: listing, choosing, settings, routing, and one real smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import peer_env
from bench.__main__ import choose, main
from bench.scenario import Options, scenarios, settings
from bench.timing import rotating_calls, summary

ROOT = Path(__file__).resolve().parents[1]


def test_list_names_every_family_without_importing_a_backend():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ("import sys, runpy; sys.argv = ['bench', '--list']; runpy.run_module('bench', run_name='__main__')\n"
            "heavy = [m for m in ('tensorflow', 'keras', 'jax', 'torch') if m in sys.modules]\n"
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    names = {line.split()[0] for line in done.stdout.splitlines()[:-1]}
    for name in ("floor-saliency-demo-64", "floor-deeplift-vgg16-8", "memory-rise-demo-8", "peers-gradcam-resnet50",
                 "accuracy-smoothgrad-demo", "precision-integrated_gradients-mobilenetv2", "first-call-saliency",
                 "backends-smoothgrad-jax", "chunk-size-resnet50-224", "feature-masks-lime-demo", "cli-startup",
                 "batch-throughput-ray"):
        assert name in names
    assert done.stdout.splitlines()[-1] == f"{len(names)} scenario(s)"


def test_choose_by_pattern_and_tag_and_name_the_unknown():
    found = scenarios()
    chosen, unknown = choose(found, ["floor-*-demo-8"], ["deeplift"])
    assert chosen == ["floor-deeplift-demo-8"] and unknown == []
    chosen, _ = choose(found, [], ["peers", "mobilenetv2", "saliency"])
    assert set(chosen) == {"peers-saliency-mobilenetv2", "first-call-saliency"}
    assert choose(found, ["no-such-*"], [])[1] == ["no-such-*"]
    assert found["peers-rise-demo"].venv == "peers" and found["backends-gradcam-torch"].backend == "torch"


def test_unknown_scenario_and_bad_set_are_errors(capsys):
    assert main(["no-such-scenario"]) == 2
    assert "python -m bench --list" in capsys.readouterr().err
    assert main(["cli-startup", "--set", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_settings_override_defaults_and_leave_other_keys():
    @dataclass(frozen=True)
    class Knobs:
        samples: int = 16
        names: tuple[str, ...] = ("a",)

    assert settings(Knobs, Options(extra={"names": "x,y"}), samples=4) == Knobs(4, ("x", "y"))
    assert settings(Knobs, Options(extra={"samples": 32, "other": 1}), samples=4) == Knobs(32, ("a",))


def test_a_set_key_no_scenario_reads_is_reported(tmp_path, capsys):
    assert main(["cli-startup", "--quick", "--set", "sampels=3", "--out", str(tmp_path)]) == 2
    assert "no chosen scenario reads: ['sampels']" in capsys.readouterr().err


def test_rotation_and_summary_are_per_round():
    order = []
    calls = rotating_calls({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3)
    assert order == ["a", "b", "b", "a", "a", "b"] and len(calls["a"]) == 3
    stats = summary({"ours": [2.0, 3.0, 9.0], "floor": [1.0, 2.0, 3.0]}, "floor")
    assert stats["ours"] == {"median_s": 3.0, "ratio": 2.0, "ratio_min": 1.5, "ratio_max": 3.0}


def test_peer_scenarios_go_to_the_peers_venv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peer_env, "VENV", tmp_path / "missing-venv")
    assert main(["peers-saliency-demo", "--quick", "--out", str(tmp_path)]) == 1
    assert "python -m bench --setup-peers" in capsys.readouterr().err
    assert not (tmp_path / "peers-saliency-demo.json").exists()


def test_quick_floor_scenario_writes_its_rows(tmp_path):
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the floor is hand-written TensorFlow; other backends run it in a child process")
    assert main(["floor-saliency-demo-1", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "floor-saliency-demo-1.json").read_text())
    assert record["error"] is None and record["quick"] and record["repeats"] == 2
    (row,) = record["rows"]
    assert row["method"] == "saliency" and row["images"] == 1
    assert row["ours_s"] > 0 and row["floor_s"] > 0
    assert row["ratio_min"] <= row["ratio_max"] and row["peak_mib"] > 0


def test_a_child_never_starts_another_child(tmp_path, monkeypatch, capsys):
    from bench.__main__ import CHILD

    monkeypatch.setenv(CHILD, "1")
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert main(["backends-saliency-jax", "--quick", "--out", str(tmp_path)]) == 1
    assert "needs backend jax" in capsys.readouterr().err


def _documented_commands() -> list[list[str]]:
    """The ``python -m bench ...`` lines of the docs, shell-expanded (braces, quotes)."""
    lines = []
    for page in ("docs/performance.md", "docs/batch.md", "README.md"):
        for line in (ROOT / page).read_text().splitlines():
            if line.startswith("python -m bench "):
                lines.append(line.split("#")[0].strip()[len("python -m bench "):])
    expanded = subprocess.run(["bash", "-c", "\n".join(f"printf '%s\\0' {args}; printf '\\n'" for args in lines)],
                              capture_output=True, text=True, check=True).stdout
    return [[a for a in line.split("\0") if a] for line in expanded.splitlines()]


def test_every_documented_command_names_scenarios_and_settings_that_exist():
    import dataclasses
    import importlib

    from bench import floor

    found = scenarios()
    keys = {f.name for f in dataclasses.fields(floor.Settings)}
    for module in {item.run.func.__module__ for item in found.values() if hasattr(item.run, "func")}:
        for value in vars(importlib.import_module(module)).values():
            if dataclasses.is_dataclass(value) and isinstance(value, type):
                keys |= {f.name for f in dataclasses.fields(value)}
    commands = _documented_commands()
    assert len(commands) >= 15
    for argv in commands:
        names = [a for a in argv if not a.startswith("-")]
        sets = [argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--set"]
        names = [n for n in names if n not in {argv[i + 1] for i, a in enumerate(argv) if a in ("--set", "--repeats",
                                                                                             "--tag")}]
        assert not choose(found, names, [])[1], argv
        assert set(sets) <= keys, argv
