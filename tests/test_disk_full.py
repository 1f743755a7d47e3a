"""A full disk during `explain` and `batch`, for real: a size-limited tmpfs mounted for the test (root only).

One clear line, no partial files (0-byte pictures, temporary .npz or shards), and a consistent folder: all of the
earlier run (explain), or the shards already complete, resumable (batch)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import kerascope as ks
from kerascope.cli import main
from kerascope.data import demo_images, demo_model_path


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _no_partial_files(folder: Path) -> None:
    every = [p for p in folder.rglob("*")]
    assert not [p for p in every if p.is_file() and p.stat().st_size == 0], every
    assert not [p for p in every if ".tmp" in p.name or p.name.startswith(".kerascope")], every


def _explain(out: Path, images: list, *extra: str) -> int:
    return main(["explain", str(demo_model_path()), *map(str, images), "--method", "saliency,gradcam",
                 "--out", str(out), "--quiet", *extra])


def test_a_full_disk_during_explain_leaves_the_earlier_run_whole(small_disk, capfd):
    out = small_disk / "run"
    assert _explain(out, demo_images()[:1]) == 0
    before = _files(out)
    capfd.readouterr()
    assert _explain(out, demo_images() * 2, "--overwrite") == 2
    captured = capfd.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Not enough disk space" in lines[0] and "Traceback" not in captured.err, lines
    assert _files(out) == before  # all of the old run: pictures, arrays, summary and page agree
    _no_partial_files(out)
    assert main(["report", str(out), "--quiet"]) == 0


def test_a_full_disk_during_a_first_explain_leaves_no_files(small_disk, capfd):
    out = small_disk / "fresh"
    assert _explain(out, demo_images() * 2) == 2
    assert "Not enough disk space" in capfd.readouterr().err
    assert _files(out) == {}
    _no_partial_files(out)


def test_a_full_disk_during_batch_is_one_line_and_the_written_shards_verify(small_disk, capfd):
    pytest.importorskip("pyarrow")
    out = small_disk / "batch"
    folder = demo_images()[0].parent
    code = main(["batch", str(demo_model_path()), str(folder), "--method", "saliency", "--out", str(out),
                 "--quiet", "--shard-size", "2", "--overlays"])
    captured = capfd.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Not enough disk space" in lines[0] and "resume" in lines[0], lines
    _no_partial_files(out)
    shards = sorted((out / "shards").glob("part-*.parquet"))
    if shards:  # whatever was written is complete and named by the manifest
        table = ks.batch.read(out)
        assert table.num_rows == 2 * len(shards)
