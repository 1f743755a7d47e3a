"""The ground-truth benchmark on the bundled model, and the ``kerascope evaluate`` command."""

from __future__ import annotations

import csv
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kerascope.data import demo_model_path  # noqa: E402
from kerascope.evaluation import benchmark, bundled_data  # noqa: E402

pytestmark = pytest.mark.skipif(not demo_model_path().exists(), reason="bundled demo model not built yet")


@pytest.fixture(scope="module")
def demo():
    from kerascope.io.models import load_model

    return load_model(demo_model_path())


@pytest.fixture(scope="module")
def result(demo):
    from conftest import snapshot

    before = snapshot(demo)
    r = benchmark(demo, methods=["gradcam", "saliency"], n=12, steps=8, sanity_images=2, batch_size=64)
    return r, before


def test_benchmark_leaves_the_model_unchanged(demo, result):
    from conftest import assert_unchanged

    _, before = result
    assert_unchanged(demo, before)


def test_gradcam_points_at_the_object_far_more_often_than_a_random_map(result):
    r, _ = result
    gradcam, random = r.get("gradcam"), r.get("random (reference)")
    assert not gradcam.error, gradcam.error
    assert gradcam.pointing_game >= 0.75
    assert random.pointing_game <= 0.35
    assert gradcam.energy_pointing_game > random.energy_pointing_game + 0.2
    # a constant map scores the objects' mean area fraction on both pointing games
    _, _, masks = bundled_data(12, 2024, 64)
    area = masks.reshape(12, -1).mean()
    assert r.get("constant (reference)").energy_pointing_game == pytest.approx(area, rel=1e-5)


def test_random_map_has_a_worse_deletion_auc_than_gradcam(result):
    r, _ = result
    assert r.get("random (reference)").deletion_auc > r.get("gradcam").deletion_auc + 0.2
    assert r.get("random (reference)").insertion_auc < r.get("gradcam").insertion_auc
    assert r.fractions[0] == 0.0 and r.fractions[-1] == 1.0 and len(r.fractions) == 9


def test_sanity_cascade_destroys_gradcam_and_saliency_but_not_a_constant_map(result):
    r, _ = result
    for name in ("gradcam", "saliency"):
        row = r.get(name)
        assert row.sanity is not None and row.sanity.steps[0] == "predictions"
        assert row.sanity_spearman < 0.5, (name, row.sanity.spearman_mean)
    constant = r.get("constant (reference)")
    assert constant.sanity_spearman == 1.0 and constant.sanity_ssim == pytest.approx(1.0, abs=1e-6)
    assert r.get("random (reference)").sanity_spearman == 1.0  # a map that ignores the model never changes


def test_markdown_and_csv_hold_the_same_numbers(result, tmp_path):
    r, _ = result
    path = r.write_csv(tmp_path / "b.csv")
    rows = list(csv.DictReader(path.open()))
    assert [row["method"] for row in rows] == ["gradcam", "saliency", "random (reference)", "constant (reference)"]
    assert float(rows[0]["pointing_game"]) == pytest.approx(r.get("gradcam").pointing_game)
    assert f"| gradcam | {r.get('gradcam').pointing_game:.3f} ± " in r.markdown()  # mean ± half of its 95% CI


def test_evaluate_command_with_a_user_model_and_data_file(tmp_path, capsys):
    from kerascope.cli import main

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4, activation="softmax", name="head"),
    ])
    model_path = tmp_path / "m.keras"
    model.save(model_path)
    images, labels, masks = bundled_data(3, seed=5, size=16)
    data_path = tmp_path / "d.npz"
    np.savez(data_path, images=images, masks=masks, labels=labels)
    out = tmp_path / "out"
    code = main(["evaluate", str(model_path), str(data_path), "--methods", "gradcam", "--steps", "4",
                 "--sanity-images", "1", "--out", str(out), "--json"])
    assert code == 0
    import json

    summary = json.loads(capsys.readouterr().out)
    assert summary["config"]["images"] == 3
    for name in ("benchmark.csv", "benchmark.md", "curves.png", "sanity.png", "sanity_curves.png", "index.html"):
        assert (out / name).stat().st_size > 0, name
    page = (out / "index.html").read_text()
    assert "gradcam" in page and "curves.png" in page
    assert "kerascope evaluate" in (out / "benchmark.md").read_text()
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=images)
    assert main(["evaluate", str(model_path), str(bad), "--out", str(out)]) == 2


def test_the_default_run_leaves_out_exhaustive_methods_with_a_row_that_says_why():
    from kerascope.evaluation import NOT_RUN_BY_DEFAULT, BenchmarkResult, MethodScores, _explainers
    from kerascope.methods.registry import available

    names = [name for name, _ in _explainers(None, baselines=False, batch_size=8, seed=0)]
    assert "shapley_exact" in available() and "shapley_exact" not in names
    assert sorted(names) == sorted(set(available()) - set(NOT_RUN_BY_DEFAULT))
    assert [name for name, _ in _explainers(["shapley_exact"], False, 8, 0)] == ["shapley_exact"]  # named: runs
    row = MethodScores("shapley_exact", error=f"not run by default: {NOT_RUN_BY_DEFAULT['shapley_exact']}",
                       applicable=False)
    table = BenchmarkResult([row], np.zeros(1)).markdown()
    assert "| shapley_exact (not run by default: all 2^16 coalitions" in table and "failed" not in table


def test_methods_that_need_a_layer_get_a_not_applicable_row_that_names_the_call(demo):
    r = benchmark(demo, methods=["layer_conductance", "gradcam"], n=2, steps=4, sanity_images=0, baselines=False)
    row = r.get("layer_conductance")
    assert not row.applicable and "needs layer=" in row.error and "LayerConductance(model, layer=...)" in row.error
    assert r.get("gradcam").applicable and not r.get("gradcam").error
