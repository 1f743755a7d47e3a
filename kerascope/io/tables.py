"""Reading tabular and time-series inputs from ``.npy``, ``.csv`` and ``.parquet`` files for a model.

A table's columns are the features of a tabular model ``(N, F)``, or the channels of a
time-series model ``(N, T, F)`` whose rows are time steps (consecutive windows of ``T`` rows
make the samples). Column names come from the CSV header or the Parquet schema; ``names=``
(CLI ``--features``) names them otherwise.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: File types read as tabular / time-series inputs.
DATA_SUFFIXES = (".npy", ".csv", ".parquet", ".pq")
#: A column holding sample names rather than values.
ID_COLUMNS = ("id", "name", "sample")


@dataclass
class DataInputs:
    """Model inputs read from a data file, with the names of their last axis and of each sample.

    Example:
        >>> d = DataInputs(np.zeros((2, 3), np.float32), ["a", "b", "c"], ["r0", "r1"])
        >>> d.kind, len(d)
        ('tabular', 2)
    """

    values: np.ndarray
    feature_names: list[str] | None
    sample_names: list[str]

    @property
    def kind(self) -> str:
        """``"tabular"`` for ``(N, F)`` inputs, ``"sequence"`` for ``(N, T, F)``, ``"text"`` for integer ``(N, T)`` ids."""
        if self.values.ndim == 3:
            return "sequence"
        return "text" if np.issubdtype(self.values.dtype, np.integer) else "tabular"

    def __len__(self) -> int:
        return int(self.values.shape[0])


def is_data_file(path: str | Path) -> bool:
    """Whether ``path`` names a file read by :func:`read_data` (by its suffix).

    Example:
        >>> is_data_file("x.csv"), is_data_file("photo.png")
        (True, False)
    """
    return Path(path).suffix.lower() in DATA_SUFFIXES


def _read_csv(path: Path) -> tuple[list[str] | None, list[list[str]]]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if not rows:
        raise ValueError(f"The CSV file has no rows. Received: path={str(path)!r}.")

    def numeric(cell: str) -> bool:
        try:
            float(cell)
        except ValueError:
            return False
        return True

    header = None if all(numeric(cell) for cell in rows[0] if cell.strip()) else [c.strip() for c in rows[0]]
    return header, rows[1:] if header is not None else rows


def _columns_to_array(path: Path, names: list[str], columns: list[list[Any]]) -> tuple[np.ndarray, list[str], list[str] | None]:
    """Numbers from the columns (an id column set apart); a column that is not numbers is refused by name."""
    ids = None
    values, kept = [], []
    for name, column in zip(names, columns, strict=True):
        if name.lower() in ID_COLUMNS and ids is None:
            ids = [str(v) for v in column]
            continue
        try:
            values.append(np.asarray([float(v) if v not in ("", None) else np.nan for v in column], np.float32))
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"Column {name!r} of {path.name} is not numbers ({error}). kerascope reads numeric features "
                f"(and one sample-name column called {' / '.join(ID_COLUMNS)}). Received: columns {names}. Encode "
                "categories as numbers the way the model was trained, or pass the model-ready array as a .npy file."
            ) from None
        kept.append(name)
    if not values:
        raise ValueError(f"{path.name} has no numeric columns. Received: columns {names}.")
    return np.stack(values, axis=1), kept, ids


def _read_table(path: Path) -> tuple[np.ndarray, list[str] | None, list[str] | None]:
    """``(values (rows, columns), column names or None, sample names or None)`` of a CSV or Parquet file."""
    if path.suffix.lower() == ".csv":
        header, rows = _read_csv(path)
        widths = {len(row) for row in rows}
        if len(widths) > 1 or (header is not None and widths and widths != {len(header)}):
            raise ValueError(
                f"The rows of {path.name} have different numbers of values ({sorted(widths)}"
                + (f"; the header has {len(header)}" if header is not None else "") + "). Each row must have "
                "one value per column."
            )
        width = len(header) if header is not None else next(iter(widths))
        names = header if header is not None else [f"feature {j}" for j in range(width)]
        columns = [[row[j].strip() for row in rows] for j in range(width)]
        values, kept, ids = _columns_to_array(path, names, columns)
        return values, kept if header is not None else None, ids
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    names = list(table.column_names)
    if "array" in names:  # one sample per row, as `kerascope batch` writes and reads them
        rows = table.column("array").to_pylist()
        ids = [str(v) for v in table.column("id").to_pylist()] if "id" in names else None
        try:
            return np.asarray(rows, np.float32), None, ids
        except ValueError as error:
            raise ValueError(f"The rows of the 'array' column of {path.name} have different shapes ({error}).") from None
    values, kept, ids = _columns_to_array(path, names, [table.column(n).to_pylist() for n in names])
    return values, kept, ids


def _fit(values: np.ndarray, shape: tuple[int | None, ...], path: Path, table: bool) -> np.ndarray:
    """``values`` shaped ``(N, *shape)``: a table's rows as time steps for a ``(T, F)`` model."""
    if len(shape) == 2 and values.ndim == 2 and table:
        steps, channels = shape
        if channels is not None and values.shape[1] != channels:
            raise ValueError(
                f"The model reads series of {channels} channel(s) per time step; {path.name} has "
                f"{values.shape[1]} column(s). Received: table shape={values.shape}. Each column is a channel, "
                "each row a time step."
            )
        rows = values.shape[0]
        if steps is None:
            return values[None]
        if rows % steps:
            raise ValueError(
                f"The model reads series of {steps} time steps; {path.name} has {rows} rows, not a multiple of "
                f"{steps}. Each row is a time step; consecutive blocks of {steps} rows are the samples."
            )
        return values.reshape(rows // steps, steps, values.shape[1])
    if values.ndim == 2 and len(shape) >= 2 and all(d is not None for d in shape) and \
            values.shape[1] == int(np.prod(shape)):
        return values.reshape(len(values), *shape)  # flat rows of a multi-axis input
    expected = tuple(shape)
    if values.ndim - 1 != len(expected) or any(e is not None and e != d for e, d in zip(expected, values.shape[1:])):
        raise ValueError(
            f"The inputs in {path.name} do not fit the model. Received: shape {values.shape}; the model expects "
            f"(N, {', '.join(str(d) for d in expected)}) (None = any)."
        )
    return values


def read_data(path: str | Path, shape: Sequence[int | None], names: Sequence[str] | None = None) -> DataInputs:
    """Read a ``.npy``, ``.csv`` or ``.parquet`` file as inputs of shape ``(N, *shape)`` for a model.

    - ``.npy``: the array as it is (``(N, F)``, ``(N, T, F)``, integer token ids ``(N, T)``);
    - ``.csv`` (header optional) / ``.parquet``: numeric columns are the features of a tabular model
      (one sample per row), or the channels of a time-series model (one time step per row; consecutive
      blocks of ``T`` rows are the samples, the whole file one sample when the model takes any length).
      A column named ``id``, ``name`` or ``sample`` names the samples. A Parquet file with an ``array``
      column holds one sample per row (as ``kerascope batch`` reads it).

    Feature (or channel) names come from the header / schema; ``names`` replaces them.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "x.csv")
        >>> _ = open(p, "w").write("age,income\\n30,1.5\\n41,2.0\\n")
        >>> d = read_data(p, (2,))
        >>> d.values.tolist(), d.feature_names, d.kind
        ([[30.0, 1.5], [41.0, 2.0]], ['age', 'income'], 'tabular')
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No such data file. Received: {str(path)!r}.")
    suffix = path.suffix.lower()
    if suffix not in DATA_SUFFIXES:
        raise ValueError(f"Expected a {', '.join(DATA_SUFFIXES)} file. Received: {str(path)!r}.")
    ids = None
    if suffix == ".npy":
        try:
            values = np.load(path, allow_pickle=False)
        except ValueError as error:
            raise ValueError(f"{path.name} is not a plain numeric .npy array ({error}).") from None
        found, table = None, False
        if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
            raise ValueError(f"{path.name} holds {values.dtype} values; expected numbers.")
    else:
        values, found, ids = _read_table(path)
        table = found is not None or values.ndim == 2
        table = table and not (suffix != ".csv" and "array" in _parquet_columns(path))
    integer = np.issubdtype(values.dtype, np.integer)
    values = values if integer else np.asarray(values, np.float32)
    values = _fit(values, tuple(shape), path, table)
    if not integer and not np.all(np.isfinite(values)):
        raise ValueError(f"{path.name} has empty, NaN or infinite values; fill them the way the model was trained.")
    width = values.shape[-1] if values.ndim >= 2 else 1
    if names is not None:
        names = [str(n) for n in names]
        if len(names) != width:
            raise ValueError(
                f"--features names {len(names)} feature(s); the inputs have {width}. Received: "
                f"features={names}. Give one name per column (a channel of a series)."
            )
    else:
        names = found
    samples = len(values)
    if ids is None or len(ids) != samples:
        ids = [f"sample {i}" for i in range(samples)] if ids is None or values.ndim != 3 else \
            [f"{ids[i * (len(ids) // samples)]}" for i in range(samples)]
    return DataInputs(values, names, ids)


def _parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    return list(pq.read_schema(path).names)
