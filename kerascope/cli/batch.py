"""``kerascope batch MODEL_FILE INPUT --out DIR [--engine local|ray] ...``: explain a whole data set."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kerascope.cli import common


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
        "a .npy, .csv or .parquet file: images, or the rows of a tabular / time-series model). Writes OUT/shards/part-*.parquet (one row per input), OUT/errors.parquet, "
        "OUT/manifest.json and with --overlays OUT/overlays/*.png. Run the same command again to resume.",
        **common.examples(
            "kerascope batch model.keras photos/ --method gradcam --targets labels.csv --out runs/a",
            "kerascope batch model.keras images.npy --method smoothgrad --param samples=16 --out runs/b --engine ray",
            "kerascope batch tabular.keras rows.csv --method integrated_gradients --out runs/c"),
    )
    common.add_run_flags(
        p, default_method="gradcam for images, integrated_gradients for tabular and time-series models; one "
        "method per run", layer_help="layer path for CAM methods", target_kind=str,
        target_extra="; or a CSV file of 'id,class' rows", overwrite_help="discard a different earlier run in OUT")
    p.add_argument("input", metavar="INPUT",
                   help="folder, list file (.txt/.lst), .npy, .csv or .parquet (images, or the rows of a tabular / "
                   "time-series model)")
    p.add_argument("--features", action=common._NamesAction, nargs="+", metavar="NAME",
                   help="names of a .csv / .parquet / .npy file's features, comma-separated (default: the header or "
                   "schema); written to OUT/features.json")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--workers", type=int, default=2, help="Ray actors (each loads the model once)")
    p.add_argument("--address", help="an existing Ray cluster (e.g. auto or ray://head:10001); default: local Ray")
    p.add_argument("--shard-size", type=int, default=512, help="inputs per Parquet shard (unit of resume)")
    p.add_argument("--overlays", action="store_true", help="also write overlay PNGs to OUT/overlays (images only)")
    p.add_argument("--map-size", nargs=2, type=int, metavar=("H", "W"), help="resize stored maps to H W")
    p.add_argument("--map-dtype", choices=["float16", "float32"], default="float32")
    common.finish_parser(p, run)


def run(args: argparse.Namespace) -> int:
    """Run ``batch``; exit code 1 if some inputs failed (they are listed in OUT/errors.parquet).

    Example:
        >>> from kerascope.cli import main
        >>> main(["batch", "missing.keras", "imgs", "--out", "o"])  # doctest: +SKIP
        2
    """
    from kerascope.batch import run as batch_run

    data, names, rows = _data_rows(args)
    methods = args.method or (["integrated_gradients"] if rows else ["gradcam"])
    if len(methods) != 1:
        raise ValueError(f"`batch` runs one method per run. Received: --method {','.join(methods)}. "
                         "Run the command once per method, each with its own --out folder.")
    # JSON round trip: parameters are compared with the saved manifest's (JSON) copy on resume
    params = json.loads(json.dumps(common.with_precision(common.parse_params(args.param), args.precision)))
    targets: Any = args.target
    if targets is not None and targets.lstrip("-").isdigit():
        targets = int(targets)
    summary = batch_run(
        args.model, args.input if data is None else data, args.out,
        method=methods[0], layer=args.layer, targets=targets, engine=args.engine,
        batch_size=args.batch_size, workers=args.workers, address=args.address, overlays=args.overlays,
        map_size=tuple(args.map_size) if args.map_size else None, map_dtype=args.map_dtype,
        shard_size=args.shard_size, size=tuple(args.size) if args.size else None, preprocess=args.preprocess,
        method_params=params, safe_mode=not args.unsafe, overwrite=args.overwrite,
        progress=not (args.quiet or args.json),
    )
    if names is not None:
        from pathlib import Path

        (Path(args.out) / "features.json").write_text(json.dumps({"feature_names": names}), encoding="utf-8")
    common.emit(args, summary.as_dict(), summary.text())
    if summary.errors_total:  # errors always reach stderr: --quiet silences progress and notes only
        for line in failed_inputs(summary.errors_table):
            common.stderr(f"kerascope batch: {line}")
        common.stderr(f"kerascope batch: {summary.errors_total} input(s) failed; reasons in {summary.errors_table}")
    return 1 if summary.errors_total else 0  # a resumed run with earlier failures exits 1 as the first run did


def _data_rows(args: argparse.Namespace) -> tuple[Any, list[str] | None, bool]:
    """A tabular / time-series model's rows (read with the model's input shape; None for a .npy file, which
    the batch engine memory-maps), their feature names, and whether the model reads rows (not images)."""
    from pathlib import Path

    from kerascope.io.tables import is_data_file

    suffix = Path(args.input).suffix.lower()
    if not is_data_file(args.input) or (suffix in (".parquet", ".pq") and _image_parquet(args.input)):
        if args.features:
            raise ValueError("--features names the columns of a .npy / .csv / .parquet file of rows. "
                             f"Received: INPUT {args.input}.")
        return None, None, False
    from kerascope.cli.explain_data import model_kind, refusal
    from kerascope.io.models import load_model
    from kerascope.io.tables import read_data

    model = load_model(args.model, safe_mode=not args.unsafe)
    kind = model_kind(model)
    if kind == "image":
        if suffix == ".npy":
            return None, None, False  # an array of images: the batch engine reads it
        raise ValueError(refusal("image", args.input))
    if kind == "text":
        raise ValueError(f"`kerascope batch` explains images, tabular and time-series rows. Received: a model "
                         f"reading token ids ({args.model}). Use `kerascope explain {args.model} ids.npy` or in "
                         "Python: ks.explain_tokens(model, token_ids).")
    if args.overlays:
        raise ValueError("--overlays draws images; this model reads tabular / time-series rows. Received: --overlays.")
    if suffix == ".npy":  # memory-mapped by the batch engine; only the names are checked here
        import numpy as np

        width = np.load(args.input, mmap_mode="r").shape[-1]
        if args.features and len(args.features) != width:
            raise ValueError(f"--features names {len(args.features)} feature(s); the inputs have {width}. "
                             f"Received: features={args.features}.")
        return None, args.features, True
    data = read_data(args.input, tuple(model.inputs[0].shape)[1:], names=args.features)
    return data.values, data.feature_names, True


def _image_parquet(path: str) -> bool:
    """Whether a Parquet file holds images (``path`` / ``image`` columns) or ``array`` rows: the batch engine's own."""
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except (OSError, ValueError):
        return True  # the batch engine says what is wrong with it
    return bool(names & {"path", "image", "array"})


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
