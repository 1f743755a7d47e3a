"""Attribution methods found elsewhere, timed against their reference library at equal settings.

PAIR ``saliency`` 0.2.1 (Blur IG, Guided IG, XRAI) gets its gradients from a compiled
``tf.function`` around a ``GradientTape`` of the same Keras model (the strongest call a PAIR user
writes); Captum 0.9 (layer / neuron conductance) runs on the torch twin of the same network. Each
scenario alternates the implementations in one process (``rotating_times``), after one warm-up call
each, and reports the median seconds and the per-round ratio's median and spread. Where a compiled
floor applies (the gradient passes alone, precomputed inputs, one ``tf.function``) it is a row too.

    python -m bench 'pair-*' 'captum-*' --quick
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from bench.scenario import Options, scenario
from bench.timing import rotating_times


def _cnn(size: int, seed: int = 0) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(16, 3, activation="relu", padding="same", name="c1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same", name="c2"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, name="out"),
    ])


def _rows(times: dict[str, list[float]], reference: str, settings: str) -> list[dict]:
    rows = []
    for impl, values in times.items():
        ratios = [r / v for r, v in zip(times[reference], values, strict=True)]
        rows.append({
            "impl": impl, "settings": settings, "median_s": statistics.median(values),
            f"{reference}_over_this": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        })
    return rows


def _tape_gradients(model: Any) -> Any:
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def grads(x: Any, target: Any) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(x)
            score = tf.gather(model(x, training=False), target, axis=1)
        return tape.gradient(score, x)

    return grads


def _pair_call(model: Any) -> Any:
    import saliency.core as pair
    import tensorflow as tf

    grads = _tape_gradients(model)

    def call(batch: Any, call_model_args: Any = None, expected_keys: Any = None) -> dict:
        x = tf.constant(np.asarray(batch, np.float32))
        return {pair.INPUT_OUTPUT_GRADIENTS: grads(x, tf.constant(call_model_args["class"])).numpy()}

    return call


def _numpy_two() -> None:
    """PAIR 0.2.1's Guided IG calls ``np.quantile(interpolation=)``, numpy 2's ``method=``."""
    import saliency.core.guided_ig as guided_ig

    class NumpyTwo:
        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

        @staticmethod
        def quantile(a: Any, q: Any, interpolation: str = "linear", **kwargs: Any) -> Any:
            return np.quantile(a, q, method=interpolation, **kwargs)

    guided_ig.np = NumpyTwo()


@scenario("pair-blur-ig", "BlurIG vs PAIR saliency's BlurIG (and the gradient-pass floor), small CNN",
          tags=("peers", "floor"))
def blur_ig(options: Options) -> list[dict]:
    import saliency.core as pair
    import tensorflow as tf

    import kerascope as ks

    size, n, steps, sigma = (32, 2, 10, 8.0) if options.quick else (64, 4, 50, 20.0)
    model = _cnn(size)
    x = np.random.default_rng(0).uniform(0, 1, (n, size, size, 3)).astype(np.float32)
    ours = ks.BlurIG(model, max_sigma=sigma, steps=steps, batch_size=steps, scores=False)
    call = _pair_call(model)
    grads = _tape_gradients(model)
    from kerascope.numeric.blur import gaussian_blur_rows

    levels = ours.sigmas()[:-1]
    points = tf.constant(np.concatenate([gaussian_blur_rows(np.repeat(x[i:i + 1], steps, 0), levels)
                                         for i in range(n)]).astype(np.float32))
    chunks = [points[i * steps:(i + 1) * steps] for i in range(n)]
    runners = {
        "kerascope": lambda: ours.explain(x, 0),
        "pair": lambda: [pair.BlurIG().GetMask(x[i], call, {"class": 0}, max_sigma=sigma, steps=steps,
                                               batch_size=steps) for i in range(n)],
        "floor": lambda: [grads(c, tf.constant(0)).numpy() for c in chunks],
    }
    for run in runners.values():
        run()
    times = rotating_times(runners, options.repeats)
    return _rows(times, "pair", f"{n}x{size}x{size}x3, steps={steps}, max_sigma={sigma}")


@scenario("pair-guided-ig", "GuidedIG vs PAIR saliency's GuidedIG (per-sample Python loop), small CNN",
          tags=("peers",))
def guided_ig(options: Options) -> list[dict]:
    import saliency.core as pair

    import kerascope as ks

    _numpy_two()
    size, n, steps = (32, 2, 10) if options.quick else (32, 8, 50)
    model = _cnn(size)
    x = np.random.default_rng(0).uniform(0, 1, (n, size, size, 3)).astype(np.float32)
    ours = ks.GuidedIG(model, steps=steps, batch_size=n, scores=False)
    call = _pair_call(model)
    runners = {
        "kerascope": lambda: ours.explain(x, 0),
        "pair": lambda: [pair.GuidedIG().GetMask(x[i], call, {"class": 0}, x_steps=steps) for i in range(n)],
    }
    for run in runners.values():
        run()
    times = rotating_times(runners, options.repeats)
    return _rows(times, "pair", f"{n}x{size}x{size}x3, steps={steps}, fraction=0.25, max_dist=0.02")


@scenario("pair-xrai", "XRAI vs PAIR saliency's XRAI: default (Felzenszwalb) segments, and given segments",
          tags=("peers",))
def xrai(options: Options) -> list[dict]:
    import saliency.core as pair
    from saliency.core import xrai as pair_xrai

    import kerascope as ks

    size, n = (48, 1) if options.quick else (96, 2)
    model = _cnn(size)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (n, size, size, 3)).astype(np.float32)
    x[:, size // 4: size // 2, size // 4: size // 2, 0] += 1.0
    base = rng.normal(size=x.shape)
    call = _pair_call(model)
    # both segment with scikit-image's Felzenszwalb (6 runs per image): the same cost on both sides
    segments = [pair_xrai._get_segments_felzenszwalb(x[i]) for i in range(n)]
    rows = []
    for label, given in (("default segments", None), ("given segments", segments)):
        ours = ks.XRAI(model, base_attribution=base, segments=given, scores=False)
        runners = {
            "kerascope": lambda ours=ours: ours.explain(x, 0),
            "pair": lambda given=given: [
                pair.XRAI().GetMask(x[i], call, {"class": 0}, base_attribution=base[i],
                                    segments=None if given is None else given[i]) for i in range(n)],
        }
        for run in runners.values():
            run()
        times = rotating_times(runners, options.repeats)
        rows += _rows(times, "pair", f"{n}x{size}x{size}x3, {label} ({len(segments[0])} masks), given base")
    return rows


@scenario("captum-conductance", "LayerConductance / NeuronConductance vs Captum on a torch twin (and a floor)",
          tags=("peers", "floor"))
def conductance(options: Options) -> list[dict]:
    import keras
    import tensorflow as tf
    import torch
    from captum.attr import LayerConductance as CaptumLayerConductance
    from captum.attr import NeuronConductance as CaptumNeuronConductance

    import kerascope as ks
    from kerascope.methods.integrated import quadrature

    size, n, steps = (16, 2, 8) if options.quick else (32, 8, 32)
    model = _cnn(size)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    for name, layer in zip(["c1", "c2", "out"], [net[0], net[3], net[7]], strict=True):
        kernel, b = model.get_layer(name).get_weights()
        kernel = kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
            layer.bias.copy_(torch.from_numpy(b))
    net.eval()
    x = np.random.default_rng(0).uniform(0, 1, (n, size, size, 3)).astype(np.float32)
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    target = torch.zeros(n, dtype=torch.long)
    rows_per_call = n * (steps + 1)
    layer_ours = ks.LayerConductance(model, layer="c2", steps=steps, batch_size=rows_per_call, scores=False)
    neuron_ours = ks.NeuronConductance(model, layer="c2", neuron=(3, 4, 5), steps=steps, batch_size=n * steps,
                                       scores=False)
    layer_theirs = CaptumLayerConductance(net, net[4])
    neuron_theirs = CaptumNeuronConductance(net, net[4])
    # the floor of layer conductance: one compiled pass giving the activations and gradients of c2 at every point
    alphas = quadrature(steps + 1, "gausslegendre")[0].astype(np.float32)
    c2 = model.get_layer("c2")
    head = keras.Sequential([keras.Input(c2.output.shape[1:]), *model.layers[3:]])
    stem = keras.Sequential([keras.Input((size, size, 3)), *model.layers[:3]])

    @tf.function
    def floor(points: Any) -> Any:
        acts = stem(points, training=False)
        with tf.GradientTape() as tape:
            tape.watch(acts)
            score = head(acts, training=False)[:, 0]
        grads = tape.gradient(score, acts)
        acts = tf.reshape(acts, (n, steps + 1, *acts.shape[1:]))
        grads = tf.reshape(grads, (n, steps + 1, *grads.shape[1:]))
        return tf.reduce_sum(grads[:, :-1] * (acts[:, 1:] - acts[:, :-1]), axis=1)

    points = tf.constant((x[:, None] * alphas[None, :, None, None, None]).reshape(-1, size, size, 3))
    results = []
    for label, ours, theirs, kwargs, floor_run in (
        ("layer_conductance", layer_ours, layer_theirs, {}, lambda: floor(points).numpy()),
        ("neuron_conductance", neuron_ours, neuron_theirs, {"neuron_selector": (5, 3, 4), "method": "gausslegendre"},
         None),
    ):
        runners = {
            "kerascope": lambda ours=ours: ours.explain(x, 0),
            "captum": lambda theirs=theirs, kwargs=kwargs: theirs.attribute(xt, target=target, n_steps=steps, **kwargs),
        }
        if floor_run is not None:
            runners["floor"] = floor_run
        for run in runners.values():
            run()
        times = rotating_times(runners, options.repeats)
        results += [{"method": label, **row} for row in _rows(times, "captum", f"{n}x{size}x{size}x3, steps={steps}")]
    return results
