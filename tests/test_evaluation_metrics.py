"""The metric families as benchmark columns: ``kerascope evaluate --metrics`` on the bundled demo model, its
table equal to calling the metric functions directly, and the confidence intervals against hand computations."""

from __future__ import annotations

import csv
import json
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope import metrics  # noqa: E402
from kerascope.data import demo_model_path  # noqa: E402
from kerascope.evaluation import benchmark, bundled_data  # noqa: E402
from kerascope.evaluation_metrics import MetricCell, available_metrics, confidence_interval  # noqa: E402

pytestmark = [pytest.mark.skipif(not demo_model_path().exists(), reason="bundled demo model not built yet")]
if keras.backend.backend() == "jax":  # Grad-CAM and the metrics' forwards compile for minutes on JAX
    pytestmark.append(pytest.mark.slow)

N, STEPS, SEED = 5, 4, 7


@pytest.fixture(scope="module")
def demo():
    from kerascope.io.models import load_model

    return load_model(demo_model_path())


@pytest.fixture(scope="module")
def data(demo):
    size = int(demo.inputs[0].shape[1])
    images, labels, masks = bundled_data(N, seed=SEED, size=size)
    return images.astype(np.float32), labels.astype(np.int64), masks.astype(bool)


@pytest.fixture(scope="module")
def gradcam_maps(demo, data):
    images, labels, _ = data
    e = ks.GradCAM(demo).explain(images, targets=labels)
    return metrics.to_maps(e.attributions, images.shape[1:3])


def _t_interval(scores, level=0.95):
    """By hand: mean ± t quantile × sample standard deviation / sqrt(n), SciPy's t distribution."""
    from scipy import stats

    s = np.asarray(scores, np.float64)
    s = s[np.isfinite(s)]
    low, high = stats.t.interval(level, len(s) - 1, loc=s.mean(), scale=stats.sem(s))
    return s.mean(), low, high


def test_confidence_interval_t_by_hand():
    s = np.array([1.0, 2.0, 3.0])  # mean 2, sd 1, t_{0.975, 2} = 4.302653
    mean, low, high, n = confidence_interval(s)
    assert (mean, n) == (2.0, 3)
    assert high - mean == pytest.approx(4.302652729911275 / math.sqrt(3), rel=1e-9)
    assert mean - low == pytest.approx(high - mean, rel=1e-12)
    rng = np.random.default_rng(0)
    for level in (0.9, 0.95, 0.99):
        x = rng.normal(size=11)
        x[3] = np.nan  # an undefined image is left out
        assert confidence_interval(x, level)[:3] == pytest.approx(_t_interval(x, level), rel=1e-10)


def test_confidence_interval_bootstrap_by_hand():
    s = np.random.default_rng(1).random(9)
    resamples, level, seed = 500, 0.9, 3
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(s), (resamples, len(s)))
    means = np.array([np.mean([s[j] for j in row]) for row in draws])  # one resample at a time
    sorted_means = np.sort(means)
    mean, low, high, n = confidence_interval(s, level, "bootstrap", resamples=resamples, seed=seed)
    assert (mean, n) == (pytest.approx(s.mean()), 9)
    # numpy's default (linear) quantile on the sorted means: position q * (R - 1)
    for q, got in ((0.05, low), (0.95, high)):
        pos = q * (resamples - 1)
        lo = int(math.floor(pos))
        assert got == pytest.approx(sorted_means[lo] + (pos - lo) * (sorted_means[lo + 1] - sorted_means[lo]))
    assert s.min() <= low < mean < high <= s.max()


def test_confidence_interval_edge_cases():
    assert confidence_interval(np.array([0.5, 0.5, 0.5]))[1:3] == (0.5, 0.5)  # no spread, zero width
    mean, low, high, n = confidence_interval(np.array([0.25, np.nan]))
    assert (mean, n) == (0.25, 1) and math.isnan(low) and math.isnan(high)
    assert math.isnan(confidence_interval(np.array([np.nan]))[0])
    with pytest.raises(ValueError, match="interval='normal'"):
        confidence_interval(np.ones(3), interval="normal")
    with pytest.raises(ValueError, match="level=1.5"):
        confidence_interval(np.ones(3), 1.5)
    assert MetricCell.of("m", np.array([1.0, 2.0, 3.0]), True).text() == "2.000 ± 2.484"


def test_cli_table_equals_the_metric_functions(demo, data, gradcam_maps, tmp_path, capsys):
    from kerascope.cli import main

    images, labels, masks = data
    data_path = tmp_path / "d.npz"
    np.savez(data_path, images=images, masks=masks, labels=labels)
    out = tmp_path / "out"
    code = main(["evaluate", str(demo_model_path()), str(data_path), "--methods", "gradcam", "--no-references",
                 "--metrics", "pixel_flipping,sparseness", "--metric", "relevance_rank_accuracy",
                 "--metric-param", "pixel_flipping.perturbation=0.0", "--steps", str(STEPS),
                 "--seed", str(SEED), "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"]["metrics"] == "pixel_flipping,sparseness,relevance_rank_accuracy"
    assert {"benchmark.csv", "benchmark.md", "metrics.png", "index.html"} <= set(summary["files"])
    assert "curves.png" not in summary["files"]  # no deletion / insertion chosen, no curves to draw
    row = next(csv.DictReader((out / "benchmark.csv").open()))
    assert row["method"] == "gradcam" and "deletion_auc" not in row and "sanity_spearman" not in row
    size = images.shape[1] * images.shape[2]
    direct = {
        "pixel_flipping": metrics.pixel_flipping(demo, images, gradcam_maps, labels, perturbation=0.0,
                                                 features_in_step=math.ceil(size / STEPS)).scores,
        "sparseness": metrics.sparseness(gradcam_maps).scores,
        "relevance_rank_accuracy": metrics.relevance_rank_accuracy(gradcam_maps, masks).scores,
    }
    markdown = (out / "benchmark.md").read_text()
    for name, scores in direct.items():
        mean, low, high = _t_interval(scores)
        assert float(row[name]) == pytest.approx(mean, rel=1e-5, abs=1e-6), name
        assert float(row[f"{name}_low"]) == pytest.approx(low, rel=1e-5, abs=1e-6), name
        assert float(row[f"{name}_high"]) == pytest.approx(high, rel=1e-5, abs=1e-6), name
        assert f"{mean:.3f} ± {(high - low) / 2:.3f}" in markdown, name


def test_python_benchmark_runs_the_families_with_their_settings(demo, data, gradcam_maps):
    images, labels, masks = data
    r = benchmark(demo, images, masks, labels, ["gradcam"], steps=STEPS, seed=SEED, baselines=False,
                  metrics=["road", "max_sensitivity", "effective_complexity", "pointing_game"],
                  metric_params={"max_sensitivity": {"samples": 3}}, interval="bootstrap", level=0.9)
    assert r.columns == ["road", "max_sensitivity", "effective_complexity", "pointing_game", "seconds_per_image"]
    cells = r.get("gradcam").cells
    road = metrics.road(demo, images, gradcam_maps, labels, percentages=[12.5, 37.5, 62.5, 87.5], seed=SEED)
    sens = metrics.max_sensitivity(demo, images, "gradcam", labels, samples=3, seed=SEED)
    for name, expected in (("road", road), ("max_sensitivity", sens),
                           ("effective_complexity", metrics.effective_complexity(gradcam_maps)),
                           ("pointing_game", metrics.pointing_game(gradcam_maps, masks))):
        np.testing.assert_allclose(cells[name].scores, expected.scores, rtol=1e-5, atol=1e-6, err_msg=name)
        assert cells[name].higher_is_better == expected.higher_is_better
        assert (cells[name].mean, cells[name].low, cells[name].high) == pytest.approx(
            confidence_interval(expected.scores, 0.9, "bootstrap", seed=SEED)[:3], rel=1e-5, abs=1e-6)
    assert r.direction("road") == "lower" and r.direction("pointing_game") == "higher"


def test_metric_choice_errors_and_failures(demo, data):
    images, labels, masks = data
    with pytest.raises(ValueError, match=r"Received: metrics=\['pixel_flip'\]\. Available metrics: pointing_game"):
        benchmark(demo, images, masks, labels, ["gradcam"], metrics=["pixel_flip"])
    with pytest.raises(ValueError, match=r"not run\. Received: \['road'\]"):
        benchmark(demo, images, masks, labels, ["gradcam"], metrics=["sparseness"], metric_params={"road": {}})
    # a metric that fails for a method leaves NaN and its reason, the other columns and methods stand
    r = benchmark(demo, images[:2], masks[:2], labels[:2], ["saliency"], steps=STEPS, baselines=False,
                  metrics=["sparseness", "pixel_flipping"],
                  metric_params={"pixel_flipping": {"features_in_step": 10 ** 9}})
    cell = r.get("saliency").cells["pixel_flipping"]
    assert np.isnan(cell.scores).all() and "features_in_step" in cell.error
    assert np.isfinite(r.get("saliency").cells["sparseness"].mean)
    assert "Metrics that failed:\n- saliency, pixel_flipping: ValueError" in r.markdown()
    assert set(available_metrics()) >= {"pixel_flipping", "road", "sparseness", "mprt", "auc", "deletion"}
