"""Targets: which scalar per sample is explained.

A target is an int (one class for every sample), a list / array of ints (one
per sample), ``None`` (the predicted class), or a callable
``outputs -> (batch,)`` scores written with ``keras.ops`` (regression, a
segmentation region, a combination of outputs of a multi-output model).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from keras import ops

PREDICTED = -1
MAX_CLASS = int(np.iinfo(np.int32).max)
"""Largest class index a target may hold (indices travel as int32 inside compiled functions)."""


def encode(targets: Any, n: int) -> tuple[np.ndarray, Callable | None]:
    """Turn a user target into ``(indices, callable)`` for ``n`` samples.

    Indices are int32, with ``-1`` meaning "the predicted class". A callable
    target returns ``(zeros, fn)``.

    Example:
        >>> encode(None, 2)[0].tolist(), encode(3, 2)[0].tolist(), encode([0, 1], 2)[0].tolist()
        ([-1, -1], [3, 3], [0, 1])
    """
    if callable(targets):
        return np.zeros((n,), np.int32), targets
    if targets is None:
        return np.full((n,), PREDICTED, np.int32), None
    array = np.asarray(targets)
    if array.dtype == object or not (
        np.issubdtype(array.dtype, np.integer)
        or (np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array)) and np.all(array == np.round(array)))
    ):
        raise TypeError(
            "`targets` must be an int, a list of ints, None or a callable. "
            f"Received: targets={targets!r}."
        )
    if array.ndim > 1:
        raise ValueError(
            f"`targets` must be an int or a 1-D list of ints (one per sample). Received: an array of shape "
            f"{array.shape}. For a score that is not one class (regression, a region, several outputs) pass "
            "a callable `outputs -> (batch,)`."
        )
    # checked before any cast: 2**40 or 2**32 + 2 must not wrap around to class 0 or 2
    if np.any(array < 0):
        bad = sorted({int(v) for v in np.atleast_1d(array)[np.atleast_1d(array) < 0]})
        raise ValueError(
            f"Class indices must be >= 0. Received: targets containing {bad[:10]}. "
            "Use targets=None for each sample's predicted class."
        )
    if np.any(array > MAX_CLASS):
        bad = sorted({int(v) for v in np.atleast_1d(array)[np.atleast_1d(array) > MAX_CLASS]})
        raise ValueError(
            f"Target class out of range. Received: targets containing {bad[:10]}; a class index is at most "
            f"{MAX_CLASS} (2**31 - 1) and below the number of classes of the explained output."
        )
    array = array.astype(np.int64)
    if array.ndim == 0:
        array = np.full((n,), int(array))
    if array.shape != (n,):
        raise ValueError(
            f"`targets` must have one entry per sample. Received: {array.shape[0] if array.ndim else 1} "
            f"targets for {n} samples (targets={targets!r})."
        )
    return array.astype(np.int32), None


def subset(targets: Any, n: int, part: slice) -> Any:
    """The targets of the samples in ``part``: a per-sample list or array is sliced, the rest kept.

    ``targets`` must already be valid for ``n`` samples (see :func:`encode`).

    Example:
        >>> subset([3, 1, 2], 3, slice(1, 3)), subset(4, 3, slice(1, 3)), subset(None, 3, slice(0, 1))
        ([1, 2], 4, None)
    """
    if targets is None or callable(targets):
        return targets
    array = np.asarray(targets)
    if array.ndim == 1 and len(array) == n:
        return array[part].tolist()
    return targets


def check_scores_shape(values: Any, rows: int) -> None:
    """Raise unless a callable target returned one score per sample: shape ``(rows,)`` or ``(rows, 1)``.

    Example:
        >>> import numpy as np
        >>> check_scores_shape(np.zeros((3,)), 3)
        >>> check_scores_shape(np.zeros((3, 4)), 3)
        Traceback (most recent call last):
        ...
        ValueError: A callable target must return one score per sample. Received: shape (3, 4) from the outputs of 3 samples. Expected: (3,) or (3, 1), e.g. `lambda outputs: outputs[:, 2]` or `lambda outputs: keras.ops.sum(outputs, axis=-1)` (keep the batch axis).
    """
    shape = tuple(getattr(values, "shape", np.shape(values)))
    if shape not in ((rows,), (rows, 1)):
        raise ValueError(
            "A callable target must return one score per sample. "
            f"Received: shape {shape} from the outputs of {rows} samples. Expected: ({rows},) or ({rows}, 1), "
            "e.g. `lambda outputs: outputs[:, 2]` or `lambda outputs: keras.ops.sum(outputs, axis=-1)` "
            "(keep the batch axis)."
        )


def callable_scores(target_fn: Callable, outputs: Any) -> Any:
    """``target_fn(outputs)`` as ``(batch,)`` scores, refusing other shapes (works inside compiled functions).

    Shapes unknown while tracing (a ``None`` batch axis) are checked eagerly by
    ``Engine.prepare`` before anything is compiled.

    Example:
        >>> import numpy as np
        >>> tuple(callable_scores(lambda o: o[:, 1:], np.ones((2, 2), "float32")).shape)
        (2,)
    """
    values = target_fn(outputs)
    shape = tuple(values.shape)
    rows = tuple(ops.shape(_first(outputs)))[0]
    known = isinstance(rows, int) and len(shape) > 0 and isinstance(shape[0], int)
    wrong_rank = len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1)
    if wrong_rank or (known and shape[0] != rows):
        check_scores_shape(values, rows)
    return ops.reshape(values, (-1,))


def _first(outputs: Any) -> Any:
    while isinstance(outputs, (list, tuple, dict)):
        outputs = next(iter(outputs.values())) if isinstance(outputs, dict) else outputs[0]
    return outputs


def callable_key(fn: Callable) -> Any:
    """A cache key under which equivalent callable targets share one compiled function.

    A new ``lambda o: o[:, 2]`` written per call is a new object each time;
    keyed by identity, every call would trace (and keep) one more compiled
    function. Two plain functions are equivalent when they have the same code
    and the same values in their closure, defaults and the globals their code
    reads (hashable values by equality, small arrays by content, anything else
    by identity). Bound methods and ``functools.partial`` are keyed by their
    parts; other callables by identity.

    Example:
        >>> def make(k):
        ...     return lambda o: o[:, k]
        >>> callable_key(make(1)) == callable_key(make(1)), callable_key(make(1)) == callable_key(make(2))
        (True, False)
    """
    key = getattr(fn, "cache_key", None)
    if callable(key) and not isinstance(fn, type):  # kerascope's own targets (ks.targets.position, region)
        return ("keyed", type(fn), key())
    if isinstance(fn, types.FunctionType):
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(_value_key(cell.cell_contents))
            except ValueError:  # an empty cell
                cells.append(("empty",))
        names = _global_names(fn.__code__)
        read = tuple((name, _value_key(fn.__globals__[name])) for name in sorted(names) if name in fn.__globals__)
        defaults = _value_key(fn.__defaults__)
        kwdefaults = _value_key(tuple(sorted((fn.__kwdefaults__ or {}).items())))
        return ("function", fn.__code__, id(fn.__globals__), tuple(cells), read, defaults, kwdefaults)
    if isinstance(fn, types.MethodType):
        return ("method", callable_key(fn.__func__), _value_key(fn.__self__))
    if isinstance(fn, functools.partial):
        keywords = tuple(sorted(fn.keywords.items()))
        return ("partial", callable_key(fn.func), _value_key(fn.args), _value_key(keywords))
    return ("object", _value_key(fn))


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


_PLAIN = (int, float, complex, str, bytes, bool, type(None), type, types.ModuleType, types.CodeType,
          types.FunctionType, types.BuiltinFunctionType, np.generic, np.dtype)


def _value_key(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.size <= 4096:
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, tuple):
        return ("tuple", tuple(_value_key(v) for v in value))
    if isinstance(value, _PLAIN):
        return ("value", type(value), value)
    return _Same(value)  # layers, tensors, lists...: the same object only (held, so its id stays taken)


class _Same:
    """Compares equal only to a holder of the very same object (whatever that object's ``==`` does)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value


def check_range(indices: np.ndarray, num_classes: int) -> None:
    """Raise if a class index is out of range for an output with ``num_classes``.

    Example:
        >>> import numpy as np
        >>> check_range(np.array([0, 1]), 2)
    """
    bad = indices[indices >= num_classes]
    if bad.size:
        raise ValueError(
            f"Target class out of range: the explained output has {num_classes} classes "
            f"(0..{num_classes - 1}). Received: targets containing {sorted(set(bad.tolist()))}."
        )


def class_scores(output: Any, indices: Any) -> tuple[Any, Any]:
    """Per-sample score ``output[i, t_i]`` (flattening non-batch axes), resolving ``-1``.

    Returns ``(scores, resolved_indices)``. Works inside compiled functions.

    Example:
        >>> import numpy as np
        >>> s, t = class_scores(np.array([[1.0, 3.0], [5.0, 2.0]], "float32"), np.array([-1, 1], "int32"))
        >>> np.asarray(s).tolist(), np.asarray(t).tolist()
        ([3.0, 2.0], [1, 1])
    """
    flat = ops.reshape(output, (ops.shape(output)[0], -1))
    predicted = ops.cast(ops.argmax(flat, axis=-1), "int32")
    indices = ops.cast(indices, "int32")
    resolved = ops.where(indices < 0, predicted, indices)
    scores = ops.take_along_axis(flat, ops.expand_dims(resolved, -1), axis=-1)[:, 0]
    return scores, resolved
