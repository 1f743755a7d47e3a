"""The command line on models that do not read images: tabular and time-series data files, token ids and texts.

Every test runs the real CLI (``kerascope.cli.main``) on tiny saved models and checks the numbers it wrote
against closed forms (the gradient of a linear model is its weights) or a hand ``GradientTape``.
"""

from __future__ import annotations

import csv
import json
import os
import re

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerascope.cli import main
from kerascope.io.tables import read_data


def _linear(tmp_path, shape, name):
    keras.utils.set_random_seed(1)
    layers = [keras.Input(shape)] + ([keras.layers.Flatten()] if len(shape) > 1 else []) + [keras.layers.Dense(3)]
    model = keras.Sequential(layers, name=name)
    path = tmp_path / f"{name}.keras"
    model.save(path)
    return model, path


def _weights(model):
    return np.asarray(model.layers[-1].kernel)


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        if header:
            writer.writerow(header)
        writer.writerows(rows)


def test_tabular_csv_saliency_is_the_gradient_and_names_come_from_the_header(tmp_path, capsys):
    model, path = _linear(tmp_path, (3,), "tab")
    rows = [["r1", 30, 1.5, 0.2], ["r2", 41, 2.0, -0.3], ["r3", 25, 0.5, 1.0]]
    _write_csv(tmp_path / "rows.csv", ["id", "age", "income", "score"], rows)
    out = tmp_path / "out"
    code = main(["explain", str(path), str(tmp_path / "rows.csv"), "--method", "saliency,integrated_gradients",
                 "--target", "2", "--out", str(out), "--quiet"])
    assert code == 0
    w = _weights(model)[:, 2]
    x = np.array([r[1:] for r in rows], np.float32)
    saved = np.load(out / "saliency.npz")
    np.testing.assert_allclose(saved["attributions"], np.broadcast_to(w, x.shape), rtol=1e-5, atol=1e-6)
    assert saved["feature_names"].tolist() == ["age", "income", "score"]
    assert saved["sample_names"].tolist() == ["r1", "r2", "r3"]
    ig = np.load(out / "integrated_gradients.npz")["attributions"]  # zero baseline, linear model: x * w exactly
    np.testing.assert_allclose(ig, x * w, rtol=1e-4, atol=1e-5)
    page = (out / "index.html").read_text()
    assert "r2" in page and "tabular" in page
    assert len(list((out / "plots").glob("*.png"))) == 6


def test_features_flag_names_the_columns_of_a_headerless_csv_and_a_npy(tmp_path):
    model, path = _linear(tmp_path, (2,), "two")
    _write_csv(tmp_path / "rows.csv", None, [[1.0, 2.0], [3.0, 4.0]])
    np.save(tmp_path / "rows.npy", np.array([[1.0, 2.0]], np.float32))
    for source in ("rows.csv", "rows.npy"):
        out = tmp_path / source.replace(".", "_")
        assert main(["explain", str(path), str(tmp_path / source), "--method", "saliency", "--features", "a,b",
                     "--out", str(out), "--quiet"]) == 0
        assert np.load(out / "saliency.npz")["feature_names"].tolist() == ["a", "b"]
    assert main(["explain", str(path), str(tmp_path / "rows.csv"), "--features", "a,b,c", "--out",
                 str(tmp_path / "bad"), "--quiet"]) == 2


def test_parquet_schema_names_features(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    model, path = _linear(tmp_path, (2,), "pq")
    pq.write_table(pa.table({"height": [1.0, 2.0], "width": [0.5, -1.0]}), tmp_path / "rows.parquet")
    out = tmp_path / "out"
    assert main(["explain", str(path), str(tmp_path / "rows.parquet"), "--method", "gradient_x_input",
                 "--target", "0", "--out", str(out), "--quiet"]) == 0
    saved = np.load(out / "gradient_x_input.npz")
    assert saved["feature_names"].tolist() == ["height", "width"]
    x = np.array([[1.0, 2.0], [0.5, -1.0]], np.float32).T
    np.testing.assert_allclose(saved["attributions"], x * _weights(model)[:, 0], rtol=1e-5)


def test_time_series_csv_rows_are_time_steps_and_columns_channels(tmp_path):
    model, path = _linear(tmp_path, (4, 2), "series")
    values = np.arange(16, dtype=np.float32).reshape(8, 2) / 10  # two series of 4 steps
    _write_csv(tmp_path / "series.csv", ["temp", "pressure"], values.tolist())
    out = tmp_path / "out"
    assert main(["explain", str(path), str(tmp_path / "series.csv"), "--method", "saliency", "--target", "1",
                 "--out", str(out), "--quiet"]) == 0
    saved = np.load(out / "saliency.npz")
    assert saved["attributions"].shape == (2, 4, 2)
    expected = _weights(model)[:, 1].reshape(4, 2)
    np.testing.assert_allclose(saved["attributions"], np.broadcast_to(expected, (2, 4, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(saved["inputs"], values.reshape(2, 4, 2))
    assert saved["feature_names"].tolist() == ["temp", "pressure"]
    assert "sequence" in (out / "index.html").read_text()
    _write_csv(tmp_path / "odd.csv", ["temp", "pressure"], values[:7].tolist())
    assert main(["explain", str(path), str(tmp_path / "odd.csv"), "--out", str(tmp_path / "o2"), "--quiet"]) == 2


def _token_model(tmp_path):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)], name="tok")
    path = tmp_path / "tok.keras"
    model.save(path)
    return model, path


def test_token_ids_in_npy_match_a_hand_gradient_at_the_embedding(tmp_path):
    import tensorflow as tf

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the hand gradient is a tf.GradientTape; the token path itself is covered on every backend")
    model, path = _token_model(tmp_path)
    ids = np.array([[1, 2, 3, 4, 5], [7, 7, 0, 9, 19]], np.int32)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out"
    assert main(["explain", str(path), str(tmp_path / "ids.npy"), "--method", "saliency", "--target", "1",
                 "--out", str(out), "--quiet"]) == 0
    embedded = tf.constant(np.asarray(model.layers[0].embeddings)[ids])
    with tf.GradientTape() as tape:
        tape.watch(embedded)
        score = model.layers[2](model.layers[1](embedded))[:, 1]
    expected = tape.gradient(score, embedded).numpy().sum(-1)  # the gradient, summed over the embedding
    saved = np.load(out / "saliency.npz")
    np.testing.assert_allclose(saved["attributions"], expected, rtol=1e-5, atol=1e-7)
    assert saved["token_ids"].tolist() == ids.tolist()


def test_inputs_a_model_cannot_take_are_refused_with_what_it_accepts(tmp_path, capsys):
    from kerascope.data import demo_images, demo_model_path

    _, tab = _linear(tmp_path, (3,), "tab")
    _, tok = _token_model(tmp_path)
    image = str(demo_images()[0])
    assert main(["explain", str(tab), image, "--out", str(tmp_path / "a")]) == 2
    message = capsys.readouterr().err
    assert ".csv" in message and "ks.explain(model, x" in message and image in message
    assert main(["explain", str(tok), "--text", "a fine film", "--out", str(tmp_path / "b")]) == 2
    message = capsys.readouterr().err
    assert "KerasHub preset folder" in message and "ids.npy" in message and "ks.explain_tokens" in message
    np.save(tmp_path / "x.npy", np.zeros((1, 3), np.float32))
    assert main(["explain", str(demo_model_path()), str(tmp_path / "x.npy"), "--out", str(tmp_path / "c")]) == 2
    message = capsys.readouterr().err
    assert "image files" in message and "ks.explain(model, images" in message
    assert main(["batch", str(tok), str(tmp_path / "x.npy"), "--out", str(tmp_path / "d")]) == 2
    assert "ks.explain_tokens" in capsys.readouterr().err
    (tmp_path / "words.csv").write_text("colour,size\nred,1\n")
    assert main(["explain", str(tab), str(tmp_path / "words.csv"), "--out", str(tmp_path / "e")]) == 2
    assert "Column 'colour'" in capsys.readouterr().err


def test_batch_explains_csv_rows_and_records_the_feature_names(tmp_path):
    import pyarrow.parquet as pq

    model, path = _linear(tmp_path, (3,), "tab")
    rows = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 0.5], [2.0, 2.0, 2.0]], np.float32)
    _write_csv(tmp_path / "rows.csv", ["a", "b", "c"], rows.tolist())
    out = tmp_path / "run"
    assert main(["batch", str(path), str(tmp_path / "rows.csv"), "--method", "gradient_x_input", "--targets", "1",
                 "--out", str(out), "--quiet"]) == 0
    table = pq.read_table(out / "shards").to_pydict()
    np.testing.assert_allclose(np.array(table["map"]), rows * _weights(model)[:, 1], rtol=1e-5)
    assert json.loads((out / "features.json").read_text())["feature_names"] == ["a", "b", "c"]


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow",
                    reason="KerasHub's tokenizers run on TensorFlow ops; the preset path is a loading path")
def test_text_with_a_keras_hub_preset_folder(tmp_path):
    pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(3)
    from _presets import save_bert_preset

    save_bert_preset(tmp_path / "preset")
    (tmp_path / "lines.txt").write_text("a dog ran\n\n")
    out = tmp_path / "out"
    assert main(["explain", str(tmp_path / "preset"), "--text", "the cat sat", "--text-file",
                 str(tmp_path / "lines.txt"), "--method", "integrated_gradients", "--param", "steps=64",
                 "--out", str(out), "--quiet"]) == 0
    saved = np.load(out / "integrated_gradients.npz")
    assert saved["texts"].tolist() == ["the cat sat", "a dog ran"]
    assert saved["token_ids"][:, :5].tolist() == [[2, 5, 6, 7, 3], [2, 8, 9, 10, 3]]
    attributions = saved["attributions"]
    assert np.all(attributions[:, 5:] == 0)  # padded positions get exactly 0
    assert np.all(np.abs(attributions[:, :5]) > 0)
    assert len(list((out / "plots").glob("*.png"))) == 2
    page = (out / "index.html").read_text()  # the token heatmaps as page text, each token's value its tooltip
    tokens = re.findall(r"<span class='tk ([pn]\d+)'[^>]* title='([^']+)'>([^<]*)</span>", page)
    cat = [(c, float(v)) for c, v, t in tokens if t == "cat"]
    assert len(cat) == 1 and np.isclose(cat[0][1], attributions[0, 2], rtol=1e-3, atol=1e-6)
    assert cat[0][0][0] == ("p" if attributions[0, 2] >= 0 else "n")
    assert [t for _, _, t in tokens][:5] == ["[CLS]", "the", "cat", "sat", "[SEP]"]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=3, max_size=3),
                min_size=1, max_size=6),
       st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), min_size=3, max_size=3, unique=True))
def test_csv_round_trip(tmp_path_factory, rows, header):
    folder = tmp_path_factory.mktemp("csv")
    if any(h in ("id", "name", "sample") for h in header):
        return
    _write_csv(folder / "x.csv", header, [[repr(v) for v in row] for row in rows])
    data = read_data(folder / "x.csv", (3,))
    np.testing.assert_array_equal(data.values, np.array(rows, np.float32))
    assert data.feature_names == header and data.kind == "tabular" and len(data) == len(rows)
