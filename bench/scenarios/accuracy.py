"""Time to accuracy: kerascope's ``tolerance=`` against the peers' smallest setting that reaches the same accuracy.

* ``accuracy-integrated_gradients-MODEL``: the accuracy is reached when the completeness error
  ``|sum(attr) - (f(x) - f(0))| / |f(x) - f(0)|`` (f from the model's logits) and the relative L2
  distance to a 1024-interval trapezoid reference (kerascope, ``steps=1025``,
  ``method="riemann_trapezoid"``) are both <= 1% for every image. kerascope runs
  ``IntegratedGradients(model, tolerance=0.01)``; Xplique runs steps 8, 16, ..., 512 until one
  reaches it.
* ``accuracy-smoothgrad-MODEL`` (noise std 0.15 on [0, 1] inputs): the Pearson correlation with a
  1024-sample i.i.d. reference (kerascope's ``SmoothGrad(samples=1024)``, another seed) is >= 0.95
  for every image. kerascope runs ``SmoothGrad(model, noise=0.15, tolerance=0.05)``; each peer runs
  16, 32, ... 1024 samples. Maps are compared with the channels kept (Xplique with ``reducer=None``,
  tf-keras-vis with ``keepdims=True``, ``normalize_map=False`` and no absolute value, so it returns
  the mean gradient too).

Then kerascope and each peer at its first accurate setting are timed in one process, alternating,
median of the rounds after the accuracy runs (which warm them up). tf-explain returns a normalised
grayscale picture, not attributions, so its accuracy cannot be measured (its speed at equal steps
is in the ``peers-*`` scenarios). Models: MobileNetV2 (alpha 0.5, 128 px, ``weights=None``, images
uniform in [0, 1]) and the trained demo CNN with its own images and a linear head.

Settings (``--set``): ``images`` (2), ``chunk`` (64), ``sg_tolerance`` (0.05), ``peers``
(``xplique,tf-keras-vis``). Runs in the peers' environment:

    python -m bench accuracy-integrated_gradients-mobilenetv2 accuracy-smoothgrad-mobilenetv2 --repeats 3
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.scenario import Options, scenario, settings
from bench.timing import rotating_times


@dataclass(frozen=True)
class AccuracySettings:
    images: int = 2
    chunk: int = 64
    sg_tolerance: float = 0.05
    peers: tuple[str, ...] = ("xplique", "tf-keras-vis")


def build(name: str, images: int, quick: bool = False) -> tuple[Any, Any]:
    """The model (logits) and ``images`` inputs."""
    import keras
    import numpy as np

    if name == "mobilenetv2":  # alpha 0.5, 128 px, weights=None, images uniform in [0, 1]
        side = 64 if quick else 128
        keras.utils.set_random_seed(0)
        model = keras.applications.MobileNetV2(
            input_shape=(side, side, 3), alpha=0.5, weights=None, classifier_activation=None)
        x = np.random.default_rng(0).uniform(0, 1, (images, side, side, 3)).astype(np.float32)
        return model, x
    if name == "demo":  # trained 64 px shapes CNN, its own images, the softmax head made linear
        import kerascope as ks
        from bench.models import demo_images
        from kerascope.data import demo_model_path

        model = ks.load_model(demo_model_path())
        last = model.layers[-1]  # Dense(softmax): every library gets the same weights with a linear head
        head = type(last).from_config(last.get_config() | {"activation": "linear", "name": "logits"})
        head.build(last.input.shape)
        head.set_weights(last.get_weights())
        return keras.Model(model.inputs, head(last.input)), demo_images(images)
    raise ValueError(f"Unknown model. Received: model={name!r}. Expected mobilenetv2 or demo.")


def _row(method: str, label: str, setting: Any, seconds: list[float], ok: bool, **detail: float) -> dict:
    import statistics

    return {"method": method, "library": label, "setting": setting, "median_s": statistics.median(seconds),
            "min_s": min(seconds), "max_s": max(seconds), "accurate": ok, **detail}


def integrated_gradients(model_name: str, options: Options) -> list[dict]:
    """IG at completeness and L2 error <= 1%: kerascope's ``tolerance=0.01`` vs Xplique's step ladder."""
    import numpy as np

    import kerascope as ks

    args = settings(AccuracySettings, options)
    model, x = build(model_name, args.images, options.quick)
    n, b = len(x), args.chunk
    logits = np.asarray(model(x), np.float64)
    t = logits.argmax(axis=1)
    onehot = np.eye(logits.shape[1], dtype=np.float32)[t]
    delta = logits[np.arange(n), t] - np.asarray(model(np.zeros_like(x)), np.float64)[np.arange(n), t]
    ref = np.asarray(ks.IntegratedGradients(model, steps=1025, method="riemann_trapezoid", batch_size=b)
                     .explain(x, t).attributions, np.float64).reshape(n, -1)

    def accuracy(attr: Any) -> tuple[float, float]:
        a = np.asarray(attr, np.float64).reshape(n, -1)
        comp = np.abs(a.sum(axis=1) - delta) / np.abs(delta)
        l2 = np.linalg.norm(a - ref, axis=1) / np.linalg.norm(ref, axis=1)
        return float(comp.max()), float(l2.max())

    ours = ks.IntegratedGradients(model, tolerance=0.01, batch_size=b)
    first = ours.explain(x, t)
    label = "kerascope tolerance=0.01"
    runners = {label: (lambda: ours.explain(x, t))}
    chosen, acc = {label: first.extras["steps"].tolist()}, {label: accuracy(first.attributions)}
    ladder: list[dict] = []
    if "xplique" in args.peers:
        from xplique.attributions import IntegratedGradients as XIG

        for steps in (8, 16, 32, 64, 128, 256, 512):
            xig = XIG(model, steps=steps, batch_size=b, reducer=None)
            a = accuracy(xig(x, onehot))
            ladder.append({"library": "xplique", "setting": steps, "completeness": a[0], "l2": a[1]})
            if max(a) <= 0.01:
                runners["xplique"] = lambda xig=xig: xig(x, onehot)
                chosen["xplique"], acc["xplique"] = steps, a
                break
    times = rotating_times(runners, options.repeats)
    return ladder + [_row("integrated_gradients", label, chosen[label], seconds, max(acc[label]) <= 0.01,
                          completeness=acc[label][0], l2=acc[label][1]) for label, seconds in times.items()]


def smoothgrad(model_name: str, options: Options) -> list[dict]:
    """SmoothGrad at worst Pearson >= 0.95: kerascope's ``tolerance=`` vs the peers' sample ladders."""
    import numpy as np

    import kerascope as ks

    args = settings(AccuracySettings, options)
    model, x = build(model_name, args.images, options.quick)
    n, b = len(x), args.chunk
    t = np.asarray(model(x)).argmax(axis=1)
    onehot = np.eye(int(model.outputs[0].shape[-1]), dtype=np.float32)[t]
    ref = np.asarray(ks.SmoothGrad(model, samples=1024, noise=0.15, seed=1234, batch_size=b)
                     .explain(x, t).attributions, np.float64).reshape(n, -1)

    def rho(attr: Any) -> float:
        a = np.asarray(attr, np.float64).reshape(n, -1)
        return float(min(np.corrcoef(a[i], ref[i])[0, 1] for i in range(n)))

    ours = ks.SmoothGrad(model, noise=0.15, tolerance=args.sg_tolerance, batch_size=b)
    first = ours.explain(x, t)  # tolerance bounds the estimated 1 - Pearson with the exact map
    label = f"kerascope tolerance={args.sg_tolerance}"
    runners = {label: lambda: ours.explain(x, t)}
    chosen, acc = {label: first.extras["samples"].tolist()}, {label: rho(first.attributions)}
    peers: dict[str, Any] = {}
    if "xplique" in args.peers:
        from xplique.attributions import SmoothGrad as XSG

        def xplique_sg(samples: int) -> Any:
            explainer = XSG(model, nb_samples=samples, noise=0.15, batch_size=b, reducer=None)
            return lambda: explainer(x, onehot)

        peers["xplique"] = xplique_sg
    if "tf-keras-vis" in args.peers:
        from tf_keras_vis.saliency import Saliency
        from tf_keras_vis.utils.scores import CategoricalScore

        vis = Saliency(model, clone=False)
        peers["tf-keras-vis"] = lambda s: (lambda: vis(
            CategoricalScore(list(t)), x, smooth_samples=s, smooth_noise=0.15, keepdims=True,
            normalize_map=False, gradient_modifier=None))
    ladder: list[dict] = []
    for peer, make in peers.items():
        for samples in (16, 32, 64, 128, 256, 512, 1024):
            call = make(samples)
            out = np.asarray(call())
            if out.size != x.size:
                ladder.append({"library": peer, "error": f"output shape {out.shape} is not the input's {x.shape}"})
                break
            r = rho(out)
            ladder.append({"library": peer, "setting": samples, "worst_pearson": r})
            if r >= 0.95:
                runners[peer], chosen[peer], acc[peer] = call, samples, r
                break
    times = rotating_times(runners, options.repeats)
    return ladder + [_row("smoothgrad", label, chosen[label], seconds, acc[label] >= 0.95, worst_pearson=acc[label])
                     for label, seconds in times.items()]


for _model_name in ("mobilenetv2", "demo"):
    scenario(f"accuracy-integrated_gradients-{_model_name}",
             f"IG to 1% error: kerascope tolerance=0.01 vs Xplique's steps, {_model_name}",
             tags=("accuracy", "peers", "integrated_gradients", _model_name), backend="tensorflow", venv="peers")(
        partial(integrated_gradients, _model_name))
    scenario(f"accuracy-smoothgrad-{_model_name}",
             f"SmoothGrad to Pearson 0.95: kerascope tolerance vs the peers' samples, {_model_name}",
             tags=("accuracy", "peers", "smoothgrad", _model_name), backend="tensorflow", venv="peers")(
        partial(smoothgrad, _model_name))
