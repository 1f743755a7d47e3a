"""What a layer has learned: feature visualisation vs tf-keras-vis and Xplique, TCAV vs Captum (same CPU, one process).

Xplique 2.x pins ``tensorflow<=2.20``; installed with ``--no-deps`` (as scripts/test.sh does) it imports and
runs on this project's TensorFlow 2.21 / Keras 3, so its scenario runs in the project's own environment.
"""

from __future__ import annotations

import collections
import statistics
import tempfile

import numpy as np

from bench.scenario import Options, scenario
from bench.timing import rotating_times


def _summary(times: dict[str, list[float]], ours: str, peer: str, settings: dict) -> list[dict]:
    ratios = [p / o for o, p in zip(times[ours], times[peer])]
    rows = [{"impl": label, "median_s": statistics.median(v), "min_s": min(v), **settings} for label, v in times.items()]
    rows.append({"impl": f"{peer} / {ours}", "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                 "max_ratio": max(ratios), **settings})
    return rows


@scenario("feature-vis-vs-tf-keras-vis",
          "visualize_features (pixel, default transforms, tv + l1) vs tf-keras-vis ActivationMaximization "
          "(its defaults: jitter, rotation, total variation + norm), equal steps / size / channels, TensorFlow",
          tags=("peers",))
def feature_vis_vs_tf_keras_vis(options: Options) -> list[dict]:
    import keras
    import tensorflow as tf
    from tf_keras_vis.activation_maximization import ActivationMaximization
    from tf_keras_vis.utils.model_modifiers import ExtractIntermediateLayer

    import kerascope as ks

    size, count, steps = (32, 4, 16) if options.quick else (64, 8, 64)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((size, size, 3)), keras.layers.Conv2D(16, 3, activation="relu", name="c1"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu", name="c2"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    channels = list(range(count))
    weights = np.zeros((count, 1, 1, 32), np.float32)
    weights[np.arange(count), 0, 0, channels] = 1.0
    maximiser = ActivationMaximization(model, model_modifier=ExtractIntermediateLayer("c2"), clone=True)
    seed = tf.random.uniform((count, size, size, 3), 0.0, 1.0, seed=0)

    def peer() -> None:
        maximiser(lambda out: tf.reduce_mean(out * weights, axis=(1, 2, 3)), seed_input=seed, steps=steps,
                  input_range=(0.0, 1.0))

    def ours() -> None:
        ks.visualize_features(model, layer="c2", channels=channels, parametrization="pixel",
                              regularizers={"tv": 0.05, "l1": 0.01}, steps=steps, progress=False)

    ours(), peer()  # compile both once
    times = rotating_times({"kerascope": ours, "tf-keras-vis": peer}, rounds=options.repeats)
    return _summary(times, "kerascope", "tf-keras-vis", {"size": size, "channels": count, "steps": steps})


def _conv_model(size: int):
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((size, size, 3)), keras.layers.Conv2D(16, 3, activation="relu", name="c1"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu", name="c2"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def _vs_xplique(options: Options, transforms: bool) -> list[dict]:
    from xplique.features_visualizations import Objective, optimize

    import kerascope as ks

    size, count, steps = (32, 4, 16) if options.quick else (64, 8, 64)
    model = _conv_model(size)
    channels = list(range(count))
    objective = Objective.channel(model, "c2", channels)

    def peer() -> None:  # Adam(0.05), Fourier basis with colour decorrelation, sigmoid: as ours
        optimize(objective, nb_steps=steps, use_fft=True, custom_shape=None,
                 transformations="standard" if transforms else None)

    def ours() -> None:
        ks.visualize_features(model, layer="c2", channels=channels, parametrization="fourier",
                              transforms="default" if transforms else None, steps=steps, pre_relu=False,
                              progress=False)

    ours(), peer()  # compile both once (Xplique traces its step again at every call: that is part of its cost)
    times = rotating_times({"kerascope": ours, "xplique": peer}, rounds=options.repeats)
    return _summary(times, "kerascope", "xplique", {"size": size, "channels": count, "steps": steps,
                                                    "transforms": "default" if transforms else "none"})


@scenario("feature-vis-vs-xplique",
          "visualize_features (Fourier, default transforms) vs Xplique's optimize (Fourier, its 'standard' "
          "transformations), equal steps / size / channels, TensorFlow", tags=("peers",), backend="tensorflow")
def feature_vis_vs_xplique(options: Options) -> list[dict]:
    return _vs_xplique(options, transforms=True)


@scenario("feature-vis-vs-xplique-plain",
          "visualize_features vs Xplique's optimize, Fourier, no transforms on either side (equal work per step)",
          tags=("peers",), backend="tensorflow")
def feature_vis_vs_xplique_plain(options: Options) -> list[dict]:
    return _vs_xplique(options, transforms=False)


@scenario("tcav-vs-captum",
          "TCAV (TensorFlow) vs Captum's TCAV (PyTorch twin, its default SGD classifier), 2 concepts, "
          "equal random sets and inputs", tags=("peers",))
def tcav_vs_captum(options: Options) -> list[dict]:
    import keras
    import torch
    from captum.concept import TCAV as CaptumTCAV
    from captum.concept import Concept

    import kerascope as ks

    d_in, hidden, n_examples, n_random, n_inputs = (16, 32, 10, 3, 16) if options.quick else (64, 256, 50, 10, 128)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((d_in,)), keras.layers.Dense(hidden, activation="relu", name="hidden"),
                              keras.layers.Dense(10, name="out")])
    net = torch.nn.Sequential(collections.OrderedDict([
        ("hidden", torch.nn.Linear(d_in, hidden)), ("relu", torch.nn.ReLU()), ("out", torch.nn.Linear(hidden, 10))]))
    for name in ("hidden", "out"):
        kernel, bias = model.get_layer(name).get_weights()
        with torch.no_grad():
            getattr(net, name).weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            getattr(net, name).bias.copy_(torch.from_numpy(bias))
    rng = np.random.default_rng(0)
    concepts = {f"c{i}": (rng.normal(size=(n_examples, d_in)) + rng.normal(size=d_in)).astype(np.float32)
                for i in range(2)}
    random = rng.normal(size=(2 * n_examples, d_in)).astype(np.float32)
    inputs = rng.normal(size=(n_inputs, d_in)).astype(np.float32)

    def ours() -> None:
        ks.TCAV(model, layer="hidden", concepts=concepts, random=random, n_random=n_random).explain(inputs, 0)

    def peer() -> None:
        def concept(cid: int, name: str, data: np.ndarray) -> Concept:
            return Concept(cid, name, [torch.from_numpy(data)])

        named = [concept(i, name, data) for i, (name, data) in enumerate(concepts.items())]
        order = [rng.permutation(len(random)) for _ in range(n_random)]
        randoms = [concept(100 + i, f"r{i}", random[o[:n_examples]]) for i, o in enumerate(order)]
        others = [concept(200 + i, f"o{i}", random[o[n_examples:]]) for i, o in enumerate(order)]
        sets = [[c, r] for c in named for r in randoms] + [[o, r] for o, r in zip(others, randoms)]
        with tempfile.TemporaryDirectory() as folder:  # a fresh folder: Captum caches CAVs on disk
            CaptumTCAV(net, ["relu"], save_path=folder + "/").interpret(torch.from_numpy(inputs), sets, target=0)

    ours(), peer()
    times = rotating_times({"kerascope": ours, "captum": peer}, rounds=options.repeats)
    return _summary(times, "kerascope", "captum", {"features": hidden, "examples": n_examples, "n_random": n_random,
                                                     "inputs": n_inputs})
