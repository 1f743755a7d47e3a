"""DeepLIFT's multipliers: the rescale, max-pooling and product rules as custom backward passes.

The batch holds the inputs in its first half and their references
(baselines) in its second half, row for row (or shares references, :class:`Shared`).

* element-wise ``f`` (ReLU, sigmoid, tanh, ELU, swish, GELU, ...): the rescale
  rule ``m = (f(x) - f(x')) / (x - x')``, the ordinary derivative where
  ``|x - x'| < 1e-10``;
* max pooling: Captum's rule: with ``y = pool(x)``, ``y' = pool(x')`` and
  ``M = max(y, y')``, route ``dy * (M - y')`` back through ``x``'s argmax and
  ``dy * (y - M)`` through ``x'``'s argmax, add the two and divide by
  ``x - x'`` (so every window passes back exactly ``dy * (y - y')``); where
  the windows tile the input (``pool_size == strides``) and the rules fuse,
  the same rule from a reshape of the windows (:func:`maxpool_windows_backward`);
* a product of two inputs ``a * b`` (``Multiply`` of two tensors, e.g. a
  squeeze-and-excitation gate): ``m_a = (b + b') / 2`` and ``m_b = (a + a') / 2``,
  the exact split ``ab - a'b' = (a - a')(b + b')/2 + (a + a')/2 (b - b')``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable
from typing import Any

import keras

from kerascope import _backend

EPS = 1e-10


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _halves(x: Any) -> tuple[Any, Any]:
    half = keras.ops.shape(x)[0] // 2
    return x[:half], x[half:]


def _twice(x: Any) -> Any:
    return keras.ops.concatenate([x, x], axis=0)


class Shared:
    """Where each row's reference is in a shared-reference batch (``group`` rows per reference).

    ``group=None``: the batch is inputs and, last, ONE reference row for all
    of them. ``group=L``: the batch is groups of ``L`` rows, each ``L - 1``
    inputs and, last, their reference (DeepLiftShap: several background rows
    in one pass). Only reshapes and broadcasts: no row is copied to pair it.

    Example:
        >>> import keras, numpy as np
        >>> v = keras.ops.convert_to_tensor(np.array([[1.0], [2.0], [10.0], [3.0], [4.0], [20.0]], "float32"))
        >>> keras.ops.convert_to_numpy(Shared(3).minus_reference(v)).ravel().tolist()
        [-9.0, -8.0, 0.0, -17.0, -16.0, 0.0]
        >>> keras.ops.convert_to_numpy(Shared(None).minus_reference(v)).ravel().tolist()
        [-19.0, -18.0, -10.0, -17.0, -16.0, 0.0]
    """

    def __init__(self, group: int | None = None) -> None:
        if group is not None and int(group) < 2:
            raise ValueError(f"A group holds inputs and their reference: at least 2 rows. Received: group={group!r}.")
        self.group = None if group is None else int(group)

    def _grouped(self, v: Any) -> Any:
        rest = tuple(v.shape[1:])
        if any(d is None for d in rest):
            rest = tuple(keras.ops.shape(v)[1:])
        return keras.ops.reshape(v, (-1, self.group, *rest)), rest

    def _apply(self, v: Any, fn: Callable[[Any, Any], Any]) -> Any:
        """``fn(v, reference of each row)`` (broadcast), in ``v``'s layout."""
        if self.group is None:
            return fn(v, v[-1:])
        grouped, rest = self._grouped(v)
        return keras.ops.reshape(fn(grouped, grouped[:, -1:]), (-1, *rest))

    def minus_reference(self, v: Any) -> Any:
        """``v`` minus each row's reference row (zero on the reference rows)."""
        return self._apply(v, lambda a, r: a - r)

    def mean_with_reference(self, v: Any) -> Any:
        """``(v + v') / 2`` for each row and its reference row (the reference rows stay as they are)."""
        return self._apply(v, lambda a, r: (a + r) * 0.5)

    def reference_rows(self, v: Any) -> Any:
        """Each row's reference row, broadcast to ``v``'s shape (a reference row is its own)."""
        return self._apply(v, lambda a, r: keras.ops.broadcast_to(r, keras.ops.shape(a)))

    def inputs(self, v: Any) -> Any:
        """The input rows (every row but the references), in order."""
        if self.group is None:
            return v[:-1]
        grouped, rest = self._grouped(v)
        return keras.ops.reshape(grouped[:, :-1], (-1, *rest))

    def reference_copies(self, v: Any) -> Any:
        """Each input row's reference row, one copy per input row (as :meth:`inputs` orders them)."""
        if self.group is None:
            return keras.ops.zeros_like(v[:-1]) + v[-1:]
        grouped, rest = self._grouped(v)
        return keras.ops.reshape(keras.ops.zeros_like(grouped[:, :-1]) + grouped[:, -1:], (-1, *rest))

    def join(self, inputs: Any, batch: Any) -> Any:
        """``inputs`` (as :meth:`inputs` orders them) with the reference rows taken from ``batch``."""
        if self.group is None:
            return keras.ops.concatenate([inputs, batch[-1:]], axis=0)
        grouped, rest = self._grouped(batch)
        parts = keras.ops.reshape(inputs, (-1, self.group - 1, *rest))
        return keras.ops.reshape(keras.ops.concatenate([parts, grouped[:, -1:]], axis=1), (-1, *rest))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shared) and other.group == self.group

    def __hash__(self) -> int:
        return hash(("shared", self.group))

    def __repr__(self) -> str:
        return f"Shared({self.group})"


def _safe_divide(numerator: Any, delta_in: Any, fallback: Any, eps: float = EPS) -> Any:
    """``numerator / delta_in``, ``fallback`` where ``|delta_in| < eps`` (Captum's ``torch.where``).

    The division is not guarded: where ``delta_in`` is 0 it gives inf / NaN, which the
    ``where`` never selects (nothing differentiates through a backward rule). One ``where``
    instead of two: on the demo model the selects were a quarter of DeepLIFT's backward pass;
    the backend's own ``select`` where it has one (TensorFlow: the same-shape kernel, half
    ``tf.where``'s time on CPU), else ``keras.ops.where``.
    """
    select = getattr(_backend.get(), "select", keras.ops.where)
    return select(keras.ops.abs(delta_in) < eps, fallback, numerator / delta_in)


def _layout(shared: bool | Shared) -> Shared | None:
    """``shared`` as a :class:`Shared` layout (``True``: one reference row last), or ``None`` for pairs."""
    if isinstance(shared, Shared):
        return shared
    return Shared(None) if shared else None


def rescale_backward(
    xs: list[Any], y: Any, dy: Any, vjp: Callable[[Any], list[Any]], shared: bool | Shared = False
) -> list[Any]:
    """The rescale rule: ``dy * (f(x) - f(x')) / (x - x')`` (``f``'s gradient where ``|x - x'| < 1e-10``).

    ``shared=False``: the batch is inputs then their references (two halves);
    ``shared=True``: inputs then one reference row shared by all of them; a
    :class:`Shared` layout: groups of inputs each followed by their reference
    (the reference rows keep their ordinary gradient; they are never read).

    Example:
        >>> import keras, numpy as np
        >>> x = keras.ops.convert_to_tensor(np.array([[-1.0, 3.0], [1.0, 1.0]], "float32"))  # input, reference
        >>> y = keras.ops.relu(x); dy = keras.ops.ones_like(x)
        >>> g = rescale_backward([x], y, dy, lambda d: [d * keras.ops.cast(x > 0, "float32")])[0]
        >>> keras.ops.convert_to_numpy(g).tolist()
        [[0.5, 1.0], [0.5, 1.0]]
    """
    x = xs[0]
    fallback = vjp(dy)[0]
    layout = _layout(shared)
    if layout is None:
        xa, xb = _halves(x)
        ya, yb = _halves(y)
        return [_safe_divide(dy * _twice(ya - yb), _twice(xa - xb), fallback)]
    # on the whole batch: a reference row's own difference is 0, so it keeps its ordinary gradient
    return [_safe_divide(dy * layout.minus_reference(y), layout.minus_reference(x), fallback)]


def maxpool_backward(xs: list[Any], y: Any, dy: Any, vjp: Callable[[Any], list[Any]]) -> list[Any]:
    """Captum's max-pooling rule (``vjp`` routes a gradient to the window maxima of each row).

    Each window passes back ``dy * (y - y')`` in total, split between the
    argmax of the input and that of the reference, divided by ``x - x'``.

    Example:
        >>> import keras, numpy as np
        >>> x = keras.ops.convert_to_tensor(np.array([[3.0, 0.0], [3.0, 4.0]], "float32"))  # input, reference
        >>> pool = lambda v: keras.ops.max(v, axis=1, keepdims=True)
        >>> y = pool(x); dy = keras.ops.ones_like(y)
        >>> route = lambda d: [d * keras.ops.cast(x == y, "float32")]
        >>> keras.ops.convert_to_numpy(maxpool_backward([x], y, dy, route)[0]).tolist()
        [[1.0, 0.25], [0.0, 0.25]]
    """
    x = xs[0]
    xa, xb = _halves(x)
    ya, yb = _halves(y)
    top = keras.ops.maximum(ya, yb)
    routed = vjp(dy * keras.ops.concatenate([top - yb, ya - top], axis=0))[0]
    ra, rb = _halves(routed)
    return [_safe_divide(_twice(ra + rb), _twice(xa - xb), vjp(dy)[0])]


def maxpool_shared_backward(
    xs: list[Any], y: Any, dy: Any, vjp: Callable[[Any], list[Any]], layout: Shared | None = None
) -> list[Any]:
    """Captum's max-pooling rule with shared reference rows (default: one, the batch's last row).

    ``xs = [x, r]``: the batch (inputs and references, as ``layout`` places
    them) and each input's reference, one copy per input
    (``layout.reference_copies``); ``y`` is the pooling of both, stacked.
    Each input's window passes back ``dy * (y - y')``, split between the
    input's argmax and the reference's (routed through ``r``'s copies, one
    per input and its own ``dy``).

    Example:
        >>> import keras, numpy as np
        >>> x = keras.ops.convert_to_tensor(np.array([[3.0, 0.0], [3.0, 4.0]], "float32"))  # input, reference
        >>> r = x[1:]
        >>> pool = lambda v: keras.ops.max(v, axis=1, keepdims=True)
        >>> y = keras.ops.concatenate([pool(x), pool(r)]); dy = keras.ops.ones_like(y)
        >>> route = lambda d: [d[:2] * keras.ops.cast(x == pool(x), "float32"), d[2:] * keras.ops.cast(r == pool(r), "float32")]
        >>> keras.ops.convert_to_numpy(maxpool_shared_backward([x, r], y, dy, route)[0]).tolist()
        [[1.0, 0.25], [0.0, 1.0]]
    """
    layout = layout or Shared(None)
    x, r = xs
    n = keras.ops.shape(x)[0]
    yx, yr = y[:n], y[n:]
    ya = layout.inputs(yx)
    top = keras.ops.maximum(ya, yr)
    dyx = dy[:n]
    dya = layout.inputs(dyx)
    routed = layout.join(dya * (top - yr), keras.ops.zeros_like(dyx))
    gx, gr = vjp(keras.ops.concatenate([routed, dya * (ya - top)], axis=0))
    fallback = vjp(keras.ops.concatenate([dyx, keras.ops.zeros_like(dy[n:])], axis=0))[0]
    multiplied = _safe_divide(layout.inputs(gx) + gr, layout.inputs(x) - r, layout.inputs(fallback))
    return [layout.join(multiplied, fallback), keras.ops.zeros_like(r)]


#: Max-pooling layers whose windows can tile the input (``pool_size == strides``): :func:`pooling_windows`.
#: 1D / 2D only: a 3D pooling's windows are rank-8 tensors, past what TensorFlow's broadcasting kernels take.
#: Not the global poolings: they are a ``max`` reduction, whose gradient splits a tie evenly (TensorFlow,
#: JAX), where a pooling's gives it to the first maximum.
TILED_MAXPOOL_LAYERS = ("MaxPooling1D", "MaxPooling2D")


def pooling_windows(layer: Any) -> tuple[tuple[int, ...], str] | None:
    """``(pool_size, padding)`` of a max pooling whose windows tile its input, else ``None``.

    Exactly a built-in ``MaxPooling1D/2D`` with ``pool_size == strides``
    (``"valid"`` or ``"same"``), channels last. Such a pooling is a reshape
    and a maximum, so :func:`maxpool_windows_backward` can run Captum's rule
    without routing gradients through the pooling's own backward pass.
    Overlapping windows, channels first, 3D and global poolings and
    subclasses keep :func:`maxpool_shared_backward`.

    Example:
        >>> import keras
        >>> pooling_windows(keras.layers.MaxPooling2D(2)), pooling_windows(keras.layers.MaxPooling1D(3, padding="same"))
        (((2, 2), 'valid'), ((3,), 'same'))
        >>> pooling_windows(keras.layers.MaxPooling2D(3, strides=2)), pooling_windows(keras.layers.GlobalMaxPooling2D())
        (None, None)
    """
    name = type(layer).__name__
    if type(layer) is not getattr(keras.layers, name, None) or getattr(layer, "data_format", None) != "channels_last":
        return None
    if name not in TILED_MAXPOOL_LAYERS:
        return None
    pool, strides = tuple(int(p) for p in layer.pool_size), tuple(int(s) for s in layer.strides)
    if pool != strides or layer.padding not in ("valid", "same"):
        return None
    return pool, layer.padding


def _window_shape(
    spatial: tuple[int, ...], pool: tuple[int, ...], padding: str
) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """``(windows per axis, (before, after) per axis)``: after < 0 crops what ``"valid"`` drops."""
    counts, edges = [], []
    for n, p in zip(spatial, pool, strict=True):
        count = -(-n // p) if padding == "same" else n // p
        extra = count * p - n  # "same": padded (TensorFlow puts the odd one after); "valid": <= 0, cropped
        before = extra // 2 if extra > 0 else 0
        counts.append(count)
        edges.append((before, extra - before))
    return tuple(counts), edges


def maxpool_windows_backward(
    xs: list[Any], y: Any, dy: Any, vjp: Callable[[Any], list[Any]] | None, layout: Shared,
    pool: tuple[int, ...], padding: str,
) -> list[Any]:
    """Captum's max-pooling rule for windows that tile the input, from a reshape of ``x`` alone.

    The same multipliers as :func:`maxpool_shared_backward` (each window
    passes back ``dy * (y - y')``, split between the input's argmax and the
    reference's, divided by ``x - x'``; a tie goes to the window's first
    maximum in row-major order, as the pooling's own gradient does), but
    every term is an element-wise function of the windows ``(rows, windows_1,
    pool_1, windows_2, pool_2, ..., channels)``: no pooling of the reference
    copies and no routing
    through the pooling's backward pass. Under XLA it is one loop over the
    input (TensorFlow, ``fuse_rules``: on the demo model it replaces six
    ``MaxPoolGrad`` of 14 ms per pass). ``y`` and ``vjp`` are not used.
    ``pool`` / ``padding``: :func:`pooling_windows`; the batch is laid out as
    ``layout`` says (a reference row gets its ordinary gradient).

    Example:
        >>> import keras, numpy as np
        >>> x = keras.ops.convert_to_tensor(np.array([[3.0, 0.0], [3.0, 4.0]], "float32").reshape(2, 2, 1))
        >>> dy = keras.ops.ones((2, 1, 1))  # input row, then the reference row
        >>> g = maxpool_windows_backward([x], None, dy, None, Shared(None), (2,), "valid")[0]
        >>> keras.ops.convert_to_numpy(g).ravel().tolist()
        [1.0, 0.25, 0.0, 1.0]
    """
    ops = keras.ops
    x = xs[0]
    spatial, channels = tuple(int(d) for d in x.shape[1:-1]), int(x.shape[-1])
    counts, edges = _window_shape(spatial, pool, padding)
    rank, size = len(spatial), math.prod(pool)
    framed = x  # cropped ("valid") or padded ("same") to whole windows
    if any(after < 0 for _, after in edges):  # "valid": the positions no window covers
        framed = framed[(slice(None), *(slice(0, c * p) for c, p in zip(counts, pool)), slice(None))]
    if any(before > 0 or after > 0 for before, after in edges):  # "same": padding no window maximum can be
        framed = ops.pad(framed, [(0, 0), *((b, max(a, 0)) for b, a in edges), (0, 0)], constant_values=float("-inf"))
    # (rows, windows_1, pool_1, windows_2, pool_2, ..., channels): no transpose, reduced over the pool axes
    windows = ops.reshape(framed, (-1, *(n for c, p in zip(counts, pool) for n in (c, p)), channels))
    reduced = tuple(range(2, 2 * rank + 1, 2))
    # each position's row-major index in its window (ties go to the first, as the pooling's own gradient)
    position = ops.reshape(ops.arange(size, dtype="int32"), (1, *(d for p in pool for d in (1, p)), 1))
    top_x = ops.max(windows, axis=reduced, keepdims=True)
    first = ops.min(ops.where(windows == top_x, position, size), axis=reduced, keepdims=True)
    at_max = ops.cast(position == first, x.dtype)  # one-hot: the window's first maximum
    top_r = layout.reference_rows(top_x)
    top = ops.maximum(top_x, top_r)
    d = ops.reshape(dy, (-1, *(n for c in counts for n in (c, 1)), channels))
    numerator = at_max * (d * (top - top_r)) + layout.reference_rows(at_max) * (d * (top_x - top))
    grads = _safe_divide(numerator, windows - layout.reference_rows(windows), at_max * d)
    grads = ops.reshape(grads, (-1, *(c * p for c, p in zip(counts, pool)), channels))
    if any(before > 0 or after > 0 for before, after in edges):
        grads = grads[(slice(None), *(slice(b, b + n) for (b, _), n in zip(edges, spatial)), slice(None))]
    if any(after < 0 for _, after in edges):
        grads = ops.pad(grads, [(0, 0), *((0, -min(a, 0)) for _, a in edges), (0, 0)])
    return [grads]


def product(a: Any, b: Any, shared: bool | Shared = False) -> Any:
    """``a * b`` whose gradient is the DeepLIFT product rule: ``(b + b') / 2`` for ``a``, ``(a + a') / 2`` for ``b``.

    The forward value is exactly ``a * b`` (``t - stop_gradient(t)`` is zero);
    broadcasting between ``a`` and ``b`` is handled by autodiff. ``shared``:
    the references are shared rows (see :func:`rescale_backward`).

    Example:
        >>> import keras, numpy as np
        >>> a = keras.ops.convert_to_tensor(np.array([[2.0], [0.0]], "float32"))
        >>> b = keras.ops.convert_to_tensor(np.array([[3.0], [1.0]], "float32"))
        >>> keras.ops.convert_to_numpy(product(a, b)).tolist()
        [[6.0], [0.0]]
    """
    sg = keras.ops.stop_gradient
    layout = _layout(shared)

    def mean_of_halves(v: Any) -> Any:
        if layout is not None:  # a reference row's own mean, (v' + v') / 2, is exactly v'
            return sg(layout.mean_with_reference(v))
        first, second = _halves(v)
        return sg(_twice((first + second) * 0.5))

    linear = a * mean_of_halves(b) + mean_of_halves(a) * b
    return sg(a * b) + (linear - sg(linear))


def _rescaled(
    fn: Callable[[Any], Any], backend: Any, shared: bool | Shared = False,
    fuse: tuple[Hashable, Callable[[Any], Any], bool] | None = None,
) -> Callable[[Any], Any]:
    rule = functools.partial(rescale_backward, shared=shared)
    return backend.custom_backward(fn, rule, f"deeplift_{_name(fn)}", fuse=fuse)
