"""Spatial / CAM methods at a channels_first layer equal the channels_last twin model (1-D and 2-D)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks

CAMS = ["gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "eigencam", "scorecam", "ablationcam"]


def _twins(rank: int) -> tuple[keras.Model, keras.Model, np.ndarray, np.ndarray]:
    """A channels_first model and its channels_last twin with the same weights, and inputs for each."""
    conv = keras.layers.Conv2D if rank == 2 else keras.layers.Conv1D
    pool = keras.layers.GlobalAveragePooling2D if rank == 2 else keras.layers.GlobalAveragePooling1D
    size = (8, 8) if rank == 2 else (12,)

    def build(fmt: str) -> keras.Model:
        shape = (2, *size) if fmt == "channels_first" else (*size, 2)
        return keras.Sequential([
            keras.Input(shape),
            conv(4, 3, padding="same", activation="relu", data_format=fmt, name="c1"),
            conv(5, 3, padding="same", data_format=fmt, name="feat"),
            pool(data_format=fmt),
            keras.layers.Dense(3),
        ])

    keras.utils.set_random_seed(0)
    first, last = build("channels_first"), build("channels_last")
    last.set_weights(first.get_weights())  # convolution kernels do not depend on the data format
    x_last = np.random.default_rng(0).normal(size=(3, *size, 2)).astype("float32")
    return first, last, np.moveaxis(x_last, -1, 1), x_last


def _runs(model: keras.Model, x: np.ndarray) -> bool:
    try:
        model(x[:1])
    except Exception:  # noqa: BLE001 - e.g. TensorFlow on CPU has no channels_first Conv2D kernel
        return False
    return True


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("method", CAMS)
def test_cam_at_a_channels_first_layer_equals_the_channels_last_twin(method, rank):
    first, last, x_first, x_last = _twins(rank)
    if not _runs(first, x_first):
        pytest.skip(f"{keras.backend.backend()} cannot run a channels_first Conv{rank}D on this device")
    expected = ks.explain(last, x_last, method=method, layer="feat", targets=1).attributions
    got = ks.explain(first, x_first, method=method, layer="feat", targets=1).attributions
    assert got.shape == expected.shape == (3, *x_last.shape[1:-1])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * max(float(np.abs(expected).max()), 1e-6))
