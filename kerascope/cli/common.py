"""Options and output helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kerascope.io.images import PREPROCESS


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` (no progress bars) and ``--json`` (machine-readable summary).

    Example:
        >>> p = argparse.ArgumentParser(); add_output_flags(p)
        >>> p.parse_args(["--json"]).json
        True
    """
    parser.add_argument("--quiet", action="store_true", help="no progress bars or chatter")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def add_image_flags(parser: argparse.ArgumentParser) -> None:
    """Image loading options: ``--preprocess``, ``--size``.

    Example:
        >>> p = argparse.ArgumentParser(); add_image_flags(p)
        >>> p.parse_args(["--size", "32", "32"]).size
        [32, 32]
    """
    parser.add_argument(
        "--preprocess", default="unit", choices=sorted(PREPROCESS),
        help="how pixels become model inputs: " + "; ".join(f"{k}: {v}" for k, v in PREPROCESS.items()),
    )
    parser.add_argument("--size", nargs=2, type=int, metavar=("H", "W"),
                        help="resize images to H W (default: the model's input size)")


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """``MODEL_FILE`` and ``--unsafe``.

    Example:
        >>> p = argparse.ArgumentParser(); add_model_flags(p)
        >>> p.parse_args(["m.keras"]).unsafe
        False
    """
    parser.add_argument("model", metavar="MODEL_FILE", help="a .keras or .h5 model file")
    parser.add_argument("--unsafe", action="store_true",
                        help="allow loading model files that run code (Lambda layers); only for trusted files")


def emit(args: argparse.Namespace, summary: dict[str, Any], text: str) -> None:
    """Print ``summary`` as JSON with ``--json``, else ``text`` (unless ``--quiet``).

    Example:
        >>> emit(argparse.Namespace(json=True, quiet=False), {"a": 1}, "ignored")
        {"a": 1}
    """
    if getattr(args, "json", False):
        print(json.dumps(summary))
    elif not getattr(args, "quiet", False):
        print(text)


def load_class_names(path: str | None) -> list[str] | None:
    """Class names from a text file (one per line) or JSON list.

    Example:
        >>> load_class_names(None) is None
        True
    """
    if path is None:
        return None
    from pathlib import Path

    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return [str(x) for x in json.loads(text)]
    return [line.strip() for line in text.splitlines() if line.strip()]


def stderr(message: str) -> None:
    """Print to standard error.

    Example:
        >>> stderr("note")  # doctest: +SKIP
    """
    print(message, file=sys.stderr)
