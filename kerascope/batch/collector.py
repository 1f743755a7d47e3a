"""Driver side of a run: gather result rows into their shards and write each shard once it is complete."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np

from kerascope.batch.shards import build_table, file_sha256, shard_range, write_shard


@dataclass(eq=False, repr=False)
class Collector:
    """Buffers result rows per shard; writes a shard (atomically) when all its rows are in.

    Rows are keyed by input index, so a row delivered twice (a retried task)
    is counted once; :meth:`finish` raises if any pending input never arrived.

    Example:
        >>> import numpy as np, tempfile
        >>> c = Collector(tempfile.mkdtemp(), [0], 2, 2, ["a", "b"], (1,), "float32")
        >>> c.add({"index": np.array([0, 1]), "target": np.array([0, 0]), "predicted": np.array([0, 0]),
        ...        "score": np.array([1.0, 2.0]), "error": np.array(["", ""]), "map": np.zeros((2, 1))})
        >>> c.finish(); c.written, c.processed
        ([0], 2)
    """

    out_dir: str
    pending: InitVar[Iterable[int]]
    shard_size: int
    total: int
    ids: list[str]
    map_shape: tuple[int, ...]
    map_dtype: str
    on_shard: Callable[[int], Any] | None = None
    bar: Any = None
    on_written: Callable[[int, str], Any] | None = None  # (shard, sha256) right after the write: the manifest records it
    # what came back so far
    expected: dict[int, int] = field(init=False)  # rows per pending shard
    buffers: dict[int, list[dict[str, np.ndarray]]] = field(init=False)
    counts: dict[int, int] = field(init=False)
    seen: np.ndarray = field(init=False)
    written: list[int] = field(default_factory=list, init=False)
    processed: int = field(default=0, init=False)
    failed: int = field(default=0, init=False)
    duplicates: int = field(default=0, init=False)
    # perf_counter of the first rows, and how many came with them
    first_time: float | None = field(default=None, init=False)
    first_rows: int = field(default=0, init=False)
    last_time: float | None = field(default=None, init=False)

    def __post_init__(self, pending: Iterable[int]) -> None:
        self.expected = {s: len(shard_range(s, self.shard_size, self.total)) for s in pending}
        self.buffers = {s: [] for s in self.expected}
        self.counts = dict.fromkeys(self.expected, 0)
        self.seen = np.zeros(self.total, bool)

    def add(self, columns: dict[str, np.ndarray]) -> None:
        """Take a batch of result columns (any order, any shards).

        Example:
            >>> Collector("out", [], 2, 0, [], (1,), "float32").add({"index": np.zeros(0, np.int64)})
        """
        index = np.asarray(columns["index"], np.int64)
        if not len(index):
            return
        fresh = ~self.seen[index] & _first_occurrence(index)
        self.duplicates += int((~fresh).sum())
        if not fresh.any():
            return
        self.seen[index[fresh]] = True
        now = time.perf_counter()
        if self.first_time is None:
            self.first_time, self.first_rows = now, int(fresh.sum())
        self.last_time = now
        columns = {k: np.asarray(v)[fresh] for k, v in columns.items()}
        index = index[fresh]
        failed = int(sum(1 for e in columns["error"] if str(e)))
        self.failed += failed
        self.processed += len(index) - failed
        if self.bar is not None:
            self.bar.update(len(index))
            self.bar.set_postfix(failed=self.failed, refresh=False)
        shards = index // self.shard_size
        for shard in np.unique(shards):
            shard = int(shard)
            if shard not in self.expected:
                raise RuntimeError(f"Received rows of shard {shard}, which was not pending (a bug).")
            pick = shards == shard
            self.buffers[shard].append({k: v[pick] for k, v in columns.items()})
            self.counts[shard] += int(pick.sum())
            if self.counts[shard] == self.expected[shard]:
                self._write(shard)

    def _write(self, shard: int) -> None:
        parts = self.buffers.pop(shard)
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        path = write_shard(self.out_dir, shard, build_table(merged, self.ids, self.map_shape, self.map_dtype))
        if self.on_written is not None:
            self.on_written(shard, file_sha256(path))
        self.written.append(shard)
        if self.on_shard is not None:
            self.on_shard(shard)

    def finish(self) -> None:
        """Raise ``RuntimeError`` when some pending inputs never came back (their shards stay unwritten).

        Example:
            >>> Collector("out", [], 2, 0, [], (1,), "float32").finish()
        """
        missing = {s: self.expected[s] - self.counts[s] for s in self.buffers}
        if missing:
            lost = sum(missing.values())
            raise RuntimeError(
                f"{lost} input(s) of {len(missing)} shard(s) never came back from the engine; those shards were "
                "not written. Run the same command again to resume: only missing shards are recomputed."
            )


def _first_occurrence(index: np.ndarray) -> np.ndarray:
    keep = np.zeros(len(index), bool)
    keep[np.unique(index, return_index=True)[1]] = True
    return keep
