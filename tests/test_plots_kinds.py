"""Pictures of non-image explanations (issues 14 and 16): sequence heat strips, tabular bars, highlighted tokens,
and the report that shows them. Each test checks what is drawn against the attributions themselves."""

from __future__ import annotations

import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.core.explanation import Explanation  # noqa: E402
from kerascope.report import read_report_data  # noqa: E402
from kerascope.report.kinds import write_data_report  # noqa: E402
from kerascope.viz.plots import data_kind, save_figure  # noqa: E402
from kerascope.viz.text import tokens_html  # noqa: E402


def _png(fig, path) -> np.ndarray:
    save_figure(fig, path, dpi=40)
    pixels = np.asarray(Image.open(path).convert("RGB"))
    assert pixels.std() > 10 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20  # drawn, not blank
    return pixels


def _panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def _red_minus_blue(rgba) -> float:
    return float(rgba[0] - rgba[2])


def _strength(rgba) -> float:
    """Signed strength of a diverging colour: the hue's sign (red +, blue -) times its darkness (0 for white)."""
    luminance = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
    return float(np.sign(rgba[0] - rgba[2]) * (1 - luminance))


@pytest.fixture(scope="module")
def series_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((24, 2)), keras.layers.Conv1D(4, 3, padding="same", activation="relu",
                                                                        name="conv"),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
    x = np.stack([np.sin(np.linspace(0, 6, 24)), np.cos(np.linspace(0, 3, 24))], -1)[None].astype("float32")
    return model, np.concatenate([x, -x])


def test_sequence_cam_is_a_heat_strip_behind_every_channel(series_model, tmp_path):
    model, x = series_model
    cam = ks.GradCAM(model, layer="conv").explain(x)
    assert cam.attributions.shape == (2, 24) and data_kind(cam.attributions, x) == "sequence"
    fig = cam.plot(x, index=1, channel_names=["sin", "cos"])  # auto: (N, T) map of (N, T, F) series
    panels = _panels(fig)
    assert [ax.get_ylabel() for ax in panels] == ["sin", "cos"]
    for c, ax in enumerate(panels):
        strip = ax.images[0]
        np.testing.assert_allclose(np.asarray(strip.get_array())[0], cam.attributions[1], rtol=1e-6)
        assert strip.get_cmap().name == "magma" and strip.norm.vmin == 0  # a CAM is unsigned
        np.testing.assert_allclose(ax.lines[0].get_ydata(), x[1, :, c])  # the series over the strip
    _png(fig, tmp_path / "cam.png")


def test_sequence_saliency_strip_per_channel_is_diverging(series_model, tmp_path):
    model, x = series_model
    sal = ks.Saliency(model).explain(x)
    fig = sal.plot(x, index=0)
    for c, ax in enumerate(_panels(fig)):
        strip = ax.images[0]
        values = np.asarray(strip.get_array())[0]
        np.testing.assert_allclose(values, sal.attributions[0, :, c], rtol=1e-6)
        top = np.abs(sal.attributions[0]).max()
        assert strip.get_cmap().name == "RdBu_r" and strip.norm.vmin == pytest.approx(-top) and strip.norm.vmax == \
            pytest.approx(top)  # declared signed: centred at zero, symmetric
        colours = strip.to_rgba(values)
        hot, cold = np.argmax(values), np.argmin(values)
        assert _red_minus_blue(colours[hot]) >= _red_minus_blue(colours[cold])
        if values[hot] > 0.3 * top:
            assert _red_minus_blue(colours[hot]) > 0
        if values[cold] < -0.3 * top:
            assert _red_minus_blue(colours[cold]) < 0
    _png(fig, tmp_path / "saliency.png")


def test_tabular_bar_lengths_are_the_attributions_with_feature_names(tmp_path):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name="dense")])
    weights = np.arange(15, dtype="float32").reshape(5, 3) / 7 - 1
    model.get_layer("dense").set_weights([weights, np.zeros(3, "float32")])
    x = np.array([[1.0, -2.0, 0.5, 3.0, -1.0], [2.0, 1.0, -1.0, 0.0, 1.0]], "float32")
    e = ks.GradientXInput(model).explain(x, 2)
    names = ["age", "income", "<b>debt</b>", "tenure", "score"]
    fig = e.plot(x, index=0, feature_names=names)  # auto: (N, F) map of (N, F) inputs
    ax = fig.axes[0]
    labels = [t.get_text().split(" = ")[0] for t in ax.get_yticklabels()]
    widths = {label: bar.get_width() for label, bar in zip(labels, ax.patches)}
    expected = weights[:, 2] * x[0]  # closed form of gradient x input on a linear model
    assert set(widths) == set(names)
    for i, name in enumerate(names):
        assert widths[name] == pytest.approx(expected[i], rel=1e-5)
    for bar in ax.patches:  # positive bars warm, negative cold
        colour = bar.get_facecolor()
        assert (_red_minus_blue(colour) > 0) == (bar.get_width() >= 0)
    _png(fig, tmp_path / "bars.png")


def test_token_colours_follow_sign_and_magnitude(tmp_path):
    values = np.array([2.0, -1.0, 0.0, 0.5, -2.0])
    vocabulary = ["<pad>", "not", "a", "<b>bad</b>", "film", "great"]
    ids = np.array([5, 1, 2, 3, 4])
    fig = ks.plot_tokens(values, ids, vocabulary)
    texts = fig.axes[0].texts
    assert [t.get_text() for t in texts] == ["great", "not", "a", "<b>bad</b>", "film"]
    colours = [t.get_bbox_patch().get_facecolor() for t in texts]
    shade = [_strength(c) for c in colours]
    assert shade[0] > shade[3] > 0 > shade[1] > shade[4]  # sign -> hue, magnitude -> darker
    assert min(colours[2][:3]) > 0.9  # zero: near white
    assert texts[0].get_color() == "#ffffff" and texts[2].get_color() == "#111111"  # readable on dark / light
    _png(fig, tmp_path / "tokens.png")

    page = tokens_html(values, ids, vocabulary)
    spans = re.findall(r'background:(#[0-9a-f]{6});color:#[0-9a-f]{6}" title="([^"]+)">([^<]*)</span>', page)
    assert [word for _, _, word in spans] == ["great", "not", "a", "&lt;b&gt;bad&lt;/b&gt;", "film"]  # escaped
    assert [float(v) for _, v, _ in spans] == values.tolist()
    html_shade = [_strength(matplotlib.colors.to_rgba(c)) for c, _, _ in spans]
    assert html_shade[0] > html_shade[3] > 0 > html_shade[1] > html_shade[4]
    unsigned = tokens_html(np.array([0.0, 1.0, 3.0]), ["a", "b", "c"])  # unsigned: light to orange
    light = [matplotlib.colors.to_rgba(c) for c in re.findall(r"background:(#[0-9a-f]{6})", unsigned)]
    assert min(light[0][:3]) > 0.9 and light[0][2] > light[1][2] > light[2][2]  # white, then ever more orange
    assert all(c[0] > c[2] for c in light[1:])  # orange, not a diverging blue


def test_text_model_tokens_shaded_by_their_summed_attribution(tmp_path):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(10, 4, name="embedding"),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
    ids = np.array([[3, 7, 1, 9, 2, 0], [4, 4, 5, 6, 8, 1]], "int32")
    e = ks.GradientXInput(model, layer="embedding").explain(ids)
    assert e.attributions.shape == (2, 6, 4) and data_kind(e.attributions, ids) == "text"
    vocabulary = [f"w{i}" for i in range(10)]
    fig = e.plot(ids, index=1, vocabulary=vocabulary)
    texts = fig.axes[0].texts
    assert [t.get_text() for t in texts] == [vocabulary[i] for i in ids[1]]
    per_token = e.attributions[1].sum(-1)  # the documented reduction: sum over the embedding axis
    shade = np.array([_strength(t.get_bbox_patch().get_facecolor()) for t in texts])
    assert np.argmax(shade) == np.argmax(per_token) and np.argmin(shade) == np.argmin(per_token)
    _png(fig, tmp_path / "text.png")


def test_data_report_one_figure_per_sample_and_method_in_order(series_model, tmp_path):
    model, x = series_model
    explanations = {"saliency": ks.Saliency(model).explain(x), "gradcam": ks.GradCAM(model, layer="conv").explain(x)}
    page = write_data_report(tmp_path / "seq", x, explanations, channel_names=["sin", "cos"],
                             class_names=["up", "down"], embed_images=True)
    data = read_report_data(page.parent)
    assert [list(entry.overlays) for entry in data["entries"]] == [["saliency", "gradcam"]] * 2
    for entry in data["entries"]:
        for rel in entry.overlays.values():
            picture = np.asarray(Image.open(page.parent / rel).convert("RGB"))
            assert picture.shape[1] >= 600 and picture.std() > 10
    text = page.read_text(encoding="utf-8")
    assert text.count("<figure class='method wide'") == 4 and "src='data:image/png;base64," in text
    assert "plots/" not in text.split("<body>")[1].split("report.json")[0]  # embedded: one self-contained file

    table = Explanation(np.array([[0.3, -0.1]]), "kernel_shap", {}, np.array([0]), np.ones(1))
    words = Explanation(np.array([[0.3, -0.1]]), "lime", {}, np.array([0]), np.ones(1))
    tab = write_data_report(tmp_path / "tab", np.ones((1, 2)), [table], feature_names=["a", "b"])
    txt = write_data_report(tmp_path / "txt", np.array([[1, 0]]), [words], vocabulary=["pad", "good"])
    assert (tab.parent / read_report_data(tab.parent)["entries"][0].overlays["kernel_shap"]).stat().st_size > 1000
    assert (txt.parent / read_report_data(txt.parent)["entries"][0].overlays["lime"]).stat().st_size > 1000
    with pytest.raises(ValueError, match="Received: kind='image'"):
        write_data_report(tmp_path / "img", np.ones((1, 4, 4, 3)), [table], kind="image")


def test_every_registered_method_declares_its_sign_convention():
    """The report's colours come from the declared convention: a new method must say which it is."""
    from kerascope.catalog import METHODS
    from kerascope.viz.colours import SIGN_CONVENTIONS, colour_scale, sign_convention

    undeclared = [entry.name for entry in METHODS if sign_convention(entry.name) is None]
    assert not undeclared, f"add {undeclared} to kerascope.viz.colours.SIGN_CONVENTIONS ('signed' or 'unsigned')"
    assert set(SIGN_CONVENTIONS) <= {entry.name for entry in METHODS}
    assert sign_convention("saliency", {"absolute": True}) == "unsigned"
    one_signed = np.abs(np.random.default_rng(0).normal(size=(4, 4)))  # a signed method whose map is all positive
    assert colour_scale(one_signed, "integrated_gradients").cmap == "RdBu_r"  # still centred at zero
    assert colour_scale(one_signed - 0.5, "unknown_method").signed  # undeclared: decided from the data
    assert not colour_scale(one_signed, "unknown_method").signed


def test_notebook_view_uses_the_colour_conventions():
    import base64
    import io

    signed = np.zeros((1, 4, 4))
    signed[0, 0, 0], signed[0, 3, 3] = 1.0, -1.0
    page = Explanation(signed, "saliency", {}, np.array([0]), np.ones(1))._repr_html_()
    uri = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri))).convert("RGB")).astype(int)
    assert pixels[0, 0, 0] > pixels[0, 0, 2] and pixels[3, 3, 2] > pixels[3, 3, 0]  # red +, blue -
    assert min(pixels[1, 1]) > 230  # zero is white on the diverging map
    table = Explanation(np.array([[0.5, -0.5, 0.0]]), "kernel_shap", {}, np.array([0]), np.ones(1))._repr_html_()
    assert table.count('class="tok"') == 3
