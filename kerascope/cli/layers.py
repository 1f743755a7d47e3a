"""``kerascope layers MODEL_FILE``: every addressable layer path with its output shape."""

from __future__ import annotations

import argparse

from kerascope.cli.common import add_model_flags, emit, examples


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``layers`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["layers", "m.keras", "--filter", "conv"]).filter
        'conv'
    """
    p = sub.add_parser("layers", help="list layer paths (usable as --layer) with output shapes",
                       **examples("kerascope layers model.keras --filter conv"))
    add_model_flags(p)
    p.add_argument("--filter", help="only paths containing this text")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the layer table.

    Example:
        >>> from kerascope.cli import main
        >>> from kerascope.data import demo_model_path
        >>> main(["layers", str(demo_model_path()), "--filter", "gap"])  # doctest: +ELLIPSIS
        gap ...
        0
    """
    from kerascope.core.layers import layers
    from kerascope.io.models import load_model

    infos = [i for i in layers(load_model(args.model, safe_mode=not args.unsafe))
             if not args.filter or args.filter in i.path]
    width = max([len(i.path) for i in infos] + [4])
    text = "\n".join(f"{i.path:<{width}}  {i.class_name:<22} {i.output_shape}" for i in infos)
    emit(args, {"layers": [{"path": i.path, "class": i.class_name, "output_shape": i.output_shape} for i in infos]}, text)
    return 0
