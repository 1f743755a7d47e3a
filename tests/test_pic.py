"""Performance Information Curves (SIC / AIC) against PAIR ``saliency.metrics.pic`` on identical inputs."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from kerascope import metrics  # noqa: E402

LAPLACE = np.array([[0, -1, 0], [-1, 4, -1], [0, -1, 0]], np.float32)


def edge_model() -> keras.Model:
    """Class 0's logit grows with the image's high frequencies: blurring lowers its probability."""
    m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(1, 3, activation="relu", use_bias=False),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")])
    m.set_weights([np.repeat(LAPLACE[:, :, None, None], 3, 2), np.array([[20.0, 0.0, 0.0]], np.float32),
                   np.array([-2.0, 0.0, 0.0], np.float32)])
    return m


def prep(batch: np.ndarray) -> np.ndarray:
    return np.asarray(batch, np.float32) / 255.0


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(1)
    x = np.clip(rng.normal(128, 60, (3, 16, 16, 3)), 0, 255).astype(np.uint8)
    return edge_model(), x, rng.normal(size=(3, 16, 16))


def test_curves_end_at_one_and_grow(case):
    model, x, sal = case
    r = metrics.pic(model, x, sal, 0, preprocess=prep, min_pred_value=0.0, num_data_points=50, batch_size=4)
    assert (r.details["skipped"] == "").all() and r.curves.shape == (3, 51)
    np.testing.assert_allclose(r.curves[:, -1], 1.0)
    assert np.all(np.diff(r.curves, axis=1) >= -1e-12) and np.all((r.scores > 0) & (r.scores < 1))
    np.testing.assert_allclose(r.details["predictions"][:, -1], model.predict(prep(x), verbose=0)[:, 0], rtol=1e-5)
    same = metrics.pic(model, x, sal, 0, preprocess=prep, min_pred_value=0.0, num_data_points=50, batch_size=64)
    np.testing.assert_allclose(same.curves, r.curves, atol=1e-5)  # batch size: float32 forward only
    with pytest.raises(ValueError, match="uint8"):
        metrics.pic(model, prep(x), sal, 0)
    with pytest.raises(ValueError, match="kind='auc'"):
        metrics.pic(model, x, sal, 0, kind="auc")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the PAIR cross-check runs once, on TensorFlow")
@pytest.mark.parametrize("kind, min_pred", [("sic", 0.0), ("aic", 0.0), ("sic", 0.999992)])
def test_pic_equals_pair(case, monkeypatch, kind, min_pred):
    ref = pytest.importorskip("saliency.metrics.pic")
    monkeypatch.setattr(np, "trapz", np.trapezoid, raising=False)  # PAIR 0.2.1 calls np.trapz, gone in NumPy 2
    model, x, sal = case
    thresholds = [0.02, 0.05, 0.13, 0.34, 0.75]  # fewer than the default: PAIR interpolates channel by channel
    ours = metrics.pic(model, x, sal, 0, kind=kind, preprocess=prep, min_pred_value=min_pred, num_data_points=100,
                       saliency_thresholds=thresholds, seed=3, batch_size=5)

    def pred_func(batch):
        p = keras.ops.convert_to_numpy(model(prep(batch), training=False))
        return p[:, 0] if kind == "sic" else (p.argmax(-1) == 0).astype(np.float64)

    skipped = 0
    for i in range(len(x)):
        try:
            expected = ref.compute_pic_metric(x[i], sal[i], ours.details["random_mask"][i], pred_func,
                                              thresholds,
                                              min_pred_value=min_pred, num_data_points=100)
        except ref.ComputePicMetricError:
            skipped += 1
            assert ours.details["skipped"][i] != "" and np.isnan(ours.scores[i])
            continue
        np.testing.assert_allclose(ours.curves[i], expected.curve_y, atol=1e-6)
        np.testing.assert_allclose(ours.scores[i], expected.auc, atol=1e-6)
    assert skipped == int(np.isnan(ours.scores).sum()) and (skipped == 0 if min_pred == 0.0 else 0 < skipped < 3)
