"""Options and output helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
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
        "--preprocess", default="auto", choices=["auto", *PREPROCESS],
        help="how pixels become model inputs (default: auto: raw when the model starts with a Rescaling/"
             "Normalization layer, else unit; the choice is printed and recorded): "
             + "; ".join(f"{k}: {v}" for k, v in PREPROCESS.items()),
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


class _NamesAction(argparse.Action):
    """Collects names from repeated flags, each value possibly comma-separated (``a,b c``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        names = list(getattr(namespace, self.dest, None) or [])
        for value in [values] if isinstance(values, str) else values:
            names.extend(part.strip() for part in str(value).split(",") if part.strip())
        setattr(namespace, self.dest, names)


def add_method_flag(parser: argparse.ArgumentParser, help_default: str) -> None:
    """``--method`` / ``--methods``: repeatable, space- or comma-separated method names (dest ``method``).

    Example:
        >>> p = argparse.ArgumentParser(); add_method_flag(p, "gradcam")
        >>> p.parse_args(["--method", "gradcam,saliency", "--methods", "rise", "occlusion"]).method
        ['gradcam', 'saliency', 'rise', 'occlusion']
    """
    parser.add_argument(
        "--method", "--methods", dest="method", nargs="+", action=_NamesAction, metavar="NAME",
        help=f"method names, repeatable or comma-separated (default: {help_default}); see `kerascope methods`",
    )


def add_precision_flag(parser: argparse.ArgumentParser) -> None:
    """``--precision {float32,bfloat16,float16}``: the compute type of the model's passes (``precision=``).

    Example:
        >>> p = argparse.ArgumentParser(); add_precision_flag(p)
        >>> p.parse_args(["--precision", "bfloat16"]).precision
        'bfloat16'
    """
    parser.add_argument(
        "--precision", choices=["float32", "bfloat16", "float16"], default=None,
        help="compute type of the model's passes (default float32); results stay float32. Opt-in: "
        "docs/performance.md lists, per method, the error against float32 and where it is faster",
    )


def with_precision(params: dict, precision: str | None) -> dict:
    """``params`` with ``precision`` added when the flag was given.

    Example:
        >>> with_precision({"samples": 8}, "bfloat16"), with_precision({}, None)
        ({'samples': 8, 'precision': 'bfloat16'}, {})
    """
    return params if precision is None else {**params, "precision": precision}


def add_target_flag(parser: argparse.ArgumentParser, kind: type = int, extra: str = "") -> None:
    """``--target`` / ``--targets`` (dest ``target``): the class to explain; default the predicted class.

    Example:
        >>> p = argparse.ArgumentParser(); add_target_flag(p)
        >>> p.parse_args(["--targets", "3"]).target
        3
    """
    parser.add_argument("--target", "--targets", dest="target", type=kind, metavar="CLASS",
                        help="class index to explain (default: the predicted class)" + extra)


def add_param_flag(parser: argparse.ArgumentParser) -> None:
    """``--param KEY=VALUE`` (repeatable): a method hyper-parameter, JSON-parsed when it parses.

    Example:
        >>> p = argparse.ArgumentParser(); add_param_flag(p)
        >>> p.parse_args(["--param", "samples=8"]).param
        ['samples=8']
    """
    parser.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="method parameter (repeatable), e.g. --param samples=20 --param window=[8,8]; values are JSON "
             "when they parse (numbers, lists, true/false), else strings; given to every chosen method that "
             "accepts it",
    )


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` pairs; values are JSON when they parse (numbers, lists), else strings.

    Example:
        >>> parse_params(["samples=20", "baseline=blur", "window=[8, 8]"])
        {'samples': 20, 'baseline': 'blur', 'window': (8, 8)}
    """
    params: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--param expects KEY=VALUE. Received: --param {item!r}.")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        params[name.strip()] = tuple(value) if isinstance(value, list) else value
    return params


def examples(*lines: str) -> dict[str, Any]:
    """Keyword arguments for ``add_parser`` that show example command lines at the end of ``--help``.

    Example:
        >>> examples("kerascope methods")["epilog"]
        'example:\\n  kerascope methods'
    """
    label = "example:" if len(lines) == 1 else "examples:"
    return {"epilog": label + "\n" + "\n".join(f"  {line}" for line in lines),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


def add_run_flags(parser: argparse.ArgumentParser, *, default_method: str, layer_help: str, target_kind: type = int,
                  target_extra: str = "", out_default: str | None = None, overwrite_help: str) -> None:
    """The flags every explaining command shares, defined once: ``MODEL_FILE``, ``--unsafe``, ``--method``,
    ``--layer``, ``--target``, ``--param``, ``--out``, ``--overwrite``, ``--batch-size``, ``--precision``.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_run_flags(p, default_method="gradcam", layer_help="a layer", overwrite_help="replace")
        >>> a = p.parse_args(["m.keras", "--method", "saliency", "--batch-size", "8", "--out", "o"])
        >>> a.method, a.batch_size, a.out, a.overwrite
        (['saliency'], 8, 'o', False)
    """
    add_model_flags(parser)
    add_method_flag(parser, default_method)
    parser.add_argument("--layer", help=layer_help)
    add_target_flag(parser, target_kind, target_extra)
    add_param_flag(parser)
    if out_default is None:
        parser.add_argument("--out", required=True, help="output folder")
    else:
        parser.add_argument("--out", default=out_default, help=f"output folder (default: {out_default})")
    parser.add_argument("--overwrite", action="store_true", help=overwrite_help)
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per model pass (default: 32)")
    add_precision_flag(parser)


def finish_parser(parser: argparse.ArgumentParser, run: Any, *, images: bool = True) -> None:
    """Add the image options (``images=True``) and ``--quiet`` / ``--json``, and set the command's ``run``.

    Example:
        >>> p = argparse.ArgumentParser(); finish_parser(p, print)
        >>> p.parse_args(["--quiet"]).run is print
        True
    """
    if images:
        add_image_flags(parser)
    add_output_flags(parser)
    parser.set_defaults(run=run)


def check_batch_size(value: int) -> int:
    """``--batch-size``, refused below 1 before anything is loaded.

    Example:
        >>> check_batch_size(0)
        Traceback (most recent call last):
        ValueError: --batch-size must be at least 1. Received: --batch-size 0.
    """
    if value < 1:
        raise ValueError(f"--batch-size must be at least 1. Received: --batch-size {value}.")
    return value

