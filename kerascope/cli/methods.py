"""``kerascope methods``: the registered methods with one-line descriptions."""

from __future__ import annotations

import argparse

from kerascope.cli.common import emit, examples


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``methods`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["methods"]).command
        'methods'
    """
    p = sub.add_parser("methods", help="list the available explanation methods",
                       **examples("kerascope methods --json"))
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the method table.

    Example:
        >>> from kerascope.cli import main
        >>> main(["methods"])  # doctest: +ELLIPSIS
        ablationcam ...gradcam ...saliency ...
        0
    """
    from kerascope.catalog import describe

    rows = describe()
    width = max(len(name) for name, _ in rows)
    emit(args, {"methods": dict(rows)}, "\n".join(f"{name:<{width}}  {text}" for name, text in rows))
    return 0
