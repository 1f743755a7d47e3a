"""Targets on outputs with positions: sequences ``(N, T, V)``, segmentation maps ``(N, H, W, C)``.

An int target on such an output would name one element of the flattened
output (position 0) and ``None`` the largest value over every position; both
are refused by the engine (:func:`check_no_positions`). These callables say
what is meant: one class at one position, or a class summed over a region.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from keras import ops


class TargetError(ValueError):
    """A position / region target that does not fit the output (raised as is, not wrapped)."""


def _leaf(outputs: Any, output: Any) -> Any:
    """The one output array a target reads (``output`` picks one of several)."""
    if output is not None:
        return outputs[output]
    if isinstance(outputs, dict):
        if len(outputs) != 1:
            raise TargetError(
                f"The model has several outputs ({sorted(outputs)}); say which one the target reads. "
                "Received: output=None. Pass e.g. `ks.targets.position(-1, 3, output='logits')`."
            )
        return next(iter(outputs.values()))
    if isinstance(outputs, (list, tuple)):
        if len(outputs) != 1:
            raise TargetError(
                f"The model has {len(outputs)} outputs; say which one the target reads. Received: output=None. "
                "Pass e.g. `ks.targets.position(-1, 3, output=0)`."
            )
        return outputs[0]
    return outputs


class PositionTarget:
    """The score of class ``c`` at position ``t`` of every sample (see :func:`position`)."""

    def __init__(self, t: int | Sequence[int], c: int | None = None, output: Any = None) -> None:
        ts = (t,) if np.ndim(t) == 0 else tuple(t)
        if not ts or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in ts):
            raise TypeError(
                f"`t` must be an int (a position, negative from the end) or a tuple of ints (one per position "
                f"axis, e.g. (row, column)). Received: t={t!r}."
            )
        if c is not None and (not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 0):
            raise TypeError(f"`c` must be a class index >= 0, or None for the largest class. Received: c={c!r}.")
        self.t = tuple(int(v) for v in ts)
        self.c = None if c is None else int(c)
        self.output = output

    def cache_key(self) -> tuple:
        return ("position", self.t, self.c, self.output)

    def __repr__(self) -> str:
        t = self.t[0] if len(self.t) == 1 else self.t
        return f"ks.targets.position({t!r}, {self.c!r})"

    def __call__(self, outputs: Any) -> Any:
        y = _leaf(outputs, self.output)
        shape = tuple(y.shape)
        if len(shape) != len(self.t) + 2:
            raise TargetError(
                f"{self!r} reads an output with {len(self.t)} position axis(es) and a class axis, shape "
                f"(N, {', '.join(['P'] * len(self.t))}, C). Received: an output of shape {shape}. "
                + ("Pass one position per axis, e.g. t=(row, column)." if len(shape) > 2 else
                   "On an output without positions use an int target.")
            )
        index = []
        for axis, t in enumerate(self.t):
            size = shape[axis + 1]
            if size is not None and not -size <= t < size:
                raise TargetError(
                    f"Position out of range: the output has {size} positions on axis {axis + 1} "
                    f"(shape {shape}). Received: t={t} (negative counts from the end)."
                )
            index.append(t if t >= 0 or size is None else size + t)
        at = y[(slice(None), *index)] if all(i >= 0 for i in index) else _take_negative(y, self.t)
        if self.c is None:
            best = ops.stop_gradient(ops.argmax(at, axis=-1))
            return ops.take_along_axis(at, ops.expand_dims(ops.cast(best, "int32"), -1), axis=-1)[:, 0]
        if shape[-1] is not None and self.c >= shape[-1]:
            raise TargetError(
                f"Target class out of range: the output has {shape[-1]} classes per position. Received: c={self.c}."
            )
        return at[:, self.c]


def _take_negative(y: Any, ts: tuple[int, ...]) -> Any:
    """``y[:, t1, t2, ...]`` for negative positions on axes whose size is only known at run time."""
    for t in ts:
        size = ops.shape(y)[1]
        y = ops.take(y, ops.convert_to_tensor(t) + size if t < 0 else t, axis=1)
    return y


class RegionTarget:
    """The sum of class ``c`` over the positions where ``mask`` is non-zero (see :func:`region`)."""

    def __init__(self, c: int, mask: Any, output: Any = None) -> None:
        if not isinstance(c, (int, np.integer)) or isinstance(c, bool) or c < 0:
            raise TypeError(f"`c` must be a class index >= 0. Received: c={c!r}.")
        mask = np.asarray(mask)
        if mask.dtype == object or mask.ndim < 1 or not (np.issubdtype(mask.dtype, np.number) or mask.dtype == bool):
            raise TypeError(
                "`mask` must be an array of 0 / 1 (or bool, or weights) over the output's positions, "
                f"e.g. shape (H, W). Received: mask of dtype {mask.dtype} and shape {mask.shape}."
            )
        self.c = int(c)
        self.mask = mask.astype(np.float32)
        self.output = output

    def cache_key(self) -> tuple:
        return ("region", self.c, self.mask.shape, self.mask.tobytes(), self.output)

    def __repr__(self) -> str:
        return f"ks.targets.region({self.c}, mask of shape {self.mask.shape})"

    def __call__(self, outputs: Any) -> Any:
        y = _leaf(outputs, self.output)
        shape = tuple(y.shape)
        positions = shape[1:-1]
        if len(shape) < 3 or self.mask.shape != positions:
            raise TargetError(
                f"`mask` must cover the output's positions: shape {positions} for an output of shape {shape} "
                f"(the same mask for every sample; for one mask per sample, explain each sample with its own "
                f"target). Received: mask of shape {self.mask.shape}."
            )
        if shape[-1] is not None and self.c >= shape[-1]:
            raise TargetError(
                f"Target class out of range: the output has {shape[-1]} classes per position. Received: c={self.c}."
            )
        values = y[..., self.c]
        mask = ops.expand_dims(ops.convert_to_tensor(self.mask, dtype=values.dtype), 0)
        return ops.sum(ops.reshape(values * mask, (ops.shape(values)[0], -1)), axis=-1)


def position(t: int | Sequence[int], c: int | None = None, *, output: Any = None) -> PositionTarget:
    """Target class ``c`` at position ``t`` of an output with positions.

    On a causal language model's ``(N, T, V)`` logits, ``position(-1, c)`` is the
    score of token ``c`` as the next token; on a ``(N, H, W, C)`` map ``t`` is
    ``(row, column)``. Negative positions count from the end; ``c=None`` takes
    each sample's largest class at that position. Usable as ``targets=`` with
    every method; ``output=`` picks one output of a multi-output model.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(9, 4),
        ...                       keras.layers.Dense(9)])
        >>> target = ks.targets.position(-1, 3)
        >>> out = m(np.arange(10).reshape(2, 5) % 9)
        >>> bool(np.allclose(target(out), out[:, -1, 3]))
        True
    """
    return PositionTarget(t, c, output)


def region(c: int, mask: Any, *, output: Any = None) -> RegionTarget:
    """Target the sum of class ``c`` over a region of an output with positions.

    ``mask`` covers the output's positions, ``(H, W)`` for a ``(N, H, W, C)``
    segmentation map or ``(T,)`` for ``(N, T, C)``, the same for every sample
    (explain samples one by one for masks of their own); values are weights
    (0 / 1 for a region), as pytorch-grad-cam's ``SemanticSegmentationTarget``.

    Example:
        >>> import numpy as np, kerascope as ks
        >>> out = np.arange(2 * 2 * 2 * 3, dtype="float32").reshape(2, 2, 2, 3)
        >>> mask = np.array([[1, 0], [0, 1]])
        >>> np.asarray(ks.targets.region(1, mask)(out)).tolist()
        [11.0, 35.0]
    """
    return RegionTarget(c, mask, output)


def check_no_positions(shape: tuple, targets: Any) -> None:
    """Refuse an int / None target on an output with positions (it would be read flattened).

    Example:
        >>> check_no_positions((None, 5, 9), 3)
        Traceback (most recent call last):
        ...
        ValueError: targets=3 on an output of shape (None, 5, 9), which has positions (5,) before its 9 classes: an int target would read the flattened output (position 0) and None the largest value over all positions. Received: targets=3. Say which position: targets=ks.targets.position(t, c) (class c at position t, negative from the end, e.g. position(-1, c) for a language model's next token), or ks.targets.region(c, mask) for a class summed over a region; or pass a callable `outputs -> (batch,)`.
    """
    if len(shape) < 3 or all(d == 1 for d in shape[1:-1]):
        return
    shown = targets if np.ndim(targets) == 0 or np.size(targets) <= 4 else f"[... {np.size(targets)} ints]"
    raise ValueError(
        f"targets={shown!r} on an output of shape {tuple(shape)}, which has positions {tuple(shape[1:-1])} before its "
        f"{shape[-1]} classes: an int target would read the flattened output (position 0) and None the largest "
        f"value over all positions. Received: targets={shown!r}. Say which position: "
        "targets=ks.targets.position(t, c) (class c at position t, negative from the end, e.g. position(-1, c) "
        "for a language model's next token), or ks.targets.region(c, mask) for a class summed over a region; "
        "or pass a callable `outputs -> (batch,)`."
    )
