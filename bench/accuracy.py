"""Time to accuracy (issue 18, item 2): kerascope's ``tolerance=`` against the peers' smallest setting
that reaches the same accuracy.

* Integrated Gradients: the accuracy is reached when the completeness error
  ``|sum(attr) - (f(x) - f(0))| / |f(x) - f(0)|`` (f from the model's logits) and the relative L2
  distance to a 1024-interval trapezoid reference (kerascope, ``steps=1025``,
  ``method="riemann_trapezoid"``) are both <= 1% for every image. kerascope runs
  ``IntegratedGradients(model, tolerance=0.01)``; each peer runs steps 8, 16, ..., 512 until one
  reaches it.
* SmoothGrad (noise std 0.15 on [0, 1] inputs): the Pearson correlation with a 1024-sample i.i.d.
  reference (kerascope's ``SmoothGrad(samples=1024)``, another seed) is >= 0.95 for every image.
  kerascope runs ``SmoothGrad(model, noise=0.15, tolerance=0.05)``; each peer runs 16, 32, ... 1024
  samples. Maps are compared with the channels kept (Xplique with ``reducer=None``, tf-keras-vis with ``keepdims=True``,
  ``normalize_map=False`` and no absolute value, so it returns the mean gradient too).

Then kerascope and each peer at its first accurate setting are timed in one process, alternating
(``bench/timing.py``), median of ``--repeats`` rounds after the accuracy runs (which warm them up).
tf-explain returns a normalised grayscale picture, not attributions, so its accuracy cannot be
measured; it is not in this table (its speed at equal steps is in ``bench/peers.py``).

Runs in the peers' environment (``bench/peers.py --setup`` creates it):
    python bench/accuracy.py --model mobilenetv2 --images 2
    python bench/accuracy.py --model demo --images 2 --methods integrated_gradients
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def build(name: str, images: int) -> tuple[Any, Any]:
    import keras
    import numpy as np

    if name == "mobilenetv2":  # the model: alpha 0.5, 128 px, weights=None, images uniform in [0, 1]
        keras.utils.set_random_seed(0)
        model = keras.applications.MobileNetV2(
            input_shape=(128, 128, 3), alpha=0.5, weights=None, classifier_activation=None)
        x = np.random.default_rng(0).uniform(0, 1, (images, 128, 128, 3)).astype(np.float32)
        return model, x
    if name == "demo":  # trained 64 px shapes CNN, its own images (the final softmax is bypassed by kerascope)
        from PIL import Image

        import kerascope as ks
        from kerascope.data import demo_model_path

        model = ks.load_model(demo_model_path())
        folder = HERE.parent / "kerascope" / "data" / "images"
        last = model.layers[-1]  # Dense(softmax): every library gets the same weights with a linear head
        config = last.get_config() | {"activation": "linear", "name": "logits"}
        head = type(last).from_config(config)
        head.build(last.input.shape)
        head.set_weights(last.get_weights())
        logits = keras.Model(model.inputs, head(last.input))
        files = sorted(folder.iterdir())[:images]
        x = np.stack([np.asarray(Image.open(f).convert("RGB"), np.float32) / 255 for f in files])
        return logits, x
    raise SystemExit(f"Unknown model. Received: --model {name!r}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["integrated_gradients", "smoothgrad"])
    parser.add_argument("--peers", nargs="*", default=["xplique", "tf-keras-vis"])
    parser.add_argument("--sg-tolerances", nargs="+", type=float, default=[0.05],
                        help="SmoothGrad tolerance= values to time (each bounds the estimated 1 - Pearson)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.worker:
        sys.path.insert(0, str(HERE))
        from peers import VENV, setup

        python = VENV / "bin" / "python"
        if not python.exists():
            setup()
        os.execv(str(python), [str(python), str(Path(__file__).resolve()), "--worker", *sys.argv[1:]])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, str(HERE))
    import keras
    import numpy as np
    import tensorflow as tf
    from timing import rotating_times

    import kerascope as ks

    model, x = build(args.model, args.images)
    n, b = len(x), args.chunk
    logits = np.asarray(model(x), np.float64)
    t = logits.argmax(axis=1)
    onehot = np.eye(logits.shape[1], dtype=np.float32)[t]
    load = os.getloadavg()
    print(f"model={args.model} images={n} chunk={b} tf={tf.__version__} keras={keras.__version__} "
          f"load_avg={load[0]:.1f},{load[1]:.1f}", flush=True)

    def as_np(a: Any) -> np.ndarray:
        return np.asarray(a, np.float64).reshape(n, -1)

    def report(method: str, label: str, setting: Any, seconds: list[float], ok: bool, detail: str) -> None:
        print(f"{method:<22}{label:<24}{str(setting):>8}{statistics.median(seconds):>10.3f}"
              f"  {min(seconds):.3f}..{max(seconds):.3f}  {'yes' if ok else 'NO '}  {detail}", flush=True)

    if "integrated_gradients" in args.methods:
        delta = logits[np.arange(n), t] - np.asarray(model(np.zeros_like(x)), np.float64)[np.arange(n), t]
        ref = as_np(ks.IntegratedGradients(model, steps=1025, method="riemann_trapezoid",
                                           batch_size=b).explain(x, t).attributions)

        def accuracy(attr: Any) -> tuple[float, float]:
            a = as_np(attr)
            comp = np.abs(a.sum(axis=1) - delta) / np.abs(delta)
            l2 = np.linalg.norm(a - ref, axis=1) / np.linalg.norm(ref, axis=1)
            return float(comp.max()), float(l2.max())

        ours = ks.IntegratedGradients(model, tolerance=0.01, batch_size=b)
        first = ours.explain(x, t)
        runners = {"kerascope tolerance=0.01": (lambda: ours.explain(x, t))}
        settings = {"kerascope tolerance=0.01": first.extras["steps"].tolist()}
        acc = {"kerascope tolerance=0.01": accuracy(first.attributions)}
        try:
            if "xplique" not in args.peers:
                raise ImportError("not asked for (--peers)")
            from xplique.attributions import IntegratedGradients as XIG

            for steps in (8, 16, 32, 64, 128, 256, 512):
                xig = XIG(model, steps=steps, batch_size=b, reducer=None)
                a = accuracy(xig(x, onehot))
                print(f"  xplique IG steps={steps}: completeness {a[0]:.4f}, L2 {a[1]:.4f}", flush=True)
                if max(a) <= 0.01:
                    runners["xplique"] = lambda xig=xig: xig(x, onehot)
                    settings["xplique"], acc["xplique"] = steps, a
                    break
        except ImportError as error:
            print(f"  xplique: not importable ({error})")
        times = rotating_times(runners, args.repeats)
        for label, seconds in times.items():
            c, l2 = acc[label]
            report("integrated_gradients", label, settings[label], seconds, max(c, l2) <= 0.01,
                   f"completeness {c:.4f}, L2 {l2:.4f}")

    if "smoothgrad" in args.methods:
        ref = as_np(ks.SmoothGrad(model, samples=1024, noise=0.15, seed=1234, batch_size=b).explain(x, t).attributions)

        def rho(attr: Any) -> float:
            a = as_np(attr)
            return float(min(np.corrcoef(a[i], ref[i])[0, 1] for i in range(n)))

        runners, settings, acc = {}, {}, {}
        for tolerance in args.sg_tolerances:  # tolerance bounds the estimated 1 - Pearson with the exact map
            ours = ks.SmoothGrad(model, noise=0.15, tolerance=tolerance, batch_size=b)
            first = ours.explain(x, t)
            label = f"kerascope tolerance={tolerance}"
            runners[label] = lambda ours=ours: ours.explain(x, t)
            settings[label], acc[label] = first.extras["samples"].tolist(), rho(first.attributions)
            print(f"  {label}: samples {settings[label]}, estimated 1 - Pearson "
                  f"{np.round(first.extras['estimated_error'].astype(np.float64), 4).tolist()}, worst Pearson {acc[label]:.4f}",
                  flush=True)
        ladder = (16, 32, 64, 128, 256, 512, 1024)
        peers: dict[str, Any] = {}
        try:
            if "xplique" not in args.peers:
                raise ImportError("not asked for (--peers)")
            from xplique.attributions import SmoothGrad as XSG

            def xplique_sg(samples: int) -> Any:
                explainer = XSG(model, nb_samples=samples, noise=0.15, batch_size=b, reducer=None)
                return lambda: explainer(x, onehot)

            peers["xplique"] = xplique_sg
        except ImportError as error:
            print(f"  xplique: not importable ({error})")
        try:
            if "tf-keras-vis" not in args.peers:
                raise ImportError("not asked for (--peers)")
            from tf_keras_vis.saliency import Saliency
            from tf_keras_vis.utils.scores import CategoricalScore

            vis = Saliency(model, clone=False)
            peers["tf-keras-vis"] = lambda s: (lambda: vis(
                CategoricalScore(list(t)), x, smooth_samples=s, smooth_noise=0.15, keepdims=True,
                normalize_map=False, gradient_modifier=None))
        except ImportError as error:
            print(f"  tf-keras-vis: not importable ({error})")
        for label, make in peers.items():
            for samples in ladder:
                call = make(samples)
                out = np.asarray(call())
                if out.size != x.size:
                    print(f"  {label}: output shape {out.shape} is not the input's {x.shape}; skipped")
                    break
                r = rho(out)
                print(f"  {label} samples={samples}: worst Pearson {r:.4f}", flush=True)
                if r >= 0.95:
                    runners[label], settings[label], acc[label] = call, samples, r
                    break
        times = rotating_times(runners, args.repeats)
        for label, seconds in times.items():
            report("smoothgrad", label, settings[label], seconds, acc[label] >= 0.95, f"worst Pearson {acc[label]:.4f}")


if __name__ == "__main__":
    main()
