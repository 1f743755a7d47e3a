"""``kerascope evaluate [MODEL] [DATA] [--methods ...] [--out DIR]``: the ground-truth benchmark.

Without arguments it evaluates every registered method on the bundled demo
model and freshly generated shapes images. ``DATA`` is an ``.npz`` file with
``images`` (N, H, W, C, already preprocessed for the model), ``masks``
(N, H, W, boolean object masks) and optionally ``labels`` (N,) class indices
(without labels the predicted classes are explained).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

from kerascope.cli.common import add_method_flag, emit, examples, finish_parser, stderr


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``evaluate`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["evaluate", "--methods", "gradcam", "saliency"]).method
        ['gradcam', 'saliency']
    """
    p = sub.add_parser(
        "evaluate", help="benchmark methods: pointing game, deletion/insertion AUC, sanity checks",
        description="Score explanation methods on images with ground-truth masks: pointing game, "
        "deletion/insertion AUC and cascading-randomisation sanity checks. DATA is an .npz with arrays "
        "images (N, H, W, C) float, preprocessed for the model, masks (N, H, W) bool and optionally labels (N,) int; "
        "build it from a folder of images and one of masks with `kerascope evaluate-data`. Without DATA, "
        "generated shape images are used (see docs/evaluation.md). The model and the data are checked against "
        "each other (input size, channels, dtype, classes) before any work.",
        **examples("kerascope evaluate", "kerascope evaluate model.keras data.npz --methods gradcam,saliency "
                   "--out eval/", "kerascope evaluate --methods gradcam,saliency --metrics pointing_game,"
                   "pixel_flipping,road,sparseness --interval bootstrap"),
    )
    p.add_argument("model", nargs="?", metavar="MODEL_FILE", help="a .keras/.h5 model (default: the bundled demo model)")
    p.add_argument("data", nargs="?", metavar="DATA",
                   help=".npz with images, masks[, labels] (default: generated shapes images)")
    add_method_flag(p, "every registered method")
    p.add_argument("--out", default="kerascope-evaluate", help="output folder (default: kerascope-evaluate)")
    p.add_argument("--n", type=int, default=32, help="generated images when DATA is not given (default: 32)")
    p.add_argument("--steps", type=int, default=16, help="deletion/insertion steps (default: 16)")
    p.add_argument("--sanity-images", type=int, default=4,
                   help="images for the cascading randomisation check; 0 skips it (default: 4)")
    p.add_argument("--seed", type=int, default=2024, help="data / reference-map / randomisation seed")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--no-references", action="store_true", help="leave out the random and constant reference maps")
    p.add_argument("--metrics", "--metric", dest="metrics", action="append", metavar="NAMES",
                   help="metric columns, repeatable or comma-separated (default: pointing_game,"
                        "energy_pointing_game,deletion,insertion,sanity); any kerascope.metrics family too, e.g. "
                        "pixel_flipping,road,sparseness,max_sensitivity: `--metrics list` lists them")
    p.add_argument("--metric-param", action="append", default=[], metavar="METRIC.KEY=VALUE",
                   help="a parameter passed on to one metric, e.g. pixel_flipping.features_in_step=64 (repeatable)")
    p.add_argument("--interval", choices=["t", "bootstrap"], default="t",
                   help="confidence interval over the images: Student's t or a seeded percentile bootstrap")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals (default: 0.95)")
    p.add_argument("--unsafe", action="store_true", help="allow model files that run code (trusted files only)")
    finish_parser(p, run, images=False)


def _load_data(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"No data file. Received: DATA={path!r}.")
    with np.load(file, allow_pickle=False) as data:
        missing = [k for k in ("images", "masks") if k not in data.files]
        if missing:
            raise ValueError(f"The data file lacks {missing}. Received: arrays {data.files} in {path!r}. "
                             "Expected images (N, H, W, C), masks (N, H, W) and optionally labels (N,).")
        labels = data["labels"] if "labels" in data.files else None
        return data["images"], data["masks"], labels  # as stored: checked against the model before any cast


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def metric_choice(args: argparse.Namespace) -> tuple[list[str] | None, dict[str, dict]]:
    """The ``--metrics`` names (None: the default columns) and the ``--metric-param`` settings per metric.

    Example:
        >>> from kerascope.cli import build_parser
        >>> a = build_parser().parse_args(["evaluate", "--metrics", "road,sparseness", "--metric", "auc",
        ...                                "--metric-param", "road.noise=0.02"])
        >>> metric_choice(a)
        (['road', 'sparseness', 'auc'], {'road': {'noise': 0.02}})
    """
    names = None if not args.metrics else [n.strip() for v in args.metrics for n in v.split(",") if n.strip()]
    params: dict[str, dict] = {}
    for item in args.metric_param:
        key, sep, value = item.partition("=")
        metric, dot, name = key.strip().partition(".")
        if not (sep and dot and metric and name):
            raise ValueError(f"--metric-param takes METRIC.KEY=VALUE. Received: --metric-param {item!r}. "
                             "Example: --metric-param pixel_flipping.features_in_step=64.")
        params.setdefault(metric, {})[name] = _value(value)
    return names, params


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write CSV, Markdown, plots and ``index.html`` to ``--out``.

    Example:
        >>> from kerascope.cli import main
        >>> main(["evaluate", "--methods", "gradcam", "--n", "4", "--out", "/tmp/ks-eval"])  # doctest: +SKIP
        0
    """
    from kerascope.evaluation import (
        _input_size,
        benchmark,
        bundled_data,
        check_data,
        plot_curves,
        plot_metrics,
        plot_sanity,
        plot_sanity_curves,
    )
    from kerascope.evaluation_metrics import available_metrics, check_metrics
    from kerascope.io.models import load_model
    from kerascope.report.html import write_report

    names, metric_params = metric_choice(args)
    if names == ["list"]:
        emit(args, {"metrics": available_metrics()}, "\n".join(available_metrics()))
        return 0
    chosen = check_metrics(names)  # a misspelt metric fails before the model loads

    if args.data:
        images, masks, labels = _load_data(args.data)  # a missing or malformed file fails before the model loads
    if args.model:
        model = load_model(args.model, safe_mode=not args.unsafe)
    else:
        from kerascope.data import demo_model_path

        model = load_model(demo_model_path())
    if not args.data:
        images, labels, masks = bundled_data(args.n, args.seed, _input_size(model)[0])
    # the model and the data must fit before any work: one message naming both, exit 2
    check_data(model, images, masks, labels, source=args.data or "generated")
    images, masks = np.asarray(images, np.float32), np.asarray(masks, bool)
    labels = None if labels is None else np.asarray(labels, np.int64)
    chatty = not (args.quiet or args.json)
    start = time.perf_counter()
    result = benchmark(
        model, images, masks, labels, args.method,
        n=args.n, seed=args.seed, steps=args.steps, sanity_images=args.sanity_images,
        batch_size=args.batch_size, baselines=not args.no_references,
        metrics=chosen, metric_params=metric_params, level=args.level, interval=args.interval,
        on_method=(lambda name: stderr(f"evaluating {name} ...")) if chatty else None,
        progress=chatty,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.write_csv(out / "benchmark.csv")
    markdown = result.markdown()
    command = "kerascope evaluate " + " ".join(
        ([args.model] if args.model else []) + ([args.data] if args.data else [])
        + (["--methods", *args.method] if args.method else [])
        + [f"--n {args.n}", f"--steps {args.steps}", f"--sanity-images {args.sanity_images}", f"--seed {args.seed}"]
        + ([f"--metrics {','.join(chosen)}"] if names else [])
        + [f"--metric-param {p}" for p in args.metric_param]
        + ([f"--interval {args.interval}"] if args.interval != "t" else [])
        + ([f"--level {args.level}"] if args.level != 0.95 else [])
    )
    settings = ", ".join(f"{k}={v}" for k, v in result.config.items())
    (out / "benchmark.md").write_text(f"{markdown}\n\n_{settings}; regenerate with `{command}`_\n", encoding="utf-8")
    with warnings.catch_warnings():  # a plot without curves (every method failed) has an empty legend
        warnings.filterwarnings("ignore", message="No artists with labels found to put in legend")
        pictures = {}
        if "deletion" in chosen and "insertion" in chosen:
            pictures["curves"] = plot_curves(result, out / "curves.png").name
        if any(r.cells for r in result.rows):
            pictures["metrics (mean and confidence interval over images)"] = plot_metrics(
                result, out / "metrics.png").name
        if args.sanity_images > 0 and "sanity" in chosen:
            pictures["sanity cascade"] = plot_sanity(result, images[0], out / "sanity.png").name
            pictures["sanity curves"] = plot_sanity_curves(result, out / "sanity_curves.png").name
    figures = "".join(
        f"<figure style='margin:8px 0'><img style='width:auto;height:auto;max-width:100%' src='{src}' "
        f"alt='{name}'><figcaption>{name}</figcaption></figure>"
        for name, src in pictures.items()
    )
    report = write_report(
        out / "index.html", [], title="kerascope evaluate", subtitle=settings,
        tables={"Benchmark (↑ higher / ↓ lower is better)": result.table(), "Plots": figures},
    )
    seconds = time.perf_counter() - start
    summary = {"rows": result.table(), "config": result.config, "seconds": seconds, "report": str(report),
               "files": sorted(p.name for p in out.iterdir())}
    emit(args, json.loads(json.dumps(summary, default=float)),
         f"{markdown}\n\n{settings}; {seconds:.1f}s -> {report}")
    return 1 if any(r.error and r.applicable for r in result.rows) else 0
