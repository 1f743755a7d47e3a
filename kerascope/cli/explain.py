"""``kerascope explain MODEL_FILE IMAGE... [--method ...] [--layer] [--target] [--out DIR]``."""

from __future__ import annotations

import argparse

from kerascope.cli.common import (
    add_image_flags,
    add_method_flag,
    add_model_flags,
    add_output_flags,
    add_param_flag,
    add_precision_flag,
    add_target_flag,
    emit,
    examples,
    load_class_names,
    parse_params,
    stderr,
    with_precision,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``explain`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["explain", "m.keras", "a.png", "--method", "saliency"]).method
        ['saliency']
    """
    p = sub.add_parser(
        "explain", help="explain image files: overlays, .npz attributions, index.html",
        description="Explain image files with one or more methods: overlays, <method>.npz attributions and "
        "an HTML report in --out.",
        **examples("kerascope explain model.keras photos/ --method gradcam,saliency --target 3 --out results/"),
    )
    add_model_flags(p)
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders (searched recursively)")
    add_method_flag(p, "gradcam")
    p.add_argument("--layer", help="layer path, e.g. inception_v3/mixed10: the feature layer of CAM methods "
                   "(default: the last layer with a spatial map); when no CAM is chosen, the layer gradient methods "
                   "(saliency, integrated_gradients, smoothgrad, ...) attribute at. Other methods use the pixels")
    add_target_flag(p)
    p.add_argument("--out", default="kerascope-out", help="output folder (default: kerascope-out)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run's files in OUT (index.html, *.npz, inputs/, overlays/, ...); "
                   "without it a folder holding them is refused")
    p.add_argument("--labels", help="class names: text file (one per line) or JSON list")
    add_param_flag(p)
    p.add_argument("--batch-size", type=int, default=32)
    add_precision_flag(p)
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
    add_image_flags(p)
    add_output_flags(p)
    p.set_defaults(run=run)


def _grid(model: object, path: str) -> str:
    """`` (8x8 positions)`` for an image layer's output (how fine a CAM can be), else ``""``."""
    try:
        from kerascope.core.layers import find_layer

        shape = tuple(find_layer(model, path).output.shape)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - shared or nested layers without one output shape: say nothing
        return ""
    return f" ({shape[1]}x{shape[2]} positions)" if len(shape) == 4 and shape[1] and shape[2] else ""


def run(args: argparse.Namespace) -> int:
    """Run ``explain``; exit code 1 if some images could not be read.

    Example:
        >>> from kerascope.cli import main
        >>> main(["explain", "missing.keras", "x.png"])  # doctest: +SKIP
        2
    """
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
    for name in args.method or ["gradcam"]:
        get(name)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1. Received: --batch-size {args.batch_size}.")
    params = with_precision(parse_params(args.param), args.precision)
    class_names = load_class_names(args.labels)
    paths = []
    for item in args.images:
        found = find_images(item)
        paths.extend(found if found else [item])
    if args.size:
        check_image_size(args.size, count=len(paths))
    prepare_output_dir(args.out)
    check_reusable(args.out, args.overwrite)
    model = load_model(args.model, safe_mode=not args.unsafe)
    chatty = not (args.quiet or args.json)
    if chatty:
        mode, reason = resolve_preprocess(model, args.preprocess)
        stderr(f"preprocessing: {mode} ({reason})")
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
        stderr("layers: " + ", ".join(f"{name}: {path}{_grid(model, path)}" for name, path in summary.layers.items()))
    emit(args, summary.as_dict(), f"explained {summary.processed} image(s) with {', '.join(summary.methods)} "
                                  f"in {summary.seconds:.1f}s -> {summary.report}")
    for name, why in summary.errors.items():  # errors always reach stderr: --quiet silences progress and notes only
        stderr(f"kerascope explain: could not read {name}: {reason_without_name(name, why)}")
    return 1 if summary.errors else 0
