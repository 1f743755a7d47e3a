"""KernelSHAP and LIME: kerascope vs the shap / lime packages vs a Captum-style Python loop, in one run.

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

Times are medians over ``--rounds`` rounds; the order of the libraries rotates every round
(bench/timing.py). Usage:

    python bench/feature_masks.py --model demo --images 2 --samples 1000 --batch-size 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from timing import rotating_times  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.methods.coalitions import LIME, _kernel_design, constrained_wls, ridge  # noqa: E402
from kerascope.methods.feature_masks import grid_mask, segmentation  # noqa: E402


def build(name: str) -> keras.Model:
    if name == "demo":
        from kerascope.data import demo_model_path

        return ks.load_model(demo_model_path())
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.5, weights=None)
    raise ValueError(f"Unknown model. Received: model={name!r}. Expected 'demo' or 'mobilenetv2'.")


def logits_model(model: keras.Model) -> Any:
    """The model's pre-softmax output as kerascope scores it (a plain eager callable for the peers)."""
    engine = ks.Engine(model)

    def call(images: np.ndarray) -> np.ndarray:
        return np.asarray(engine.forward(images.astype(np.float32), batch_size=len(images)))

    return call


def images_of(mask: np.ndarray, image: np.ndarray, z: np.ndarray, baseline: float) -> np.ndarray:
    keep = np.asarray(z, bool)[:, mask][..., None]
    return np.where(keep, image[None], np.float32(baseline)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", choices=["demo", "mobilenetv2"])
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--mask", default="slic", choices=["slic", "grid"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-loop1", action="store_true", help="skip the perturbations_per_eval=1 loop")
    args = parser.parse_args()

    import lime.lime_image as lime_image
    import shap

    model = build(args.model)
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

    groups = {
        "KernelSHAP": {"kerascope": ours_kernel, "shap": shap_kernel,
                       f"captum-loop({bs})": lambda: loop("kernel_shap", bs)},
        "LIME": {"kerascope": ours_lime, "lime": lime_package, f"captum-loop({bs})": lambda: loop("lime", bs)},
    }
    # Captum's default perturbations_per_eval=1 (one eager call per coalition) is so slow that it is
    # timed once, after the rotating rounds of the others
    single = {"KernelSHAP": lambda: loop("kernel_shap", 1), "LIME": lambda: loop("lime", 1)}
    print(f"model={args.model} input={tuple(size)} images={args.images} samples={n} batch_size={bs} "
          f"mask={args.mask} features/image={features} backend={keras.backend.backend()}")
    print("| method | library | s / image (median) | x kerascope | rounds (s / image) |")
    print("|---|---|---:|---:|---|")
    for method, runners in groups.items():
        for run in runners.values():  # warm-up: compilation and first calls
            run()
        times = rotating_times(runners, args.rounds)
        ours = statistics.median(times["kerascope"]) / args.images
        for label, values in times.items():
            per = statistics.median(values) / args.images
            rounds = ", ".join(f"{v / args.images:.3f}" for v in values)
            print(f"| {method} | {label} | {per:.3f} | {per / ours:.2f} | {rounds} |", flush=True)
        if not args.skip_loop1:
            per = rotating_times({"one": single[method]}, 1)["one"][0] / args.images
            print(f"| {method} | captum-loop(1) | {per:.3f} | {per / ours:.2f} | {per:.3f} (one round) |", flush=True)


if __name__ == "__main__":
    main()
