"""Sharded Parquet output: deterministic shards, atomic writes, a manifest, resume.

Input ``i`` always belongs to shard ``i // shard_size``. A shard is written
as a whole, to a temporary file that is renamed into place
(``shards/part-00007.parquet``), and its SHA-256 is recorded in the manifest
(``"shards": {"7": "<sha256>"}``) right after. A resumed run skips only the
shards whose file still has the recorded checksum and holds exactly the
indices and ids it must hold; every other shard (missing, truncated,
bit-flipped, copied over another, or written without a recorded checksum) is
recomputed. Each shard holds one row per input, failed inputs
included (``error`` is set and ``map`` is null), so every input appears
exactly once in the union of the shards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.io.paths import file_sha256  # noqa: F401  (re-exported: kerascope.batch.file_sha256)

MANIFEST = "manifest.json"
SHARDS = "shards"
ERRORS = "errors.parquet"
COLUMNS = ("index", "id", "target", "predicted", "score", "error", "map")
# The manifest keys that must match for a resume to reuse existing shards.
RESUME_KEYS = (
    "method", "method_params", "model_sha256", "inputs_sha256", "num_inputs", "shard_size",
    "map_shape", "map_dtype", "input_shape", "preprocess", "targets_sha256",
)


def shard_path(out_dir: str | Path, shard: int) -> Path:
    """Path of shard number ``shard``.

    Example:
        >>> shard_path("out", 7).as_posix()
        'out/shards/part-00007.parquet'
    """
    return Path(out_dir) / SHARDS / f"part-{shard:05d}.parquet"


def shard_range(shard: int, shard_size: int, total: int) -> range:
    """The input indices of a shard.

    Example:
        >>> shard_range(2, 4, 10)
        range(8, 10)
    """
    return range(shard * shard_size, min((shard + 1) * shard_size, total))


def num_shards(total: int, shard_size: int) -> int:
    """How many shards ``total`` inputs make.

    Example:
        >>> num_shards(10, 4), num_shards(0, 4)
        (3, 0)
    """
    if shard_size < 1:
        raise ValueError(f"`shard_size` must be at least 1. Received: shard_size={shard_size}.")
    return -(-total // shard_size)


def shard_problem(
    out_dir: str | Path, shard: int, shard_size: int, total: int, checksum: str | None, ids: list[str] | None = None
) -> str | None:
    """Why shard ``shard`` cannot be reused (``None`` when it can): checksum, row count, indices, ids.

    Example:
        >>> shard_problem("no-such-dir", 0, 4, 10, None)
        'missing'
    """
    import pyarrow.parquet as pq

    path = shard_path(out_dir, shard)
    if not path.is_file():
        return "missing"
    if not checksum:
        return "no checksum recorded in the manifest"
    try:
        if file_sha256(path) != checksum:
            return "checksum differs from the one recorded when it was written"
        table = pq.read_table(path, columns=["index", "id"])
    except Exception as error:  # unreadable in any way: recompute it
        return f"unreadable ({type(error).__name__}: {error})"
    expected = shard_range(shard, shard_size, total)
    if table.num_rows != len(expected):
        return f"{table.num_rows} rows instead of {len(expected)}"
    if table.column("index").to_pylist() != list(expected):
        return "holds other inputs' indices"
    if ids is not None and table.column("id").to_pylist() != ids[expected.start:expected.stop]:
        return "holds other inputs' ids"
    return None


def verify_shards(
    out_dir: str | Path, shard_size: int, total: int, checksums: dict[str, str] | None = None,
    ids: list[str] | None = None,
) -> tuple[set[int], dict[int, str]]:
    """The shards a resume may skip, and ``{shard: why}`` for existing shard files it must recompute.

    ``checksums`` maps shard numbers (as strings) to the SHA-256 recorded when each was
    written (default: the manifest's ``"shards"``).

    Example:
        >>> verify_shards("no-such-dir", 4, 10)
        (set(), {})
    """
    if checksums is None:
        manifest = read_manifest(out_dir) or {}
        checksums = manifest.get("shards") if isinstance(manifest.get("shards"), dict) else {}
    done, rejected = set(), {}
    for shard in range(num_shards(total, shard_size)):
        problem = shard_problem(out_dir, shard, shard_size, total, (checksums or {}).get(str(shard)), ids)
        if problem is None:
            done.add(shard)
        elif problem != "missing":
            rejected[shard] = problem
    return done, rejected


def complete_shards(out_dir: str | Path, shard_size: int, total: int, ids: list[str] | None = None) -> set[int]:
    """Shards on disk whose content is verified (checksum in the manifest, indices, ids): the ones a resume skips.

    Example:
        >>> complete_shards("no-such-dir", 4, 10)
        set()
    """
    return verify_shards(out_dir, shard_size, total, ids=ids)[0]


def clean_temporary(out_dir: str | Path) -> int:
    """Remove temporary files left by an interrupted run; returns how many.

    Example:
        >>> clean_temporary("no-such-dir")
        0
    """
    folder = Path(out_dir) / SHARDS
    if not folder.is_dir():
        return 0
    stale = [p for p in folder.iterdir() if ".tmp" in p.name]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def map_type(shape: tuple[int, ...], dtype: str) -> Any:
    """The Arrow type of the ``map`` column: a fixed-shape tensor.

    Example:
        >>> str(map_type((2, 2), "float16").storage_type)
        'fixed_size_list<item: halffloat>[4]'
    """
    import pyarrow as pa

    return pa.fixed_shape_tensor(pa.from_numpy_dtype(np.dtype(dtype)), list(shape))


def build_table(columns: dict[str, np.ndarray], ids: list[str], map_shape: tuple[int, ...], map_dtype: str) -> Any:
    """An Arrow table from result columns (``index``, ``target``, ``predicted``, ``score``, ``error``, ``map``).

    ``error`` holds ``""`` for success; it becomes null, and so does the map of a failed row.

    Example:
        >>> t = build_table({"index": np.array([0, 1]), "target": np.array([1, -1]),
        ...                  "predicted": np.array([1, -1]), "score": np.array([2.0, np.nan]),
        ...                  "error": np.array(["", "bad"]), "map": np.zeros((2, 2, 2))}, ["a", "b"], (2, 2), "float32")
        >>> t.column("error").to_pylist(), t.column("map").null_count
        ([None, 'bad'], 1)
    """
    import pyarrow as pa

    order = np.argsort(columns["index"], kind="stable")
    index = np.asarray(columns["index"], np.int64)[order]
    errors = [str(e) or None for e in np.asarray(columns["error"])[order]]
    failed = np.array([e is not None for e in errors], bool)
    maps = np.ascontiguousarray(np.asarray(columns["map"])[order], dtype=np.dtype(map_dtype))
    if maps.shape[1:] != tuple(map_shape):
        raise ValueError(f"Map shape changed within a run. Received: {maps.shape[1:]}, expected {tuple(map_shape)}.")
    size = int(np.prod(map_shape))
    values = pa.array(maps.reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(values, size, mask=pa.array(failed))
    tensor = pa.ExtensionArray.from_storage(map_type(map_shape, map_dtype), storage)

    def masked(name: str, dtype: Any) -> Any:
        return pa.array(np.asarray(columns[name])[order], type=dtype, mask=failed)

    return pa.table({
        "index": pa.array(index, pa.int64()),
        "id": pa.array([ids[i] for i in index], pa.string()),
        "target": masked("target", pa.int64()),
        "predicted": masked("predicted", pa.int64()),
        "score": masked("score", pa.float64()),
        "error": pa.array(errors, pa.string()),
        "map": tensor,
    })


def write_shard(out_dir: str | Path, shard: int, table: Any) -> Path:
    """Write one shard atomically (temporary file, fsync, rename); returns its path.

    Example:
        >>> import pyarrow as pa, tempfile
        >>> write_shard(tempfile.mkdtemp(), 0, pa.table({"index": [0]})).name
        'part-00000.parquet'
    """
    import pyarrow.parquet as pq

    path = shard_path(out_dir, shard)
    _atomic_write(path, lambda handle: pq.write_table(table, handle))
    return path


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    """Write JSON atomically.

    Example:
        >>> import tempfile, os
        >>> write_json(os.path.join(tempfile.mkdtemp(), "m.json"), {"a": 1}).read_text()
        '{\\n  "a": 1\\n}'
    """
    path = Path(path)
    _atomic_write(path, lambda handle: handle.write(json.dumps(data, indent=2).encode()))
    return path


def read_manifest(out_dir: str | Path) -> dict[str, Any] | None:
    """The manifest of a run folder, or ``None`` when there is none.

    A manifest that is not valid JSON raises ``ValueError`` naming the file.

    Example:
        >>> read_manifest("no-such-dir") is None
        True
    """
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, found {type(data).__name__}")
        return data
    except (UnicodeDecodeError, ValueError, TypeError) as error:
        raise ValueError(
            f"Could not read {str(path)!r} ({type(error).__name__}: {error}). Use a new --out folder, or pass "
            "overwrite=True (CLI: --overwrite) to start this one again."
        ) from None


def check_resumable(old: dict[str, Any], new: dict[str, Any], out_dir: str | Path) -> None:
    """Raise ``ValueError`` when ``out_dir`` holds a different run than the one asked for.

    Example:
        >>> check_resumable({"method": "gradcam"}, {"method": "gradcam"}, "out")
    """
    differ = [k for k in RESUME_KEYS if json.dumps(old.get(k), sort_keys=True) != json.dumps(new.get(k), sort_keys=True)]
    if differ:
        details = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ)
        if "inputs_sha256" in differ:
            details += (" (the inputs changed: other files or ids, or files rewritten under the same names, "
                        "seen by their size and modification time)")
        raise ValueError(
            f"The output folder {str(out_dir)!r} holds a different run, so its shards cannot be reused. "
            f"Received differences: {details}. Use a new --out folder, or pass overwrite=True (CLI: --overwrite)."
        )


def remove_outputs(out_dir: str | Path) -> None:
    """Delete the shards, errors table and manifest of a previous run (for ``overwrite=True``).

    Example:
        >>> remove_outputs("no-such-dir")
    """
    out = Path(out_dir)
    folder = out / SHARDS
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith(("part-", ".part-")):
                path.unlink()
    for name in (MANIFEST, ERRORS):
        (out / name).unlink(missing_ok=True)


def read_results(out_dir: str | Path, columns: Iterable[str] | None = None) -> Any:
    """All shards of a run as one Arrow table, in input order.

    Example:
        >>> import kerascope as ks
        >>> ks.batch.read_results("out").num_rows  # doctest: +SKIP
        20000
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = sorted((Path(out_dir) / SHARDS).glob("part-*.parquet"))
    if not paths:
        raise FileNotFoundError(f"No result shards. Received: out_dir={str(out_dir)!r}.")
    cols = list(columns) if columns is not None else None
    return pa.concat_tables([pq.read_table(p, columns=cols) for p in paths])


def maps_to_numpy(table: Any) -> np.ndarray:
    """The ``map`` column as one array ``(rows, *map_shape)``; failed rows are NaN.

    Example:
        >>> t = build_table({"index": np.array([0, 1]), "target": np.array([0, 0]),
        ...                  "predicted": np.array([0, 0]), "score": np.array([1.0, 1.0]),
        ...                  "error": np.array(["", "x"]), "map": np.ones((2, 1, 2))}, ["a", "b"], (1, 2), "float32")
        >>> maps_to_numpy(t).tolist()
        [[[1.0, 1.0]], [[nan, nan]]]
    """
    column = table.column("map").combine_chunks()
    shape = tuple(column.type.shape)
    values = column.storage.flatten().to_numpy(zero_copy_only=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    out = np.full((len(column), *shape), np.nan, dtype=np.result_type(values.dtype, np.float16))
    out[valid] = values.reshape(-1, *shape)
    return out


def write_errors(out_dir: str | Path) -> tuple[Path, int]:
    """Collect the failed rows of every shard into ``errors.parquet`` (index, id, error); returns path, count.

    Example:
        >>> write_errors("out")  # doctest: +SKIP
        (PosixPath('out/errors.parquet'), 2)
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = read_results(out_dir, columns=["index", "id", "error"])
    failed = table.filter(pc.is_valid(table.column("error")))
    path = Path(out_dir) / ERRORS
    _atomic_write(path, lambda handle: pq.write_table(failed, handle))
    return path, failed.num_rows
