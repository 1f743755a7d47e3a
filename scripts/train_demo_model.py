"""Train the bundled demo model reproducibly on generated shapes (no downloads).

Usage:
    python scripts/train_demo_model.py            # writes kerascope/data/shapes_cnn.keras + images
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from kerascope.data import CLASS_NAMES, generate_shapes  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "kerascope" / "data"
SIZE = 64


def build_model() -> keras.Model:
    """The demo CNN: conv blocks, global average pooling, softmax head."""
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = inputs
    for i, filters in enumerate((16, 32, 64)):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i + 1}a")(x)
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i + 1}b")(x)
        if i < 2:
            x = keras.layers.MaxPooling2D(2, name=f"pool{i + 1}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(len(CLASS_NAMES), activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name="shapes_cnn")


def main() -> None:
    keras.utils.set_random_seed(0)
    x, y, _ = generate_shapes(6000, SIZE, seed=0)
    xv, yv, _ = generate_shapes(600, SIZE, seed=1)
    model = build_model()
    model.compile(keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=64, epochs=12, validation_data=(xv, yv), verbose=2)
    loss, acc = model.evaluate(xv, yv, verbose=0)
    print(f"validation accuracy: {acc:.3f}")
    model.save(OUT / "shapes_cnn.keras")

    images, labels, masks = generate_shapes(8, SIZE, seed=123, classes=(0, 1, 2, 3))
    (OUT / "images").mkdir(exist_ok=True)
    meta = {"class_names": list(CLASS_NAMES), "validation_accuracy": round(float(acc), 4), "images": {}}
    mask_arrays = {}
    for i, (image, label, mask) in enumerate(zip(images, labels, masks)):
        name = f"{i:02d}_{CLASS_NAMES[label]}.png"
        Image.fromarray(np.round(image * 255).astype(np.uint8)).save(OUT / "images" / name)
        rows, cols = np.nonzero(mask)
        meta["images"][name] = {
            "label": int(label),
            "box": [int(rows.min()), int(cols.min()), int(rows.max()) + 1, int(cols.max()) + 1],
        }
        mask_arrays[name] = mask
    np.savez_compressed(OUT / "demo_masks.npz", **mask_arrays)
    (OUT / "demo.json").write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
