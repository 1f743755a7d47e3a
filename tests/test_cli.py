"""The command line on real files: explain (with a corrupt image), layers, methods, demo."""

from __future__ import annotations

import json
import shutil

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.cli import main
from kerascope.data import demo_images, demo_masks, demo_metadata, demo_model_path


def test_explain_reports_unreadable_image_and_processes_the_rest(tmp_path, capsys):
    images = demo_images()[:3]
    corrupt = tmp_path / "broken.png"
    corrupt.write_bytes(b"this is not a png")
    out = tmp_path / "out"
    code = main(["explain", str(demo_model_path()), *map(str, images), str(corrupt),
                 "--method", "gradcam", "--method", "saliency", "--out", str(out), "--json"])
    assert code == 1  # partial failure is signalled
    summary = json.loads(capsys.readouterr().out)
    assert summary["processed"] == 3 and summary["failed"] == 1
    assert "broken.png" in next(iter(summary["errors"]))
    assert (out / "index.html").exists()
    assert len(list((out / "overlays").glob("*.png"))) == 6
    saved = ks.Explanation.load(out / "gradcam.npz")
    assert saved.attributions.shape == (3, 64, 64)
    html = (out / "index.html").read_text()
    assert "broken.png" in html and "not a readable image" in html


def test_explain_matches_python_api(tmp_path):
    out = tmp_path / "out"
    assert main(["explain", str(demo_model_path()), str(demo_images()[0]), "--method", "saliency",
                 "--target", "2", "--out", str(out), "--quiet"]) == 0
    model = ks.load_model(demo_model_path())
    from kerascope.io.images import load_images

    x = load_images(demo_images()[:1], size=(64, 64)).inputs
    expected = ks.Saliency(model).explain(x, targets=2).attributions
    np.testing.assert_allclose(ks.Explanation.load(out / "saliency.npz").attributions, expected, rtol=1e-5, atol=1e-7)


def test_layers_and_methods_commands(capsys):
    assert main(["layers", str(demo_model_path()), "--json"]) == 0
    paths = [row["path"] for row in json.loads(capsys.readouterr().out)["layers"]]
    assert "conv3b" in paths and "predictions" in paths
    assert main(["methods", "--json"]) == 0
    assert {"saliency", "gradcam", "guided_gradcam"} <= set(json.loads(capsys.readouterr().out)["methods"])


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["layers", str(tmp_path / "nope.keras")]) == 2
    assert "No model file" in capsys.readouterr().err
    model_copy = tmp_path / "m.keras"
    shutil.copy(demo_model_path(), model_copy)
    assert main(["explain", str(model_copy), str(demo_images()[0]), "--method", "gradcam",
                 "--layer", "conv9", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "Received: layer='conv9'" in capsys.readouterr().err


def test_unsafe_model_file_is_refused(tmp_path, capsys):
    inputs = keras.Input((3,))
    outputs = keras.layers.Lambda(lambda t: t * 2.0)(inputs)
    path = tmp_path / "lambda.keras"
    keras.Model(inputs, outputs).save(path)
    with pytest.raises(ValueError, match="safe_mode=False"):
        ks.load_model(path)
    assert main(["layers", str(path)]) == 2
    assert "--unsafe" in capsys.readouterr().err


def test_demo_heatmaps_land_on_the_objects(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--json", "--method", "gradcam"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["processed"] == len(demo_images())
    explanation = ks.Explanation.load(out / "gradcam.npz")
    masks = demo_masks()
    meta = demo_metadata()
    hits = 0
    for i, path in enumerate(demo_images()):
        cam = explanation.attributions[i]
        hits += bool(masks[path.name].ravel()[np.argmax(cam)])
        assert explanation.targets[i] == meta["images"][path.name]["label"]
    assert hits >= len(demo_images()) - 1  # the Grad-CAM peak lies on the object
    assert (out / "index.html").exists()


def test_method_parameters_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["explain", str(demo_model_path()), str(demo_images()[0]), "--method", "smoothgrad",
                 "--param", "samples=3", "--param", "noise=0.0", "--out", str(out), "--quiet"]) == 0
    saved = ks.Explanation.load(out / "smoothgrad.npz")
    assert saved.params["samples"] == 3
    plain = main(["explain", str(demo_model_path()), str(demo_images()[0]), "--method", "saliency",
                  "--out", str(tmp_path / "plain"), "--quiet"])
    assert plain == 0
    np.testing.assert_allclose(saved.attributions, ks.Explanation.load(tmp_path / "plain" / "saliency.npz").attributions,
                               rtol=1e-5, atol=1e-7)  # noise=0 SmoothGrad equals Saliency
    assert main(["explain", str(demo_model_path()), str(demo_images()[0]), "--method", "gradcam",
                 "--param", "samples=3", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "No chosen method accepts the parameter(s) ['samples']" in capsys.readouterr().err
