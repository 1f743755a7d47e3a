"""`kerascope evaluate` checks the model against the data first; `evaluate-data` builds the .npz from folders.

The documented example in docs/evaluation.md is run as written; the built arrays are compared with
the pixels and masks that were written to the folders.
"""

from __future__ import annotations

import json
import re
import shlex
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

from kerascope.cli import main
from kerascope.evaluation import check_data, plain_text

DOC = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"


def grey_model(classes: int = 7) -> keras.Model:
    """A 48x48 one-channel classifier (like a facial-expression model)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((48, 48, 1)), keras.layers.Conv2D(2, 3, name="conv"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(classes, activation="softmax")])


def test_evaluate_refuses_a_model_that_does_not_fit_before_any_work(tmp_path, capsys):
    model_file = tmp_path / "fer.keras"
    grey_model().save(model_file)
    out = tmp_path / "eval"
    assert main(["evaluate", str(model_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kerascope evaluate: error: The model does not fit")
    assert "images have 3 channel(s) but the model takes 1" in err
    assert "the generated shapes data has 4 classes" in err and "the model has 7" in err
    assert "model input (None, 48, 48, 1)" in err and "kerascope evaluate-data" in err
    assert "Traceback" not in err and not out.exists()  # stopped before any work


def test_check_data_names_every_mismatch():
    model = grey_model(3)
    good = np.zeros((2, 48, 48, 1), np.float32), np.ones((2, 48, 48), bool), np.array([0, 2])
    check_data(model, *good)  # fits: no error
    with pytest.raises(ValueError) as error:
        check_data(model, np.zeros((2, 32, 40, 1)), np.ones((3, 32, 40), bool), np.array([0, 3]))
    text = str(error.value)
    assert "images are 32x40 but the model takes 48x48" in text
    assert "masks must be (N, H, W) matching the images (2, 32, 40), found (3, 32, 40)" in text
    assert "labels go up to 3 but the model has 3 classes (0..2)" in text
    with pytest.raises(ValueError, match="images must be numbers, found dtype <U1"):
        check_data(model, np.full((2, 48, 48, 1), "a"), good[1])
    with pytest.raises(ValueError, match="labels must be integer class indices"):
        check_data(model, good[0], good[1], np.array([0.5, 1.0]))


def test_plain_text_strips_colour_codes():
    assert plain_text("\x1b[31mValueError\x1b[0m: \x1b[1mbad\x1b[0m\nshape") == "ValueError: bad shape"


def _blocks(heading: str) -> tuple[str, list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return python, [line for line in bash.splitlines() if line.startswith("kerascope ")]


def test_documented_example_builds_the_data_and_evaluates(tmp_path, monkeypatch, capsys):
    python, commands = _blocks("## Your own data")
    monkeypatch.chdir(tmp_path)
    exec(compile(python, str(DOC), "exec"), {})  # noqa: S102 - the documented snippet, as written
    assert [c.split()[1] for c in commands] == ["evaluate-data", "evaluate"]

    assert main(shlex.split(commands[0])[1:]) == 0
    captured = capsys.readouterr()
    assert "preprocessing: unit" in captured.err and "wrote data.npz: 8 images 64x64x3" in captured.out
    with np.load("data.npz") as data:
        images, masks, labels, names = data["images"], data["masks"], data["labels"], data["names"]
    # independent: the files written by the snippet, read back with PIL
    for i, name in enumerate(names):
        pixels = np.asarray(Image.open(Path("shapes/images") / name).convert("RGB"), np.float32) / 255
        np.testing.assert_allclose(images[i], pixels, atol=1e-6)
        np.testing.assert_array_equal(masks[i], np.asarray(Image.open(Path("shapes/masks") / name)) > 127)
    classes = Path("shapes/classes.txt").read_text().split()
    expected = {row.split(",")[0]: classes.index(row.split(",")[1]) for row in Path("shapes/labels.csv").read_text().split()}
    assert labels.tolist() == [expected[n] for n in names]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*shlex.split(commands[1])[1:], "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in summary["rows"]][:2] == ["gradcam", "saliency"]
    assert not any("legend" in str(w.message) for w in caught)
    cells = json.dumps(summary["rows"])
    assert "\x1b" not in cells and "\\u001b" not in cells
    assert all(r.get("pointing_game") is not None for r in summary["rows"][:2])


def test_evaluate_data_lists_every_problem(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "images" / "a.png")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "images" / "b.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "masks" / "a.png")  # empty mask; b has none
    out = tmp_path / "d.npz"
    assert main(["evaluate-data", str(tmp_path / "images"), str(tmp_path / "masks"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "a: the mask a.png marks no pixel" in err and "b: no mask named b.*" in err
    assert not out.exists()
