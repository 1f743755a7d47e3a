"""``kerascope explain MODEL_FILE IMAGE... [--method ...] [--layer] [--target] [--out DIR]``."""

from __future__ import annotations

import argparse

from kerascope.cli import common


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``explain`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["explain", "m.keras", "a.png", "--method", "saliency"]).method
        ['saliency']
    """
    p = sub.add_parser(
        "explain", help="explain images, tabular / time-series data files or texts: .npz attributions, index.html",
        description="Explain image files, a .npy / .csv / .parquet file of tabular or time-series inputs, or "
        "texts (--text, with a KerasHub preset folder) with one or more methods: <method>.npz attributions and "
        "an HTML report in --out (with overlays for images).",
        **common.examples(
            "kerascope explain model.keras photos/ --method gradcam,saliency --target 3 --out results/",
            "kerascope explain tabular.keras data.csv --method integrated_gradients,saliency --out tab/",
            "kerascope explain sensor.keras series.npy --features temp,pressure --out ts/",
            "kerascope explain my_bert_preset/ --text \"a fine film\" --text-file reviews.txt --out text/"),
    )
    common.add_run_flags(
        p, default_method="gradcam for images, integrated_gradients for tabular, time-series and text models",
        layer_help="layer path, e.g. inception_v3/mixed10: the feature layer of CAM methods (default: the last "
        "layer with a spatial map); when no CAM is chosen, the layer gradient methods (saliency, "
        "integrated_gradients, smoothgrad, ...) attribute at. Other methods use the pixels. For text: the token "
        "embedding (found by default)",
        out_default="kerascope-out",
        overwrite_help="replace an earlier run's files in OUT (index.html, *.npz, inputs/, overlays/, ...); "
        "without it a folder holding them is refused")
    p.add_argument("images", nargs="*", metavar="INPUT",
                   help="image files or folders (searched recursively); or one .npy, .csv or .parquet file of "
                   "tabular / time-series inputs (or token ids) for a model that does not read images")
    p.add_argument("--features", action=common._NamesAction, nargs="+", metavar="NAME",
                   help="names of the data file's features (time series: channels), comma-separated; default: "
                   "the CSV header or Parquet schema")
    p.add_argument("--text", action="append", metavar="TEXT",
                   help="a text to explain (repeatable), with a KerasHub preset folder as MODEL_FILE; its "
                   "preprocessor tokenizes the text")
    p.add_argument("--text-file", metavar="FILE", help="texts to explain, one per line (with --text or alone)")
    p.add_argument("--labels", help="class names: text file (one per line) or JSON list")
    p.add_argument("--cmap", default=None,
                   help="matplotlib colormap for overlays (default: RdBu_r centred at 0 for signed methods, magma "
                   "for unsigned ones)")
    p.add_argument("--alpha", type=float, default=0.6, help="overlay opacity (default: 0.6)")
    p.add_argument("--shared-scale", action="store_true",
                   help="one colour scale for every panel of a method (default: each image its own)")
    p.add_argument("--figures", nargs="?", const="png,svg", default="", metavar="FORMATS",
                   help="also write publication figures (input, overlay, colour bar with unit, caption) to "
                   "OUT/figures/: png, svg and/or pdf (default when given alone: png,svg)")
    p.add_argument("--figure-size", type=float, nargs=2, default=(6.4, 3.2), metavar=("W", "H"),
                   help="figure size in inches (default: 6.4 3.2)")
    p.add_argument("--figure-dpi", type=int, default=200, help="figure resolution (default: 200)")
    common.finish_parser(p, run)


def _grid(model: object, path: str) -> str:
    """`` (8x8 positions)`` for an image layer's output (how fine a CAM can be), else ``""``."""
    try:
        from kerascope.core.layers import find_layer

        shape = tuple(find_layer(model, path).output.shape)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - shared or nested layers without one output shape: say nothing
        return ""
    return f" ({shape[1]}x{shape[2]} positions)" if len(shape) == 4 and shape[1] and shape[2] else ""


def _data_input(args: argparse.Namespace) -> str | None:
    """The one data file of the run (``.npy``, ``.csv``, ``.parquet``), None for images; mixed inputs are refused."""
    from kerascope.io.tables import is_data_file

    data = [item for item in args.images if is_data_file(item)]
    if (args.text or args.text_file) and args.images:
        raise ValueError(
            f"--text / --text-file explain texts with the model's tokenizer; give no INPUT files with them. "
            f"Received: {' '.join(args.images[:3])}. Token ids in a .npy file go without --text."
        )
    if not args.images and not (args.text or args.text_file):
        raise ValueError(
            "Nothing to explain: give image files or folders, one .npy / .csv / .parquet data file, or --text. "
            "Example: kerascope explain model.keras photos/ (see kerascope explain --help)."
        )
    if data and len(args.images) > 1:
        raise ValueError(
            f"A data file is explained on its own (one .npy, .csv or .parquet file per run). Received: "
            f"{' '.join(args.images[:4])}."
        )
    if args.features and not data:
        raise ValueError("--features names the columns of a .npy / .csv / .parquet file. Received: no data file.")
    return data[0] if data else None


def run(args: argparse.Namespace) -> int:
    """Run ``explain``; exit code 1 if some images could not be read.

    Example:
        >>> from kerascope.cli import main
        >>> main(["explain", "missing.keras", "x.png"])  # doctest: +SKIP
        2
    """
    from kerascope.cli.explain_data import model_kind, refusal
    from kerascope.io.images import check_image_size, find_images
    from kerascope.io.models import load_model
    from kerascope.io.paths import prepare_output_dir
    from kerascope.io.preprocessing import resolve_preprocess
    from kerascope.io.staging import check_reusable
    from kerascope.methods.registry import get
    from kerascope.pipeline import explain_images
    from kerascope.report.html import reason_without_name
    from kerascope.viz.overlay import check_overlay_options

    # every option is checked before the model is loaded or anything is computed
    check_overlay_options(args.cmap, args.alpha)
    from kerascope.viz.figure import check_figure_formats

    check_figure_formats(args.figures)
    for name in args.method or []:
        get(name)
    common.check_batch_size(args.batch_size)
    params = common.with_precision(common.parse_params(args.param), args.precision)
    class_names = common.load_class_names(args.labels)
    data = _data_input(args)
    if data is not None or args.text or args.text_file:
        from kerascope.cli.explain_data import run_data, run_text

        prepare_output_dir(args.out)
        check_reusable(args.out, args.overwrite)
        model = load_model(args.model, safe_mode=not args.unsafe)
        if data is None:
            return run_text(args, model, params, class_names)
        return run_data(args, model, data, params, class_names)
    paths = []
    for item in args.images:
        found = find_images(item)
        paths.extend(found if found else [item])
    if args.size:
        check_image_size(args.size, count=len(paths))
    prepare_output_dir(args.out)
    check_reusable(args.out, args.overwrite)
    model = load_model(args.model, safe_mode=not args.unsafe)
    kind = model_kind(model)
    if kind != "image":
        raise ValueError(refusal(kind, " ".join(args.images[:3]) + (" ..." if len(args.images) > 3 else "")))
    chatty = not (args.quiet or args.json)
    if chatty:
        mode, reason = resolve_preprocess(model, args.preprocess)
        common.stderr(f"preprocessing: {mode} ({reason})")
    summary = explain_images(
        model, paths, args.out,
        methods=args.method or ["gradcam"],
        layer=args.layer,
        targets=args.target,
        size=tuple(args.size) if args.size else None,
        preprocess=args.preprocess,
        class_names=class_names,
        batch_size=args.batch_size,
        common_params=params,
        cmap=args.cmap,
        alpha=args.alpha,
        progress=chatty,
        model_path=args.model,
        overwrite=args.overwrite,
        shared_scale=args.shared_scale,
        figures=check_figure_formats(args.figures),
        figure_size=tuple(args.figure_size),
        figure_dpi=args.figure_dpi,
    )
    if chatty and summary.layers:
        common.stderr("layers: " + ", ".join(f"{name}: {path}{_grid(model, path)}" for name, path in summary.layers.items()))
    common.emit(args, summary.as_dict(), f"explained {summary.processed} image(s) with {', '.join(summary.methods)} "
                                  f"in {summary.seconds:.1f}s -> {summary.report}")
    for name, why in summary.errors.items():  # errors always reach stderr: --quiet silences progress and notes only
        common.stderr(f"kerascope explain: could not read {name}: {reason_without_name(name, why)}")
    return 1 if summary.errors else 0
