"""`ks.batch.read` trusts only what the manifest vouches for; a resumed run sees inputs rewritten under the same
names."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import kerascope as ks
from kerascope.data import demo_model_path

pytest.importorskip("pyarrow")


def _run(inputs, out: Path, **kw):
    return ks.batch.run(demo_model_path(), inputs, out, method="saliency", shard_size=2, progress=False, **kw)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    first = rng.uniform(size=(5, 64, 64, 3)).astype("float32")
    _run(first, root / "a")
    _run(first[::-1].copy(), root / "b")  # the same indices and ids, other inputs
    return root


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def test_read_verifies_and_returns_an_untouched_run(two_runs, tmp_path):
    table = ks.batch.read(two_runs / "a")
    assert table.column("index").to_pylist() == [0, 1, 2, 3, 4]


def test_read_names_a_shard_copied_from_another_run(two_runs, tmp_path):
    out = _copy(two_runs / "a", tmp_path / "a")
    shutil.copy(two_runs / "b" / "shards" / "part-00001.parquet", out / "shards" / "part-00001.parquet")
    with pytest.raises(ValueError, match=r"Shard shards/part-00001.parquet does not match the run's manifest "
                                         r"\(checksum differs"):
        ks.batch.read(out)
    assert ks.batch.read(out, verify=False).num_rows == 5  # the opt-out reads what is there


@pytest.mark.parametrize("where", [0.5, 0.9])
def test_read_names_a_shard_with_flipped_bytes(two_runs, tmp_path, where):
    out = _copy(two_runs / "a", tmp_path / "a")
    path = out / "shards" / "part-00002.parquet"
    data = bytearray(path.read_bytes())
    at = int(len(data) * where)
    data[at: at + 8] = bytes(b ^ 0xFF for b in data[at: at + 8])
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"part-00002.parquet does not match"):
        ks.batch.read(out, columns=["index"])


def test_read_names_a_shard_the_manifest_does_not_know(two_runs, tmp_path):
    out = _copy(two_runs / "a", tmp_path / "a")
    shutil.copy(out / "shards" / "part-00000.parquet", out / "shards" / "part-00009.parquet")
    with pytest.raises(ValueError, match=r"part-00009.parquet does not match the run's manifest \(not a shard"):
        ks.batch.read(out)


def _images(folder: Path, shade: int) -> Path:
    folder.mkdir(exist_ok=True)
    for i in range(4):
        Image.fromarray(np.full((64, 64, 3), (shade + 40 * i) % 256, np.uint8)).save(folder / f"img{i}.png")
    return folder


@pytest.mark.parametrize("change", ["rewrite", "touch"])
def test_a_resume_after_inputs_changed_under_the_same_names_is_not_mixed(tmp_path, change):
    folder = _images(tmp_path / "in", 10)
    out = tmp_path / "out"
    _run(str(folder), out)
    first = ks.batch.maps_to_numpy(ks.batch.read(out))
    target = folder / "img2.png"
    if change == "rewrite":  # new content under the same name
        Image.fromarray(np.full((64, 64, 3), 200, np.uint8)).save(target)
    else:  # same size, new modification time
        stat = target.stat()
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    with pytest.raises(ValueError, match=r"holds a different run.*inputs changed"):
        _run(str(folder), out)
    summary = _run(str(folder), out, overwrite=True)
    assert summary.processed == 4 and summary.skipped == 0  # recomputed, not mixed
    again = ks.batch.maps_to_numpy(ks.batch.read(out))
    if change == "touch":
        np.testing.assert_allclose(again, first, rtol=1e-6, atol=1e-7)
    # an unchanged folder still resumes (nothing recomputed)
    assert _run(str(folder), out).skipped == 4
