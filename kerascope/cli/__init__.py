"""The ``kerascope`` command line: a thin layer over the public API.

Each sub-command lives in its own module with ``add_parser(subparsers)`` and
``run(args) -> int``; :data:`COMMANDS` lists them in help order.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kerascope.cli import batch, demo, evaluate, evaluate_data, explain, layers, methods, report, visualize
from kerascope.cli.quiet import quiet_backends

_BACKEND_MODULES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def missing_backend_message(error: ModuleNotFoundError) -> str | None:
    """A message naming the extra to install when ``error`` is the configured Keras backend missing.

    Example:
        >>> print(missing_backend_message(ModuleNotFoundError("No module named 'jax'", name="jax")))
        ... # doctest: +ELLIPSIS
        the Keras backend 'jax' is not installed (KERAS_BACKEND=...). Install it with ...
    """
    import os

    backend = (error.name or "").split(".")[0]
    if backend not in _BACKEND_MODULES:
        return None
    configured = os.environ.get("KERAS_BACKEND", "tensorflow (the default)")
    other = "jax" if backend == "tensorflow" else "tensorflow"
    return (
        f"the Keras backend {backend!r} is not installed (KERAS_BACKEND={configured}). Install it with "
        f"`pip install -e \".[{backend}]\"` from a kerascope checkout (or `pip install \"kerascope[{backend}]\"`), "
        f"or choose an installed backend, e.g. `export KERAS_BACKEND={other}` (see docs/backends.md)."
    )

COMMANDS = [explain, layers, methods, demo, report, batch, evaluate, evaluate_data, visualize]


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
    parser.add_argument("--verbose", action="store_true",
                        help="show the deep-learning backend's own start-up logs and warnings")
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
        with quiet_backends(verbose=args.verbose):
            return int(args.run(args) or 0)
    except ModuleNotFoundError as error:
        message = missing_backend_message(error)
        if message is None:
            raise
        print(f"kerascope {args.command}: error: {message}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, TypeError) as error:
        print(f"kerascope {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kerascope: interrupted; files already written are kept.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
