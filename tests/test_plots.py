"""Matplotlib helpers: figure sizes, colormap choice, colour bars, and that the PNGs show real content."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.core.explanation import Explanation  # noqa: E402
from kerascope.viz.plots import display_map, plot_explanation, save_figure  # noqa: E402


def _png(fig, path, dpi=50) -> np.ndarray:
    save_figure(fig, path, dpi=dpi)
    return np.asarray(Image.open(path).convert("RGB"))


def _assert_real_picture(pixels: np.ndarray) -> None:
    assert pixels.std() > 10  # not blank
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # colour maps, not a flat fill


@pytest.fixture(scope="module")
def model_and_images():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3),
    ])
    return model, np.random.default_rng(0).random((3, 16, 16, 3)).astype("float32")


def test_plot_grid_size_colormaps_and_colorbars(model_and_images, tmp_path):
    model, images = model_and_images
    saliency = ks.Saliency(model).explain(images)
    gradcam = ks.GradCAM(model, layer="conv").explain(images)
    fig = ks.plot_grid(images, [saliency, gradcam], size=2.0, title="grid")
    pixels = _png(fig, tmp_path / "grid.png", dpi=50)
    assert pixels.shape == (int((3 * 2.0 + 0.3) * 50), 3 * 2.0 * 50, 3)  # rows x cols panels (+ title)
    _assert_real_picture(pixels)
    shown = [ax.images[-1] for ax in fig.axes if ax.images and ax.get_title().startswith(("saliency", "gradcam"))]
    assert len(shown) == 6
    for picture in shown:
        low, high = picture.get_clim()
        if picture.axes.get_title().startswith("saliency"):  # signed gradients: diverging, centred on zero
            assert picture.get_cmap().name == "RdBu_r" and low == -high and high > 0
        else:  # ReLU'd CAM: sequential from zero
            assert picture.get_cmap().name == "magma" and low == 0 and high > 0
    colour_bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colour_bars) == 6
    # the signed map is the channel sum of the raw attribution, clipped at the 99.5th percentile
    first = shown[0]
    expected = saliency.attributions[0].astype(np.float64).sum(-1)
    np.testing.assert_allclose(np.asarray(first.get_array()), expected, rtol=1e-6)
    assert first.get_clim()[1] == pytest.approx(np.percentile(np.abs(expected), 99.5))


def test_explanation_plot_and_overlay_mode(model_and_images, tmp_path):
    model, images = model_and_images
    gradcam = ks.GradCAM(model, layer="conv").explain(images)
    fig = gradcam.plot(images, alpha=0.5, indices=[2], class_names=["a", "<b>", "c"], size=3.0)
    pixels = _png(fig, tmp_path / "one.png", dpi=40)
    assert pixels.shape == (3 * 40, 2 * 3 * 40, 3)
    _assert_real_picture(pixels)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    target = int(gradcam.targets[2])
    assert titled == ["input", f"gradcam\n{['a', '<b>', 'c'][target]}"]
    with pytest.raises(ValueError, match="Received: 2 images, 3 samples"):
        ks.plot_grid(images[:2], gradcam)


def test_display_map_modes():
    a = np.array([[[1.0, -3.0]], [[2.0, 0.5]]])  # (2, 1, 2)
    np.testing.assert_allclose(display_map(a, "signed")[0], [[-2.0], [2.5]])
    np.testing.assert_allclose(display_map(a, "absolute")[0], [[4.0], [2.5]])
    np.testing.assert_allclose(display_map(a, "positive")[0], [[1.0], [2.5]])
    assert display_map(a)[1] is True and display_map(np.abs(a))[1] is False
    with pytest.raises(ValueError, match="Received: sign='x'"):
        display_map(a, "x")


def test_sequence_plot_colours_follow_attribution(tmp_path):
    t = np.linspace(0, 4 * np.pi, 120)
    values = np.stack([np.sin(t), np.cos(t)], -1)
    attributions = np.stack([np.sin(2 * t), -np.abs(np.cos(t))], -1)
    fig = ks.plot_sequence(values, attributions, channel_names=["x", "y"], size=(6.0, 1.5))
    pixels = _png(fig, tmp_path / "seq.png", dpi=60)
    assert pixels.shape == (2 * 1.5 * 60, 6.0 * 60, 3)
    _assert_real_picture(pixels)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_ylabel() for ax in panels] == ["x", "y"]
    strip = panels[0].images[0]  # the heat strip behind the series: one cell per time step
    np.testing.assert_allclose(np.asarray(strip.get_array())[0], attributions[:, 0])
    assert strip.get_cmap().name == "RdBu_r" and strip.norm.vmin == -strip.norm.vmax == -np.abs(attributions).max()
    np.testing.assert_allclose(panels[0].lines[0].get_ydata(), values[:, 0])  # the series drawn over it
    # red where the attribution is most positive, blue where most negative
    colours = strip.to_rgba(np.asarray(strip.get_array())[0])
    hot, cold = np.argmax(attributions[:, 0]), np.argmin(attributions[:, 0])
    assert colours[hot][0] > colours[hot][2] and colours[cold][2] > colours[cold][0]


def test_tabular_bars_sorted_and_signed(tmp_path):
    attributions = np.array([0.1, -0.7, 0.4, 0.0, -0.2])
    fig = ks.plot_tabular(attributions, ["a", "b", "c", "d", "e"], values=np.arange(5.0), top_k=4, size=(5, 3))
    pixels = _png(fig, tmp_path / "bars.png", dpi=50)
    assert pixels.shape == (150, 250, 3)
    _assert_real_picture(pixels)
    ax = fig.axes[0]
    widths = [bar.get_width() for bar in ax.patches]
    assert widths == [0.1, -0.2, 0.4, -0.7]  # top 4 by magnitude, largest at the top
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a = 0", "e = 4", "c = 2", "b = 1"]
    red, blue = ax.patches[2].get_facecolor(), ax.patches[3].get_facecolor()
    assert red[0] > red[2] and blue[2] > blue[0]


def test_explanation_plot_kinds_for_sequences_and_tables(tmp_path):
    keras.utils.set_random_seed(0)
    tab = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    e = ks.GradientXInput(tab).explain(x)
    fig = e.plot(x, kind="tabular", index=1, feature_names=[f"f{i}" for i in range(6)])
    bars = sorted(abs(b.get_width()) for b in fig.axes[0].patches)
    np.testing.assert_allclose(bars, np.sort(np.abs(e.attributions[1])), rtol=1e-6)
    assert fig.axes[0].get_title() == f"gradient_x_input · target {int(e.targets[1])}"
    _assert_real_picture(_png(fig, tmp_path / "tab.png"))

    seq = keras.Sequential([keras.Input((20, 2)), keras.layers.Conv1D(3, 3, activation="relu"),
                            keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
    xs = np.random.default_rng(2).normal(size=(2, 20, 2)).astype("float32")
    es = ks.Saliency(seq).explain(xs)
    fig = es.plot(xs, kind="sequence", index=0)
    assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) == 2
    _assert_real_picture(_png(fig, tmp_path / "seq.png"))
    with pytest.raises(ValueError, match="Received: kind='pie'"):
        plot_explanation(es, xs, kind="pie")
    assert isinstance(Explanation(np.ones((1, 4)), "m", {}, np.array([0]), np.ones(1)).plot().axes[0].patches[0]
                      .get_width(), float)
