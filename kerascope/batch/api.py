"""``ks.batch.run``: explain a whole data set into sharded Parquet, locally or on Ray, resumably."""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.batch import shards as sh
from kerascope.batch.collector import Collector
from kerascope.batch.sources import fingerprint, open_source
from kerascope.batch.worker import BatchExplainer, WorkerConfig
from kerascope.core.progress import new_bar
from kerascope.io.images import check_image_size
from kerascope.io.paths import prepare_output_dir
from kerascope.io.preprocessing import resolve_preprocess
from kerascope.io.staging import DiskFullError

ENGINES = ("local", "ray")
MAP_DTYPES = ("float16", "float32")


@dataclass
class BatchSummary:
    """What a batch run did: counts for this run, timings, and where things are.

    ``processed``/``failed`` count the inputs computed by this run; ``skipped``
    the inputs of shards a previous run had already completed.

    Example:
        >>> BatchSummary(out_dir="out", engine="local").as_dict()["processed"]
        0
    """

    out_dir: str
    engine: str
    total: int = 0
    processed: int = 0
    failed: int = 0
    skipped: int = 0
    shards_written: int = 0
    shards_skipped: int = 0
    shards_rejected: int = 0
    seconds: float = 0.0
    compute_seconds: float = 0.0
    startup_seconds: float = 0.0
    images_per_s: float = 0.0
    errors_total: int = 0
    errors_table: str | None = None
    manifest: str | None = None
    preprocess: str | None = None
    preprocess_reason: str | None = None
    layer: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for ``--json``).

        Example:
            >>> "images_per_s" in BatchSummary(out_dir="o", engine="ray").as_dict()
            True
        """
        return dict(vars(self))

    def text(self) -> str:
        """One human line.

        Example:
            >>> BatchSummary(out_dir="o", engine="local", processed=10, seconds=2.0, images_per_s=5.0).text()[:12]
            'processed 10'
        """
        line = (f"processed {self.processed}, failed {self.failed}, skipped {self.skipped} (already done) "
                f"in {self.seconds:.1f}s ({_rate(self)}, engine {self.engine}) -> {self.out_dir}")
        if self.preprocess:
            line += f"\npreprocessing: {self.preprocess} ({self.preprocess_reason})"
        if self.layer:
            line += f"\nlayer: {self.layer}"
        if self.shards_rejected:
            line += (f"\n{self.shards_rejected} shard file(s) on disk failed verification and were recomputed "
                     "(see details.shards_rejected)")
        if self.errors_total:
            line += f"\n{self.errors_total} input(s) failed; reasons in {self.errors_table}"
        return line


file_sha256 = sh.file_sha256


def _rate(summary: BatchSummary) -> str:
    """The run's throughput (``images_per_s``) as :func:`kerascope.io.display.format_rate` words it."""
    from kerascope.io.display import format_rate

    computed = summary.processed + summary.failed
    return format_rate(computed, computed / summary.images_per_s if summary.images_per_s > 0 else 0.0, "input")


def _check_classes(values: np.ndarray, where: str) -> None:
    bad = np.flatnonzero(values < 0)
    if len(bad):
        raise ValueError(
            f"Target classes must be non-negative class indices. Received: {where} has {len(bad)} negative "
            f"value(s), e.g. {values[bad[0]]} at position {bad[0]}. Leave a target out (or pass targets=None) "
            "to explain the predicted class."
        )


def resolve_targets(targets: Any, ids: list[str]) -> tuple[np.ndarray, int]:
    """Per-input target classes (-1 = the predicted class) and how many inputs a mapping did not cover.

    ``targets``: ``None`` (predicted class), an int (same class for all), a
    sequence with one int per input, a dict ``id -> class`` or the path of a CSV
    file with rows ``id,class`` (a header row is allowed). Ids are matched as
    written, else by file name when that is unique. Negative classes and
    non-integers are errors, and so is an id listed twice with different classes;
    inputs without a target (predicted class used), ids that match no input and
    repeated identical rows are reported with counts in a ``UserWarning``.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     resolve_targets({"a.png": 2}, ["a.png", "b.png"])
        (array([ 2, -1]), 1)
        >>> resolve_targets(-3, ["a.png"])
        Traceback (most recent call last):
        ValueError: Target classes must be non-negative class indices. ...
    """
    n = len(ids)
    if targets is None:
        return np.full(n, -1, np.int64), 0
    if isinstance(targets, (bool, np.bool_)):
        raise TypeError(f"A target class must be an integer index. Received: targets={targets!r}.")
    if isinstance(targets, (int, np.integer)):
        _check_classes(np.array([int(targets)]), f"targets={int(targets)}")
        return np.full(n, int(targets), np.int64), 0
    if isinstance(targets, (str, Path)):
        targets = _read_targets_csv(Path(targets))
    if isinstance(targets, dict):
        lookup = {}
        for k, v in targets.items():
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"A target class must be an integer index. Received: {k!r} -> {v!r}.")
            lookup[str(k)] = int(v)
        _check_classes(np.array(list(lookup.values()), np.int64), "the targets mapping")
        names = [Path(i).name for i in ids]
        unique_names = len(set(names)) == len(names)
        by_name = {Path(k).name: v for k, v in lookup.items()} if unique_names else {}
        values, used = [], set()
        for i, name in zip(ids, names, strict=True):
            if i in lookup:
                values.append(lookup[i])
                used.add(i)
            elif name in by_name:
                values.append(by_name[name])
                used.update(k for k in lookup if Path(k).name == name)
            else:
                values.append(-1)
        out = np.asarray(values, np.int64)
        missing = int((out < 0).sum())
        unknown = [k for k in lookup if k not in used]
        notes = []
        if missing:
            notes.append(f"{missing} of {n} input(s) have no target and are explained for their predicted class")
        if unknown:
            notes.append(f"{len(unknown)} target id(s) match no input and are ignored, e.g. {unknown[:3]}")
        if notes:
            warnings.warn("Batch targets: " + "; ".join(notes) + ".", UserWarning, stacklevel=3)
        return out, missing
    try:
        raw = list(targets)
    except TypeError:
        raise TypeError(
            f"Unsupported targets. Received: type={type(targets).__name__}. Expected None, an int, one int per "
            "input, a dict id -> class or a CSV path."
        ) from None
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in raw):
        raise TypeError("Targets must be integer class indices, one per input. Received a non-integer value.")
    out = np.asarray(raw, np.int64).reshape(-1)
    if out.shape != (n,):
        raise ValueError(f"Expected one target per input ({n}). Received: {out.shape[0]} targets.")
    _check_classes(out, "the targets sequence")
    return out, 0


def _read_targets_csv(path: Path) -> dict[str, int]:
    if not path.exists():
        raise FileNotFoundError(f"No targets file. Received: targets={str(path)!r}.")
    out: dict[str, int] = {}
    lines: dict[str, int] = {}
    conflicts: list[str] = []
    repeated = 0
    with open(path, newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle)):
            if not row or row[0].startswith("#"):
                continue
            if len(row) < 2:
                raise ValueError(f"{path}:{number + 1}: expected 'id,class'. Received: {row!r}.")
            try:
                value = int(row[1])
            except ValueError:
                if number == 0:
                    continue  # header
                raise ValueError(
                    f"{path}:{number + 1}: the class must be an integer index. Received: {row[1]!r}."
                ) from None
            if value < 0:
                raise ValueError(
                    f"{path}:{number + 1}: the class must be a non-negative index. Received: {row[1]!r} for id "
                    f"{row[0].strip()!r}. Leave the id out to explain its predicted class."
                )
            key = row[0].strip()
            if key in out:
                if out[key] != value:
                    conflicts.append(f"{key!r} (line {lines[key]}: {out[key]}, line {number + 1}: {value})")
                else:
                    repeated += 1
                continue
            out[key], lines[key] = value, number + 1
    if conflicts:
        raise ValueError(
            f"{path}: {len(conflicts)} id(s) listed more than once with different classes: "
            f"{', '.join(conflicts[:5])}{' ...' if len(conflicts) > 5 else ''}. Keep one row per id."
        )
    if repeated:
        warnings.warn(f"{path}: {repeated} repeated row(s) with the same id and class ignored.", UserWarning,
                      stacklevel=4)
    return out


def run(
    model: str | Path,
    inputs: Any,
    out_dir: str | Path,
    *,
    method: str = "gradcam",
    layer: str | None = None,
    targets: Any = None,
    engine: str = "local",
    batch_size: int = 32,
    workers: int = 2,
    address: str | None = None,
    overlays: bool = False,
    map_size: tuple[int, int] | None = None,
    map_dtype: str = "float32",
    shard_size: int = 512,
    size: tuple[int, int] | None = None,
    preprocess: str = "auto",
    method_params: dict[str, Any] | None = None,
    safe_mode: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    on_shard: Callable[[int], Any] | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> BatchSummary:
    """Explain every input of a data set; write sharded Parquet, a manifest and an errors table.

    Output in ``out_dir``: ``shards/part-NNNNN.parquet`` (one row per input:
    ``index``, ``id``, ``target``, ``predicted``, ``score``, ``error``, ``map``),
    ``errors.parquet`` (the failed inputs and why), ``manifest.json`` (method,
    parameters, model SHA-256, kerascope version, summary) and with
    ``overlays=True`` ``overlays/*.png``. Running again on the same folder
    resumes: shards whose file still has the checksum the manifest recorded when
    it was written, and holds exactly its inputs' indices and ids, are skipped;
    missing, damaged or swapped shards are recomputed (``shards_rejected``).

    Args:
        model: path of a ``.keras``/``.h5`` file (hashed into the manifest; sent to Ray actors as bytes).
        inputs: a folder of images (recursive), an image, a list file, a ``.npy``/``.parquet`` file,
            a list of paths or an array (see :func:`kerascope.batch.sources.open_source`).
        targets: None (predicted class), an int, one int per input, a dict id -> class, or a CSV path.
        engine: ``"local"`` (this process, no Ray needed) or ``"ray"``.
        workers: Ray actors (each loads the model once).
        address: an existing Ray cluster (e.g. ``"ray://head:10001"`` or ``"auto"``); default: a local Ray.
        map_size: ``(H, W)`` to resize the stored maps to (bilinear); default: the method's output size.
        map_dtype: ``"float32"`` or ``"float16"`` for the stored maps.
        shard_size: inputs per shard (the unit of atomic writes and of resume).
        on_shard: called with each shard number after the shard is written.

    Example:
        >>> import kerascope as ks, numpy as np, tempfile
        >>> from kerascope.data import demo_model_path
        >>> s = ks.batch.run(demo_model_path(), np.zeros((3, 64, 64, 3), np.float32), tempfile.mkdtemp(),
        ...                  shard_size=2, progress=False)
        >>> s.processed, s.shards_written
        (3, 2)
    """
    start = time.perf_counter()
    size, map_size = _check_options(engine, map_dtype, batch_size, workers, size, map_size)
    model_path = Path(model)
    if not model_path.is_file():
        raise FileNotFoundError(f"No model file. Received: model={str(model)!r}. Batch runs need a model file.")
    out = prepare_output_dir(out_dir)
    with disk_full_is_one_line(out):
        return _run(start, model_path, inputs, out, method, layer, targets, engine, batch_size, workers, address,
                    overlays, map_size, map_dtype, shard_size, size, preprocess, method_params, safe_mode, overwrite,
                    progress, on_shard, ray_remote_args)


@contextlib.contextmanager
def disk_full_is_one_line(out: Path) -> Iterator[None]:
    """A full disk while a batch run writes becomes :class:`~kerascope.io.staging.DiskFullError` (one line).

    Shards and overlays are written to temporary files renamed into place, so no partial file is left;
    the manifest keeps naming the shards already complete, and running the same command again resumes.

    Example:
        >>> import errno, pathlib
        >>> try:
        ...     with disk_full_is_one_line(pathlib.Path("out")):
        ...         raise OSError(errno.ENOSPC, "No space left on device")
        ... except ValueError as error:
        ...     print(str(error)[:40])
        Not enough disk space in 'out' (No space
    """
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        raise DiskFullError(
            f"Not enough disk space in {str(out)!r} ({error.strerror}). The shards written so far are complete "
            "and verified and no partial file is left: free some space and run the same command again to resume."
        ) from None


def _run(start: float, model_path: Path, inputs: Any, out: Path, method: str, layer: str | None, targets: Any,
         engine: str, batch_size: int, workers: int, address: str | None, overlays: bool, map_size: Any,
         map_dtype: str, shard_size: int, size: Any, preprocess: str, method_params: dict[str, Any] | None,
         safe_mode: bool, overwrite: bool, progress: bool, on_shard: Callable[[int], Any] | None,
         ray_remote_args: dict[str, Any] | None) -> BatchSummary:
    source = open_source(inputs)
    ids = source.ids()
    total = len(ids)
    target_array, targets_missing = resolve_targets(targets, ids)
    params = dict(method_params or {})
    if layer is not None:
        params["layer"] = layer
    config = WorkerConfig(
        model_path=str(model_path), source=source, method=method, method_params=params, batch_size=batch_size,
        size=tuple(size) if size else None, preprocess=preprocess,
        map_size=tuple(map_size) if map_size else None, map_dtype=map_dtype,
        overlay_dir=str(out / "overlays") if overlays else None, safe_mode=safe_mode,
    )
    explainer = BatchExplainer(config)  # fails early, in the driver, on a bad method / layer / model
    # "auto" is decided once, from the loaded model, and every worker gets the decided mode
    config.preprocess, preprocess_reason = resolve_preprocess(explainer.model, preprocess)
    shown = config.preprocess if len(explainer.input_shape) == 3 else None  # pixels only: data rows go as they are
    source.validate(explainer.input_shape)
    map_shape = explainer.map_shape()
    manifest = _manifest(explainer, config, model_path, source, target_array, targets_missing, shard_size,
                         map_shape, map_dtype, preprocess_reason, total)
    done, rejected, checksums = _resume_state(out, manifest, shard_size, ids, overwrite)
    manifest["shards"] = checksums
    pending = [s for s in range(manifest["num_shards"]) if s not in done]
    manifest_path = sh.write_json(out / sh.MANIFEST, {**manifest, "status": "running"})

    def record(shard: int, digest: str) -> None:  # the manifest names every shard's checksum once written
        checksums[str(shard)] = digest
        sh.write_json(out / sh.MANIFEST, {**manifest, "status": "running"})

    summary = BatchSummary(out_dir=str(out), engine=engine, total=total, manifest=str(manifest_path),
                           shards_skipped=len(done), shards_rejected=len(rejected),
                           skipped=sum(len(sh.shard_range(s, shard_size, total)) for s in done),
                           preprocess=shown, preprocess_reason=preprocess_reason, layer=manifest["layer"])
    pending_indices = [np.arange(r.start, r.stop, dtype=np.int64)
                       for r in (sh.shard_range(s, shard_size, total) for s in pending)]
    started = False
    if engine == "ray" and pending_indices:
        from kerascope.batch.ray_engine import start_ray

        started, summary.startup_seconds = start_ray(address)
    bar = _progress_bar(sum(len(i) for i in pending_indices), progress)
    collector = Collector(str(out), pending, shard_size, total, ids, map_shape, map_dtype, on_shard, bar,
                          on_written=record)
    try:
        compute_start = time.perf_counter()
        if engine == "local":
            from kerascope.batch.local import execute_local

            execute_local(explainer, pending_indices, target_array, batch_size, collector)
        elif pending_indices:
            from kerascope.batch.ray_engine import execute_ray

            summary.details = execute_ray(
                config, pending_indices, target_array, collector, workers=workers, batch_size=batch_size,
                model_bytes=model_path.read_bytes(), ray_remote_args=ray_remote_args,
            )
        summary.compute_seconds = time.perf_counter() - compute_start
        collector.finish()
    finally:
        if started:
            import ray

            ray.shutdown()
        if bar is not None:
            bar.close()
        summary.processed, summary.failed = collector.processed, collector.failed
        summary.shards_written = len(collector.written)
    errors_path, summary.errors_total = sh.write_errors(out) if total else (None, 0)
    summary.errors_table = str(errors_path) if errors_path else None
    summary.seconds = time.perf_counter() - start
    _record_throughput(summary, collector, compute_start, rejected)
    sh.write_json(out / sh.MANIFEST, {**manifest, "status": "complete", "summary": summary.as_dict()})
    return summary


def _check_options(engine: str, map_dtype: str, batch_size: int, workers: int, size: Any, map_size: Any
                   ) -> tuple[Any, Any]:
    """Refuse bad run options before any work; return the checked image and map sizes."""
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine. Received: engine={engine!r}. Expected one of {list(ENGINES)}.")
    if map_dtype not in MAP_DTYPES:
        raise ValueError(f"Unsupported map dtype. Received: map_dtype={map_dtype!r}. Expected one of {list(MAP_DTYPES)}.")
    if batch_size < 1 or workers < 1:
        raise ValueError(f"`batch_size` and `workers` must be >= 1. Received: batch_size={batch_size}, workers={workers}.")
    if size is not None:  # decoded a batch at a time: memory is bounded by batch_size, not the data set
        size = check_image_size(size, count=batch_size)
    if map_size is not None:
        map_size = check_image_size(map_size, count=batch_size)
    return size, map_size


def _manifest(explainer: BatchExplainer, config: WorkerConfig, model_path: Path, source: Any,
              target_array: np.ndarray, targets_missing: int, shard_size: int, map_shape: tuple[int, ...],
              map_dtype: str, preprocess_reason: str, total: int) -> dict[str, Any]:
    """What identifies the run: method, parameters, model and input fingerprints, shard layout."""
    from kerascope import __version__

    return {
        "format": 1,
        "kerascope_version": __version__,
        "method": explainer.method.name,
        "method_params": explainer.params(),
        "model_file": str(model_path),
        "model_sha256": file_sha256(model_path),
        "input": source.describe(),
        "num_inputs": total,
        "inputs_sha256": fingerprint(source),
        "input_shape": list(explainer.input_shape),
        "preprocess": config.preprocess,
        "preprocess_reason": preprocess_reason,
        "layer": explainer.params().get("layer"),
        "targets_sha256": hashlib.sha256(target_array.tobytes()).hexdigest(),
        "targets_missing": targets_missing,
        "shard_size": shard_size,
        "num_shards": sh.num_shards(total, shard_size),
        "map_shape": list(map_shape),
        "map_dtype": map_dtype,
        "columns": list(sh.COLUMNS),
    }


def _resume_state(out: Path, manifest: dict[str, Any], shard_size: int, ids: list[str], overwrite: bool
                  ) -> tuple[set[int], dict[int, str], dict[str, str]]:
    """The shards a previous run of the same job left that verify (done), those refused and why, their checksums."""
    total = manifest["num_inputs"]
    try:
        previous = sh.read_manifest(out)
    except ValueError:
        if not overwrite:
            raise
        previous = {}
    if previous is not None and overwrite:
        sh.remove_outputs(out)
        previous = None
    if previous is not None:
        sh.check_resumable(previous, manifest, out)
    sh.clean_temporary(out)
    done: set[int] = set()
    rejected: dict[int, str] = {}
    if previous is not None:  # reuse only shards whose checksum and content verify
        recorded = previous.get("shards") if isinstance(previous.get("shards"), dict) else {}
        done, rejected = sh.verify_shards(out, shard_size, total, checksums=recorded, ids=ids)
    checksums = {str(s): previous["shards"][str(s)] for s in sorted(done)} if previous is not None else {}
    return done, rejected, checksums


def _record_throughput(summary: BatchSummary, collector: Collector, compute_start: float,
                       rejected: dict[int, str]) -> None:
    """Images per second over the compute phase, and once every worker is up; what resume refused."""
    computed = summary.processed + summary.failed
    summary.images_per_s = computed / summary.compute_seconds if summary.compute_seconds > 0 else 0.0
    if collector.first_time is not None:
        summary.details["first_result_seconds"] = round(collector.first_time - compute_start, 3)
        rest = computed - collector.first_rows
        span = (collector.last_time or collector.first_time) - collector.first_time
        if rest > 0 and span > 0:  # throughput once every worker is up (excludes model loading in actors)
            summary.details["steady_images_per_s"] = round(rest / span, 2)
    if collector.duplicates:
        summary.details["duplicates_dropped"] = collector.duplicates
    if rejected:
        summary.details["shards_rejected"] = {str(k): v for k, v in rejected.items()}


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled or total == 0:
        return None
    return new_bar(total, "kerascope batch", miniters=0)


def read(out_dir: str | Path, columns: Sequence[str] | None = None, *, verify: bool = True) -> Any:
    """The results of a run as a ``pyarrow.Table`` in input order (see :func:`maps_to_numpy` for the maps).

    With ``verify=True`` (the default) every shard file is first checked against the manifest: the
    SHA-256 recorded when it was written, its row count and its inputs' indices. A shard that was
    changed on disk, copied from another run, or is not in the manifest raises ``ValueError`` naming
    it. ``verify=False`` skips this (reading a large run without hashing it).

    Example:
        >>> import kerascope as ks, numpy as np, tempfile
        >>> from kerascope.data import demo_model_path
        >>> out = tempfile.mkdtemp()
        >>> _ = ks.batch.run(demo_model_path(), np.zeros((2, 64, 64, 3), np.float32), out, progress=False)
        >>> ks.batch.read(out).column("index").to_pylist()
        [0, 1]
    """
    if verify:
        verify_for_read(out_dir)
    return sh.read_results(out_dir, columns)


def verify_for_read(out_dir: str | Path) -> None:
    """Raise ``ValueError`` naming the first shard file that does not match the run's manifest.

    Example:
        >>> verify_for_read("no-such-dir")
        Traceback (most recent call last):
        ...
        FileNotFoundError: No manifest.json to verify the shards against. Received: out_dir='no-such-dir'. ...
    """
    found = sh.read_manifest(out_dir)
    if found is None:
        raise FileNotFoundError(
            f"No manifest.json to verify the shards against. Received: out_dir={str(out_dir)!r}. Read a run "
            "folder written by ks.batch.run, or pass verify=False to read the shards as they are."
        )
    total, size = int(found["num_inputs"]), int(found["shard_size"])
    recorded = found.get("shards") if isinstance(found.get("shards"), dict) else {}
    known = {sh.shard_path(out_dir, s).name: s for s in range(sh.num_shards(total, size))}
    folder = Path(out_dir) / sh.SHARDS
    for path in sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []:
        shard = known.get(path.name)
        problem = ("not a shard of this run" if shard is None
                   else sh.shard_problem(out_dir, shard, size, total, recorded.get(str(shard))))
        if problem is not None:
            raise ValueError(
                f"Shard {path.relative_to(out_dir)} does not match the run's manifest ({problem}): it was changed "
                "on disk or comes from another run. Run the same `ks.batch.run` / `kerascope batch` command again "
                "to recompute it, or pass verify=False to read the shards as they are."
            )


def manifest(out_dir: str | Path) -> dict[str, Any]:
    """The manifest of a run folder.

    Example:
        >>> manifest("out")["method"]  # doctest: +SKIP
        'gradcam'
    """
    found = sh.read_manifest(out_dir)
    if found is None:
        raise FileNotFoundError(f"No manifest.json. Received: out_dir={str(out_dir)!r}.")
    return json.loads(json.dumps(found))
