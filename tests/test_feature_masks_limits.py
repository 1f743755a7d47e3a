"""Feature-mask methods at scale and at their edges: streamed coalitions (memory bounded by batch_size, results
unchanged), refusals sized before any work, dict inputs giving dict results, R^2 where it is 0/0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import kerascope as ks

BACKEND = keras.backend.backend()
MiB = 2**20


def _image_model(size: int = 8) -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((size, size, 1))
    h = keras.layers.Conv2D(2, 3, padding="same", activation="tanh")(x)
    return keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h)))


def _images(n: int, size: int = 8) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, size, size, 1)).astype("float32")


# ---- streaming: the same numbers whatever the chunking, and equal to a hand-built ablation -----------------

def test_per_pixel_feature_ablation_equals_the_hand_built_ablation_at_any_batch_size():
    m, x = _image_model(), _images(2)
    mask = np.arange(64).reshape(8, 8)
    # independent: f(x) - f(x with pixel j set to 0), every pixel as its own input row
    ablated = np.repeat(x[:, None], 64, axis=1).reshape(2, 64, 64)
    ablated[:, np.arange(64), np.arange(64)] = 0.0
    full = np.asarray(m.predict(x, verbose=0))[:, 1]
    drop = np.asarray(m.predict(ablated.reshape(128, 8, 8, 1), verbose=0))[:, 1].reshape(2, 64)
    expected = (full[:, None] - drop).reshape(2, 8, 8, 1)
    for batch_size in (5, 64, 1000):  # chunks cut inside a sample, at its end, across samples
        e = ks.FeatureAblation(m, mask=mask, batch_size=batch_size).explain(x, 1)
        np.testing.assert_allclose(e.attributions, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("cls", "params"), [
    (ks.ShapleySampling, {"samples": 3}),
    (ks.KernelSHAP, {"samples": 40}),
    (ks.LIME, {"samples": 50}),
    (ks.ShapleyExact, {}),
])
def test_streamed_coalitions_do_not_depend_on_the_chunking(cls, params):
    m, x = _image_model(), _images(3)
    # per-sample masks with different numbers of features: rows of several samples share a chunk
    mask = np.stack([np.arange(64).reshape(8, 8) % (5 + i) for i in range(3)])
    runs = [cls(m, mask=mask, batch_size=b, seed=0, **params) if cls is not ks.ShapleyExact
            else cls(m, mask=mask, batch_size=b) for b in (3, 7, 4096)]
    first, *others = [r.explain(x, None) for r in runs]
    for other in others:
        np.testing.assert_allclose(other.attributions, first.attributions, rtol=1e-6, atol=1e-7)
    if cls in (ks.ShapleySampling, ks.ShapleyExact):  # efficiency: sum of the features = f(x) - f(baseline)
        values = np.nan_to_num(first.extras["feature_attributions"]).sum(axis=1)
        np.testing.assert_allclose(values, first.scores - first.extras["base_scores"], rtol=1e-4, atol=1e-5)


_PROBE = """
import json, sys, numpy as np, keras
sys.path.insert(0, {tests!r})
from _memory_probe import peak_of
import kerascope as ks
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((64, 64, 1)), keras.layers.Flatten(), keras.layers.Dense(2, activation="tanh")])
images = np.random.default_rng(0).uniform(size=({n}, 64, 64, 1)).astype("float32")
mask = np.arange(64 * 64).reshape(64, 64)   # one feature per pixel: 4,096 features
for method in (ks.FeatureAblation(m, mask=mask, batch_size=256),
               ks.ShapleySampling(m, mask=mask, samples=1, batch_size=256)):
    method.explain(images[:1], 0)   # compile
    rise, total, e = peak_of(method.explain, images, 0)
    print(json.dumps({{"method": method.name, "rise": rise, "total": total, "maps": int(e.attributions.nbytes)}}))
"""


def test_per_pixel_coalitions_take_memory_bounded_by_batch_size():
    if BACKEND != "tensorflow":
        pytest.skip("the coalitions are numpy, shared by every backend; measured once (allocators differ)")
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak-RSS mark")
    tests = str(Path(__file__).parent)
    env = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "3", "MALLOC_MMAP_THRESHOLD_": "1048576",
           "PYTHONPATH": str(Path(tests).parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", _PROBE.format(tests=tests, n=6)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["method"] for r in rows] == ["feature_ablation", "shapley_sampling"]
    # the whole coalition matrix of the 6 images would be 6 x 4,097 x 4,096 bytes = 96 MiB (plus copies);
    # a chunk of 256 rows is 1 MiB of coalitions and 4 MiB of perturbed images
    for row in rows:
        assert row["rise"] < 40 * MiB, row
    print(rows)


# ---- refusals sized before any work --------------------------------------------------------------------------

def _wide_model(features: int) -> keras.Model:
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(1)])


@pytest.mark.parametrize("cls", [ks.KernelSHAP, ks.LIME])
@pytest.mark.parametrize("features", [100_000, 30_000])
def test_regression_methods_refuse_masks_too_large_for_memory_naming_features_and_bytes(cls, features):
    x = np.ones((1, features), "float32")
    with pytest.raises(ValueError, match=rf"k={features:,} features needs about [0-9.]+ (GB|TB)") as error:
        cls(_wide_model(features)).explain(x, 0)
    assert "ShapleySampling or FeatureAblation" in str(error.value)


@pytest.mark.parametrize("features", [100_000, 5_000])
def test_shapley_exact_refusal_formats_any_number_of_features(features):
    with pytest.raises(ValueError, match=rf"k={features:,} features .*more than max_features=16"):
        ks.ShapleyExact(_wide_model(features)).explain(np.ones((1, features), "float32"), 0)


# ---- dict in, dict out ---------------------------------------------------------------------------------------

def _three_inputs() -> keras.Model:
    keras.utils.set_random_seed(0)
    a, b, c = keras.Input((2,), name="a"), keras.Input((2,), name="b"), keras.Input((3,), name="c")
    h = keras.layers.Concatenate()([a, b, c])
    return keras.Model([a, b, c], keras.layers.Dense(2, activation="tanh")(keras.layers.Dense(5)(h)))


METHODS = [
    (ks.FeatureAblation, {}), (ks.ShapleyExact, {"batch_size": 128}), (ks.ShapleySampling, {"samples": 4}),
    (ks.KernelSHAP, {"samples": 30}), (ks.LIME, {"samples": 40}),
]


@pytest.mark.parametrize(("cls", "params"), METHODS, ids=[c.__name__ for c, _ in METHODS])
def test_dict_inputs_give_results_keyed_like_the_inputs(cls, params):
    m = _three_inputs()
    rng = np.random.default_rng(0)
    arrays = {"a": rng.normal(size=(2, 2)), "b": rng.normal(size=(2, 2)), "c": rng.normal(size=(2, 3))}
    as_list = cls(m, **params).explain([arrays["a"], arrays["b"], arrays["c"]], 0).attributions
    # every input, keys in any order
    given = {"c": arrays["c"], "a": arrays["a"], "b": arrays["b"]}
    result = cls(m, **params).explain(given, 0).attributions
    assert isinstance(result, dict) and sorted(result) == ["a", "b", "c"]
    for name, expected in zip("abc", as_list, strict=True):
        np.testing.assert_allclose(result[name], expected, rtol=1e-5, atol=1e-6)
    # a subset of the inputs: a dict of the chosen inputs
    subset = cls(m, input_index=["c", "a"], **params).explain(given, 0).attributions
    assert isinstance(subset, dict) and list(subset) == ["c", "a"]
    assert subset["c"].shape == (2, 3) and subset["a"].shape == (2, 2)
    listed = cls(m, input_index=[2, 0], **params).explain([arrays["a"], arrays["b"], arrays["c"]], 0).attributions
    assert isinstance(listed, list)
    np.testing.assert_allclose(subset["c"], listed[0], rtol=1e-5, atol=1e-6)


def test_gradient_methods_with_a_subset_of_dict_inputs_give_a_dict_too():
    m = _three_inputs()
    rng = np.random.default_rng(0)
    given = {"a": rng.normal(size=(2, 2)), "b": rng.normal(size=(2, 2)), "c": rng.normal(size=(2, 3))}
    result = ks.Saliency(m, input_index=["b", "c"]).explain(given, 0).attributions
    assert isinstance(result, dict) and list(result) == ["b", "c"]
    everything = ks.Saliency(m, input_index=[0, 1, 2]).explain(given, 0).attributions
    np.testing.assert_allclose(result["b"], everything["b"], rtol=1e-6)


# ---- R^2 where it is 0/0 -------------------------------------------------------------------------------------

def test_lime_with_one_coalition_reports_no_r2():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    e = ks.LIME(m, samples=1).explain(np.ones((2, 3)), 0)
    assert np.isnan(e.extras["r2"]).all(), e.extras["r2"]


@pytest.mark.parametrize("cls", [ks.LIME, ks.KernelSHAP])
def test_r2_is_nan_when_the_scores_do_not_vary_and_a_number_when_they_do(cls):
    # a model that ignores its inputs: every coalition scores the same, R^2 is 0/0
    constant = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="zeros",
                                                                      bias_initializer="ones")])
    e = cls(constant, samples=20).explain(np.ones((1, 4)), 0)
    assert np.isnan(e.extras["r2"]).all()
    varying = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones")])
    e = cls(varying, samples=20, **({"alpha": 0.0} if cls is ks.LIME else {})).explain(np.ones((1, 4)), 0)
    assert 0.9 < float(e.extras["r2"][0]) <= 1.0 + 1e-6
