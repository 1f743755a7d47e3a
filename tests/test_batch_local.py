"""Batch runs with the local engine: parity with the in-process API, errors table, targets, resume.

No Ray involved: the interrupted run executes in a subprocess in which ``import ray`` fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import kerascope as ks
from kerascope.batch import shards as sh
from kerascope.data import generate_shapes
from kerascope.io.images import load_images

SIZE = 16


def _tiny_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((SIZE, SIZE, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.Conv2D(6, 3, activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(3, activation="softmax", name="dense"),
    ], name="tiny_batch")


def write_images(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` generated shape images as PNG, alternating between two sub-folders."""
    x, _, _ = generate_shapes(n, size=SIZE, seed=seed)
    paths = []
    for i, image in enumerate(x):
        path = folder / ("a" if i % 2 else "b") / f"img{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(image * 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_local")
    model = _tiny_model()
    model_path = root / "tiny.keras"
    model.save(model_path)
    folder = root / "images"
    paths = write_images(folder, 40)
    (folder / "a" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (folder / "b" / "empty.jpg").write_bytes(b"")
    return {"root": root, "model": model, "model_path": model_path, "folder": folder, "paths": paths}


def logits_by_hand(model: keras.Model, x: np.ndarray) -> np.ndarray:
    """Pre-softmax logits from the pooled features and the Dense weights (independent of kerascope)."""
    pooled = keras.ops.convert_to_numpy(keras.Model(model.inputs[0], model.get_layer("gap").output)(x))
    kernel, bias = model.get_layer("dense").get_weights()
    return pooled @ kernel + bias


def rows_by_id(table: pa.Table) -> dict[str, dict]:
    return {row["id"]: row for row in table.drop_columns(["map"]).to_pylist()}


def test_local_run_matches_in_process_api(setup, tmp_path):
    out = tmp_path / "out"
    summary = ks.batch.run(setup["model_path"], setup["folder"], out, method="gradcam", layer="conv",
                           shard_size=16, batch_size=8, progress=False, overlays=True)
    assert (summary.processed, summary.failed, summary.shards_written) == (40, 2, 3)
    table = ks.batch.read(out)
    ids = table.column("id").to_pylist()
    assert table.column("index").to_pylist() == list(range(42))
    assert sorted(ids) == sorted({*ids}) and len(ids) == 42  # every input exactly once
    rows = rows_by_id(table)
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert {e["id"] for e in errors} == {"a/corrupt.png", "b/empty.jpg"}
    assert all("not a readable image" in e["error"] for e in errors)

    # In-process API on the same files (read back from PNG like the batch does).
    ok_paths = setup["paths"]
    x = load_images(ok_paths, (SIZE, SIZE)).inputs
    expected = ks.GradCAM(setup["model"], layer="conv").explain(x)
    keys = [p.relative_to(setup["folder"]).as_posix() for p in ok_paths]
    order = [ids.index(k) for k in keys]
    maps = ks.batch.maps_to_numpy(table)[order]
    np.testing.assert_allclose(maps, expected.attributions, rtol=1e-4, atol=1e-6)
    logits = logits_by_hand(setup["model"], x)
    np.testing.assert_array_equal([rows[k]["predicted"] for k in keys], logits.argmax(-1))
    np.testing.assert_array_equal([rows[k]["target"] for k in keys], logits.argmax(-1))
    np.testing.assert_allclose([rows[k]["score"] for k in keys], logits.max(-1), rtol=1e-4, atol=1e-5)
    assert np.isnan(ks.batch.maps_to_numpy(table)[ids.index("a/corrupt.png")]).all()

    manifest = ks.batch.manifest(out)
    assert manifest["status"] == "complete"
    assert manifest["model_sha256"] == hashlib.sha256(setup["model_path"].read_bytes()).hexdigest()
    assert manifest["kerascope_version"] == ks.__version__
    assert manifest["method"] == "gradcam" and manifest["method_params"]["layer"] == "conv"
    assert manifest["map_shape"] == [SIZE, SIZE] and manifest["num_inputs"] == 42
    assert len(list((out / "overlays").glob("*.png"))) == 40


def test_targets_csv_npy_input_and_map_resolution(setup, tmp_path):
    x, _, _ = generate_shapes(12, size=SIZE, seed=5)
    npy = tmp_path / "x.npy"
    np.save(npy, x)
    targets_csv = tmp_path / "labels.csv"
    wanted = {i: (i * 2) % 3 for i in range(0, 12, 2)}  # every other input gets an explicit target
    targets_csv.write_text("id,class\n" + "".join(f"{i},{t}\n" for i, t in wanted.items()))
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="6 of 12 input"):  # the uncovered inputs are counted
        summary = ks.batch.run(setup["model_path"], npy, out, targets=targets_csv, map_size=(8, 8),
                               map_dtype="float16", shard_size=5, batch_size=4, progress=False)
    assert (summary.processed, summary.failed) == (12, 0)
    table = ks.batch.read(out)
    assert table.schema.field("map").type.value_type == pa.float16()
    logits = logits_by_hand(setup["model"], x)
    chosen = np.array([wanted.get(i, int(logits[i].argmax())) for i in range(12)])
    np.testing.assert_array_equal(table.column("target").to_numpy(), chosen)
    np.testing.assert_array_equal(table.column("predicted").to_numpy(), logits.argmax(-1))
    np.testing.assert_allclose(table.column("score").to_numpy(), logits[np.arange(12), chosen], rtol=1e-4, atol=1e-5)
    full = ks.GradCAM(setup["model"], layer="conv").explain(x, [int(t) for t in chosen]).attributions
    resized = np.asarray(keras.ops.image.resize(full[..., None], (8, 8), interpolation="bilinear",
                                                antialias=False))[..., 0]
    maps = ks.batch.maps_to_numpy(table)
    assert maps.shape == (12, 8, 8)
    np.testing.assert_allclose(maps, resized, rtol=2e-3, atol=2e-3 * float(np.abs(resized).max()))


def test_parquet_arrays_with_wrong_shapes_go_to_errors(setup, tmp_path):
    x, _, _ = generate_shapes(6, size=SIZE, seed=9)
    rows = [img.reshape(-1).tolist() for img in x]
    rows[2] = rows[2][:-3]  # wrong number of values
    rows[4] = x[4][:8].reshape(-1).tolist()
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(6)], "array": rows}), source)
    out = tmp_path / "out"
    summary = ks.batch.run(setup["model_path"], source, out, method="saliency", progress=False)
    assert (summary.processed, summary.failed) == (4, 2)
    table = ks.batch.read(out)
    errors = dict(zip(table.column("id").to_pylist(), table.column("error").to_pylist(), strict=True))
    assert errors["r2"].startswith("wrong shape") and errors["r4"].startswith("wrong shape")
    good = [0, 1, 3, 5]
    expected = ks.Saliency(setup["model"]).explain(x[good]).attributions
    np.testing.assert_allclose(ks.batch.maps_to_numpy(table)[good], expected, rtol=1e-4, atol=1e-6)


KILLER = textwrap.dedent("""
    import os, signal, sys
    import kerascope as ks

    def on_shard(shard):
        if shard == 1:  # two shards on disk: die without any clean-up
            os.kill(os.getpid(), signal.SIGKILL)

    assert "ray" not in sys.modules
    ks.batch.run(sys.argv[1], sys.argv[2], sys.argv[3], layer="conv", shard_size=10, batch_size=4,
                 progress=False, on_shard=on_shard)
""")


def test_killed_run_resumes_only_missing_shards_without_ray(setup, tmp_path):
    out = tmp_path / "out"
    blocker = tmp_path / "no_ray"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('ray is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [str(setup["model_path"]), str(setup["folder"]), str(out)]
    done = subprocess.run([sys.executable, "-c", KILLER, *args], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == -9, done.stderr[-2000:]
    written = sorted(p.name for p in (out / "shards").glob("part-*.parquet"))
    assert written == ["part-00000.parquet", "part-00001.parquet"]
    before = {name: (out / "shards" / name).stat().st_mtime_ns for name in written}
    (out / "shards" / ".part-00002.parquet.tmp-99999").write_bytes(b"half a file")  # as a crash mid-write leaves

    cli = "import sys; from kerascope.cli import main; sys.exit(main(sys.argv[1:]))"
    resume = [sys.executable, "-c", cli, "batch", *args[:2], "--out", str(out), "--layer", "conv",
              "--shard-size", "10", "--batch-size", "4", "--json"]
    done = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-2000:]  # 1: some inputs (the corrupt files) failed
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["shards_skipped"], summary["shards_written"], summary["skipped"]) == (2, 3, 20)
    assert summary["processed"] + summary["failed"] == 22
    assert {name: (out / "shards" / name).stat().st_mtime_ns for name in written} == before
    assert not list((out / "shards").glob(".*tmp*"))

    table = ks.batch.read(out)
    assert table.column("index").to_pylist() == list(range(42))  # complete, no duplicates
    fresh = tmp_path / "fresh"
    ks.batch.run(setup["model_path"], setup["folder"], fresh, layer="conv", shard_size=21, progress=False)
    reference = ks.batch.read(fresh)
    np.testing.assert_allclose(ks.batch.maps_to_numpy(table), ks.batch.maps_to_numpy(reference), rtol=1e-5, atol=1e-7)
    assert table.column("error").to_pylist() == reference.column("error").to_pylist()


def test_resume_refuses_a_different_run_and_overwrite_replaces_it(setup, tmp_path):
    out = tmp_path / "out"
    ks.batch.run(setup["model_path"], setup["folder"], out, layer="conv", shard_size=50, progress=False)
    with pytest.raises(ValueError, match="holds a different run.*method"):
        ks.batch.run(setup["model_path"], setup["folder"], out, method="saliency", shard_size=50, progress=False)
    again = ks.batch.run(setup["model_path"], setup["folder"], out, layer="conv", shard_size=50, progress=False)
    assert (again.processed, again.skipped) == (0, 42)
    replaced = ks.batch.run(setup["model_path"], setup["folder"], out, method="saliency", shard_size=50,
                            overwrite=True, progress=False)
    assert replaced.processed == 40 and ks.batch.manifest(out)["method"] == "saliency"
    assert ks.batch.maps_to_numpy(ks.batch.read(out)).shape == (42, SIZE, SIZE, 3)
    assert sh.complete_shards(out, 50, 42) == {0}
