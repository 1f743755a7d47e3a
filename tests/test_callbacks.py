"""ExplanationCallback: writes the expected TensorBoard summaries / PNGs and leaves training unchanged."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.callbacks import ExplanationCallback  # noqa: E402
from kerascope.viz.overlay import overlay  # noqa: E402


def _model() -> keras.Model:
    model = keras.Sequential([
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
        keras.layers.Dropout(0.3),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax", name="head"),
    ])
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    return model


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.random((24, 12, 12, 3)).astype("float32"), rng.integers(0, 3, 24)


def _fit(callbacks: list, epochs: int = 2) -> tuple[keras.Model, dict]:
    keras.utils.set_random_seed(7)
    model = _model()
    x, y = _data()
    history = model.fit(x, y, epochs=epochs, batch_size=8, shuffle=False, verbose=0, callbacks=callbacks)
    return model, history.history


def _events(folder: Path) -> list[tuple[int, str, list[bytes]]]:
    import tensorflow as tf

    found = []
    for file in sorted(folder.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(file)):
            for value in event.summary.value:
                found.append((event.step, value.tag, value.metadata.plugin_data.plugin_name,
                              list(tf.make_ndarray(value.tensor))))
    return found


def test_training_unchanged_and_summaries_written(tmp_path):
    images = _data()[0][:3]
    callback = ExplanationCallback(images, method=["gradcam", "saliency"], layer=None, every=1,
                                   log_dir=tmp_path / "logs", png_dir=tmp_path / "png")
    with_cb, history_cb = _fit([callback])
    without, history = _fit([])
    for a, b in zip(with_cb.get_weights(), without.get_weights()):
        np.testing.assert_array_equal(a, b)  # same seed, shuffle=False: bit-identical training
    assert history_cb["loss"] == history["loss"]

    events = _events(tmp_path / "logs")
    assert [(step, tag) for step, tag, _, _ in events] == [
        (0, "kerascope/gradcam"), (0, "kerascope/saliency"), (1, "kerascope/gradcam"), (1, "kerascope/saliency"),
    ]
    assert callback.summaries == 4 and len(callback.seconds) == 2
    for _, _, plugin, tensor in events:
        assert plugin == "images"
        assert tensor[:2] == [b"12", b"12"] and len(tensor) == 2 + 3  # width, height, one PNG per image
    # the last logged overlay equals one recomputed by hand on the final weights
    explanation = ks.Saliency(with_cb).explain(images)
    expected = overlay(images[2], explanation.attributions[2])
    import tensorflow as tf

    decoded = tf.io.decode_png(events[-1][3][2 + 2]).numpy()
    np.testing.assert_array_equal(decoded, expected)
    png = np.asarray(Image.open(tmp_path / "png" / "saliency" / "epoch0002_002.png"))
    np.testing.assert_array_equal(png, expected)
    assert len(callback.written) == 2 * 2 * 3
    assert sorted(p.name for p in (tmp_path / "png" / "gradcam").iterdir()) == [
        f"epoch{e:04d}_{i:03d}.png" for e in (1, 2) for i in range(3)
    ]


def test_every_n_epochs_png_only(tmp_path):
    callback = ExplanationCallback(_data()[0][:2], method="gradcam", targets=[0, 2], every=2,
                                   png_dir=tmp_path / "png")
    _fit([callback], epochs=5)
    names = sorted(p.name for p in (tmp_path / "png" / "gradcam").iterdir())
    assert names == [f"epoch{e:04d}_{i:03d}.png" for e in (2, 4) for i in range(2)]
    assert not list(tmp_path.rglob("events.out.tfevents.*")) and callback.summaries == 0


def test_argument_errors():
    with pytest.raises(ValueError, match="needs somewhere to write"):
        ExplanationCallback(np.zeros((1, 4, 4, 3)))
    with pytest.raises(ValueError, match="Received: every=0"):
        ExplanationCallback(np.zeros((1, 4, 4, 3)), every=0, png_dir="x")
    with pytest.raises(ValueError, match="Unknown method"):
        ExplanationCallback(np.zeros((1, 4, 4, 3)), method="nope", png_dir="x")
    with pytest.raises(ValueError, match="No chosen method accepts the parameter"):
        ExplanationCallback(np.zeros((1, 4, 4, 3)), method="saliency", png_dir="x", layr="conv")
