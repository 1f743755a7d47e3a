"""The command line on other model kinds: a multi-output model (``--param output_index=NAME``) and
``--layer`` reaching gradient methods as layer attribution while CAMs and other methods keep working.

Through the real ``kerascope`` entry point (``kerascope.cli.main``) on saved ``.keras`` files and
PNG images; every result is compared with the Python API on the same loaded pixels.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from PIL import Image

import kerascope as ks
from kerascope.cli import main
from kerascope.io.images import load_images

L = keras.layers


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A two-output image model (dict outputs ``cls`` / ``reg``), a one-output CNN and two PNG images."""
    folder = tmp_path_factory.mktemp("cli_models")
    keras.utils.set_random_seed(0)
    image = keras.Input((16, 16, 3), name="image")
    h = L.Conv2D(4, 3, activation="relu", name="conv1")(image)
    h = L.Conv2D(3, 3, activation="relu", name="conv2")(h)
    pooled = L.GlobalAveragePooling2D()(h)
    two = keras.Model(image, {"cls": L.Dense(3, name="cls")(pooled), "reg": L.Dense(1, name="reg")(pooled)})
    two.save(folder / "two_outputs.keras")
    one = keras.Model(image, L.Dense(3, name="out")(pooled))
    one.save(folder / "cnn.keras")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        paths.append(folder / f"im{i}.png")
        Image.fromarray(rng.integers(0, 255, (16, 16, 3)).astype("uint8")).save(paths[-1])
    return folder, [str(p) for p in paths]


def pixels(paths: list[str]) -> np.ndarray:
    return load_images(paths, size=(16, 16)).inputs


def test_output_index_by_name_reaches_the_method(files, tmp_path, capsys):
    folder, paths = files
    model_file = str(folder / "two_outputs.keras")
    out = tmp_path / "out"
    code = main(["explain", model_file, *paths, "--method", "saliency,gradcam", "--param", "output_index=cls",
                 "--target", "1", "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["processed"] == 2 and summary["layers"] == {"gradcam": "conv2"}
    model = ks.load_model(model_file)
    x = pixels(paths)
    for name, cls in (("saliency", ks.Saliency), ("gradcam", ks.GradCAM)):
        saved = ks.Explanation.load(out / f"{name}.npz")
        expected = cls(model, output_index="cls").explain(x, 1).attributions
        np.testing.assert_allclose(saved.attributions, expected, rtol=1e-5, atol=1e-7)
        assert saved.params["output_index"] == "cls"
    # the other output gives other maps: the parameter really chose the output
    other = ks.Saliency(model, output_index="reg").explain(x, 0).attributions
    assert not np.allclose(other, ks.Explanation.load(out / "saliency.npz").attributions)
    # without it: a refusal that says how to choose on the command line
    assert main(["explain", model_file, paths[0], "--method", "saliency", "--out", str(tmp_path / "o2")]) == 2
    assert "--param output_index=cls" in capsys.readouterr().err


def test_layer_reaches_gradient_methods_and_cams(files, tmp_path, capsys):
    folder, paths = files
    model_file = str(folder / "cnn.keras")
    model = ks.load_model(model_file)
    x = pixels(paths)
    # no CAM chosen: --layer is the layer the gradient methods attribute at; Occlusion stays on the pixels
    out = tmp_path / "grad"
    code = main(["explain", model_file, *paths, "--method", "saliency,integrated_gradients,occlusion",
                 "--layer", "conv1", "--param", "steps=8", "--param", "window=4", "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layers"] == {"saliency": "conv1", "integrated_gradients": "conv1"}
    expected = {
        "saliency": ks.Saliency(model, layer="conv1").explain(x, None),
        "integrated_gradients": ks.IntegratedGradients(model, layer="conv1", steps=8).explain(x, None),
        "occlusion": ks.Occlusion(model, window=4).explain(x, None),
    }
    shapes = {"saliency": (2, 14, 14, 4), "integrated_gradients": (2, 14, 14, 4), "occlusion": (2, 16, 16, 3)}
    for name, want in expected.items():
        saved = ks.Explanation.load(out / f"{name}.npz")
        assert saved.attributions.shape == shapes[name], name
        np.testing.assert_allclose(saved.attributions, want.attributions, rtol=1e-4,
                                   atol=1e-6 * (np.abs(want.attributions).max() + 1e-12))
    assert len(list((out / "overlays").glob("*.png"))) == 6  # layer attributions are drawn too
    # with a CAM: --layer names the CAM layer and Saliency stays on the pixels (the README's example)
    out = tmp_path / "cam"
    assert main(["explain", model_file, *paths, "--method", "gradcam,saliency", "--layer", "conv1",
                 "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"] == {"gradcam": "conv1"}
    np.testing.assert_allclose(ks.Explanation.load(out / "gradcam.npz").attributions,
                               ks.GradCAM(model, layer="conv1").explain(x, None).attributions, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(ks.Explanation.load(out / "saliency.npz").attributions,
                               ks.Saliency(model).explain(x, None).attributions, rtol=1e-4, atol=1e-7)
    # a layer no chosen method takes is refused
    assert main(["explain", model_file, paths[0], "--method", "occlusion", "--layer", "conv1",
                 "--out", str(tmp_path / "o2")]) == 2
    assert "layer" in capsys.readouterr().err


def test_demo_keeps_gradient_methods_on_the_pixels(tmp_path):
    """The demo names its CAM layer; the gradient methods must not turn into layer attributions."""
    out = tmp_path / "demo"
    assert main(["demo", "--method", "gradcam,saliency", "--out", str(out), "--quiet"]) == 0
    assert ks.Explanation.load(out / "saliency.npz").attributions.shape == (8, 64, 64, 3)
    gradcam = ks.Explanation.load(out / "gradcam.npz")
    assert gradcam.attributions.shape == (8, 64, 64) and gradcam.layer == "conv3b"
