"""Inputs of a batch run: a folder of images, a list file, a ``.npy`` file, a Parquet file or an array.

A source is a fixed, ordered list of inputs. The order decides shard
assignment, so it must be the same on every run over the same data: folders
are walked recursively and sorted, list files keep their line order, array
files their row order. Sources are small picklable descriptions (paths, not
pixels) so that Ray actors can open them on their own side; files are opened
lazily and cached per process.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.io.images import IMAGE_SUFFIXES, ImageReadError, find_images, preprocess, read_image

LIST_SUFFIXES = {".txt", ".lst", ".list"}


@dataclass
class Loaded:
    """One loaded chunk: model inputs for the readable items, and why the others failed.

    ``positions`` are the global input indices of the rows of ``inputs``;
    ``errors`` maps global index -> reason.

    Example:
        >>> Loaded(np.array([0]), np.zeros((1, 2, 2, 3), np.float32), None, {1: "bad"}).errors
        {1: 'bad'}
    """

    positions: np.ndarray
    inputs: np.ndarray
    pixels: np.ndarray | None
    errors: dict[int, str] = field(default_factory=dict)


class Source:
    """Base class: ``len(source)``, ``source.ids()``, ``source.load(indices, shape, mode)``.

    ``shape`` is the model's ``(H, W, C)`` (``None`` where any size goes);
    ``mode`` is the pixel preprocessing of :func:`kerascope.io.images.preprocess`.

    Example:
        >>> src = ArraySource(np.zeros((3, 4, 4, 1), np.float32))
        >>> len(src), src.ids()[:2]
        (3, ['0', '1'])
    """

    kind = "base"

    def __len__(self) -> int:
        raise NotImplementedError

    def ids(self) -> list[str]:
        """Stable identifiers, one per input (file path relative to the folder, or the row number).

        Example:
            >>> ArraySource(np.zeros((2, 1, 1, 1))).ids()
            ['0', '1']
        """
        return [str(i) for i in range(len(self))]

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this source.

        Example:
            >>> ArraySource(np.zeros((2, 1, 1, 1))).describe()["kind"]
            'array'
        """
        return {"kind": self.kind, "count": len(self)}

    def content_key(self) -> str:
        """Extra text that changes when the inputs' content changes (ids alone name files, not pixels).

        Example:
            >>> ArraySource(np.zeros((1, 1, 1, 1))).content_key()[:6]
            'array:'
        """
        return ""

    def validate(self, shape: tuple[int | None, ...]) -> None:
        """Raise ``ValueError`` when the whole source cannot fit the model (checked before a run).

        Example:
            >>> ArraySource(np.zeros((1, 4, 4, 3))).validate((4, 4, 3))
        """

    def load(self, indices: np.ndarray, shape: tuple[int | None, ...], mode: str = "unit") -> Loaded:
        """Load the inputs at ``indices``; failures go to ``Loaded.errors`` (never raised).

        Example:
            >>> ArraySource(np.ones((3, 2, 2, 1), np.float32)).load(np.array([2]), (2, 2, 1)).inputs.shape
            (1, 2, 2, 1)
        """
        raise NotImplementedError


def _fingerprint(ids: list[str]) -> str:
    digest = hashlib.sha256()
    for item in ids:
        digest.update(item.encode("utf-8", "surrogateescape"))
        digest.update(b"\0")
    return digest.hexdigest()


def _image_size(shape: tuple[int | None, ...]) -> tuple[int, int]:
    if shape[0] is None or shape[1] is None:
        raise ValueError(
            "The model accepts any image size, so images cannot be stacked into batches. "
            "Received: size=None. Pass `size=(H, W)` (CLI: --size H W)."
        )
    return int(shape[0]), int(shape[1])


def _stack_images(
    indices: np.ndarray, read: Any, shape: tuple[int | None, ...], mode: str
) -> Loaded:
    size = _image_size(shape)
    channels = int(shape[2] or 3)
    pixels, ok, errors = [], [], {}
    for index in indices:  # file I/O per input; the explanation itself is batched
        try:
            pixels.append(read(int(index), size, channels))
            ok.append(int(index))
        except ImageReadError as error:
            errors[int(index)] = str(error)
        except Exception as error:  # a broken file must never stop the run
            errors[int(index)] = f"{type(error).__name__}: {error}"
    stacked = np.stack(pixels) if pixels else np.zeros((0, *size, channels), np.uint8)
    return Loaded(np.asarray(ok, np.int64), preprocess(stacked, mode), stacked, errors)


class ImageFiles(Source):
    """Image files by path; ``ids`` are the paths as the user named them (relative to a folder).

    Example:
        >>> from kerascope.data import demo_images
        >>> src = ImageFiles([str(p) for p in demo_images()[:2]])
        >>> src.load(np.array([0, 1]), (16, 16, 3)).inputs.shape
        (2, 16, 16, 3)
    """

    kind = "images"

    def __init__(self, paths: list[str], ids: list[str] | None = None, origin: str | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self._ids = list(ids) if ids is not None else list(self.paths)
        self.origin = origin

    def __len__(self) -> int:
        return len(self.paths)

    def ids(self) -> list[str]:
        return list(self._ids)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": len(self), "origin": self.origin}

    def content_key(self) -> str:
        """Each file's size and modification time: a file rewritten under the same name changes the key.

        Example:
            >>> from kerascope.data import demo_images
            >>> ImageFiles([str(demo_images()[0])]).content_key()[:6]
            'files:'
        """
        return "files:" + _fingerprint([_file_stamp(p) for p in self.paths])

    def load(self, indices: np.ndarray, shape: tuple[int | None, ...], mode: str = "unit") -> Loaded:
        return _stack_images(indices, lambda i, size, c: read_image(self.paths[i], size, c), shape, mode)


def _file_stamp(path: str | Path) -> str:
    """``"size:mtime_ns"`` of a file (``"missing"`` when it cannot be read): what a resume compares."""
    try:
        stat = Path(path).stat()
    except OSError:
        return "missing"
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _check_array(value: np.ndarray, shape: tuple[int | None, ...]) -> str | None:
    if value.ndim != len(shape) or any(e is not None and e != d for e, d in zip(shape, value.shape, strict=True)):
        return f"wrong shape: got {tuple(value.shape)}, the model expects {tuple(shape)} (None = any)."
    if not np.all(np.isfinite(value)):
        return "the array contains NaN or infinite values."
    return None


def _array_rows(values: np.ndarray, positions: np.ndarray, shape: tuple[int | None, ...], mode: str) -> Loaded:
    inputs = preprocess(values, mode) if values.dtype == np.uint8 else np.asarray(values, np.float32)
    bad = {int(p): why for p, row in zip(positions, inputs, strict=True) if (why := _check_array(row, shape))}
    keep = np.array([int(p) not in bad for p in positions], bool)
    return Loaded(positions[keep], inputs[keep], np.asarray(values)[keep], bad)


class ArraySource(Source):
    """An in-memory array ``(N, H, W, C)``: uint8 pixels are preprocessed, floats are used as they are.

    Example:
        >>> ArraySource(np.zeros((2, 4, 4, 3), np.uint8)).load(np.array([1]), (4, 4, 3)).positions.tolist()
        [1]
    """

    kind = "array"

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.asarray(array)
        if self.array.ndim < 2:
            raise ValueError(f"Expected an array of inputs (N, ...). Received: shape={self.array.shape}.")

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def content_key(self) -> str:
        data = np.ascontiguousarray(self.array)
        return f"array:{data.shape}:{data.dtype}:{hashlib.sha256(data.tobytes()).hexdigest()}"

    def validate(self, shape: tuple[int | None, ...]) -> None:
        if _check_array(np.zeros(self.array.shape[1:], np.float32), shape):
            raise ValueError(
                f"The input array does not fit the model. Received: array shape={self.array.shape}; "
                f"the model expects (N, {', '.join(str(d) for d in shape)}) (None = any)."
            )

    def load(self, indices: np.ndarray, shape: tuple[int | None, ...], mode: str = "unit") -> Loaded:
        indices = np.asarray(indices, np.int64)
        return _array_rows(self.array[indices], indices, shape, mode)


class NumpyFile(ArraySource):
    """A ``.npy`` file of inputs ``(N, H, W, C)``, memory-mapped (only the rows asked for are read).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x.npy"); np.save(p, np.zeros((3, 2, 2, 1), np.float32))
        >>> len(NumpyFile(p))
        3
    """

    kind = "npy"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._array: np.ndarray | None = None
        try:
            self._length = int(np.load(self.path, mmap_mode="r").shape[0])
        except (OSError, ValueError) as error:
            raise ValueError(f"Could not read the NumPy file. Received: path={self.path!r} ({error}).") from error

    @property
    def array(self) -> np.ndarray:  # type: ignore[override]
        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r")
        return self._array

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}

    def __len__(self) -> int:
        return self._length

    def content_key(self) -> str:
        size = Path(self.path).stat().st_size
        digest = hashlib.sha256()
        with open(self.path, "rb") as handle:  # head and tail: cheap, and catches most rewrites
            digest.update(handle.read(1 << 20))
            handle.seek(max(0, size - (1 << 20)))
            digest.update(handle.read(1 << 20))
        return f"npy:{self.array.shape}:{self.array.dtype}:{size}:{digest.hexdigest()}"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": len(self), "origin": self.path}

    def load(self, indices: np.ndarray, shape: tuple[int | None, ...], mode: str = "unit") -> Loaded:
        indices = np.asarray(indices, np.int64)
        order = np.argsort(indices)  # sorted reads on a memory map
        values = np.empty((len(indices), *self.array.shape[1:]), self.array.dtype)
        values[order] = self.array[indices[order]]
        return _array_rows(values, indices, shape, mode)


class ParquetRows(Source):
    """A Parquet file with one input per row.

    Recognised columns: ``path`` (image file paths, relative to the Parquet
    file's folder if not absolute), ``image`` (encoded image bytes, or a struct
    with a ``bytes`` field as Hugging Face datasets write them) or ``array``
    (numbers, nested or flat, reshaped to the model's input shape; a row with
    the wrong number of values is an error row). Optional ``id``.

    Example:
        >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x.parquet")
        >>> pq.write_table(pa.table({"array": [[0.0] * 4, [1.0] * 3]}), p)
        >>> ParquetRows(p).load(np.array([0, 1]), (2, 2, 1)).errors[1][:11]
        'wrong shape'
    """

    kind = "parquet"
    COLUMNS = ("path", "image", "array")

    def __init__(self, path: str | Path) -> None:
        import pyarrow.parquet as pq

        self.path = str(path)
        schema = pq.read_schema(self.path)
        found = [c for c in self.COLUMNS if c in schema.names]
        if not found:
            raise ValueError(
                f"The Parquet file has no input column. Received: columns={schema.names} in {self.path!r}. "
                f"Expected one of {list(self.COLUMNS)} (plus an optional 'id')."
            )
        self.column = found[0]
        self._length = pq.read_metadata(self.path).num_rows
        self._has_id = "id" in schema.names
        self._table: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_table": None}

    def _read(self) -> Any:
        if self._table is None:
            import pyarrow.parquet as pq

            self._table = pq.read_table(self.path, columns=[self.column], memory_map=True)
        return self._table

    def __len__(self) -> int:
        return self._length

    def ids(self) -> list[str]:
        import pyarrow.parquet as pq

        if self._has_id:
            return [str(v) for v in pq.read_table(self.path, columns=["id"]).column("id").to_pylist()]
        if self.column == "path":
            return [str(v) for v in pq.read_table(self.path, columns=["path"]).column("path").to_pylist()]
        return super().ids()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": len(self), "origin": self.path, "column": self.column}

    def content_key(self) -> str:
        """The Parquet file's size and modification time, and with a ``path`` column each image file's.

        Example:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> p = os.path.join(tempfile.mkdtemp(), "x.parquet")
            >>> pq.write_table(pa.table({"array": [[0.0] * 4]}), p)
            >>> ParquetRows(p).content_key()[:8]
            'parquet:'
        """
        stamps = [_file_stamp(self.path)]
        if self.column == "path":
            base = Path(self.path).parent
            for value in self._read().column("path").to_pylist():
                path = Path(str(value))
                stamps.append("missing" if value is None else _file_stamp(path if path.is_absolute() else base / path))
        return "parquet:" + _fingerprint(stamps)

    def load(self, indices: np.ndarray, shape: tuple[int | None, ...], mode: str = "unit") -> Loaded:
        indices = np.asarray(indices, np.int64)
        values = self._read().column(self.column).take(indices).to_pylist()
        if self.column == "path":
            base = Path(self.path).parent
            where = {int(i): v for i, v in zip(indices, values, strict=True)}

            def read_path(i: int, size: tuple[int, int], c: int) -> np.ndarray:
                if where[i] is None:
                    raise ImageReadError("empty path.")
                path = Path(where[i])
                return read_image(path if path.is_absolute() else base / path, size, c)

            return _stack_images(indices, read_path, shape, mode)
        if self.column == "image":
            where = {int(i): v for i, v in zip(indices, values, strict=True)}
            return _stack_images(indices, lambda i, size, c: _decode(where[i], size, c), shape, mode)
        rows, ok, errors = [], [], {}
        for index, value in zip(indices, values, strict=True):
            try:
                if value is None:
                    raise ValueError("empty row.")
                array = np.asarray(value, np.float32)
                known = all(d is not None for d in shape)
                if known and array.size == int(np.prod(shape)) and array.shape != tuple(shape):
                    array = array.reshape(shape)
                if (why := _check_array(array, shape)) is not None:
                    raise ValueError(why)
                rows.append(array)
                ok.append(int(index))
            except ValueError as error:
                errors[int(index)] = str(error) if "wrong shape" in str(error) else f"unusable row: {error}"
        if rows and len({r.shape for r in rows}) > 1:
            raise ValueError("Rows of the Parquet 'array' column have different shapes; the model needs one.")
        stacked = np.stack(rows) if rows else np.zeros((0, *[d or 1 for d in shape]), np.float32)
        return Loaded(np.asarray(ok, np.int64), stacked, stacked, errors)


def _decode(value: Any, size: tuple[int, int], channels: int) -> np.ndarray:
    if isinstance(value, dict):
        value = value.get("bytes")
    if not value:
        raise ImageReadError("empty image bytes.")
    return read_image(io.BytesIO(value), size, channels)  # type: ignore[arg-type]


def _read_list(path: Path) -> ImageFiles:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    names = [line for line in lines if line and not line.startswith("#")]
    paths = [str(p if (p := Path(n)).is_absolute() else path.parent / p) for n in names]
    return ImageFiles(paths, ids=names, origin=str(path))


def open_source(inputs: Any) -> Source:
    """Make a :class:`Source` from what the user passed.

    A folder (images found recursively, sorted; ids relative to it), an image
    file, a list file (``.txt``/``.lst``/``.list``: one path per line, relative
    to the list file; ``#`` comments), a ``.npy`` file, a ``.parquet`` file, a
    list of paths, an array, or a :class:`Source`.

    Example:
        >>> from kerascope.data import demo_images
        >>> src = open_source(demo_images()[0].parent)
        >>> src.kind, src.ids()[0].endswith(".png")
        ('images', True)
    """
    if isinstance(inputs, Source):
        return inputs
    if isinstance(inputs, np.ndarray):
        return ArraySource(inputs)
    if isinstance(inputs, (list, tuple)):
        return ImageFiles([str(p) for p in inputs])
    path = Path(inputs)
    if path.is_dir():
        found = find_images(path)
        return ImageFiles([str(p) for p in found], ids=[p.relative_to(path).as_posix() for p in found],
                          origin=str(path))
    if not path.exists():
        raise FileNotFoundError(f"No such input. Received: inputs={str(path)!r}.")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return NumpyFile(path)
    if suffix in (".parquet", ".pq"):
        return ParquetRows(path)
    if suffix in LIST_SUFFIXES:
        return _read_list(path)
    if suffix in IMAGE_SUFFIXES:
        return ImageFiles([str(path)], ids=[path.name], origin=str(path))
    raise ValueError(
        f"Unrecognised input. Received: inputs={str(path)!r}. Expected a folder of images, an image, a list "
        f"file ({sorted(LIST_SUFFIXES)}), a .npy file or a .parquet file."
    )


def fingerprint(source: Source) -> str:
    """SHA-256 over the ordered ids: a resumed run must see the same inputs in the same order.

    Example:
        >>> a = np.zeros((2, 1, 1, 1))
        >>> fingerprint(ArraySource(a)) == fingerprint(ArraySource(a + 1))
        False
    """
    return _fingerprint([source.content_key(), *source.ids()])
