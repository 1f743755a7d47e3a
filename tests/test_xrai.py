"""XRAI: closed forms on partitions, the default base attribution, input checks (every backend).

PAIR's own checks: with disjoint segments covering the image every pixel gets its segment's mean
attribution and the ranks order the segments by it; the default base attribution is IG from a black
and a white baseline, averaged, max over channels (exact on a linear model: ``w (x - (lo + hi) / 2)``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from tests.conftest import assert_unchanged, snapshot  # noqa: E402

H = W = 8


def linear(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((H, W, 2)), keras.layers.Flatten(), keras.layers.Dense(2, name="out")])


def quadrants():
    rows, cols = np.mgrid[:H, :W]
    return np.stack([(rows < 4) & (cols < 4), (rows < 4) & (cols >= 4), (rows >= 4) & (cols < 4),
                     (rows >= 4) & (cols >= 4)])


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).uniform(0, 1, (3, H, W, 2)).astype(np.float32)


def test_partition_closed_form(images):
    base = np.random.default_rng(1).normal(size=(3, H, W))
    q = quadrants()
    e = ks.XRAI(linear(), segments=[q] * 3, base_attribution=base, min_pixel_diff=1, batch_size=2).explain(images, 0)
    for i in range(3):
        means = np.array([base[i][m].mean() for m in q])
        expected = sum(means[k] * q[k] for k in range(4))
        np.testing.assert_allclose(e.attributions[i], expected, rtol=1e-6, atol=1e-7)
        rank_of = np.argsort(np.argsort(-means)) + 1
        np.testing.assert_array_equal(e.extras["ranks"][i], sum(rank_of[k] * q[k] for k in range(4)))


def test_default_base_attribution_is_black_white_ig(images):
    m = linear()
    w = m.get_layer("out").get_weights()[0][:, 1].reshape(H, W, 2)
    lo = images.reshape(3, -1).min(axis=1)[:, None, None, None]
    hi = images.reshape(3, -1).max(axis=1)[:, None, None, None]
    base = (w * (images - (lo + hi) / 2)).max(axis=-1)
    segs = [quadrants()] * 3
    ours = ks.XRAI(m, segments=segs, steps=4, min_pixel_diff=1).explain(images, 1)
    ref = ks.XRAI(m, segments=segs, base_attribution=base, min_pixel_diff=1).explain(images, 1)
    np.testing.assert_allclose(ours.attributions, ref.attributions, rtol=1e-5, atol=1e-6)


def test_area_threshold_leaves_the_rest_at_its_mean(images):
    base = np.arange(H * W, dtype=np.float64).reshape(1, H, W)
    q = quadrants()
    e = ks.XRAI(linear(), segments=[q], base_attribution=base, area_threshold=0.2, min_pixel_diff=1)
    got = e.explain(images[:1], 0)
    # one region (the densest quadrant: bottom right) covers 25% > 20%; the other 75% share their mean
    np.testing.assert_allclose(got.attributions[0][q[3]], base[0][q[3]].mean())
    np.testing.assert_allclose(got.attributions[0][~q[3]], base[0][~q[3]].mean())
    assert set(np.unique(got.extras["ranks"])) == {1, 2}


def test_segment_and_base_errors(images):
    m = linear()
    before = snapshot(m)
    q = quadrants()
    with pytest.raises(ValueError, match=r"segments\[1\] with shape \(4, 8, 7\)"):
        ks.XRAI(m, segments=[q, q[:, :, :7], q]).explain(images, 0)
    with pytest.raises(ValueError, match="one list / stack of masks per image \\(3 images\\).*2 entries"):
        ks.XRAI(m, segments=[q, q]).explain(images, 0)
    with pytest.raises(ValueError, match="boolean"):
        ks.XRAI(m, segments=[q * 2.0] * 3).explain(images, 0)
    with pytest.raises(ValueError, match="base_attribution"):
        ks.XRAI(m, segments=[q] * 3, base_attribution=np.zeros((3, 4, 4))).explain(images, 0)
    with pytest.raises(ValueError, match="one image input"):
        ks.XRAI(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])).explain(np.ones((1, 3)), 0)
    with pytest.raises(ValueError, match="min_pixel_diff"):
        ks.XRAI(m, min_pixel_diff=0)
    ks.explain(m, images, method="xrai", segments=[q] * 3, steps=2, min_pixel_diff=1)
    assert_unchanged(m, before)
