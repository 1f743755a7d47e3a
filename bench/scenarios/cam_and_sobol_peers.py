"""pytorch-grad-cam's CAM variants and FullGrad, Xplique's Sobol and HSIC: kerascope against each reference
at equal settings, and against the compiled floor (the same arithmetic in one hand-written compiled function).

Run: ``PYTHONPATH=$PWD python -m bench 'cam-variants-*' 'gsa-*' --quick`` (TensorFlow backend). Each row is
one implementation's median seconds per call; ``ratio`` is the median of the per-round ratios to the
reference (``vs``), with their min and max (the rounds alternate implementations in one process).
"""

from __future__ import annotations

import statistics
import sys
import types
from typing import Any

import numpy as np

from bench.scenario import Options, scenario
from bench.timing import rotating_times

CLASSES = 10


def _rows(times: dict[str, list[float]], reference: str, case: str) -> list[dict]:
    rows = []
    for impl, seconds in times.items():
        row = {"case": case, "impl": impl, "median_s": round(statistics.median(seconds), 5)}
        if impl != reference:
            ratios = [a / b for a, b in zip(seconds, times[reference], strict=True)]
            row.update(vs=reference, ratio=round(statistics.median(ratios), 3),
                       ratio_min=round(min(ratios), 3), ratio_max=round(max(ratios), 3))
        rows.append(row)
    return rows


def _grad_cam() -> Any:
    if "torchvision" not in sys.modules:  # pytorch-grad-cam imports torchvision only for unused helpers
        vision = types.ModuleType("torchvision")
        transforms = types.ModuleType("torchvision.transforms")
        functional = types.ModuleType("torchvision.transforms.functional")
        for name in ("Compose", "Normalize", "ToTensor"):
            setattr(transforms, name, None)
        functional.resize = None
        vision.transforms, transforms.functional = transforms, functional
        sys.modules.update({"torchvision": vision, "torchvision.transforms": transforms,
                            "torchvision.transforms.functional": functional})
    import pytorch_grad_cam

    return pytorch_grad_cam


def _pair(size: int) -> tuple[Any, Any, Any, Any]:
    """A small CNN in Keras (features + head) and its torch twin with the same weights."""
    import keras
    import torch

    keras.utils.set_random_seed(0)
    features = keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="c1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, padding="same", use_bias=False, name="c2"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.ReLU(name="r2"),
    ], name="features")
    head = keras.Sequential([
        keras.Input((size // 2, size // 2, 32)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="c3"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES, name="out"),
    ], name="head")
    model = keras.Sequential([keras.Input((size, size, 3)), features, head])
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32, eps=1e-3), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, CLASSES),
    ).eval()
    with torch.no_grad():
        for layer, index in ((features.get_layer("c1"), 0), (features.get_layer("c2"), 3), (head.get_layer("c3"), 6)):
            weights = layer.get_weights()
            net[index].weight.copy_(torch.from_numpy(np.ascontiguousarray(weights[0].transpose(3, 2, 0, 1))))
            if len(weights) > 1:
                net[index].bias.copy_(torch.from_numpy(weights[1]))
        gamma, beta, mean, var = features.get_layer("bn").get_weights()
        net[4].weight.copy_(torch.from_numpy(gamma))
        net[4].bias.copy_(torch.from_numpy(beta))
        net[4].running_mean.copy_(torch.from_numpy(mean))
        net[4].running_var.copy_(torch.from_numpy(var))
        kernel, bias = head.get_layer("out").get_weights()
        net[10].weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
        net[10].bias.copy_(torch.from_numpy(bias))
    return model, features, head, net


@scenario("cam-variants-vs-pytorch-grad-cam",
          "FEM, GradCAMElementWise, EigenGradCAM, KPCACAM, FullGrad, ShapleyCAM vs pytorch-grad-cam 1.5.7 on a torch twin "
          "(both full calls: maps resized to the input), and GradCAMElementWise vs a compiled GradientTape floor",
          tags=("peers", "floor"))
def cam_variants(options: Options) -> list[dict]:
    import keras
    import tensorflow as tf
    import torch

    import kerascope as ks

    torch.set_num_threads(1)
    size, n = (32, 8) if options.quick else (64, 32)
    model, features, head, net = _pair(size)
    grad_cam = _grad_cam()
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    x = np.random.default_rng(0).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)
    targets = list(np.arange(n) % CLASSES)
    tensor = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    wanted = [ClassifierOutputTarget(int(t)) for t in targets]
    layer = "features/r2"
    pairs = {
        "FEM": (ks.FEM(model, layer=layer, batch_size=n), grad_cam.FEM(net, [net[5]])),
        "GradCAMElementWise": (ks.GradCAMElementWise(model, layer=layer, batch_size=n),
                               grad_cam.GradCAMElementWise(net, [net[5]])),
        "EigenGradCAM": (ks.EigenGradCAM(model, layer=layer, batch_size=n), grad_cam.EigenGradCAM(net, [net[5]])),
        "KPCACAM": (ks.KPCACAM(model, layer=layer, batch_size=n), grad_cam.KPCA_CAM(net, [net[5]])),
        "FullGrad": (ks.FullGrad(model, batch_size=n), grad_cam.FullGrad(net, [])),
        "ShapleyCAM": (ks.ShapleyCAM(model, layer=layer, batch_size=n), grad_cam.ShapleyCAM(net, [net[5]])),
    }
    rows = []
    for name, (ours, theirs) in pairs.items():
        ours.explain(x, targets)  # compile once
        theirs(tensor, wanted)
        times = rotating_times({
            "kerascope": lambda ours=ours: ours.explain(x, targets),
            "pytorch-grad-cam": lambda theirs=theirs: theirs(tensor, wanted),
        }, rounds=options.repeats)
        rows += _rows(times, "pytorch-grad-cam", name)

    index = tf.constant(np.stack([np.arange(n), targets], 1), tf.int32)

    @tf.function(jit_compile=False, reduce_retracing=True)
    def floor(batch: tf.Tensor) -> tf.Tensor:  # the same map by hand: one forward, one backward, the combine
        a = features(batch, training=False)
        with tf.GradientTape() as tape:
            tape.watch(a)
            score = tf.reduce_sum(tf.gather_nd(head(a, training=False), index))
        g = tape.gradient(score, a)
        return tf.nn.relu(tf.reduce_sum(tf.nn.relu(g * a), axis=-1))

    ours = ks.GradCAMElementWise(model, layer=layer, batch_size=n, upsample=False)
    ours.explain(x, targets)
    floor(tf.constant(x)).numpy()
    times = rotating_times({
        "kerascope": lambda: ours.explain(x, targets),
        "tape floor": lambda: floor(tf.constant(x)).numpy(),
    }, rounds=options.repeats)
    rows += _rows(times, "tape floor", "GradCAMElementWise upsample=False")
    rows += _second_order_and_bias_floors(options, features, head, x, targets, pairs, tensor, wanted)
    keras.backend.clear_session()
    return rows


def _second_order_and_bias_floors(options: Options, features: Any, head: Any, x: np.ndarray, targets: list,
                                  pairs: dict, tensor: Any, wanted: list) -> list[dict]:
    """FullGrad and ShapleyCAM by hand, each one ``tf.function`` (the passes they need and their arithmetic,
    resized with ``tf.image.resize``), against kerascope and pytorch-grad-cam: the compiled floor's ratio to
    pytorch-grad-cam bounds what kerascope can reach on this backend."""
    import tensorflow as tf

    from kerascope.methods.fullgrad import effective_bias

    n, size = len(x), x.shape[1]
    index = tf.constant(np.stack([np.arange(n), targets], 1), tf.int32)
    c1, pool, c2, bn, r2 = features.layers
    c3, gap, out = head.layers
    biases = [tf.constant(effective_bias(layer)) for layer in (c1, bn, c3)]

    def scaled(m: tf.Tensor) -> tf.Tensor:  # FullGrad's psi: per-channel min-max, summed, resized
        m = m - tf.reduce_min(m, axis=(1, 2), keepdims=True)
        m = tf.reduce_sum(m / (tf.reduce_max(m, axis=(1, 2), keepdims=True) + 1e-7), axis=-1)
        return tf.image.resize(m[..., None], (size, size))[..., 0]

    @tf.function(reduce_retracing=True)
    def fullgrad(batch: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(batch)
            a1 = c1(batch)
            b = bn(c2(pool(a1)), training=False)
            a3 = c3(r2(b))
            score = tf.reduce_sum(tf.gather_nd(out(gap(a3)), index))
        gx, g1, gb, g3 = tape.gradient(score, [batch, a1, b, a3])
        return (scaled(tf.abs(batch * gx)) + scaled(tf.abs(biases[0] * g1 * tf.cast(a1 > 0, a1.dtype)))
                + scaled(tf.abs(biases[1] * gb)) + scaled(tf.abs(biases[2] * g3 * tf.cast(a3 > 0, a3.dtype))))

    @tf.function(reduce_retracing=True)
    def shapley(batch: tf.Tensor) -> tf.Tensor:
        a = features(batch, training=False)
        with tf.GradientTape() as outer:
            outer.watch(a)
            with tf.GradientTape() as inner:
                inner.watch(a)
                score = tf.reduce_sum(tf.gather_nd(head(a, training=False), index))
            g = inner.gradient(score, a)
        hvp = outer.gradient(g, a, output_gradients=a)
        hvp = tf.zeros_like(a) if hvp is None else hvp
        weights = tf.reduce_mean(g - 0.5 * hvp, axis=(1, 2), keepdims=True)
        cam = tf.nn.relu(tf.reduce_sum(weights * a, axis=-1))
        return tf.image.resize(cam[..., None], (size, size))[..., 0]

    rows = []
    for name, floor in (("FullGrad", fullgrad), ("ShapleyCAM", shapley)):
        ours, theirs = pairs[name]
        floor(tf.constant(x)).numpy()
        times = rotating_times({
            "kerascope": lambda ours=ours: ours.explain(x, targets),
            "pytorch-grad-cam": lambda theirs=theirs: theirs(tensor, wanted),
            "tape floor": lambda floor=floor: floor(tf.constant(x)).numpy(),
        }, rounds=options.repeats)
        rows += _rows(times, "pytorch-grad-cam", name + " with its floor")
        rows += [dict(r, case=name + " vs floor") for r in _rows({k: times[k] for k in ("kerascope", "tape floor")},
                                                                 "tape floor", name) if r["impl"] == "kerascope"]
    return rows


def _image_model(size: int) -> Any:
    import keras

    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES),
    ])


@scenario("gsa-sobol-hsic-vs-xplique",
          "Sobol and HSIC vs Xplique 2.0 on identical designs (same grid, N, batch size), and vs a compiled "
          "forward over the same perturbed rows (the floor of a perturbation method)", tags=("peers", "floor"))
def gsa(options: Options) -> list[dict]:
    import tensorflow as tf
    from xplique.attributions.global_sensitivity_analysis import HsicAttributionMethod, SobolAttributionMethod
    from xplique.attributions.global_sensitivity_analysis.replicated_designs import ReplicatedSampler
    from xplique.attributions.global_sensitivity_analysis.samplers import Sampler

    import kerascope as ks

    size, n, grid, designs, masks, batch = (32, 2, 4, 16, 64, 256) if options.quick else (64, 4, 8, 32, 512, 256)
    model = _image_model(size)
    x = np.random.default_rng(2).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)
    targets = list(np.arange(n) % CLASSES)
    one_hot = np.eye(CLASSES, dtype=np.float32)[targets]
    sobol = ks.Sobol(model, grid_size=grid, samples=designs, batch_size=batch)
    hsic = ks.HSIC(model, grid_size=grid, samples=masks, batch_size=batch)

    class SameSobol(ReplicatedSampler):
        def __call__(self, dimension: int, nb_design: int) -> np.ndarray:
            return sobol.design(dimension)

    class SameHsic(Sampler):
        def __call__(self, dimension: int, nb_design: int) -> np.ndarray:
            return hsic.design(dimension).astype(np.float32)

    x_sobol = SobolAttributionMethod(model, grid_size=grid, nb_design=designs, sampler=SameSobol(), batch_size=batch)
    x_hsic = HsicAttributionMethod(model, grid_size=grid, nb_design=masks, sampler=SameHsic(binary=True),
                                   batch_size=batch)

    # the floor: the perturbed rows built once in numpy, scored by one compiled forward per chunk
    k = grid * grid
    cell = size // grid
    design = sobol.design(k)
    rows_m = np.concatenate([design[:designs], design[2 * designs:]])  # what kerascope scores: A and the C_j
    weights = np.repeat(np.repeat(rows_m.reshape(-1, grid, grid), cell, 1), cell, 2)[..., None]
    forward = tf.function(lambda b: model(b, training=False), reduce_retracing=True)

    def floor() -> None:
        for image, target in zip(x, targets, strict=True):
            for start in range(0, len(weights), batch):
                forward(tf.constant(weights[start:start + batch] * image))[:, target].numpy()

    rows = []
    for case, ours, theirs, extra in (("Sobol", sobol, x_sobol, floor), ("HSIC", hsic, x_hsic, None)):
        ours.explain(x, targets)
        theirs.explain(x, one_hot)
        runners = {"kerascope": lambda ours=ours: ours.explain(x, targets),
                   "xplique": lambda theirs=theirs: theirs.explain(x, one_hot)}
        if extra is not None:
            extra()
            runners["forward floor"] = extra
        times = rotating_times(runners, rounds=options.repeats)
        rows += _rows(times, "xplique", case)
        if extra is not None:
            rows += [dict(r, vs="forward floor", ratio=round(statistics.median(
                [a / b for a, b in zip(times["kerascope"], times["forward floor"], strict=True)]), 3))
                for r in _rows({"kerascope": times["kerascope"]}, "kerascope", case + " vs floor")]
    return rows
