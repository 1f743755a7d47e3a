"""Batch runs on a real local Ray (Ray Data actor pool): parity, resume, errors, an actor killed mid-run.

Marked ``ray``; skip with ``-m "not ray"``. Needs ``pip install "kerascope[ray]"``.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

import kerascope as ks  # noqa: E402
from kerascope.batch.ray_engine import start_ray  # noqa: E402
from kerascope.batch.sources import ImageFiles  # noqa: E402
from kerascope.io.images import load_images  # noqa: E402
from tests.test_batch_local import SIZE, _tiny_model, write_images  # noqa: E402

pytestmark = pytest.mark.ray


class KillOnFirstBatch(ImageFiles):
    """Image source whose first ``load`` in any process kills that process (SIGKILL), once per marker file.

    It runs inside a Ray actor: the actor dies in the middle of a batch, as on an out-of-memory kill.
    """

    def __init__(self, paths, ids, marker):
        super().__init__(paths, ids)
        self.marker = str(marker)

    def load(self, indices, shape, mode="unit"):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return super().load(indices, shape, mode)
        os.write(fd, f"{os.getpid()} {int(indices[0])}".encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def local_ray():
    started, seconds = start_ray()
    assert ray.is_initialized()
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors get KillOnFirstBatch by value
    yield seconds
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_ray")
    model = _tiny_model()
    model.save(root / "tiny.keras")
    folder = root / "images"
    paths = write_images(folder, 300, seed=11)
    (folder / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\ntruncated")
    (folder / "b" / "notes.png").write_text("a text file with an image suffix")
    return {"root": root, "model": model, "model_path": root / "tiny.keras", "folder": folder, "paths": paths}


def expected_maps(data, ids):
    keys = [p.relative_to(data["folder"]).as_posix() for p in data["paths"]]
    x = load_images(data["paths"], (SIZE, SIZE)).inputs
    maps = ks.GradCAM(data["model"], layer="conv").explain(x).attributions
    return [ids.index(k) for k in keys], maps


def test_ray_resumes_a_local_run_and_matches_the_in_process_api(local_ray, data, tmp_path):
    out = tmp_path / "out"

    def interrupt(shard):
        if shard == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ks.batch.run(data["model_path"], data["folder"], out, layer="conv", shard_size=40, batch_size=16,
                     progress=False, on_shard=interrupt)
    summary = ks.batch.run(data["model_path"], data["folder"], out, layer="conv", shard_size=40, batch_size=16,
                           engine="ray", workers=2, progress=False)
    assert (summary.shards_skipped, summary.shards_written, summary.skipped) == (3, 5, 120)
    assert summary.processed + summary.failed == 302 - 120
    assert summary.details["actors"] == 2
    table = ks.batch.read(out)
    assert table.column("index").to_pylist() == list(range(302))
    ids = table.column("id").to_pylist()
    order, expected = expected_maps(data, ids)
    np.testing.assert_allclose(ks.batch.maps_to_numpy(table)[order], expected, rtol=1e-4, atol=1e-6)
    errors = {row["id"]: row["error"] for row in pq.read_table(out / "errors.parquet").to_pylist()}
    assert set(errors) == {"a/broken.png", "b/notes.png"}
    assert all("not a readable image" in why for why in errors.values())


def test_actor_killed_mid_run_every_input_exactly_once(local_ray, data, tmp_path):
    marker = tmp_path / "killed"
    base = ks.batch.open_source(data["folder"])
    source = KillOnFirstBatch(base.paths, base.ids(), marker)
    out = tmp_path / "out"
    summary = ks.batch.run(data["model_path"], source, out, layer="conv", shard_size=50, batch_size=16,
                           engine="ray", workers=2, progress=False)
    pid, first = (int(v) for v in marker.read_text().split())
    assert pid != os.getpid() and first >= 0  # an actor process died in its first batch
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (summary.processed, summary.failed, summary.shards_written) == (300, 2, 7)
    table = ks.batch.read(out)
    assert table.column("index").to_pylist() == list(range(302))  # no loss, no duplicates
    assert summary.details.get("duplicates_dropped", 0) == 0
    ids = table.column("id").to_pylist()
    order, expected = expected_maps(data, ids)
    np.testing.assert_allclose(ks.batch.maps_to_numpy(table)[order], expected, rtol=1e-4, atol=1e-6)
