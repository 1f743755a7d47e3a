"""``kerascope batch MODEL_FILE INPUT --out DIR [--engine local|ray] ...``: explain a whole data set."""

from __future__ import annotations

import argparse
import json
from typing import Any

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
    parse_params,
    stderr,
    with_precision,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``batch`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> a = build_parser().parse_args(["batch", "m.keras", "imgs/", "--out", "o", "--engine", "ray"])
        >>> a.engine, a.workers, a.map_dtype
        ('ray', 2, 'float32')
    """
    p = sub.add_parser(
        "batch",
        help="explain a whole data set into sharded Parquet (resumable; local or Ray)",
        description="Explain every input of INPUT (a folder of images searched recursively, a list file, "
        "a .npy or .parquet file). Writes OUT/shards/part-*.parquet (one row per input), OUT/errors.parquet, "
        "OUT/manifest.json and with --overlays OUT/overlays/*.png. Run the same command again to resume.",
        **examples("kerascope batch model.keras photos/ --method gradcam --targets labels.csv --out runs/a",
                   "kerascope batch model.keras images.npy --method smoothgrad --param samples=16 --out runs/b "
                   "--engine ray"),
    )
    add_model_flags(p)
    p.add_argument("input", metavar="INPUT", help="folder, list file (.txt/.lst), .npy or .parquet")
    add_method_flag(p, "gradcam; one method per run")
    p.add_argument("--layer", help="layer path for CAM methods")
    add_param_flag(p)
    add_target_flag(p, str, "; or a CSV file of 'id,class' rows")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--batch-size", type=int, default=32)
    add_precision_flag(p)
    p.add_argument("--workers", type=int, default=2, help="Ray actors (each loads the model once)")
    p.add_argument("--address", help="an existing Ray cluster (e.g. auto or ray://head:10001); default: local Ray")
    p.add_argument("--shard-size", type=int, default=512, help="inputs per Parquet shard (unit of resume)")
    p.add_argument("--overlays", action="store_true", help="also write overlay PNGs to OUT/overlays")
    p.add_argument("--map-size", nargs=2, type=int, metavar=("H", "W"), help="resize stored maps to H W")
    p.add_argument("--map-dtype", choices=["float16", "float32"], default="float32")
    p.add_argument("--overwrite", action="store_true", help="discard a different earlier run in OUT")
    add_image_flags(p)
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``batch``; exit code 1 if some inputs failed (they are listed in OUT/errors.parquet).

    Example:
        >>> from kerascope.cli import main
        >>> main(["batch", "missing.keras", "imgs", "--out", "o"])  # doctest: +SKIP
        2
    """
    from kerascope.batch import run as batch_run

    methods = args.method or ["gradcam"]
    if len(methods) != 1:
        raise ValueError(f"`batch` runs one method per run. Received: --method {','.join(methods)}. "
                         "Run the command once per method, each with its own --out folder.")
    # JSON round trip: parameters are compared with the saved manifest's (JSON) copy on resume
    params = json.loads(json.dumps(with_precision(parse_params(args.param), args.precision)))
    targets: Any = args.target
    if targets is not None and targets.lstrip("-").isdigit():
        targets = int(targets)
    summary = batch_run(
        args.model, args.input, args.out,
        method=methods[0], layer=args.layer, targets=targets, engine=args.engine,
        batch_size=args.batch_size, workers=args.workers, address=args.address, overlays=args.overlays,
        map_size=tuple(args.map_size) if args.map_size else None, map_dtype=args.map_dtype,
        shard_size=args.shard_size, size=tuple(args.size) if args.size else None, preprocess=args.preprocess,
        method_params=params, safe_mode=not args.unsafe, overwrite=args.overwrite,
        progress=not (args.quiet or args.json),
    )
    emit(args, summary.as_dict(), summary.text())
    if summary.errors_total:  # errors always reach stderr: --quiet silences progress and notes only
        for line in failed_inputs(summary.errors_table):
            stderr(f"kerascope batch: {line}")
        stderr(f"kerascope batch: {summary.errors_total} input(s) failed; reasons in {summary.errors_table}")
    return 1 if summary.errors_total else 0  # a resumed run with earlier failures exits 1 as the first run did


def failed_inputs(errors_table: str | None, limit: int = 20) -> list[str]:
    """``"<id>: <reason>"`` for the first ``limit`` failed inputs of a run's errors table (and how many more).

    Example:
        >>> failed_inputs(None)
        []
    """
    if not errors_table:
        return []
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(errors_table, columns=["id", "error"])
    except (OSError, ValueError) as error:
        return [f"could not read the errors table {errors_table} ({error})"]
    rows = [f"{row['id']}: {row['error']}" for row in table.slice(0, limit).to_pylist()]
    if table.num_rows > limit:
        rows.append(f"... and {table.num_rows - limit} more")
    return rows
