"""kerascope's Quantus metric families against Quantus 0.6.0 at equal settings, on the same CPU.

Quantus runs on a PyTorch twin of the same small CNN with identical weights (tests/_quantus.py), both sides
on the same images, attributions, masks and targets, alternating in one process (``rotating_times``):
the rows give each side's median seconds, the ratio of medians and the spread of the per-round ratios.
The ``forward_floor`` row times only the forwards pixel flipping needs, each side's way: the ceiling of the
speed-up of a metric whose time is its forwards (Quantus batches the curves' forwards over samples too).
``--set metrics=pixel_flipping,forward_floor`` times a subset. kerascope's side runs on the Keras backend of
the run (``--backend torch`` compares like with like on the forward: both sides' convolutions are PyTorch's);
on TensorFlow, ``TF_ENABLE_ONEDNN_OPTS=1`` in the environment turns on oneDNN where TensorFlow leaves it off
(CPUs without AVX-512 VNNI / AMX), several times faster on this CNN's convolution. Every row records both.

    python -m bench metrics-vs-quantus --repeats 3
    TF_ENABLE_ONEDNN_OPTS=1 python -m bench metrics-vs-quantus --repeats 3
    python -m bench metrics-vs-quantus --backend torch --repeats 3
    python -m bench metrics-vs-quantus --repeats 5 --set cpu_time=1   # CPU seconds, one thread each side
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.scenario import Options, scenario, settings
from bench.timing import cpu_clock, one_tf_thread, rotating_times


def _cases(options: Options):
    import sys
    from pathlib import Path

    import numpy as np

    from kerascope import metrics

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' twin builder
    from _quantus import build_pair, import_quantus, nchw, torch_saliency

    quantus = import_quantus()
    size, n = (16, 4) if options.quick else (32, 16)
    model, net = build_pair(seed=0, size=size)
    rng = np.random.default_rng(0)
    x = rng.random((n, size, size, 3)).astype(np.float32)
    y = rng.integers(0, 3, n)
    a = rng.normal(size=(n, size, size, 3)).astype(np.float32)
    maps = rng.normal(size=(n, size, size)).astype(np.float32)
    masks = np.zeros((n, size, size), bool)
    masks[:, size // 4: 3 * size // 4, size // 4: 3 * size // 4] = True
    common = dict(model=net, x_batch=nchw(x), y_batch=y, channel_first=True, batch_size=64)
    step = size * size // 16
    samples = 10 if options.quick else 50

    def q(cls, a_q, call=None, **params):
        metric = getattr(quantus, cls)(normalise=False, disable_warnings=True, **params)
        return lambda: metric(a_batch=a_q.copy(), **common, **(call or {}))

    cases = {
        "pixel_flipping": (lambda: metrics.pixel_flipping(model, x, a, y, features_in_step=step, batch_size=64),
                           q("PixelFlipping", nchw(a), {"softmax": True}, features_in_step=step, abs=False)),
        "region_perturbation": (
            lambda: metrics.region_perturbation(model, x, maps, y, patch_size=4, regions=32, batch_size=64),
            q("RegionPerturbation", maps[:, None], {"softmax": True}, patch_size=4, regions_evaluation=32,
              abs=False)),
        "selectivity": (lambda: metrics.selectivity(model, x, a, y, patch_size=4, batch_size=64),
                        q("Selectivity", nchw(a), {"softmax": True}, patch_size=4, abs=False)),
        "faithfulness_estimate": (
            lambda: metrics.faithfulness_estimate(model, x, a, y, features_in_step=step, batch_size=64),
            q("FaithfulnessEstimate", nchw(a), {"softmax": False}, features_in_step=step, abs=False)),
        "faithfulness_correlation": (
            lambda: metrics.faithfulness_correlation(model, x, a, y, nr_runs=50, subset_size=step, batch_size=64),
            q("FaithfulnessCorrelation", nchw(a), {"softmax": False}, nr_runs=50, subset_size=step, abs=False,
              return_aggregate=False)),
        "sparseness": (lambda: metrics.sparseness(maps), q("Sparseness", maps[:, None])),
        "auc": (lambda: metrics.auc(maps, masks),
                q("AUC", maps[:, None], {"s_batch": masks[:, None].astype(np.float32)})),
        "relevance_rank_accuracy": (
            lambda: metrics.relevance_rank_accuracy(maps, masks),
            q("RelevanceRankAccuracy", maps[:, None], {"s_batch": masks[:, None].astype(np.float32)})),
        "max_sensitivity": (
            lambda: metrics.max_sensitivity(model, x, "saliency", y, samples=samples, radius=0.1, batch_size=64),
            q("MaxSensitivity", torch_saliency(net, nchw(x), y), {"explain_func": torch_saliency},
              nr_samples=samples, lower_bound=0.1, abs=False, return_aggregate=False)),
        "local_lipschitz_estimate": (
            lambda: metrics.local_lipschitz_estimate(model, x, "saliency", y, samples=samples, batch_size=64),
            q("LocalLipschitzEstimate", torch_saliency(net, nchw(x), y), {"explain_func": torch_saliency},
              nr_samples=samples, abs=False, return_aggregate=False)),
        "non_sensitivity": (lambda: metrics.non_sensitivity(model, x, a, y, features_in_step=1, batch_size=64),
                            q("NonSensitivity", nchw(a), {"softmax": True}, features_in_step=1)),
    }
    # ROAD: Quantus's ranks index pixels only for one-channel images, so a one-channel twin
    gray_model, gray_net = build_pair(seed=0, size=size, channels=1)
    gray = x[..., :1].copy()
    pct = list(range(5, 100, 10))
    road = quantus.ROAD(percentages=pct, noise=0.01, normalise=False, abs=False, disable_warnings=True)
    cases["road"] = (lambda: metrics.road(gray_model, gray, maps, y, percentages=pct, batch_size=64),
                     lambda: road(model=gray_net, x_batch=nchw(gray), y_batch=y, a_batch=maps[:, None].copy(),
                                  channel_first=True, batch_size=64))
    cases["forward_floor"] = _forward_floor(model, net, x, step)
    # the Keras backend of kerascope's side, and TensorFlow's oneDNN switch (read when TensorFlow loads; on a
    # CPU without AVX-512 VNNI / AMX TensorFlow leaves oneDNN off unless TF_ENABLE_ONEDNN_OPTS=1)
    import os

    import keras

    return cases, {"images": n, "size": size, "features_in_step": step, "backend": keras.backend.backend(),
                   "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")}


def _forward_floor(model, net, x, step):
    """The forwards alone of pixel flipping's perturbed images, each side's way: the Keras model compiled by
    kerascope's backend layer (``tf.function`` on TensorFlow, ``torch.no_grad`` on PyTorch, ``jax.jit`` on JAX)
    in chunks of 64 against PyTorch on one batch of the N images per step (as Quantus): the ceiling of the
    speed-up of any metric whose time is its forwards."""
    import numpy as np
    import torch

    from kerascope import _backend

    n = len(x)
    points = -(-x[0].size // step)
    images = np.repeat(x, points, axis=0)  # the same number of images as pixel flipping scores
    forward = _backend.get().compile_forward(lambda xs: model(xs[0]), input_specs=[((None, *x.shape[1:]), "float32")])
    steps = torch.from_numpy(np.ascontiguousarray(images.reshape(n, points, *x.shape[1:]).transpose(1, 0, 4, 2, 3)))

    def ours():
        return [np.asarray(forward([images[i:i + 64]])) for i in range(0, len(images), 64)]

    def theirs():
        with torch.no_grad():
            return [torch.softmax(net(batch), -1).numpy() for batch in steps]

    return ours, theirs


@dataclass(frozen=True)
class MetricsSettings:
    """``--set metrics=pixel_flipping,road``: only these cases (default: all)."""

    metrics: tuple[str, ...] = ()
    cpu_time: bool = False  # CPU seconds of the process, one TensorFlow thread: the work done, steady under load


@scenario("metrics-vs-quantus", "Quantus metric families: kerascope (Keras, any backend) vs Quantus 0.6.0 (torch twin)",
          tags=("peers",))
def metrics_vs_quantus(options: Options) -> list[dict]:
    import keras
    import torch

    torch.set_num_threads(1)  # both sides single-threaded compute on a shared machine: work, not contention
    chosen_settings = settings(MetricsSettings, options)
    chosen = chosen_settings.metrics
    if chosen_settings.cpu_time and keras.backend.backend() == "tensorflow":
        one_tf_thread()
    cases, setting = _cases(options)
    setting["cpu_time"] = chosen_settings.cpu_time
    unknown = sorted(set(chosen) - set(cases))
    if unknown:
        raise ValueError(f"Unknown metrics. Received: --set metrics={','.join(chosen)}. Available: {', '.join(cases)}.")
    rows = []
    for name, (ours, theirs) in cases.items():
        if chosen and name not in chosen:
            continue
        ours(), theirs()  # warm-up: compilation, first calls
        times = rotating_times({"kerascope": ours, "quantus": theirs}, rounds=options.repeats,
                               clock=cpu_clock(chosen_settings.cpu_time))
        ratios = [q / k for k, q in zip(times["kerascope"], times["quantus"], strict=True)]
        k_med, q_med = statistics.median(times["kerascope"]), statistics.median(times["quantus"])
        rows.append({"metric": name, **setting, "kerascope_s": k_med, "quantus_s": q_med,
                     "speedup": q_med / k_med, "speedup_min": min(ratios), "speedup_max": max(ratios)})
        print(f"{name:26s} kerascope {k_med:8.4f}s  quantus {q_med:8.4f}s  x{q_med / k_med:6.1f} "
              f"[{min(ratios):.1f}, {max(ratios):.1f}]", flush=True)
    return rows
