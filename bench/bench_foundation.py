"""Speed of the foundation methods against a hand-written compiled GradientTape baseline.

Runs in ONE process: kerascope's Saliency / GradientXInput / GuidedBackprop /
GradCAM and a hand-written ``tf.function`` forward+backward on the same model
and inputs, alternating the order, and prints median seconds and the ratio.

Usage:
    python bench/bench_foundation.py [--model mobilenetv2|resnet50|demo] [--batch 8] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerascope as ks  # noqa: E402


def build(name: str) -> tuple[keras.Model, str]:
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None, classifier_activation=None), "Conv_1"
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, classifier_activation=None), "conv5_block3_out"
    if name == "demo":
        from kerascope.data import demo_model_path

        return ks.load_model(demo_model_path()), "conv3b"
    raise SystemExit(f"unknown model {name!r}")


def timeit(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    model, layer_name = build(args.model)
    shape = tuple(model.inputs[0].shape[1:])
    x = np.random.default_rng(0).uniform(0, 1, (args.batch, *shape)).astype(np.float32)
    targets = np.arange(args.batch, dtype=np.int32) % int(model.outputs[0].shape[-1])
    layer = model.get_layer(layer_name)
    features = keras.Model(model.inputs, [layer.output, model.outputs[0]])
    spec = tf.TensorSpec((None, *shape), tf.float32)

    @tf.function(input_signature=[spec, tf.TensorSpec((None,), tf.int32)])
    def baseline_grad(inputs, t):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = model(inputs, training=False)
            score = tf.reduce_sum(tf.gather(out, t, axis=1, batch_dims=1))
        return tape.gradient(score, inputs)

    @tf.function(input_signature=[spec, tf.TensorSpec((None,), tf.int32)])
    def baseline_cam(inputs, t):
        with tf.GradientTape() as tape:
            acts, out = features(inputs, training=False)
            score = tf.reduce_sum(tf.gather(out, t, axis=1, batch_dims=1))
        grads = tape.gradient(score, acts)
        cam = tf.nn.relu(tf.einsum("nhwc,nc->nhw", acts, tf.reduce_mean(grads, axis=(1, 2))))
        return tf.image.resize(cam[..., None], shape[:2])[..., 0]

    xt, tt = tf.constant(x), tf.constant(targets)
    cases = {
        "baseline tape grad": lambda: baseline_grad(xt, tt).numpy(),
        "Saliency": lambda: ks.Saliency(model, batch_size=args.batch).explain(x, targets),
        "GradientXInput": lambda: ks.GradientXInput(model, batch_size=args.batch).explain(x, targets),
        "GuidedBackprop": lambda: ks.GuidedBackprop(model, batch_size=args.batch).explain(x, targets),
        "baseline tape Grad-CAM": lambda: baseline_cam(xt, tt).numpy(),
        "GradCAM": lambda: ks.GradCAM(model, layer=layer_name, batch_size=args.batch).explain(x, targets),
    }
    for fn in cases.values():  # warm-up: compile everything once
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(args.repeats):
        order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
        for name in order:
            times[name] += timeit(cases[name], 1)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"model={args.model} batch={args.batch} repeats={args.repeats} tf={tf.__version__} keras={keras.__version__}")
    print(f"{'case':<24} {'median s':>9} {'ratio':>7}")
    for name, median in medians.items():
        base = medians["baseline tape Grad-CAM"] if "CAM" in name else medians["baseline tape grad"]
        print(f"{name:<24} {median:9.4f} {median / base:7.3f}")


if __name__ == "__main__":
    main()
