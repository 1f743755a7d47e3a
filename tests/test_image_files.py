"""Image files as other tools write them (16-bit, float), used output folders, --quiet errors, full disks."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import kerascope as ks
from kerascope.cli import main
from kerascope.data import demo_images, demo_model_path
from kerascope.io.images import ImageReadError, read_image


def _png16(path: Path, values: np.ndarray) -> Path:
    """A 16-bit grayscale PNG written byte by byte (numpy + zlib), independent of Pillow's writer."""
    h, w = values.shape
    rows = b"".join(b"\x00" + values[i].astype(">u2").tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 16, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))
    return path


def _gradient(h: int = 64, w: int = 64, top: int = 65535) -> np.ndarray:
    return np.round(np.linspace(0, top, h * w)).reshape(h, w).astype(np.uint16)


# ---- 16-bit and float images are read with their values, scaled into the 8-bit range --------------------------

@pytest.mark.parametrize("writer", ["pillow", "bytes"])
def test_a_16_bit_grayscale_png_is_scaled_not_clipped(tmp_path, writer):
    values = _gradient()
    path = tmp_path / "wide.png"
    if writer == "pillow":
        Image.fromarray(values).save(path)
    else:
        _png16(path, values)
    expected = np.round(values / 65535.0 * 255.0).astype(np.uint8)
    read = read_image(path, channels=1)[..., 0]
    np.testing.assert_array_equal(read, expected)
    assert 120 < read.mean() < 135  # clipped at 255 it was almost white (mean ~255)
    rgb = read_image(path, channels=3)
    np.testing.assert_array_equal(rgb, np.repeat(expected[..., None], 3, axis=-1))


@pytest.mark.parametrize(("scale", "factor"), [(1.0, 255.0), (255.0, 1.0)])
def test_a_float_tiff_is_read_in_its_range(tmp_path, scale, factor):
    values = np.linspace(0, 1, 48 * 40, dtype=np.float32).reshape(48, 40) * scale
    Image.fromarray(values).save(tmp_path / "f.tif")
    read = read_image(tmp_path / "f.tif", channels=1)[..., 0]
    np.testing.assert_array_equal(read, np.round(values.astype(np.float64) * factor).astype(np.uint8))
    assert read.max() == 255 and read.min() == 0  # not all black


@pytest.mark.parametrize("values", [np.full((8, 8), -0.5, np.float32), np.full((8, 8), 1000.0, np.float32),
                                    np.full((8, 8), np.nan, np.float32)])
def test_a_float_image_of_unknown_scale_is_refused_by_name(tmp_path, values):
    Image.fromarray(values).save(tmp_path / "odd.tif")
    with pytest.raises(ImageReadError, match=r"odd.tif: a float image with"):
        read_image(tmp_path / "odd.tif")


_CASES = st.sampled_from(["uint8", "uint16", "float01", "float255", "int32"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=_CASES, h=st.integers(1, 12), w=st.integers(1, 12), seed=st.integers(0, 2**16),
       channels=st.sampled_from([1, 3]))
def test_any_bit_depth_reads_as_its_values_scaled_to_8_bits(tmp_path, kind, h, w, seed, channels):
    rng = np.random.default_rng(seed)
    if kind == "uint8":
        values, suffix, expected = rng.integers(0, 256, (h, w)).astype(np.uint8), ".png", None
        expected = values.astype(np.float64)
    elif kind == "uint16":
        values, suffix = rng.integers(0, 65536, (h, w)).astype(np.uint16), ".png"
        expected = values / 65535.0 * 255.0
    elif kind == "float01":
        values, suffix = rng.uniform(0, 1, (h, w)).astype(np.float32), ".tif"
        expected = values.astype(np.float64) * 255.0
    elif kind == "float255":
        values, suffix = rng.uniform(0, 255, (h, w)).astype(np.float32), ".tif"
        values.flat[0] = 200.0  # above 1: the [0, 255] reading
        expected = values.astype(np.float64)
    else:
        values, suffix = rng.integers(256, 65536, (h, w)).astype(np.int32), ".tif"
        expected = values / 65535.0 * 255.0
    path = tmp_path / f"{kind}-{h}-{w}-{seed}{suffix}"
    Image.fromarray(values).save(path)
    read = read_image(path, channels=channels)
    assert read.dtype == np.uint8 and read.shape == (h, w, channels)
    np.testing.assert_array_equal(read[..., 0], np.round(expected).astype(np.uint8))
    np.testing.assert_array_equal(read, np.repeat(read[..., :1], channels, axis=-1))


def test_explaining_a_16_bit_png_equals_explaining_its_8_bit_twin(tmp_path):
    values = _gradient()
    Image.fromarray(values).save(tmp_path / "wide.png")
    Image.fromarray(np.round(values / 65535.0 * 255.0).astype(np.uint8)).save(tmp_path / "narrow.png")
    for name in ("wide", "narrow"):
        assert main(["explain", str(demo_model_path()), str(tmp_path / f"{name}.png"), "--method", "saliency",
                     "--target", "1", "--out", str(tmp_path / name), "--quiet"]) == 0
    wide, narrow = (ks.Explanation.load(tmp_path / n / "saliency.npz") for n in ("wide", "narrow"))
    np.testing.assert_allclose(wide.attributions, narrow.attributions, rtol=1e-6, atol=1e-8)
    assert np.abs(wide.attributions).max() > 0
    (thumbnail_file,) = (tmp_path / "wide" / "inputs").iterdir()
    thumbnail = np.asarray(Image.open(thumbnail_file))
    assert 100 < thumbnail.mean() < 160  # shown with its values, not white


# ---- a used output folder is refused unless --overwrite; the report rebuilds after any allowed run -------------

def _explain(out: Path, *extra: str, images: list | None = None, method: str = "saliency") -> int:
    paths = [str(p) for p in (images or demo_images()[:2])]
    return main(["explain", str(demo_model_path()), *paths, "--method", method, "--out", str(out), "--quiet", *extra])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_explain_into_a_folder_holding_an_earlier_run_is_refused_and_overwrite_replaces_it(tmp_path, capsys):
    out = tmp_path / "r"
    assert _explain(out, method="saliency") == 0
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    capsys.readouterr()
    assert _explain(out, method="gradcam", images=demo_images()[2:3]) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--overwrite" in err and "saliency.npz" in err
    assert _snapshot(out) == before  # nothing was touched
    # --overwrite: the new run only (no stale saliency.npz, inputs or overlays), the user's file kept
    assert _explain(out, "--overwrite", method="gradcam", images=demo_images()[2:3]) == 0
    assert sorted(p.name for p in out.glob("*.npz")) == ["gradcam.npz"]
    assert len(list((out / "inputs").iterdir())) == 1 and len(list((out / "overlays").iterdir())) == 1
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(".kerascope")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["methods"] == ["gradcam"] and summary["processed"] == 1
    assert main(["report", str(out), "--quiet", "--redraw"]) == 0
    html = (out / "index.html").read_text()
    assert "gradcam" in html and "saliency" not in html.lower().replace("saliency map", "")


def test_explain_refuses_a_folder_with_the_users_own_index_html(tmp_path, capsys):
    out = tmp_path / "site"
    out.mkdir()
    (out / "index.html").write_text("<p>my page</p>")
    assert _explain(out) == 2
    assert "index.html" in capsys.readouterr().err
    assert (out / "index.html").read_text() == "<p>my page</p>"
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]


# ---- --quiet never hides an error --------------------------------------------------------------------------------

def test_quiet_explain_still_says_why_an_image_failed(tmp_path, capfd):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png at all")
    Image.fromarray(np.full((8, 8), 500.0, np.float32)).save(tmp_path / "odd.tif")
    code = main(["explain", str(demo_model_path()), str(demo_images()[0]), str(bad), str(tmp_path / "odd.tif"),
                 "--method", "saliency", "--out", str(tmp_path / "o"), "--quiet"])
    out, err = capfd.readouterr()
    assert code == 1 and out == ""
    assert "broken.png" in err and "not a readable image" in err
    assert "odd.tif" in err and "cannot tell this one's scale" in err


def test_quiet_batch_still_says_why_an_input_failed(tmp_path, capfd):
    pytest.importorskip("pyarrow")
    folder = tmp_path / "in"
    folder.mkdir()
    for p in demo_images()[:2]:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "zz-broken.png").write_bytes(b"not a png")
    code = main(["batch", str(demo_model_path()), str(folder), "--method", "saliency", "--out",
                 str(tmp_path / "b"), "--quiet"])
    out, err = capfd.readouterr()
    assert code == 1 and out == ""
    assert "zz-broken.png" in err and "1 input(s) failed" in err
