"""KernelSHAP and LIME: kerascope vs the shap / lime packages vs a Captum-style Python loop, in one process.

Same model (the demo CNN, or a small MobileNetV2 with weights=None), same images, same superpixel mask
(SLIC or a grid), same baseline, same number of coalitions per image, same batch size. Per image:

- ``kerascope``: ``ks.KernelSHAP`` / ``ks.LIME`` (coalition rows built in numpy chunks, scored by the
  engine's compiled forward pass, closed-form solve).
- ``shap``: ``shap.KernelExplainer`` on the coalition function ``z -> model.predict(images(z))``
  (shap's usual way to explain images by superpixels), ``l1_reg=False``.
- ``lime``: ``lime_image.LimeImageExplainer.explain_instance`` with the same ``segmentation_fn`` and
  ``hide_color``, ``classifier_fn = model.predict``.
- ``captum-loop``: what Captum's ``KernelShap`` / ``Lime`` do, written for Keras: coalitions drawn in
  Python, ``perturbations_per_eval`` of them stacked per eager ``model(...)`` call, then the solve. With
  Captum's default ``perturbations_per_eval=1`` (row ``captum-loop(1)``) every coalition is one call.

``feature-masks-METHOD-MODEL`` times kerascope and its peers on the same images, medians over
the rounds, the order rotating every round; Captum's default ``perturbations_per_eval=1`` (one
eager call per coalition) is so slow that it is timed once, after the rotating rounds (skip it
with ``--set skip_loop1=1``). Settings: ``images`` (2), ``samples`` (1000), ``batch_size`` (100),
``mask`` (``slic`` or ``grid``).

    python -m bench feature-masks-kernel_shap-demo feature-masks-lime-demo --repeats 3
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from bench.scenario import Options, scenario, settings
from bench.timing import rotating_times


@dataclass(frozen=True)
class MaskSettings:
    images: int = 2
    samples: int = 1000
    batch_size: int = 100
    mask: str = "slic"
    skip_loop1: bool = False


def build(name: str) -> Any:
    import keras

    from bench.models import build_model

    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.5, weights=None)
    return build_model(name)


def logits_model(model: Any) -> Any:
    """The model's pre-softmax output as kerascope scores it (a plain eager callable for the peers)."""
    import kerascope as ks

    engine = ks.Engine(model)

    def call(images: np.ndarray) -> np.ndarray:
        return np.asarray(engine.forward(images.astype(np.float32), batch_size=len(images)))

    return call


def images_of(mask: np.ndarray, image: np.ndarray, z: np.ndarray, baseline: float) -> np.ndarray:
    keep = np.asarray(z, bool)[:, mask][..., None]
    return np.where(keep, image[None], np.float32(baseline)).astype(np.float32)


def compare(method: str, model_name: str, options: Options) -> list[dict]:
    """kerascope's ``method`` (``kernel_shap`` or ``lime``) vs its package and a Captum-style loop."""
    import keras

    import kerascope as ks
    from kerascope.methods.coalitions import LIME, _kernel_design, constrained_wls, ridge
    from kerascope.methods.feature_masks import grid_mask, segmentation

    quick = {"images": 1, "samples": 64, "batch_size": 32, "skip_loop1": True} if options.quick else {}
    args = settings(MaskSettings, options, **quick)
    import lime.lime_image as lime_image
    import shap

    model = build(model_name)
    size = model.inputs[0].shape[1:3]
    from kerascope.data import demo_images
    from kerascope.io.images import read_image

    paths = (demo_images() * args.images)[: args.images]
    x = np.stack([read_image(p, size=tuple(size)) for p in paths]).astype(np.float32) / 255.0
    if args.mask == "slic":
        masks = segmentation("slic", n_segments=50)(x)
    else:
        masks = np.broadcast_to(grid_mask(size, 7), x.shape[:3])
    masks = np.stack([np.unique(m, return_inverse=True)[1].reshape(m.shape) for m in masks])
    features = [int(m.max()) + 1 for m in masks]
    forward = logits_model(model)
    targets = forward(x).argmax(axis=1)
    baseline, n, bs = 0.0, args.samples, args.batch_size

    def ours_kernel() -> Any:
        return ks.KernelSHAP(model, mask=masks, baseline=baseline, samples=n, batch_size=bs).explain(x, targets)

    def ours_lime() -> Any:
        return ks.LIME(model, mask=masks, baseline=baseline, samples=n, batch_size=bs).explain(x, targets)

    def shap_kernel() -> None:
        for i in range(len(x)):
            # the peers call the same compiled logits forward as kerascope (model.predict would keep the softmax)
            def g(z: np.ndarray, i: int = i) -> np.ndarray:
                out = []
                for s in range(0, len(z), bs):
                    out.append(forward(images_of(masks[i], x[i], z[s: s + bs], baseline))[:, targets[i]])
                return np.concatenate(out)

            explainer = shap.KernelExplainer(g, np.zeros((1, features[i])))
            explainer.shap_values(np.ones((1, features[i])), nsamples=n, l1_reg=False, silent=True)

    def lime_package() -> None:
        explainer = lime_image.LimeImageExplainer(random_state=0)
        for i in range(len(x)):
            explainer.explain_instance(
                x[i].astype(np.float64), lambda images: forward(images.astype(np.float32)),
                labels=(int(targets[i]),), top_labels=None, hide_color=baseline, num_features=features[i],
                num_samples=n, segmentation_fn=lambda image, i=i: masks[i], batch_size=bs,
            )

    def loop(method: str, per_eval: int) -> None:
        """Captum's structure: Python draws, `per_eval` coalitions stacked per eager model call, solve."""
        draw = np.random.default_rng(0)
        kernel = LIME(model).kernel
        for i in range(len(x)):
            k = features[i]
            if method == "kernel_shap":
                z, w = _kernel_design(k, n, draw)
                z = np.concatenate([np.zeros((1, k), bool), np.ones((1, k), bool), z])
            else:
                z = draw.integers(0, 2, size=(n, k)).astype(bool)
                z[0] = True
            scores = []
            for s in range(0, len(z), per_eval):
                batch = keras.ops.convert_to_tensor(images_of(masks[i], x[i], z[s: s + per_eval], baseline))
                out = model(batch, training=False)
                scores.append(keras.ops.convert_to_numpy(out)[:, targets[i]])
            y = np.concatenate(scores).astype(np.float64)
            if method == "kernel_shap":
                constrained_wls(z[2:].astype(float), y[2:] - y[0], w, y[1] - y[0])
            else:
                ridge(z.astype(float), y, kernel(z), 1.0)

    runners = {
        "kernel_shap": {"kerascope": ours_kernel, "shap": shap_kernel,
                        f"captum-loop({bs})": lambda: loop("kernel_shap", bs)},
        "lime": {"kerascope": ours_lime, "lime": lime_package, f"captum-loop({bs})": lambda: loop("lime", bs)},
    }[method]
    for run in runners.values():  # warm-up: compilation and first calls
        run()
    times = rotating_times(runners, options.repeats)
    ours = statistics.median(times["kerascope"]) / args.images
    common = {"method": method, "model": model_name, "input": str(tuple(size)), "samples": n, "batch_size": bs,
              "mask": args.mask, "features": str(features)}
    rows = []
    for label, values in times.items():
        per = statistics.median(values) / args.images
        rows.append({**common, "library": label, "s_per_image": per, "x_kerascope": per / ours,
                     "min_s_per_image": min(values) / args.images, "max_s_per_image": max(values) / args.images})
    if not args.skip_loop1:
        per = rotating_times({"one": lambda: loop(method, 1)}, 1)["one"][0] / args.images
        rows.append({**common, "library": "captum-loop(1)", "s_per_image": per, "x_kerascope": per / ours,
                     "rounds": 1})
    return rows


for _model_name in ("demo", "mobilenetv2"):
    for _method in ("kernel_shap", "lime"):
        scenario(f"feature-masks-{_method}-{_model_name}",
                 f"{_method} on superpixels: kerascope vs its package vs a Captum-style loop, {_model_name}",
                 tags=("peers", "feature-masks", _method, _model_name), backend="tensorflow")(
            partial(compare, _method, _model_name))
