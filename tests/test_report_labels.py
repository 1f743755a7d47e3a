"""Pictures that explain themselves: labelled report panels (read in a real headless Chromium), shared colour
scales, signed maps whose "no effect" is not the image, publication figures (read back with Pillow), file modes
under the user's umask and legible text colour bars.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from kerascope.core.explanation import Explanation  # noqa: E402
from kerascope.pipeline import explain_images  # noqa: E402
from kerascope.report import read_report_data, write_report  # noqa: E402
from kerascope.viz.colours import DIMMED, colour_scale  # noqa: E402
from kerascope.viz.overlay import scaled_overlay  # noqa: E402
from kerascope.viz.quantities import map_quantity  # noqa: E402
from tests.test_report_browser import browser, tiny_model  # noqa: E402, F401  (module fixtures, reused)

CLASSES = ["cat", "dog", "bird"]
METHODS = ("gradcam", "saliency", "guided_gradcam")
WITH_LAYER = {"gradcam", "guided_gradcam"}

#: What a reader sees on each panel once the page is laid out.
LABEL_PROBE = """JSON.stringify({
  note: (document.querySelector('.scale-note') || {}).innerText || null,
  heads: Array.from(document.querySelectorAll('table.preds th:first-child')).map(t => t.innerText),
  entries: Array.from(document.querySelectorAll('section.entry')).map(s => ({
    name: s.querySelector('h2').innerText,
    tableInside: s.querySelector('table.preds').getBoundingClientRect().right
                 <= s.querySelector('figure.input').getBoundingClientRect().right + 1,
    panels: Array.from(s.querySelectorAll('figure.method')).map(f => ({
      method: f.dataset.method,
      target: (f.querySelector('.panel .target') || {}).innerText || null,
      layer: (f.querySelector('.panel .layer') || {}).innerText || null,
      quantity: (f.querySelector('.quantity') || {}).innerText || null,
      ticks: Array.from(f.querySelectorAll('.ticks span')).map(t => t.innerText),
      legend: (f.querySelector('.legend') || {}).innerText || null,
      visible: f.querySelector('.quantity') ? f.querySelector('.quantity').getBoundingClientRect().height > 0 : false,
    }))}))
})"""


def _images(folder: Path) -> list[Path]:
    rng = np.random.default_rng(3)
    paths = []
    for i in range(2):
        paths.append(folder / f"img{i}.png")
        Image.fromarray((rng.random((20, 24, 3)) * 255).astype(np.uint8)).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """One run per scale (per image, with figures, under a 022 umask; shared), on the same two images."""
    images = _images(tmp_path_factory.mktemp("label-images"))
    per_image, shared = tmp_path_factory.mktemp("per-image"), tmp_path_factory.mktemp("shared")
    previous = os.umask(0o022)
    try:
        explain_images(tiny_model, images, per_image, methods=METHODS, layer="conv", class_names=CLASSES, top_k=2,
                       progress=False, figures=("png", "svg", "pdf"), figure_size=(5.0, 2.5), figure_dpi=60)
    finally:
        os.umask(previous)
    explain_images(tiny_model, images, shared, methods=METHODS[:2], layer="conv", class_names=CLASSES,
                   progress=False, shared_scale=True)
    return {"per_image": per_image, "shared": shared}


def test_every_panel_names_method_target_layer_quantity_and_scale_in_chromium(runs, browser, tmp_path):  # noqa: F811
    out = runs["per_image"]
    page = browser.open((out / "index.html").as_uri(), tmp_path / "labels.png", probe=LABEL_PROBE)
    assert page["errors"] == [] and page["dialogs"] == []
    assert page["note"].startswith("Colour scales: per image.") and "--shared-scale (shared_scale=True)" in page["note"]
    assert all(entry["tableInside"] for entry in page["entries"])  # "top 2 of 3 classes" wraps, no overlap
    assert page["heads"] == ["top 2 of 3 classes"] * 2
    saved = {m: Explanation.load(out / f"{m}.npz") for m in METHODS}
    assert [e["name"] for e in page["entries"]] == ["img0.png", "img1.png"]
    for i, entry in enumerate(page["entries"]):
        assert [p["method"] for p in entry["panels"]] == list(METHODS)
        for panel in entry["panels"]:
            method = panel["method"]
            assert panel["target"] == f"target: {CLASSES[int(saved[method].targets[i])]}"
            assert panel["layer"] == ("layer: conv" if method in WITH_LAYER else None)
            expected = map_quantity(method)
            assert panel["quantity"] == f"{expected.quantity} [{expected.unit}] · scale: this image only"
            assert panel["visible"] and len(panel["ticks"]) == 3
        signed = [p["legend"] for p in entry["panels"] if p["method"] != "gradcam"]
        assert all(text.endswith("uncoloured (the dimmed grey image): no effect") for text in signed)
    shared = browser.open((runs["shared"] / "index.html").as_uri(), tmp_path / "shared.png", probe=LABEL_PROBE)
    assert shared["note"].startswith("Colour scales: shared per method.")
    for entry in shared["entries"]:
        for panel in entry["panels"]:
            assert panel["quantity"].endswith(f"scale: shared by every {panel['method']} panel")


def _reduced(explanation: Explanation) -> np.ndarray:
    a = np.asarray(explanation.attributions, np.float64)
    return a.sum(-1) if a.ndim == 4 else a  # saliency: channel sum (signed); gradcam: the map


def test_shared_scale_is_one_limit_per_method_from_all_maps(runs, tmp_path):
    from kerascope.cli import main

    for folder in runs.values():
        for entry in read_report_data(folder)["entries"]:
            assert all(scale["unit"] and scale["quantity"] for scale in entry.scales.values())
    shared = read_report_data(runs["shared"])["entries"]
    per_image = read_report_data(runs["per_image"])["entries"]
    for method in METHODS[:2]:
        maps = _reduced(Explanation.load(runs["shared"] / f"{method}.npz"))
        expected = np.percentile(np.abs(maps), 99.5)  # all images' magnitudes together
        assert [e.scales[method]["high"] for e in shared] == pytest.approx([expected] * len(shared))
        assert all(e.scales[method]["shared"] for e in shared)
        own = [np.percentile(np.abs(m), 99.5) for m in maps]
        assert [e.scales[method]["high"] for e in per_image] == pytest.approx(own)
        assert len(set(np.round(own, 9))) == len(own)  # the per-image limits really differ
    # a rebuild with --shared-scale redraws the per-image run onto the shared scales
    folder = tmp_path / "copy"
    shutil.copytree(runs["per_image"], folder)
    assert main(["report", str(folder), "--shared-scale", "--quiet"]) == 0
    rebuilt = read_report_data(folder)["entries"]
    for method in METHODS[:2]:
        assert [e.scales[method]["high"] for e in rebuilt] == pytest.approx([e.scales[method]["high"] for e in shared])
    assert "Colour scales: shared per method." in (folder / "index.html").read_text(encoding="utf-8")
    assert [e.layers for e in rebuilt] == [e.layers for e in per_image] == [{"gradcam": "conv",
                                                                            "guided_gradcam": "conv"}] * 2


def test_signed_no_effect_is_the_dimmed_image_never_white():
    white = np.ones((4, 8, 3))
    attribution = np.zeros((4, 8))
    attribution[:, 4:] = np.linspace(0.25, 1.0, 4)  # no effect on the left half, raising on the right
    scale = colour_scale(attribution, "saliency", percentile=100)
    overlay = scaled_overlay(white, attribution, scale, alpha=0.6).astype(int)
    assert (overlay[:, :4] == round(DIMMED[1] * 255)).all()  # white image, no effect: dim grey, not white
    red = overlay[:, 4:]
    assert (red[..., 0] - red[..., 2] > 20).all()  # raising: red
    distance = np.linalg.norm(red[0] - round(DIMMED[1] * 255), axis=-1)
    assert (np.diff(distance) > 0).all(), red[0]  # the stronger the effect, the further from "no effect"
    assert scale.stops[len(scale.stops) // 2] == "#666666"  # the bar's zero is the middle of the dimmed grey
    black = scaled_overlay(np.zeros((4, 8, 3)), attribution, scale, alpha=0.6)
    assert (black[:, :4] == round(DIMMED[0] * 255)).all()


def test_publication_figures_carry_caption_colour_bar_and_metadata(runs, tmp_path):
    out = runs["per_image"]
    for method in METHODS:
        explanation = Explanation.load(out / f"{method}.npz")
        for i, stem in enumerate(["0000_img0", "0001_img1"]):
            png = Image.open(out / "figures" / f"{stem}_{method}.png")
            assert png.size == (300, 150)  # 5 x 2.5 inches at 60 dpi
            facts = {k.split(":", 1)[1]: v for k, v in png.text.items() if k.startswith("kerascope:")}
            quantity = map_quantity(method)
            assert facts["method"] == method and facts["model"] == explanation.extras["model"]
            assert facts["layer"] == ("conv" if method in WITH_LAYER else "")
            assert facts["target"] == CLASSES[int(explanation.targets[i])]
            assert facts["score"] == f"{float(explanation.scores[i]):.4g}"
            assert (facts["quantity"], facts["unit"]) == (quantity.quantity, quantity.unit)
            assert facts["scale"] == "this image only"
            assert png.text["Title"].startswith(f"model {facts['model']} · {method}")
            svg = (out / "figures" / f"{stem}_{method}.svg").read_text(encoding="utf-8")
            assert png.text["Title"] in svg and quantity.quantity in svg
            pdf = (out / "figures" / f"{stem}_{method}.pdf").read_bytes()
            assert pdf.startswith(b"%PDF") and b"/Title" in pdf and f"kerascope {method}".encode() in pdf
    # the Python API: the figure's parts, read back
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    saliency = Explanation.load(out / "saliency.npz")
    figure = saliency.figure(index=1, class_names=CLASSES)  # the input comes from extras["paths"]
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    image_axes, bar_axes = figure.axes[:2], figure.axes[2]
    assert [ax.get_title() for ax in image_axes] == ["input", "saliency"]
    assert " ".join(bar_axes.get_xlabel().split()) == "d score / d pixel [score per pixel value]"
    low, high = bar_axes.get_xlim()
    ticks = [(t.get_text(), t.get_window_extent(renderer)) for t, v in
             zip(bar_axes.get_xticklabels(), bar_axes.get_xticks()) if low <= v <= high]
    assert len(ticks) >= 2 and all(text for text, _ in ticks) and "0" in [text for text, _ in ticks]
    assert all(a.x1 <= b.x0 for (_, a), (_, b) in zip(ticks, ticks[1:]))  # no overlap
    inside = figure.bbox  # nothing drawn outside the figure: the label and caption are whole
    for text in (bar_axes.xaxis.label, figure.texts[0]):
        box = text.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
    assert figure.texts[0].get_text() == (f"model {saliency.extras['model']} · saliency · target "
                                          f"{CLASSES[int(saliency.targets[1])]} (score {saliency.scores[1]:.4g})")
    path = saliency.save_figure(tmp_path / "fig.png", index=0, size=(4, 2), dpi=50, class_names=CLASSES)
    assert Image.open(path).size == (200, 100) and Image.open(path).text["kerascope:method"] == "saliency"
    with pytest.raises(ValueError, match="Unknown figure format. Received: figures=\\['gif'\\]"):
        saliency.save_figure(tmp_path / "fig.gif")


def test_files_follow_the_umask(runs, tmp_path):
    out = runs["per_image"]  # written under umask 022
    modes = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
    assert modes["index.html"] == modes["report.json"] == modes["summary.json"] == 0o644
    assert {m for p, m in modes.items() if (out / p).is_file()} == {0o644}, modes
    assert {m for p, m in modes.items() if (out / p).is_dir()} == {0o755}, modes
    previous = os.umask(0o027)
    try:
        page = write_report(tmp_path / "strict" / "index.html", [])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(page.stat().st_mode) == stat.S_IMODE((page.parent / "report.json").stat().st_mode) == 0o640
    assert json.loads((page.parent / "report.json").read_text())["format"] == 1


@pytest.mark.parametrize("scale", [3.3e-6, 1.0, 123456.7])
@pytest.mark.parametrize("width", [2.0, 8.0])
def test_text_colour_bar_ticks_never_overlap(scale, width):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kerascope.viz.text import plot_tokens

    values = np.random.default_rng(0).normal(size=12) * scale
    for signed in (True, False):
        figure = plot_tokens(np.abs(values) if not signed else values, [f"w{i}" for i in range(12)], width=width)
        renderer = FigureCanvasAgg(figure).get_renderer()
        figure.draw(renderer)
        bar = figure.axes[-1]
        low, high = bar.get_xlim()
        boxes = sorted((t.get_window_extent(renderer).x0, t.get_window_extent(renderer).x1)
                       for t, v in zip(bar.get_xticklabels(), bar.get_xticks()) if low <= v <= high and t.get_text())
        assert len(boxes) >= 2
        assert all(a[1] < b[0] for a, b in zip(boxes, boxes[1:])), boxes
        top = np.abs(values).max()
        assert (low, high) == pytest.approx((-top, top) if signed else (0.0, top))  # the bar shows real values


def test_data_report_panels_name_target_layer_and_quantity(tmp_path):
    from kerascope.report.kinds import write_data_report

    tabular = Explanation(np.array([[0.5, -0.2, 0.1]]), "saliency", {}, np.array([1]), np.ones(1))
    page = write_data_report(tmp_path, np.ones((1, 3)), [tabular], feature_names=["a", "b", "c"],
                             class_names=CLASSES).read_text(encoding="utf-8")
    assert "<span class='target'>target: <b>dog</b></span>" in page
    assert "<div class='quantity'>d score / d feature [score per feature value]</div>" in page
    at_layer = Explanation(np.random.default_rng(0).random((1, 5, 4)), "integrated_gradients", {}, np.array([0]),
                           np.ones(1), layer="embedding")
    page = write_data_report(tmp_path / "text", np.ones((1, 5), np.int32), [at_layer], kind="text",
                             vocabulary=list("abcdef")).read_text(encoding="utf-8")
    assert "layer: <b>embedding</b>" in page and "share of score(input) − score(baseline) [score units]" in page
