"""``kerascope demo``: the main job on the bundled model and images."""

from __future__ import annotations

import argparse

from kerascope.cli.common import add_method_flag, emit, examples, finish_parser

DEMO_METHODS = ("gradcam", "guided_gradcam", "saliency", "gradient_x_input", "guided_backprop")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``demo`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["demo", "--out", "d"]).out
        'd'
    """
    p = sub.add_parser(
        "demo", help="explain the bundled images with the bundled model; writes an HTML report",
        **examples("kerascope demo --out demo_out --method gradcam,saliency"),
    )
    p.add_argument("--out", default="demo_out", help="output folder (default: demo_out)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run's files in OUT")
    add_method_flag(p, ", ".join(DEMO_METHODS))
    finish_parser(p, run, images=False)


def run(args: argparse.Namespace) -> int:
    """Run the demo.

    Example:
        >>> from kerascope.cli import main
        >>> main(["demo", "--out", "/tmp/kerascope-demo", "--quiet"])  # doctest: +SKIP
        0
    """
    from kerascope.data import demo_images, demo_metadata, demo_model_path
    from kerascope.io.models import load_model
    from kerascope.methods.registry import accepted_parameters, available, get, method_name
    from kerascope.pipeline import explain_images

    meta = demo_metadata()
    methods = args.method or [m for m in DEMO_METHODS if m in available()]
    # conv3b is the CAMs' feature layer; gradient methods keep attributing at the pixels
    cams = {method_name(m): {"layer": "conv3b"} for m in methods
            if "layer" in accepted_parameters(get(m)) and not getattr(get(m), "layer_attribution", False)}
    summary = explain_images(
        load_model(demo_model_path()), demo_images(), args.out,
        methods=methods, method_params=cams, class_names=meta["class_names"],
        progress=not (args.quiet or args.json), title="kerascope demo: synthetic shapes",
        model_path=demo_model_path(), overwrite=args.overwrite,
    )
    emit(args, summary.as_dict(),
         f"demo: {summary.processed} images x {len(summary.methods)} methods in {summary.seconds:.1f}s\n"
         f"open {summary.report}")
    return 0
