"""``kerascope report RESULTS_DIR``: rebuild ``index.html`` from saved explanations, without the model."""

from __future__ import annotations

import argparse

from kerascope.cli.common import emit, examples, finish_parser, load_class_names


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``report`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["report", "out", "--labels", "names.txt"]).labels
        'names.txt'
    """
    p = sub.add_parser(
        "report",
        help="rebuild RESULTS_DIR/index.html from the saved .npz explanations and inputs/ (no model needed)",
        **examples("kerascope report results/ --labels classes.txt --embed"),
    )
    p.add_argument("results", metavar="RESULTS_DIR", help="a folder written by `kerascope explain` or `demo`")
    p.add_argument("--labels", help="class names: text file (one per line) or JSON list")
    p.add_argument("--title", help="page title (default: the saved one)")
    p.add_argument("--redraw", action="store_true", help="redraw every overlay (default: only missing ones)")
    p.add_argument("--cmap", default=None,
                   help="matplotlib colormap for redrawn overlays (default: RdBu_r centred at 0 for signed methods, "
                   "magma for unsigned ones)")
    p.add_argument("--alpha", type=float, default=0.6, help="opacity of redrawn overlays (default: 0.6)")
    p.add_argument("--embed", action="store_true", help="inline the pictures: index.html works as a single file")
    p.add_argument("--shared-scale", action="store_true",
                   help="redraw with one colour scale for every panel of a method (default: each image its own)")
    finish_parser(p, run, images=False)


def run(args: argparse.Namespace) -> int:
    """Rebuild the report; exit code 1 when some saved files could not be used (listed on the page).

    Example (a folder with nothing saved in it: exit code 2, and the reason on stderr):
        >>> import tempfile
        >>> from kerascope.cli import main
        >>> main(["report", tempfile.mkdtemp(), "--quiet"])
        2
    """
    import time

    from kerascope.report.html import read_report_data
    from kerascope.report.rebuild import rebuild_report

    start = time.perf_counter()
    path = rebuild_report(
        args.results,
        class_names=load_class_names(args.labels),
        title=args.title,
        redraw=args.redraw,
        cmap=args.cmap,
        alpha=args.alpha,
        embed_images=args.embed,
        shared_scale=args.shared_scale,
        progress=not (args.quiet or args.json),
    )
    data = read_report_data(path.parent) or {}
    entries = data.get("entries", [])
    summary = {
        "report": str(path),
        "images": len(entries),
        "methods": list(dict.fromkeys(m for e in entries for m in e.overlays)),  # in the order given
        "errors": data.get("errors", {}),
        "unreadable": data.get("unreadable", {}),
        "seconds": round(time.perf_counter() - start, 3),
    }
    lines = [f"rebuilt {path} ({summary['images']} images, methods {', '.join(summary['methods'])})"]
    lines += [f"could not use {name}: {why}" for name, why in summary["unreadable"].items()]
    emit(args, summary, "\n".join(lines))
    return 1 if summary["unreadable"] else 0
