"""The result of every method: raw attributions plus what produced them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else f"<array shape={value.shape}>"
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


@dataclass
class Explanation:
    """Raw attributions (numpy) with the targets, scores, method and parameters.

    ``attributions`` is an array for single-input models and a list of arrays
    (one per input) for multi-input models. ``scores`` holds each target's score at
    the input, or is ``None`` when the method was asked not to spend a pass on it
    (``scores=False``, see :class:`~kerascope.methods.base.Method`). Gradient methods return signed
    values of the inputs' shape; CAM methods ``(N, H, W)`` maps. Nothing is
    min-max scaled; display normalisation lives in :mod:`kerascope.viz`.

    Example:
        >>> import numpy as np
        >>> e = Explanation(np.ones((1, 2, 2)), "saliency", {}, np.array([0]), np.array([1.0]))
        >>> e.attributions.shape, e.method
        ((1, 2, 2), 'saliency')
    """

    attributions: Any
    method: str
    params: dict[str, Any]
    targets: np.ndarray
    scores: np.ndarray | None
    layer: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(len(self.targets))

    def save(self, path: str | Path) -> Path:
        """Save to a ``.npz`` file (arrays) with JSON metadata; returns the path.

        Example:
            >>> import numpy as np, tempfile, os
            >>> e = Explanation(np.ones((1, 2)), "saliency", {"a": 1}, np.array([0]), np.array([1.0]))
            >>> p = e.save(os.path.join(tempfile.mkdtemp(), "e.npz"))
            >>> Explanation.load(p).params
            {'a': 1}
        """
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {"targets": self.targets}
        if self.scores is not None:  # no scores (``scores=False``): no array, loaded back as None
            arrays["scores"] = np.asarray(self.scores)
        multi = isinstance(self.attributions, (list, tuple))
        attrs = list(self.attributions) if multi else [self.attributions]
        for i, a in enumerate(attrs):
            arrays[f"attributions_{i}"] = np.asarray(a)
        extra_arrays = {k: v for k, v in self.extras.items() if isinstance(v, np.ndarray)}
        for k, v in extra_arrays.items():
            arrays[f"extra_{k}"] = v
        meta = {
            "method": self.method,
            "params": _jsonable(self.params),
            "layer": self.layer,
            "multi": multi,
            "count": len(attrs),
            "extras": _jsonable({k: v for k, v in self.extras.items() if k not in extra_arrays}),
            "format": 1,
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = path.with_name(path.name + ".tmp.npz")
        try:
            np.savez_compressed(tmp, **arrays)
            tmp.replace(path)
        finally:  # a full disk leaves no partial file behind
            tmp.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Explanation:
        """Load an Explanation written by :meth:`save` (no pickle involved).

        A missing file raises ``FileNotFoundError``; an empty, truncated or corrupt file,
        or one that is not a kerascope explanation, raises ``ValueError`` naming the file.

        Example:
            >>> import tempfile, os
            >>> p = os.path.join(tempfile.mkdtemp(), "e.npz"); _ = open(p, "wb").write(b"PK\x03\x04 cut")
            >>> Explanation.load(p)
            Traceback (most recent call last):
            ValueError: Could not read the explanation file ...
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"No explanation file. Received: path={str(path)!r}.")
        try:
            with np.load(path, allow_pickle=False) as data:
                if not hasattr(data, "files"):
                    raise ValueError("a single array, not an .npz archive")
                if "meta" not in data:
                    raise ValueError("no metadata: not written by kerascope")
                meta = json.loads(bytes(data["meta"]).decode())
                if not isinstance(meta, dict) or not isinstance(meta.get("method"), str):
                    raise ValueError("metadata without a method name")
                count = meta.get("count")
                if not isinstance(count, int) or not 1 <= count <= 64:
                    raise ValueError(f"metadata with an invalid attribution count {count!r}")
                attrs = [np.asarray(data[f"attributions_{i}"]) for i in range(count)]
                targets = np.asarray(data["targets"])
                scores = np.asarray(data["scores"]) if "scores" in data.files else None
                if targets.ndim != 1 or any(a.ndim < 1 or len(a) != len(targets) for a in attrs):
                    raise ValueError(
                        f"attributions {[a.shape for a in attrs]} do not match targets {targets.shape}"
                    )
                extras = dict(meta.get("extras") or {})
                for key in data.files:
                    if key.startswith("extra_"):
                        extras[key[len("extra_"):]] = data[key]
                params = meta.get("params") or {}
                return cls(
                    attributions=attrs if meta.get("multi") else attrs[0],
                    method=meta["method"],
                    params=params if isinstance(params, dict) else {},
                    targets=targets,
                    scores=scores,
                    layer=meta.get("layer") if isinstance(meta.get("layer"), str) else None,
                    extras=extras,
                )
        except Exception as error:  # zipfile/zlib/EOF/JSON/key errors all mean the same thing to the user
            if isinstance(error, MemoryError):
                raise
            raise ValueError(
                f"Could not read the explanation file {str(path)!r}: {type(error).__name__}: {error}. "
                "It is empty, truncated, corrupt or not written by `Explanation.save`."
            ) from None

    def per_position(self) -> np.ndarray:
        """Attributions summed over their last axis: one value per token / pixel / time step.

        For attributions at a layer (``layer=`` on a gradient method) of shape
        ``(N, T, E)`` (an Embedding) this is the per-token map ``(N, T)``; for
        ``(N, H, W, C)`` the per-pixel map ``(N, H, W)``; for inputs ``(N, T, F)``
        the per-time-step map. The sum (not the mean or a norm) keeps
        Integrated Gradients' completeness: ``per_position().sum(axis=1)`` is
        still ``f(x) - f(baseline)``.

        Example:
            >>> import numpy as np
            >>> e = Explanation(np.ones((2, 5, 8)), "integrated_gradients", {}, np.array([0, 0]), np.ones(2))
            >>> e.per_position().shape, float(e.per_position()[0, 0])
            ((2, 5), 8.0)
        """
        if isinstance(self.attributions, (list, tuple)):
            raise ValueError(
                "per_position() needs one attribution array; this explanation has one per model input "
                f"({len(self.attributions)}). Received: attributions of a multi-input model. Sum one of "
                "them over its last axis, e.g. `e.attributions[0].sum(-1)`."
            )
        array = np.asarray(self.attributions)
        if array.ndim < 3:
            raise ValueError(
                f"per_position() sums the last (embedding / channel) axis of (N, positions..., C) "
                f"attributions. Received: attributions with shape {array.shape}."
            )
        return array.sum(axis=-1)

    def plot(self, inputs: Any = None, **kwargs: Any) -> Any:
        """A matplotlib Figure of this explanation (see :func:`kerascope.viz.plots.plot_explanation`).

        Image attributions give a grid (inputs in the first column when given), signed values
        in a diverging colormap and heatmaps in a sequential one, with colour bars;
        ``kind="sequence"`` / ``"tabular"`` plot time series and feature attributions.

        Example:
            >>> import numpy as np
            >>> e = Explanation(np.random.rand(2, 8, 8), "gradcam", {}, np.array([0, 1]), np.ones(2))
            >>> type(e.plot(np.random.rand(2, 8, 8, 3))).__name__
            'Figure'
        """
        from kerascope.viz.plots import plot_explanation

        return plot_explanation(self, inputs, **kwargs)

    def figure(self, inputs: Any = None, index: int = 0, **kwargs: Any) -> Any:
        """A publication figure of sample ``index``: input, overlay, colour bar with unit, caption.

        ``inputs`` is the batch that was explained (or ``None``: the file in ``extras["paths"]``
        when there is one, else the map alone); keyword arguments go to
        :func:`kerascope.viz.figure.explanation_figure` (``model_name``, ``class_names``, ``size``, ...).

        Example:
            >>> import numpy as np
            >>> e = Explanation(np.random.rand(2, 8, 8), "gradcam", {}, np.array([0, 1]), np.ones(2))
            >>> e.figure(np.random.rand(2, 8, 8, 3), index=1).kerascope_facts["target"]
            '1'
        """
        from kerascope.viz.figure import explanation_figure, input_image

        return explanation_figure(self, input_image(self, inputs, index), index, **kwargs)

    def save_figure(self, path: str | Path, inputs: Any = None, index: int = 0, *,
                    size: tuple[float, float] = (6.4, 3.2), dpi: int = 200, **kwargs: Any) -> Path:
        """Save :meth:`figure` as PNG, SVG or PDF (from the suffix), ``size`` inches at ``dpi``, with metadata.

        Example:
            >>> import numpy as np, tempfile, os
            >>> e = Explanation(np.random.rand(1, 8, 8), "gradcam", {}, np.array([0]), np.ones(1))
            >>> e.save_figure(os.path.join(tempfile.mkdtemp(), "f.svg"), dpi=50).suffix
            '.svg'
        """
        from kerascope.viz.figure import save_explanation_figure

        return save_explanation_figure(self.figure(inputs, index, size=size, **kwargs), path, dpi=dpi)

    def _repr_html_(self) -> str:
        from kerascope.viz.notebook import explanation_html

        return explanation_html(self)
