"""Standardising user inputs: arrays, lists / dicts of arrays, dtypes, batching."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kerascope.numeric.chunking import chunk_bounds


class Inputs:
    """The model inputs as a flat list of numpy arrays plus how to rebuild them.

    A single array, a list/tuple of arrays (multi-input models) or a dict of
    arrays (named inputs) are accepted. Floating point inputs are converted to
    float32 (float64 images work with a float32 model); integer inputs (token
    ids) keep their dtype.

    Two structures are kept: the user's (``kind``, ``keys``: how results are
    returned, :meth:`rebuild`) and the one the model is called with
    (:meth:`model_arg`). They are the same until :func:`check_against_model`
    matches the inputs to a model with a known input signature: a dict is then
    matched by name (any key order) and a list by position, ``arrays`` (and
    ``keys``) are put in the order of ``model.inputs``, and the model is always
    called the same way, whatever structure the user passed. :attr:`signature`
    (part of every compiled function's cache key) includes the call structure.

    Example:
        >>> import numpy as np
        >>> x = Inputs(np.zeros((2, 3), "float64"))
        >>> x.arrays[0].dtype, x.num_samples
        (dtype('float32'), 2)
        >>> x.rebuild([np.ones((2, 3))]).shape
        (2, 3)
    """

    def __init__(self, inputs: Any) -> None:
        if isinstance(inputs, dict):
            self.kind, self.keys = "dict", list(inputs)
            raw = [inputs[k] for k in self.keys]
        elif isinstance(inputs, (list, tuple)):
            self.kind, self.keys = "list", None
            raw = list(inputs)
        else:
            self.kind, self.keys = "single", None
            raw = [inputs]
        self.call_kind, self.call_keys = self.kind, self.keys
        if not raw:
            raise ValueError("`inputs` is empty. Received: inputs=[]. Pass an array of shape (batch, ...).")
        self.arrays = [_as_array(x, i) for i, x in enumerate(raw)]
        sizes = {len(a) for a in self.arrays}
        if len(sizes) != 1:
            raise ValueError(
                "All model inputs must have the same batch size. Received batch sizes: "
                f"{[len(a) for a in self.arrays]}."
            )
        self.num_samples = sizes.pop()
        if self.num_samples == 0:
            raise ValueError(
                f"`inputs` has no samples. Received: inputs with shape {self.arrays[0].shape}."
            )

    def model_arg(self, arrays: list[Any]) -> Any:
        """Return ``arrays`` in the structure the model's ``call`` expects.

        Example:
            >>> import numpy as np
            >>> Inputs({"a": np.zeros((1, 2))}).model_arg([1])
            {'a': 1}
        """
        return self.structurer()(arrays)

    @property
    def batch_size(self) -> int:
        """The number of samples (old name of :attr:`num_samples`; ``batch_size`` elsewhere is a chunk size).

        Example:
            >>> import numpy as np
            >>> Inputs(np.zeros((3, 2))).batch_size
            3
        """
        return self.num_samples

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.num_samples = value

    def structurer(self) -> Callable[[list[Any]], Any]:
        """Return a function doing :meth:`model_arg` that does not hold the arrays.

        Example:
            >>> import numpy as np
            >>> Inputs([np.zeros((1, 2))]).structurer()(["x"])
            ['x']
        """
        return _structurer(self.call_kind, self.call_keys)

    def rebuild(self, arrays: list[Any]) -> Any:
        """Results per input (in the order of :attr:`arrays`) in the user's structure.

        Example:
            >>> import numpy as np
            >>> Inputs([np.zeros((1, 2)), np.zeros((1, 3))]).rebuild(["a", "b"])
            ['a', 'b']
        """
        return _structurer(self.kind, self.keys)(arrays)

    @property
    def signature(self) -> tuple[Any, ...]:
        """What a compiled function depends on: the call structure and per-sample shapes and dtypes.

        Example:
            >>> import numpy as np
            >>> Inputs({"b": np.zeros((4, 3)), "a": np.zeros((4, 1))}).signature
            (('dict', ('b', 'a')), ((3,), 'float32'), ((1,), 'float32'))
        """
        structure = (self.call_kind, None if self.call_keys is None else tuple(self.call_keys))
        return (structure, *((s[1:], d) for s, d in self.specs))

    @property
    def specs(self) -> list[tuple[tuple[int, ...], str]]:
        """Shapes and dtypes, used as the compiled function's signature.

        Example:
            >>> import numpy as np
            >>> Inputs(np.zeros((4, 3))).specs
            [((4, 3), 'float32')]
        """
        return [(a.shape, a.dtype.name) for a in self.arrays]

    def subset(self, part: slice) -> Inputs:
        """The samples in ``part`` (views, not copies), with the same user and call structures.

        Example:
            >>> import numpy as np
            >>> x = Inputs({"a": np.arange(4.0)[:, None]})
            >>> y = x.subset(slice(1, 3))
            >>> y.num_samples, y.keys, y.arrays[0][:, 0].tolist()
            (2, ['a'], [1.0, 2.0])
        """
        chunk = object.__new__(Inputs)
        chunk.__dict__.update(self.__dict__)
        chunk.arrays = [a[part] for a in self.arrays]
        chunk.num_samples = len(chunk.arrays[0])
        # where the chunk starts among the user's samples (warnings name the user's sample positions)
        chunk.first_index = getattr(self, "first_index", 0) + (part.indices(self.num_samples)[0] if part.step in (None, 1) else 0)
        return chunk

    def chunks(self, batch_size: int) -> Iterator[tuple[slice, list[np.ndarray]]]:
        """Yield ``(slice, arrays)`` chunks of at most ``batch_size`` samples.

        Example:
            >>> import numpy as np
            >>> [s for s, _ in Inputs(np.zeros((5, 1))).chunks(2)]
            [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
        """
        for start, stop in chunk_bounds(self.num_samples, batch_size):
            part = slice(start, stop)
            yield part, [a[part] for a in self.arrays]


def _structurer(kind: str, keys: list[str] | None) -> Callable[[list[Any]], Any]:
    if kind == "dict":
        names = list(keys or [])
        return lambda arrays: dict(zip(names, arrays))
    if kind == "list":
        return list
    return lambda arrays: arrays[0]


def _as_array(x: Any, index: int) -> np.ndarray:
    if hasattr(x, "detach") and not isinstance(x, np.ndarray):  # a torch tensor, maybe requiring grad
        x = x.detach().cpu().numpy()
    elif hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    try:
        array = np.asarray(x)
    except Exception as error:
        raise TypeError(
            f"Input {index} could not be converted to a numpy array. Received: {type(x).__name__}."
        ) from error
    if array.dtype == object:
        raise TypeError(
            f"Input {index} is not numeric (ragged or mixed values). Received: dtype=object, "
            f"shape={array.shape}. Pass a numeric array of shape (batch, ...)."
        )
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_) or np.iscomplexobj(array):
        raise TypeError(
            f"Input {index} is not real-valued numeric data. Received: dtype={array.dtype.name}, "
            f"shape={array.shape}. Pass int, float or bool arrays (decode strings, take the real part)."
        )
    if array.ndim == 0:
        raise ValueError(
            f"Input {index} is a scalar. Received: shape=(). Pass an array of shape (batch, ...)."
        )
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(array)):
            bad = int(np.sum(~np.isfinite(array)))
            raise ValueError(
                f"Input {index} contains {bad} NaN or infinite values. Received: array of shape "
                f"{array.shape}. Clean or impute the inputs before explaining them."
            )
        return np.ascontiguousarray(array, dtype=np.float32)
    if np.issubdtype(array.dtype, np.bool_):
        return array.astype(np.float32)
    return np.ascontiguousarray(array)


def model_input_names(model: Any) -> tuple[list[str], str] | None:
    """The names of the model's inputs in the order of ``model.inputs`` and how it is called.

    Returns ``(names, call_kind)`` (``"dict"``: the model was built on a dict of
    inputs and is called with one; ``"list"`` / ``"single"``: positionally), or
    ``None`` when the model has no known input signature (subclassed models).

    Example:
        >>> import keras
        >>> p, q = keras.Input((2,), name="p"), keras.Input((3,), name="q")
        >>> model_input_names(keras.Model([q, p], keras.layers.Concatenate()([p, q])))
        (['q', 'p'], 'list')
    """
    try:
        tensors = list(model.inputs)
    except Exception:
        return None
    if not tensors:
        return None
    struct = getattr(model, "_inputs_struct", None)  # Functional: the structure it was built with
    if isinstance(struct, dict) and all(not isinstance(v, (dict, list, tuple)) for v in struct.values()):
        return sorted(struct), "dict"  # Keras flattens a dict by sorted keys: model.inputs' order
    return [t.name for t in tensors], "single" if len(tensors) == 1 else "list"


def check_against_model(model: Any, inputs: Inputs) -> None:
    """Match ``inputs`` to the model's inputs (by name or position) and check their shapes.

    A dict is matched by name, in any key order (as Keras does); a list or a
    single array by position. ``inputs`` is reordered in place to the order of
    ``model.inputs`` and will call the model in one fixed structure, so the
    compiled functions (keyed by :attr:`Inputs.signature`) never see two
    orders. Only models with a known input signature (Functional / Sequential)
    are matched; subclassed models are checked by their own forward pass.

    Example:
        >>> import keras, numpy as np
        >>> p, q = keras.Input((2,), name="p"), keras.Input((3,), name="q")
        >>> m = keras.Model([p, q], keras.layers.Concatenate()([p, q]))
        >>> x = Inputs({"q": np.zeros((1, 3)), "p": np.zeros((1, 2))})
        >>> check_against_model(m, x)
        >>> x.keys, [a.shape for a in x.arrays], type(x.model_arg(x.arrays)).__name__
        (['p', 'q'], [(1, 2), (1, 3)], 'list')
    """
    known = model_input_names(model)
    if known is None:
        return
    names, call_kind = known
    expected = [tuple(t.shape) for t in model.inputs]
    if inputs.kind == "dict":
        given = list(inputs.keys or [])
        if sorted(map(str, given)) != sorted(names):
            missing = [n for n in names if n not in given]
            unknown = [k for k in given if k not in names]
            raise ValueError(
                f"The input dict's keys do not match the names of model {model.name!r}'s inputs. "
                f"Received keys: {given}. Expected keys (any order): {names}"
                + (f"; missing: {missing}" if missing else "")
                + (f"; unknown: {unknown}" if unknown else "")
                + ". Pass a dict with exactly these keys, or a list of arrays in this order."
            )
        order = [given.index(n) for n in names]
        inputs.arrays = [inputs.arrays[i] for i in order]
        inputs.keys = list(names)
    elif len(expected) != len(inputs.arrays):
        raise ValueError(
            f"Model {model.name!r} takes {len(expected)} input(s) ({names}) but received {len(inputs.arrays)}. "
            f"Expected shapes: {expected}. Received shapes: {[a.shape for a in inputs.arrays]}."
        )
    inputs.call_kind, inputs.call_keys = call_kind, (list(names) if call_kind == "dict" else None)
    for i, (want, arr) in enumerate(zip(expected, inputs.arrays)):
        got = arr.shape
        ok = len(want) == len(got) and all(w is None or w == g for w, g in zip(want[1:], got[1:]))
        if not ok:
            label = f"Input {i}" if len(names) == 1 else f"Input {i} ({names[i]!r})"
            raise ValueError(
                f"{label} does not match the model's input shape. Received: shape={got}. "
                f"Expected: {want} (None = any size). Resize or reshape the inputs, e.g. "
                "images to the model's height and width with a batch axis first."
            )


def fit_structure(model: Any, arg: Any) -> Any:
    """``arg`` (a tensor, list or dict) in the structure ``model`` was built with, when they differ only in form.

    A functional model built with ``Model([image], ...)`` or ``Model({"face": image}, ...)``
    (e.g. an ``.hdf5`` model with a named input) expects a list or a dict; calling it with a
    bare tensor works but makes Keras warn "The structure of `inputs` doesn't match the
    expected structure". Every call kerascope makes goes through here, so the user's data
    reaches the model in its own structure. Lists map to dicts in the model's flattened
    (``model.inputs``) order, dicts to lists by input name; anything else is returned as is.

    Example:
        >>> import keras, numpy as np
        >>> x = keras.Input((2,), name="face")
        >>> m = keras.Model([x], keras.layers.Dense(1)(x))
        >>> type(fit_structure(m, np.ones((1, 2)))).__name__
        'list'
        >>> list(fit_structure(keras.Model({"face": x}, m.outputs[0]), np.ones((1, 2))))
        ['face']
    """
    try:
        expected = model.input  # functional models: the structure they were built with
    except Exception:  # noqa: BLE001 - Sequential before its first call, subclassed models: nothing to match
        return arg
    import keras

    if isinstance(expected, dict):
        if isinstance(arg, dict):
            return arg
        keys = keras.tree.flatten({key: key for key in expected})  # the order of model.inputs
        values = list(arg) if isinstance(arg, (list, tuple)) else [arg]
        return dict(zip(keys, values)) if len(values) == len(keys) else arg
    if isinstance(expected, (list, tuple)):
        if isinstance(arg, dict):
            names = [getattr(t, "name", None) for t in expected]
            return [arg[name] for name in names] if all(name in arg for name in names) else arg
        if not isinstance(arg, (list, tuple)) and len(expected) == 1:
            return [arg]
        return arg
    if isinstance(arg, (list, tuple)) and len(arg) == 1:
        return arg[0]
    if isinstance(arg, dict) and len(arg) == 1:
        return next(iter(arg.values()))
    return arg
