"""Pictures of language explanations: the token matrix and heatmap as PNG, and token spans in the HTML report.

References: matplotlib's own ``RdBu_r`` colour of each value on a symmetric scale (computed here, not taken
from the code under test), pixels read back from the saved PNG, and the page as Chromium draws it.
"""

from __future__ import annotations

import dataclasses
import re

import keras
import matplotlib
import numpy as np
import pytest
from PIL import Image

import kerascope as ks
from kerascope.report import render, write_report
from kerascope.report.html import sanitize_html
from kerascope.report.tokens import token_tables
from kerascope.viz.tokens import plot_token_matrix
from tests.test_report_browser import CHROMIUM, Browser

PROMPT = np.array([3, 5, 7, 2, 9])
CONT = np.array([4, 11, 6])
LABELS = ["<s>", "the", "cat&dog", "sat", "on", "a", "mat", "."]


@pytest.fixture(scope="module")
def generation():
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32")
    e = keras.layers.Embedding(24, 8)(ids)
    lm = keras.Model(ids, keras.layers.Dense(24)(e + keras.layers.MultiHeadAttention(2, 4)(e, e, use_causal_mask=True)))
    g = ks.explain_generation(lm, PROMPT, CONT, method="gradient_x_input")
    return dataclasses.replace(g, tokens=LABELS)


def expected_hex(values: np.ndarray) -> list[str]:
    """Each value's colour: RdBu_r at its place on the symmetric scale, quantised to 10 steps per sign."""
    scale = np.abs(values).max()
    steps = np.rint(values / scale * 10)
    return [matplotlib.colors.to_hex(matplotlib.colormaps["RdBu_r"](0.5 + 0.05 * s)) for s in steps]


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def has_colour(picture: np.ndarray, hex_colour: str, tolerance: int = 6) -> bool:
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return bool((np.abs(picture - rgb).max(-1) <= tolerance).any())


def test_matrix_png_cells_are_their_values_colours_with_a_legend(generation, tmp_path):
    g = generation
    assert np.abs(g.token_attributions[:, : g.prompt_length]).max() > 0
    path = g.save_png(tmp_path / "matrix.png", dpi=80)
    picture = pixels(path)
    title = f"gradient_x_input: log p(continuation) = {g.log_prob:.4g}"
    figure = plot_token_matrix(g.token_attributions, LABELS[5:], LABELS, prompt_length=5, title=title)
    width, height = figure.get_size_inches() * 80
    assert picture.shape[:2] == (round(height), round(width))
    assert picture.std() > 20  # not blank
    # the colour bar (right of the matrix) spans both ends of the signed scale: the legend is drawn
    bar = picture[:, int(picture.shape[1] * 0.8):]
    assert has_colour(bar, "#67001f", 12) and has_colour(bar, "#053061", 12)
    # every visible cell has its value's colour at its centre; cells a row cannot see are grey
    figure.savefig(tmp_path / "again.png", dpi=figure.dpi)  # pixels = display coordinates
    ax = figure.axes[0]
    again = pixels(tmp_path / "again.png")
    values = g.token_attributions
    scale = np.abs(values[np.arange(8)[None] < 5 + np.arange(3)[:, None]]).max()
    for j in range(3):
        for i in range(8):
            x, y = ax.transData.transform((i, j))
            shown = again[int(round(again.shape[0] - y)), int(round(x))]
            if i >= 5 + j:
                want = np.array([0xD9, 0xD9, 0xD9])
            else:
                want = np.array(matplotlib.colormaps["RdBu_r"](0.5 + 0.5 * values[j, i] / scale)[:3]) * 255
            assert np.abs(shown - want).max() <= 3, (j, i, shown, want)


def test_token_heatmap_png_and_refusals(generation, tmp_path):
    picture = pixels(generation.save_png(tmp_path / "tokens.png", what="tokens"))
    assert picture.shape[1] == 800 and picture.std() > 20
    top = int(np.argmax(np.abs(generation.attributions)))
    assert has_colour(picture, "#67001f" if generation.attributions[top] > 0 else "#053061", 12)
    with pytest.raises(ValueError, match="'matrix' or 'tokens'"):
        generation.save_png(tmp_path / "x.png", what="heat")
    with pytest.raises(ValueError, match="one label per row and column"):
        plot_token_matrix(np.zeros((2, 3)), ["a"], ["a", "b", "c"])


def test_report_token_spans_have_their_values_colours_and_survive_a_rebuild(generation, tmp_path):
    g = generation
    tables = token_tables(g)
    spans = tables["gradient_x_input: tokens"]
    found = re.findall(r"<span class='tk (\w+)' style='background:(#[0-9a-f]{6});color:#[0-9a-f]{6}' "
                       r"title='([^']*)'>([^<]*)</span>", spans)
    assert [t for _, _, _, t in found] == ["&lt;s&gt;", "the", "cat&amp;dog", "sat", "on", "a", "mat", "."]
    assert [c for _, c, _, _ in found] == expected_hex(g.attributions)
    np.testing.assert_allclose([float(v) for _, _, v, _ in found], g.attributions, rtol=1e-3)
    assert "-" in spans and "red raises the continuation" in spans  # the legend
    cells = re.findall(r"<td class='tk (\w+)' style='background:(#[0-9a-f]{6})'", tables[
        "gradient_x_input: generated token x earlier token"])
    visible = g.token_attributions[np.arange(8)[None] < 5 + np.arange(3)[:, None]]
    assert [c for _, c in cells] == expected_hex(visible)
    page = (write_report(tmp_path / "index.html", [], tables=tables)).read_text()
    assert found[0][0] in page and f".tk.{found[0][0]}{{background:{found[0][1]}" in page
    # a rebuilt page drops inline styles: the classes, coloured by the page's stylesheet, remain
    clean = {k: sanitize_html(v)[0] for k, v in tables.items()}
    assert "style=" not in "".join(clean.values())
    rebuilt = render([], tables=clean)
    for name, colour, _, _ in found:
        assert f"class='tk {name}'" in clean["gradient_x_input: tokens"]
        assert f".tk.{name}{{background:{colour}" in rebuilt
    assert ".tk{" not in render([], tables={"metrics": [{"auc": 0.5}]})


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")
def test_token_report_renders_in_chromium(generation, tmp_path):
    g = generation
    page = write_report(tmp_path / "index.html", [], tables=token_tables(g))
    browser = Browser(tmp_path / "profile")
    try:
        report = browser.open(page.as_uri(), tmp_path / "shot.png")
    finally:
        browser.close()
    assert report["errors"] == [] and report["dialogs"] == []
    shot = pixels(tmp_path / "shot.png")
    for colour in set(expected_hex(g.attributions)):
        assert has_colour(shot, colour, 2), colour
