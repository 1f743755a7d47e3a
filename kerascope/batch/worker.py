"""The per-batch work shared by both engines: load inputs, explain, shape the result columns.

:class:`BatchExplainer` loads the model once (in the driver for the local
engine, once per actor for Ray) and turns a batch of input indices into
result columns. It never raises for a bad input: unreadable files, wrong
shapes, and even a batch that fails as a whole (each of its inputs is then
retried alone) become error rows.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.batch.sources import Source
from kerascope.numeric.resize import resize_maps


@dataclass
class WorkerConfig:
    """Everything a worker needs to rebuild the computation (picklable; sent to Ray actors).

    Example:
        >>> WorkerConfig(model_path="m.keras", source=None).method
        'gradcam'
    """

    model_path: str
    source: Source | None
    method: str = "gradcam"
    method_params: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 32
    size: tuple[int, int] | None = None
    preprocess: str = "unit"
    map_size: tuple[int, int] | None = None
    map_dtype: str = "float32"
    overlay_dir: str | None = None
    safe_mode: bool = True


def _overlay_name(index: int, item_id: str) -> str:
    stem = Path(item_id).stem if item_id else str(index)
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:80]
    return f"{index:07d}_{stem}.png"


class BatchExplainer:
    """Load the model once; explain batches of input indices into result columns.

    Called with ``{"index": int array, "target": int array (-1 = predicted class)}``
    (the Ray Data batch format) and returns ``index``, ``target``, ``predicted``,
    ``score``, ``error`` (``""`` when fine) and ``map`` arrays.

    Example:
        >>> import numpy as np
        >>> from kerascope.data import demo_model_path
        >>> from kerascope.batch.sources import ArraySource
        >>> w = BatchExplainer(WorkerConfig(str(demo_model_path()), ArraySource(np.zeros((2, 64, 64, 3), np.float32))))
        >>> w({"index": np.array([0, 1]), "target": np.array([-1, 2])})["target"].tolist()[1]
        2
    """

    def __init__(self, config: WorkerConfig, model_bytes: bytes | None = None) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        from kerascope.io.images import model_image_size
        from kerascope.io.models import load_model
        from kerascope.methods.registry import build

        self.config = config
        if model_bytes is not None:  # a cluster node may not see the driver's files: the model travels as bytes
            folder = tempfile.mkdtemp(prefix="kerascope-model-")
            local = Path(folder) / Path(config.model_path).name
            local.write_bytes(model_bytes)
            self.model = load_model(local, safe_mode=config.safe_mode)
        else:
            self.model = load_model(config.model_path, safe_mode=config.safe_mode)
        shape = tuple(self.model.inputs[0].shape)[1:] if getattr(self.model, "inputs", None) else ()
        if len(shape) in (2, 1) and config.size is None:  # tabular (N, F), series (N, T, F): rows as they are
            self.input_shape: tuple[int | None, ...] = shape
        else:
            h, w, c = model_image_size(self.model)
            if config.size is not None:
                h, w = config.size
            self.input_shape = (h, w, c)
        params = dict(config.method_params)
        common = {"batch_size": config.batch_size}
        self.method = build(config.method, self.model, params, common)
        # Pin what depends on the data (a CAM's default layer costs a forward pass) once, not per batch.
        probe_input = np.zeros((1, *[d or 32 for d in self.input_shape]), np.float32)
        before = self.method.params()
        pinned = {k: v for k, v in self.method.resolved_params(probe_input).items() if before.get(k) != v}
        if pinned:
            self.method = build(config.method, self.model, {**params, **pinned}, common)
        self._map_shape: tuple[int, ...] | None = None
        self._ids: list[str] | None = None

    # --- description (for the manifest) -----------------------------------------------
    def params(self) -> dict[str, Any]:
        """The method's hyper-parameters as JSON-ready values (layer resolved to its path).

        Example:
            >>> from kerascope.data import demo_model_path
            >>> BatchExplainer(WorkerConfig(str(demo_model_path()), None)).params()["layer"]  # doctest: +SKIP
            'conv3'
        """
        from kerascope.core.explanation import _jsonable

        return _jsonable(self.method.params())

    def map_shape(self) -> tuple[int, ...]:
        """Shape of one stored map (found once by explaining a zero input).

        Example:
            >>> from kerascope.data import demo_model_path
            >>> BatchExplainer(WorkerConfig(str(demo_model_path()), None)).map_shape()
            (64, 64)
        """
        if self._map_shape is None:
            probe_input = np.zeros((1, *[d or 32 for d in self.input_shape]), np.float32)
            with warnings.catch_warnings():  # a zero probe's map may well be zero: no news for the user
                warnings.simplefilter("ignore")
                self._explain(probe_input, np.array([-1]))
        assert self._map_shape is not None
        return self._map_shape

    # --- the work -----------------------------------------------------------------------
    def _explain(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Explain one stack of inputs; returns target, predicted, score, maps."""
        logits = None
        if np.all(targets < 0):
            explanation = self.method.explain(inputs, None)
            predicted = np.asarray(explanation.targets, np.int64)
        else:
            logits = self.method.engine.forward(inputs, batch_size=self.config.batch_size)
            logits = np.asarray(logits[0] if isinstance(logits, (list, tuple)) else logits)
            predicted = logits.reshape(len(inputs), -1).argmax(axis=-1).astype(np.int64)
            chosen = np.where(targets < 0, predicted, targets).astype(np.int64)
            explanation = self.method.explain(inputs, [int(t) for t in chosen])
        attributions = explanation.attributions
        if isinstance(attributions, (list, tuple)):
            raise ValueError("Batch runs support single-input models only.")
        maps = resize_maps(np.asarray(attributions, np.float32), self.config.map_size)
        maps = maps.astype(np.dtype(self.config.map_dtype))
        if self._map_shape is None:
            self._map_shape = tuple(int(d) for d in maps.shape[1:])
        if explanation.scores is not None:
            scores = np.asarray(explanation.scores, np.float64).reshape(len(inputs))
        else:  # scores=False: the targets' scores from the forward pass this batch ran anyway
            flat = np.asarray(logits, np.float64).reshape(len(inputs), -1)
            scores = np.take_along_axis(flat, np.asarray(explanation.targets, np.int64)[:, None], axis=1)[:, 0]
        return np.asarray(explanation.targets, np.int64), predicted, scores, maps

    def explain_indices(self, indices: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
        """Result columns for the inputs at ``indices`` (``targets``: -1 = the predicted class).

        Example:
            >>> import numpy as np
            >>> from kerascope.data import demo_model_path
            >>> from kerascope.batch.sources import ArraySource
            >>> w = BatchExplainer(WorkerConfig(str(demo_model_path()), ArraySource(np.zeros((1, 64, 64, 3)))))
            >>> w.explain_indices(np.array([0]), np.array([-1]))["map"].shape
            (1, 64, 64)
        """
        indices = np.asarray(indices, np.int64)
        targets = np.asarray(targets, np.int64)
        n = len(indices)
        out_target = np.full(n, -1, np.int64)
        out_pred = np.full(n, -1, np.int64)
        out_score = np.full(n, np.nan, np.float64)
        errors = np.array([""] * n, dtype=object)
        position = {int(i): k for k, i in enumerate(indices)}
        try:
            loaded = self.config.source.load(indices, self.input_shape, self.config.preprocess)  # type: ignore[union-attr]
        except Exception as error:  # the source itself broke for this batch
            errors[:] = f"could not load: {type(error).__name__}: {error}"
            loaded = None
        chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, maps)
        if loaded is not None:
            for index, reason in loaded.errors.items():
                errors[position[index]] = reason
            if len(loaded.positions):
                rows = np.array([position[int(i)] for i in loaded.positions], np.int64)
                try:
                    pieces = [(rows, *self._explain(loaded.inputs, targets[rows]))]
                except Exception:  # the batch failed as a whole: find the culprit(s), one input at a time
                    pieces = []
                    for k, row in enumerate(rows):  # failure path only
                        try:
                            pieces.append((rows[k : k + 1], *self._explain(loaded.inputs[k : k + 1], targets[row : row + 1])))
                        except Exception as error:
                            errors[row] = f"explanation failed: {type(error).__name__}: {error}"
                for part_rows, t, p, s, m in pieces:
                    out_target[part_rows], out_pred[part_rows], out_score[part_rows] = t, p, s
                    chunks.append((part_rows, m))
                if self.config.overlay_dir and loaded.pixels is not None:
                    self._overlays(loaded, chunks, indices)
        shape = self._map_shape if self._map_shape is not None else self.map_shape()
        maps = np.zeros((n, *shape), np.dtype(self.config.map_dtype))
        for rows, m in chunks:
            maps[rows] = m
        return {"index": indices, "target": out_target, "predicted": out_pred, "score": out_score,
                "error": errors.astype(str), "map": maps}

    def _overlays(self, loaded: Any, chunks: list[tuple[np.ndarray, np.ndarray]], indices: np.ndarray) -> None:
        from kerascope.viz.overlay import save_overlay

        if self._ids is None:
            self._ids = self.config.source.ids()  # type: ignore[union-attr]
        pixels = {int(i): loaded.pixels[k] for k, i in enumerate(loaded.positions)}
        folder = Path(self.config.overlay_dir)  # type: ignore[arg-type]
        for rows, maps in chunks:
            for row, attribution in zip(rows, maps, strict=True):
                index = int(indices[row])
                name = _overlay_name(index, self._ids[index])
                save_overlay(folder / name, pixels[index], attribution.astype(np.float32))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.explain_indices(batch["index"], batch["target"])
