"""Files, CLI, report, batch: hostile and careless input never escapes a folder, never runs in a
page, never crashes with a traceback, and never makes a resumed batch run trust a damaged shard."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import warnings
import zlib
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import kerascope as ks
from kerascope.batch import shards as sh
from kerascope.batch.api import resolve_targets
from kerascope.cli import main
from kerascope.core.explanation import Explanation
from kerascope.pipeline import explain_images
from kerascope.report import read_report_data, rebuild_report

SIZE = 16
SECRET = "TOP-SECRET-kerascope-test-line"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax", name="head"),
    ])
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    model.save(path)
    return path


def _png(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((SIZE, SIZE, 3)) * 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def results(model_file, tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("imgs")
    paths = [_png(src / f"img{i}.png", i) for i in range(2)]
    out = tmp_path_factory.mktemp("results") / "run"
    explain_images(ks.load_model(model_file), paths, out, methods=("gradcam", "saliency"), layer="conv",
                   progress=False)
    return out


def _copy(results: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "box" / "run"
    shutil.copytree(results, folder)
    return folder


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


# ------------------------------------------------------------------------------------------- report: paths
def test_method_name_from_npz_never_becomes_a_path_outside(results, tmp_path, capsys):
    folder = _copy(results, tmp_path)
    target = tmp_path / "escaped"
    evil = "x/" + "../" * 12 + str(target)
    e = Explanation.load(folder / "saliency.npz")
    (folder / "saliency.npz").unlink()
    Explanation(e.attributions, evil, {}, e.targets, e.scores).save(folder / "evil.npz")
    before_outside = _files(tmp_path) - {f"box/run/{f}" for f in _files(folder)}
    assert main(["report", str(folder), "--quiet", "--redraw"]) == 0
    after_outside = _files(tmp_path) - {f"box/run/{f}" for f in _files(folder)}
    assert after_outside == before_outside  # nothing written outside the results folder
    assert not list(tmp_path.rglob("escaped*")) and not Path(str(target) + ".png").exists()
    drawn = sorted(p.name for p in (folder / "overlays").glob("*.png"))
    evil_overlays = [n for n in drawn if not n.endswith(("_gradcam.png", "_saliency.png"))]
    assert len(evil_overlays) == 2 and all(set(n) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.-") for n in
                                           evil_overlays)
    page = (folder / "index.html").read_text(encoding="utf-8")
    assert "x/../" in page  # the name is shown (escaped), it just never reaches a path


def test_embed_reads_only_images_inside_the_folder(results, tmp_path, capsys):
    folder = _copy(results, tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    (folder / "notes.png").write_text(SECRET)  # inside, named .png, but not an image
    for npz in folder.glob("*.npz"):
        npz.unlink()  # so the overlay paths of report.json are what the page would show
    data = json.loads((folder / "report.json").read_text())
    data["entries"][0]["overlays"] = {"up": "../../secret.txt", "abs": str(secret), "fake": "notes.png",
                                      "ok": data["entries"][0]["overlays"]["gradcam"]}
    (folder / "report.json").write_text(json.dumps(data))
    (folder / "inputs" / data["entries"][1]["image"].split("/")[-1]).unlink()
    (folder / "inputs" / data["entries"][1]["image"].split("/")[-1]).symlink_to(secret)  # a link leading out
    code = main(["report", str(folder), "--embed", "--json"])
    assert code == 1
    summary = json.loads(capsys.readouterr().out)
    page = (folder / "index.html").read_text(encoding="utf-8")
    encoded = base64.b64encode(SECRET.encode()).decode()
    assert SECRET not in page and encoded[:20] not in page
    unreadable = " ".join(f"{k} {v}" for k, v in summary["unreadable"].items())
    assert "secret.txt" in unreadable and "notes.png" in unreadable and "outside" in unreadable
    sources = [s.split("'")[0] for s in page.split("src='")[1:]]
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    for s in sources:
        assert base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_symlinked_overlays_folder_is_refused(results, tmp_path, capsys):
    folder = _copy(results, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(folder / "overlays")
    (folder / "overlays").symlink_to(elsewhere, target_is_directory=True)
    assert main(["report", str(folder), "--redraw", "--quiet"]) == 2
    assert "outside the results folder" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------------------------------------------------- report: HTML
def test_saved_html_and_text_are_rebuilt_not_re_emitted(results, tmp_path):
    folder = _copy(results, tmp_path)
    data = json.loads((folder / "report.json").read_text())
    data["title"] = "<script>alert('t')</script>"
    data["html_tables"] = {"plots": "<table><tr><td onclick='alert(1)'>kept &amp; shown</td></tr></table>"
                                    "<script>alert(2)</script><img src=x onerror=alert(3)>"
                                    "<figure><img src='overlays/" + Path(data["entries"][0]["overlays"]["gradcam"]).name
                                    + "' onload='alert(4)'></figure><a href='javascript:alert(5)'>link</a>"}
    data["tables"] = {"str table": "<script>alert(6)</script><b>bold</b>"}
    data["errors"] = {"<img src=y onerror=alert(7)>": "<script>alert(8)</script>"}
    (folder / "report.json").write_text(json.dumps(data))
    rebuild_report(folder)
    page = (folder / "index.html").read_text(encoding="utf-8").lower()
    for bad in ("<script", "javascript:", "<a "):
        assert bad not in page, bad
    assert re.search(r"<[^>]*\son[a-z]+\s*=", page) is None  # no event handler in any tag (escaped text is fine)
    assert "&lt;script&gt;alert(8)" in page
    assert "kept &amp; shown" in page and "<b>bold</b>" in page and "link" in page
    assert "<img src='overlays/" in page  # the picture inside the folder survives the whitelist
    saved = read_report_data(folder)
    assert "'x'" not in json.dumps(saved["html_tables"]) and "x:" in " ".join(saved["unreadable"].values()).lower()


# ------------------------------------------------------------------------------------------- report: files
def test_unreadable_npz_and_report_json_are_listed_and_exit_1(results, tmp_path, capsys):
    folder = _copy(results, tmp_path)
    raw = (folder / "saliency.npz").read_bytes()
    (folder / "saliency.npz").write_bytes(raw[: len(raw) // 2])
    (folder / "empty.npz").write_bytes(b"")
    (folder / "report.json").write_text('{"entries": [')
    for bad in ("saliency.npz", "empty.npz"):
        with pytest.raises(ValueError, match=f"Could not read the explanation file .*{bad}"):
            Explanation.load(folder / bad)
    with pytest.raises(ValueError, match="report.json"):
        read_report_data(folder)
    assert main(["report", str(folder), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert {"saliency.npz", "empty.npz", "report.json"} <= set(summary["unreadable"])
    assert summary["methods"] == ["gradcam"] and summary["images"] == 2
    page = (folder / "index.html").read_text(encoding="utf-8")
    assert "Saved files that could not be used" in page and "saliency.npz" in page


# ------------------------------------------------------------------------------------------- explain
def _bomb_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A PNG header announcing width x height pixels (what a decompression bomb looks like to a reader)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))
    return path


def test_decompression_bomb_is_reported_by_name_and_the_rest_processed(model_file, tmp_path, capsys):
    good = _png(tmp_path / "good.png", 0)
    bomb = _bomb_png(tmp_path / "bomb.png")
    out = tmp_path / "out"
    code = main(["explain", str(model_file), str(good), str(bomb), "--method", "saliency", "--out", str(out),
                 "--json"])
    assert code == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["processed"] == 1 and summary["failed"] == 1
    assert "bomb.png" in next(iter(summary["errors"])) and "too large" in next(iter(summary["errors"].values()))
    assert Explanation.load(out / "saliency.npz").attributions.shape == (1, SIZE, SIZE, 3)


@pytest.mark.parametrize("extra, message", [
    (["--cmap", "nosuchcmap"], "Unknown colormap. Received: cmap='nosuchcmap'"),
    (["--alpha", "3"], "opacity must lie in [0, 1]"),
    (["--size", "0", "0"], "`size` must be two positive integers"),
    (["--size", "100000", "100000"], "`size` is too large"),
    (["--method", "nosuchmethod"], "nosuchmethod"),
])
def test_explain_options_are_checked_before_any_work(model_file, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert main(["explain", str(model_file), str(_png(tmp_path / "a.png", 0)), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "a.png" not in err  # the image is not blamed
    assert not out.exists()  # nothing was computed or written


def test_output_folder_and_model_file_problems_are_messages(model_file, tmp_path, capsys):
    image = str(_png(tmp_path / "a.png", 0))
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert main(["explain", str(model_file), image, "--out", str(a_file)]) == 2
    assert "is an existing file" in capsys.readouterr().err
    assert main(["explain", str(model_file), image, "--out", str(a_file / "sub")]) == 2
    assert "lies under a file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="under a file"):
        ks.batch.run(model_file, np.zeros((1, SIZE, SIZE, 3), np.float32), a_file / "sub", progress=False)
    text = tmp_path / "text.keras"
    text.write_text("not a model")
    cut = tmp_path / "cut.keras"
    cut.write_bytes(model_file.read_bytes()[:2000])
    for bad in (text, cut):
        assert main(["layers", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "Not a valid .keras model file" in err and "File not found" not in err


def test_output_index_errors_are_kerascope_messages():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, [keras.layers.Dense(2, name="a")(inputs), keras.layers.Dense(3, name="b")(inputs)])
    x = np.ones((2, 4), np.float32)
    for method in (ks.Saliency, ks.IntegratedGradients):
        with pytest.raises(ValueError, match=r"^Unknown output. Received: output_index=5. The model has 2"):
            method(model, output_index=5).explain(x)
        with pytest.raises(ValueError, match=r"^The model has 2 outputs; choose one") as info:
            method(model).explain(x)
        assert "in user code" not in str(info.value)
    scores = ks.Saliency(model, output_index=1).explain(x, targets=2).scores  # the valid choice still works
    kernel, bias = model.get_layer("b").get_weights()
    np.testing.assert_allclose(scores, (x @ kernel + bias)[:, 2], rtol=1e-5)


# ------------------------------------------------------------------------------------------- batch resume
def _shard_run(model_file: Path, out: Path, x: np.ndarray, **kwargs) -> ks.batch.BatchSummary:
    return ks.batch.run(model_file, x, out, method="saliency", shard_size=5, batch_size=5, progress=False, **kwargs)


def test_resume_recomputes_swapped_truncated_and_bit_flipped_shards(model_file, tmp_path):
    x = np.random.default_rng(0).random((20, SIZE, SIZE, 3)).astype(np.float32)
    reference = tmp_path / "reference"
    _shard_run(model_file, reference, x)
    expected = ks.batch.maps_to_numpy(ks.batch.read(reference))
    manifest = ks.batch.manifest(reference)
    assert sorted(manifest["shards"]) == ["0", "1", "2", "3"]
    for shard, digest in manifest["shards"].items():
        assert sh.file_sha256(sh.shard_path(reference, int(shard))) == digest

    out = tmp_path / "out"
    shutil.copytree(reference, out)
    part = [sh.shard_path(out, s) for s in range(4)]
    shutil.copy(part[0], part[1])  # swapped: right row count, wrong indices
    raw = part[2].read_bytes()
    part[2].write_bytes(raw[: len(raw) // 2])  # truncated
    raw = bytearray(part[3].read_bytes())
    raw[len(raw) // 3] ^= 0x10  # one bit flipped inside the map data
    part[3].write_bytes(bytes(raw))
    done, rejected = sh.verify_shards(out, 5, 20, checksums=manifest["shards"], ids=[str(i) for i in range(20)])
    assert done == {0} and set(rejected) == {1, 2, 3}
    assert "checksum" in rejected[1] and "checksum" in rejected[3]
    resumed = _shard_run(model_file, out, x)
    assert (resumed.shards_skipped, resumed.shards_rejected, resumed.shards_written) == (1, 3, 3)
    table = ks.batch.read(out)
    assert table.column("index").to_pylist() == list(range(20))
    np.testing.assert_array_equal(ks.batch.maps_to_numpy(table), expected)

    old_format = json.loads((out / "manifest.json").read_text())
    del old_format["shards"]  # a shard with no recorded checksum cannot be verified: recomputed
    (out / "manifest.json").write_text(json.dumps(old_format))
    again = _shard_run(model_file, out, x)
    assert (again.shards_skipped, again.shards_written) == (0, 4)
    np.testing.assert_array_equal(ks.batch.maps_to_numpy(ks.batch.read(out)), expected)


def test_resumed_run_with_failed_inputs_exits_1_and_ids_never_escape(model_file, tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        _png(folder / f"p{i}.png", i)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    out = tmp_path / "out"
    args = ["batch", str(model_file), str(folder), "--out", str(out), "--method", "saliency", "--json"]
    assert main(args) == 1
    assert json.loads(capsys.readouterr().out)["failed"] == 1
    assert main(args) == 1  # nothing recomputed, but the errors table is not empty
    summary = json.loads(capsys.readouterr().out)
    assert (summary["skipped"], summary["errors_total"]) == (4, 1)

    rows = [np.asarray(Image.open(folder / f"p{i}.png")).reshape(-1).tolist() for i in range(2)]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["../" * 10 + str(tmp_path / "escaped"), "/etc/x"], "array": rows}), source)
    out2 = tmp_path / "box" / "out"
    before = _files(tmp_path)
    ks.batch.run(model_file, source, out2, method="saliency", overlays=True, progress=False)
    new = _files(tmp_path) - before
    assert new and all(f.startswith("box/out/") for f in new)
    assert len(list((out2 / "overlays").glob("*.png"))) == 2


# ------------------------------------------------------------------------------------------- batch targets
def test_batch_targets_are_validated(model_file, tmp_path, capsys):
    ids = ["a.png", "b.png", "c.png"]
    with pytest.raises(ValueError, match="non-negative"):
        resolve_targets(-3, ids)
    with pytest.raises(ValueError, match="non-negative"):
        resolve_targets([0, -1, 2], ids)
    csv = tmp_path / "t.csv"
    csv.write_text("id,class\na.png,1\nb.png,-2\n")
    with pytest.raises(ValueError, match=r"t.csv:3: the class must be a non-negative index"):
        resolve_targets(csv, ids)
    csv.write_text("id,class\na.png,1\nb.png,2\na.png,0\n")
    with pytest.raises(ValueError, match=r"'a.png' \(line 2: 1, line 4: 0\)"):
        resolve_targets(csv, ids)
    csv.write_text("id,class\na.png,1\na.png,1\nzzz.png,2\nyyy.png,0\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values, missing = resolve_targets(csv, ids)
    text = " ".join(str(w.message) for w in caught)
    assert values.tolist() == [1, -1, -1] and missing == 2
    assert "1 repeated row" in text and "2 target id(s) match no input" in text and "2 of 3 input(s)" in text
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, SIZE, SIZE, 3), np.float32))
    assert main(["batch", str(model_file), str(x), "--out", str(tmp_path / "o"), "--targets", "-3"]) == 2
    assert "non-negative" in capsys.readouterr().err
