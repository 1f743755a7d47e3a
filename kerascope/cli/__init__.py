"""The ``kerascope`` command line: a thin layer over the public API.

Each sub-command lives in its own module with ``add_parser(subparsers)`` and
``run(args) -> int``; :data:`COMMANDS` lists them in help order.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kerascope.cli import batch, demo, evaluate, explain, layers, methods, report

COMMANDS = [explain, layers, methods, demo, report, batch, evaluate]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command.

    Example:
        >>> build_parser().parse_args(["layers", "m.keras"]).command
        'layers'
    """
    parser = argparse.ArgumentParser(
        prog="kerascope",
        description="Explain the predictions of Keras 3 models (saliency, Grad-CAM, ...).",
    )
    from kerascope import __version__

    parser.add_argument("--version", action="version", version=f"kerascope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 1 partial failure, 2 usage error).

    Example:
        >>> main(["methods", "--json"])  # doctest: +SKIP
        0
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError, TypeError) as error:
        print(f"kerascope {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kerascope: interrupted; files already written are kept.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
