"""Targets: which scalar per sample is explained.

A target is an int (one class for every sample), a list / array of ints (one
per sample), ``None`` (the predicted class), or a callable
``outputs -> (batch,)`` scores written with ``keras.ops`` (regression, a
segmentation region, a combination of outputs of a multi-output model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from keras import ops

PREDICTED = -1


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
        or (np.issubdtype(array.dtype, np.floating) and np.all(array == np.round(array)))
    ):
        raise TypeError(
            "`targets` must be an int, a list of ints, None or a callable. "
            f"Received: targets={targets!r}."
        )
    array = array.astype(np.int64)
    if array.ndim == 0:
        array = np.full((n,), int(array))
    if array.shape != (n,):
        raise ValueError(
            f"`targets` must have one entry per sample. Received: {array.shape[0] if array.ndim else 1} "
            f"targets for {n} samples (targets={targets!r})."
        )
    if np.any(array < 0):
        raise ValueError(f"Class indices must be >= 0. Received: targets={array.tolist()}.")
    return array.astype(np.int32), None


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
