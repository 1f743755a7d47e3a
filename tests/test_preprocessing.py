"""Pixel preprocessing is read from the model, printed once and recorded in every output.

Real tiny models with and without a ``Rescaling`` layer, saved to files and run through
the command line; the recorded probabilities are checked against the model called by hand
on the pixels scaled as the recorded mode says.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from PIL import Image

from kerascope.cli import main
from kerascope.core.explanation import Explanation
from kerascope.io.preprocessing import resolve_preprocess, scaling_layer


def tiny(rescale: bool, nested: bool = False, seed: int = 0) -> keras.Model:
    """16x16 RGB classifier of 3 classes; with ``rescale`` it divides its inputs by 255 itself."""
    keras.utils.set_random_seed(seed)
    body = [keras.layers.Conv2D(4, 3, activation="relu", name="conv"), keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, activation="softmax", name="out")]
    if not rescale:
        return keras.Sequential([keras.Input((16, 16, 3)), *body], name="plain")
    if nested:
        front = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.RandomFlip(name="flip"),
                                  keras.layers.Rescaling(1 / 255, name="scale")], name="front")
        return keras.Sequential([keras.Input((16, 16, 3)), front, *body], name="nested")
    return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255, name="scale"), *body],
                            name="rescaled")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> list:
    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        path = folder / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def _pixels(paths) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p).convert("RGB"), np.float32) for p in paths])


def test_resolve_reads_the_models_own_layers():
    assert resolve_preprocess(tiny(True))[0] == "raw"
    assert scaling_layer(tiny(True, nested=True)).name == "scale"  # found inside a nested model, past RandomFlip
    assert resolve_preprocess(tiny(True, nested=True))[0] == "raw"
    mode, reason = resolve_preprocess(tiny(False))
    assert mode == "unit" and "assumed" in reason and "--preprocess" in reason
    adapted = keras.layers.Normalization(name="norm")
    adapted.adapt(np.random.default_rng(0).random((8, 16, 16, 3)).astype(np.float32))  # values in [0, 1]
    unit_norm = keras.Sequential([keras.Input((16, 16, 3)), adapted, keras.layers.Flatten()])
    assert resolve_preprocess(unit_norm)[0] == "unit"
    assert resolve_preprocess(tiny(True), "symmetric") == ("symmetric", "chosen with --preprocess")
    # a Rescaling deeper in the network is not input preprocessing
    late = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(2, 3), keras.layers.Rescaling(2.0)])
    assert scaling_layer(late) is None
    with pytest.raises(ValueError, match="Received: preprocess='bgr'"):
        resolve_preprocess(tiny(False), "bgr")


@pytest.mark.parametrize("rescale, mode", [(True, "raw"), (False, "unit")])
def test_explain_cli_prints_and_records_the_mode(tmp_path, capsys, pictures, rescale, mode):
    model = tiny(rescale)
    model_file = tmp_path / "m.keras"
    model.save(model_file)
    out = tmp_path / "out"
    assert main(["explain", str(model_file), *map(str, pictures), "--method", "gradcam,saliency",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("preprocessing: ") == 1
    assert f"preprocessing: {mode} (" in err
    assert "layers: gradcam: conv (14x14 positions)" in err  # the CAM layer chosen, and how fine it is
    assert err.index("preprocessing: ") < err.index("layers: ")

    summary = json.loads((out / "summary.json").read_text())
    assert summary["preprocess"] == mode and summary["preprocess_reason"]
    assert summary["layers"] == {"gradcam": "conv"}
    saved = Explanation.load(out / "gradcam.npz")
    assert saved.extras["preprocess"] == mode and saved.extras["layer"] == "conv"
    assert Explanation.load(out / "saliency.npz").extras["preprocess"] == mode

    report = json.loads((out / "report.json").read_text())
    assert f"preprocessing {mode}" in report["subtitle"] and "gradcam layer conv" in report["subtitle"]
    about = report["about"]  # the page's "About this page" box
    assert about["preprocessing"].startswith(f"{mode}: ") and about["preprocessing"].endswith(")")
    assert about["methods"]["gradcam"]["layer"] == "conv" and "layer" not in about["methods"]["saliency"]
    # the recorded probabilities are the model's on the pixels scaled as recorded (independent call)
    scaled = _pixels(pictures) / (1.0 if mode == "raw" else 255.0)
    probs = np.asarray(model(scaled))
    for i, entry in enumerate(report["entries"]):
        target = int(np.argmax(probs[i]))
        assert entry["target"] == str(target)
        np.testing.assert_allclose(entry["target_probability"], probs[i, target], rtol=1e-4)
        assert [int(c) for c, _ in entry["predictions"]] == list(np.argsort(-probs[i])[:3])


def test_labels_name_the_target_and_top3(tmp_path, pictures):
    model_file = tmp_path / "m.keras"
    tiny(True).save(model_file)
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\nfox\n")
    out = tmp_path / "out"
    assert main(["explain", str(model_file), str(pictures[0]), "--labels", str(labels), "--out", str(out),
                 "--quiet"]) == 0
    entry = json.loads((out / "report.json").read_text())["entries"][0]
    assert {c for c, _ in entry["predictions"]} == {"cat", "dog", "fox"}
    assert entry["target"] == entry["predictions"][0][0]
    assert entry["target_probability"] == pytest.approx(entry["predictions"][0][1])


def test_quiet_and_json_print_no_preprocessing_line(tmp_path, capsys, pictures):
    model_file = tmp_path / "m.keras"
    tiny(False).save(model_file)
    assert main(["explain", str(model_file), str(pictures[0]), "--out", str(tmp_path / "o"), "--json"]) == 0
    captured = capsys.readouterr()
    assert "preprocessing:" not in captured.err
    assert json.loads(captured.out)["preprocess"] == "unit"


def test_batch_manifest_records_mode_reason_and_layer(tmp_path, capsys, pictures):
    model_file = tmp_path / "m.keras"
    tiny(True, nested=True).save(model_file)
    out = tmp_path / "run"
    assert main(["batch", str(model_file), str(pictures[0].parent), "--out", str(out), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["preprocess"] == "raw" and "'scale'" in manifest["preprocess_reason"]
    assert manifest["layer"] == "conv"
    assert manifest["summary"]["preprocess"] == "raw"
