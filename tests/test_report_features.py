"""The feature-visualisation grid in the HTML report, read back from the page and shown in headless Chromium."""

from __future__ import annotations

import base64
import re
import shutil

import keras
import numpy as np
import pytest
from PIL import Image
from test_report_browser import browser  # noqa: E402, F401 - tests/ is on sys.path; the module fixture, reused

import kerascope as ks
from kerascope.pipeline import explain_images
from kerascope.report import add_feature_grid, read_report_data, rebuild_report

HEADING = "What each channel of conv detects"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A report by `kerascope explain`'s pipeline (2 images) and a visualisation of 3 channels of its layer."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, name="head")])
    src = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray((rng.random((16, 16, 3)) * 255).astype(np.uint8)).save(src / name)
    out = tmp_path_factory.mktemp("report")
    explain_images(model, [src / "a.png", src / "b.png"], out, methods=("gradcam",), layer="conv", progress=False)
    result = ks.visualize_features(model, layer="conv", channels=[0, 2, 3], steps=3, progress=False)
    return out, result


def _section(page: str) -> str:
    start = page.index(f"<h2>{HEADING}</h2>")
    return page[start:page.index("</div></div>", start)]


def test_the_report_shows_one_picture_per_channel_with_its_label_and_objective(run, tmp_path):
    out, result = run
    folder = tmp_path / "r"
    shutil.copytree(out, folder)
    page = add_feature_grid(folder, result).read_text(encoding="utf-8")
    section = _section(page)
    sources = re.findall(r"<img src='([^']+)'", section)
    assert sources == [f"features/conv/channel_{i:03d}.png" for i in range(3)]
    for i, source in enumerate(sources):  # each picture is the visualised image, as saved
        shown = np.asarray(Image.open(folder / source)).astype(np.float32) / 255
        np.testing.assert_allclose(shown, result.images[i], atol=1 / 255 + 1e-6)
    for label, curve in zip(["channel 0", "channel 2", "channel 3"], result.objective):
        assert f"<b>{label}</b><br>objective {curve[-1]:.3g}" in section
    assert page.count("<section class='card entry'>") == 2  # the explained images are still there
    # kept in report.json: a later rebuild (kerascope report) shows the grid again
    assert HEADING in read_report_data(folder)["html_tables"]
    rebuilt = rebuild_report(folder).read_text(encoding="utf-8")
    assert re.findall(r"<img src='([^']+)'", _section(rebuilt)) == sources


@pytest.mark.parametrize("embed", [False, True], ids=["folder", "single-file"])
def test_the_grid_renders_in_chromium(run, browser, tmp_path, embed):  # noqa: F811 (the imported fixture)
    out, result = run
    folder = tmp_path / "r"
    shutil.copytree(out, folder)
    path = add_feature_grid(folder, result, embed_images=embed)
    if embed:  # moved away from its pictures: they must still show
        lone = tmp_path / "lone.html"
        shutil.move(path, lone)
        path = lone
        grid = re.findall(r"<img src='([^']+)'", _section(lone.read_text(encoding="utf-8")))
        assert len(grid) == 3 and all(base64.b64decode(s.split(",", 1)[1])[:4] == b"\x89PNG" for s in grid)
    page = browser.open(path.as_uri(), tmp_path / "shot.png")
    assert page["errors"] == [] and page["dialogs"] == []
    assert len(page["images"]) == 2 * 2 + 3  # 2 inputs with one overlay each, 3 channels
    assert all(i["complete"] and i["width"] == 16 for i in page["images"]), page["images"]
    assert page["scrollWidth"] <= page["innerWidth"]


def test_the_command_line_adds_the_grid_to_a_report(run, tmp_path, capsys):
    import json

    from kerascope.cli import main

    out, result = run
    folder = tmp_path / "r"
    shutil.copytree(out, folder)
    model_file = tmp_path / "m.keras"
    keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)]).save(model_file)
    assert main(["visualize", str(model_file), "--layer", "conv", "--channels", "0:2", "--steps", "2",
                 "--out", str(tmp_path / "f"), "--report", str(folder), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    page = (folder / "index.html").read_text(encoding="utf-8")
    assert summary["report"] == str(folder / "index.html")
    assert re.findall(r"<img src='([^']+)'", _section(page)) == [f"features/conv/channel_{i:03d}.png" for i in range(2)]
