"""DeepLIFT's backward rules, installed on a model for the duration of one call.

The batch holds the inputs in its first half and their references
(baselines) in its second half, row for row. Every non-linearity the model
has gets a backward pass that multiplies by DeepLIFT's *multipliers*
(Shrikumar et al. 2017, as in Captum's ``DeepLift``), computed from the
paired rows; linear layers keep their ordinary gradient, which is already
their multiplier. The rules are written once in ``keras.ops``; the backends
only provide ``custom_backward`` (a custom vector-Jacobian product).

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

With these, the attributions ``(x - x') * m`` sum to ``f(x) - f(x')``
(summation-to-delta). Everything is scoped: the model's attributes are put
back in ``finally``.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import keras

from kerascope import _backend
from kerascope.core.layers import iter_layers, operation_paths
from kerascope.core.probe import attribute, patched_attribute

EPS = 1e-10

#: Activation functions (by ``__name__``) that act element-wise: the rescale rule applies.
ELEMENTWISE_ACTIVATIONS = frozenset({
    "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "sigmoid", "hard_sigmoid", "log_sigmoid",
    "tanh", "hard_tanh", "tanh_shrink", "softplus", "softsign", "silu", "swish", "hard_silu",
    "hard_swish", "gelu", "mish", "exponential", "sparse_plus", "squareplus", "soft_shrink",
    "hard_shrink",
})

#: Layers that are one element-wise function of one input (their ``call`` gets the rescale rule).
ELEMENTWISE_LAYERS = ("ReLU", "LeakyReLU", "ELU")

MAXPOOL_LAYERS = (
    "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "GlobalMaxPooling1D", "GlobalMaxPooling2D",
    "GlobalMaxPooling3D",
)

#: Layers that are affine in their inputs at inference: their gradient is already their multiplier.
LINEAR_LAYERS = (
    "InputLayer", "Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose",
    "Conv2DTranspose", "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
    "SeparableConv2D", "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
    "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D", "Flatten", "Reshape",
    "Permute", "RepeatVector", "BatchNormalization", "Add", "Subtract", "Average", "Concatenate",
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
    "GaussianDropout", "AlphaDropout", "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
    "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D", "UpSampling3D",
    "Rescaling", "Normalization", "Identity", "Activation",
)

#: Element-wise ``keras.ops`` operations of a Functional graph (``keras.ops.tanh(x)`` between layers).
ELEMENTWISE_OPS = frozenset({
    "Relu", "Relu6", "Sigmoid", "Tanh", "Softplus", "Softsign", "Silu", "Swish", "LogSigmoid",
    "LeakyRelu", "HardSigmoid", "HardSilu", "HardSwish", "Elu", "Selu", "Gelu", "Celu", "Mish",
    "Exp", "Exp2", "Expm1", "Log", "Log1p", "Sqrt", "Square", "Abs", "Absolute", "Sin", "Cos",
    "SparsePlus", "Squareplus", "HardTanh", "TanhShrink", "SoftShrink", "HardShrink",
})

#: Linear ``keras.ops`` operations (whatever their arguments).
LINEAR_OPS = frozenset({
    "Add", "Subtract", "Negative", "Reshape", "Transpose", "Concatenate", "ExpandDims", "Squeeze",
    "GetItem", "Mean", "Sum", "Cast", "Stack", "Tile", "Repeat", "BroadcastTo", "Pad", "Moveaxis",
    "Swapaxes", "Flip", "Roll", "Average", "Slice", "Identity", "Ravel", "Copy", "Conjugate", "Real",
})

#: ``keras.ops`` operations that are linear when only one argument depends on the inputs
#: (``x * 2.0``, ``x @ w``); for ``Divide`` / ``TrueDivide`` it must be the numerator.
ONE_TENSOR_LINEAR_OPS = frozenset({"Multiply", "Divide", "TrueDivide", "Matmul", "Einsum", "Dot", "Tensordot"})


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


def rules_fuse() -> bool:
    """Whether ``fuse=True`` changes anything here: the backend compiles a rule into one kernel.

    TensorFlow where XLA compiles (a tiny kernel is tried once); never JAX (``jax.jit`` fuses the
    whole pass already) or PyTorch (op by op). Where it does not, callers keep one rule object,
    so that a pass is not traced twice for nothing.

    Example:
        >>> import keras
        >>> rules_fuse() == (keras.backend.backend() == "tensorflow")
        True
    """
    return bool(_backend.get().fuses_rules())


def _fuse_key(
    obj: Any, kind: str, shared: bool | Shared, fuse: bool
) -> tuple[Hashable, Callable[[Any], Any], bool] | None:
    """The backend's ``fuse=`` for a rescale-rule site: ``(key, fn, exact)`` (the layout in the key), or ``None``."""
    found = fusable(obj, kind) if fuse else None
    if found is None:
        return None
    key, fn, exact = found
    rule = "deeplift_maxpool" if kind == "maxpool" else "deeplift_rescale"
    return (rule, key, _layout(shared)), fn, exact


#: Element-wise layers whose rule may be fused: their settings are their whole definition.
FUSABLE_LAYERS = ("ReLU", "LeakyReLU", "ELU")
_UNSET = object()
#: The fresh layers' ``call`` per key (a handful of small stateless layers, built once).
_FRESH: dict[Hashable, Callable[[Any], Any]] = {}


def fusable(obj: Any, kind: str) -> tuple[Hashable, Callable[[Any], Any], bool] | None:
    """``(key, fn, exact)`` for a site whose rule can run as one compiled kernel, else ``None``.

    A Keras activation function (the function itself: ``keras.activations.relu``),
    a built-in ``ReLU`` / ``LeakyReLU`` / ``ELU`` layer (exactly that class), or
    (``kind="maxpool"``) a max pooling whose windows tile its input (:func:`pooling_windows`),
    keyed by what defines it, so that equal sites share one kernel. ``fn`` is
    the activation function, or a fresh layer built from the layer's config:
    it holds nothing of the user's model. ``exact``: ``fn`` is only ``max`` /
    ``min`` (ReLU, ReLU6, a clipped ReLU), the same bits however compiled.
    Anything else (custom activations, subclasses, raw ``keras.ops`` nodes)
    keeps the rule's separate ops.

    Example:
        >>> import keras
        >>> key, fn, exact = fusable(keras.layers.ReLU(max_value=6.0, name="a"), "elementwise")
        >>> values = keras.ops.convert_to_numpy(fn(keras.ops.convert_to_tensor([-1.0, 9.0]))).tolist()
        >>> key == fusable(keras.layers.ReLU(max_value=6.0, name="b"), "elementwise")[0], values, exact
        (True, [0.0, 6.0], True)
        >>> fusable(keras.layers.Dense(2, activation="tanh"), "activation")
        (('activation', 'tanh'), <function tanh at ...>, False)
        >>> fusable(keras.layers.Dense(2, activation=lambda x: x * x), "activation") is None
        True
        >>> fusable(keras.layers.MaxPooling2D(2), "maxpool")[2], fusable(keras.layers.MaxPooling2D(3, 2), "maxpool")
        (True, None)
    """
    if kind == "activation":
        fn = attribute(obj, "activation")
        name = getattr(fn, "__name__", "")
        if name in ELEMENTWISE_ACTIVATIONS and getattr(keras.activations, name, _UNSET) is fn:
            return ("activation", name), fn, name in ("relu", "relu6")
        return None
    if kind == "maxpool":  # windows that tile the input: a reshape and a maximum, the same bits anywhere
        found = _fresh(obj) if pooling_windows(obj) is not None else None
        return None if found is None else (*found, True)
    builtins = tuple(getattr(keras.layers, n) for n in FUSABLE_LAYERS)
    if kind != "elementwise" or type(obj) not in builtins:
        return None
    found = _fresh(obj)
    if found is None:
        return None
    config = obj.get_config()
    exact = isinstance(obj, keras.layers.ReLU) and not config.get("negative_slope") and not config.get("threshold")
    return (*found, exact)


def fused_kernels(model: keras.Layer) -> int:
    """How many fused kernels ``model``'s DeepLIFT rules compile per number of rows (distinct key and shape).

    A site's shapes are those of its layer's outputs (a max pooling's: inputs) at each of its
    calls in the model's graph; a site whose graph is not known (a subclassed model's layers)
    counts once. (Unknown dimensions and several row counts per call make it a lower bound.)

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, activation="relu"),
        ...                       keras.layers.Conv2D(2, 3, activation="relu"), keras.layers.MaxPooling2D(2),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2, activation="relu")])
        >>> fused_kernels(m)  # ReLU at 6x6x2 and 4x4x2, the pooling, ReLU at 2
        4
    """
    sites, _ = classify(model, [])
    kernels: set[Hashable] = set()
    for _, obj, kind in sites:
        found = fusable(obj, kind)
        if found is None:
            continue
        shapes: set[Hashable] = set()
        for node in getattr(obj, "_inbound_nodes", None) or []:
            tensors = getattr(node, "input_tensors" if kind == "maxpool" else "output_tensors", None) or []
            shapes.update(tuple(t.shape[1:]) for t in tensors[:1])
        for shape in shapes or {id(obj)}:
            kernels.add((kind == "maxpool", found[0], shape))
    return len(kernels)


def _fresh(layer: keras.Layer) -> tuple[Hashable, Callable[[Any], Any]] | None:
    """``(key, call)``: a new layer of ``layer``'s class and settings, built once per key (``None``: unhashable)."""
    config = {k: v for k, v in layer.get_config().items() if k not in ("name", "trainable", "dtype")}
    try:
        key = ("layer", type(layer).__name__, tuple(sorted(config.items())))
        hash(key)
    except TypeError:  # a setting that is not a plain value
        return None
    if key not in _FRESH:  # named, so that Keras' automatic layer names (re_lu_1, ...) are left alone
        _FRESH[key] = type(layer).from_config({**config, "name": f"kerascope_fused_{type(layer).__name__.lower()}"}).call
    return key, _FRESH[key]


def _tensor_positions(op: Any) -> list[tuple[int, ...]] | None:
    """For each Functional node of ``op``: the positions of its arguments that are graph tensors."""
    nodes = getattr(op, "_inbound_nodes", None)
    if not nodes:
        return None
    positions = []
    for node in nodes:
        args = node.arguments.args
        positions.append(tuple(i for i, a in enumerate(args) if keras.tree.flatten(a)
                               and any(isinstance(t, keras.KerasTensor) for t in keras.tree.flatten(a))))
    return positions


def classify(model: keras.Layer, bypassed: list[str]) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """Sort the model's layers and operations into DeepLIFT rules.

    Returns ``(sites, problems)``: ``sites`` is ``[(path, layer_or_op, kind)]``
    with kind ``"activation"`` (an element-wise ``activation`` attribute),
    ``"elementwise"`` (an element-wise layer / op: its ``call``), ``"maxpool"``
    or ``"product"``; ``problems`` describes every layer / op no rule covers
    (``"'name' (Class ...)"``). Softmax layers in ``bypassed`` are skipped.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, activation="tanh", name="c"),
        ...                       keras.layers.MaxPooling2D(name="p"), keras.layers.Reshape((1, 2)),
        ...                       keras.layers.LSTM(2, name="l")])
        >>> sites, problems = classify(m, [])
        >>> [(p, k) for p, _, k in sites], problems
        ([('c', 'activation'), ('p', 'maxpool')], ["'l' (LSTM)"])
    """
    linear = tuple(getattr(keras.layers, n) for n in LINEAR_LAYERS if hasattr(keras.layers, n))
    elementwise = tuple(getattr(keras.layers, n) for n in ELEMENTWISE_LAYERS)
    maxpool = tuple(getattr(keras.layers, n) for n in MAXPOOL_LAYERS if hasattr(keras.layers, n))
    sites: list[tuple[str, Any, str]] = []
    problems: list[str] = []
    refused: list[str] = []
    for path, layer in iter_layers(model):
        kind = type(layer).__name__
        if any(path.startswith(r + "/") for r in refused):
            continue  # inside a refused layer (an LSTM's cell, an attention's softmax)
        if isinstance(layer, keras.Model) or (_has_children(layer) and not _is_builtin(layer)):
            continue  # containers: their layers are checked one by one (their own ops: see DeepLIFT docs)
        if isinstance(layer, elementwise):
            sites.append((path, layer, "elementwise"))
            continue
        if isinstance(layer, maxpool):
            sites.append((path, layer, "maxpool"))
            continue
        if isinstance(layer, keras.layers.Multiply):
            counts = {len(keras.tree.flatten(n.arguments.args)) for n in getattr(layer, "_inbound_nodes", [])}
            if counts - {2}:
                problems.append(f"{path!r} (Multiply of {max(counts)} tensors; the product rule needs 2)")
            else:
                sites.append((path, layer, "product"))
            continue
        if isinstance(layer, keras.layers.Softmax) and path in bypassed:
            continue
        if not isinstance(layer, linear):
            problems.append(f"{path!r} ({kind})")
            refused.append(path)
            continue
        activation = attribute(layer, "activation")
        if activation is None:
            continue
        act = _name(activation)
        if act == "linear" or (act == "softmax" and path in bypassed):
            continue
        if act in ELEMENTWISE_ACTIVATIONS:
            sites.append((path, layer, "activation"))
        else:
            problems.append(f"{path!r} ({kind} with activation {act!r})")
    for path, op in operation_paths(model):
        kind = type(op).__name__
        if kind in ELEMENTWISE_OPS:
            sites.append((path, op, "elementwise"))
        elif kind in LINEAR_OPS:
            continue
        elif kind in ONE_TENSOR_LINEAR_OPS:
            positions = _tensor_positions(op) or [()]
            if all(len(p) <= 1 and (kind not in ("Divide", "TrueDivide") or p in ((), (0,))) for p in positions):
                continue
            if kind == "Multiply" and all(len(p) == 2 for p in positions):
                sites.append((path, op, "product"))
            else:
                problems.append(f"{path!r} ({kind} of two tensors)")
        else:
            problems.append(f"{path!r} (operation {kind})")
    return sites, problems


def _is_builtin(layer: keras.Layer) -> bool:
    return type(layer).__module__.startswith(("keras.", "keras_hub.", "keras_nlp.", "keras_cv."))


def _has_children(layer: keras.Layer) -> bool:
    flatten = getattr(layer, "_flatten_layers", None)
    return bool(flatten and any(True for _ in flatten(include_self=False, recursive=False)))


@contextlib.contextmanager
def deeplift_rules(
    model: keras.Layer, backend: Any, shared: bool | Shared = False, fuse: bool = False
) -> Iterator[int]:
    """Install DeepLIFT's backward rules on every non-linearity of ``model`` for the block.

    Element-wise ``activation`` attributes are swapped for a rescaled copy;
    element-wise layers, max-pooling layers, ``Multiply`` layers of two
    tensors and element-wise / product ``keras.ops`` nodes of Functional
    graphs get a wrapped ``call``. Everything is restored in ``finally``.
    Yields the number of rules installed. Layers no rule covers are left as
    they are (:func:`classify` reports them; callers refuse such models).
    ``shared=False``: each batch is inputs then one reference per input;
    ``shared=True``: inputs then ONE reference row for all of them (the
    batch is ``N + 1`` rows instead of ``2 N``); a :class:`Shared` layout:
    groups of inputs, each followed by their reference row. ``fuse``: the
    rule of every :func:`fusable` site (the rescale rule; with shared
    references, the max-pool rule on tiling windows) runs as one kernel where
    the backend compiles one (TensorFlow: XLA, float32), the same numbers up
    to float32 rounding.

    Example:
        >>> import keras
        >>> from kerascope import _backend
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh", name="h")])
        >>> with deeplift_rules(m, _backend.get()) as n:
        ...     n, attribute(m.get_layer("h"), "activation").__name__
        (1, 'deeplift_tanh')
        >>> m.get_layer("h").activation.__name__
        'tanh'
    """
    sites, _ = classify(model, [])
    with contextlib.ExitStack() as stack:
        for _, obj, kind in sites:
            if kind == "activation":
                rescaled = _rescaled(attribute(obj, "activation"), backend, shared, _fuse_key(obj, kind, shared, fuse))
                stack.enter_context(patched_attribute(obj, "activation", rescaled))
                continue
            stack.enter_context(patched_attribute(obj, "call", _rule_call(obj, kind, backend, shared, fuse)))
        yield len(sites)


def _rule_call(obj: Any, kind: str, backend: Any, shared: bool | Shared, fuse: bool = False) -> Callable[..., Any]:
    """The ``call`` that replaces a layer's / op's for the block (``kind``: a :func:`classify` kind)."""
    original = attribute(obj, "call")
    if kind == "product":
        if isinstance(obj, keras.Layer):
            def layer_product(inputs: Any, *args: Any, **kwargs: Any) -> Any:
                a, b = keras.tree.flatten(inputs)
                return product(a, b, shared)
            return layer_product

        def op_product(x1: Any, x2: Any, *args: Any, **kwargs: Any) -> Any:
            return product(x1, x2, shared)
        return op_product
    layout = _layout(shared)
    if kind == "maxpool" and layout is not None:
        tiled_key = _fuse_key(obj, kind, shared, fuse)
        if tiled_key is not None:  # one compiled kernel from the windows: no routing, no reference copies
            pool, padding = pooling_windows(obj)
            tiled = backend.custom_backward(
                original, functools.partial(maxpool_windows_backward, layout=layout, pool=pool, padding=padding),
                f"deeplift_maxpool_{obj.name}", fuse=tiled_key)

        def both(x: Any, r: Any) -> Any:
            return keras.ops.concatenate([original(x), original(r)], axis=0)

        rule_of = functools.partial(maxpool_shared_backward, layout=layout)
        pooled = backend.custom_backward(both, rule_of, f"deeplift_maxpool_{obj.name}")

        def shared_pool(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            x = keras.ops.convert_to_tensor(inputs)
            if tiled_key is not None and None not in tuple(x.shape[1:]):
                return tiled(x)
            # the reference once per input; no gradient flows to it (the rule returns zeros for it), and
            # without the stop the zeros were summed and scattered back into the batch (a slice gradient
            # of the full input: 6 of the demo model's 35 ms)
            reference = layout.reference_copies(keras.ops.stop_gradient(x))
            y = pooled(x, reference)
            # the first rows by `slice` (its gradient is a pad; a strided slice's was 2 ms on the demo model)
            return keras.ops.slice(y, [0] * len(y.shape), [keras.ops.shape(x)[0], *keras.ops.shape(y)[1:]])
        return shared_pool
    rule = rescale_backward if kind == "elementwise" else maxpool_backward
    if layout is not None:
        rule = functools.partial(rule, shared=layout)

    def one(x: Any) -> Any:
        return original(x)

    fused = _fuse_key(obj, kind, shared, fuse) if kind == "elementwise" else None  # pairs: max pooling as written
    wrapped = backend.custom_backward(one, rule, f"deeplift_{kind}_{obj.name}", fuse=fused)

    def call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapped(inputs)
    return call


class DeepLiftBackward:
    """A backward rule for :meth:`Engine.gradients` (``rule=``): DeepLIFT, pairs or shared references.

    ``shared=False`` is ``rule="deeplift"`` (inputs, then one reference per
    input); ``shared=True``: the batch is the inputs and, last, one reference
    row that every input is compared with; ``group=L`` (with ``shared``):
    groups of ``L`` rows, ``L - 1`` inputs then their reference (several
    references per pass). ``fuse``: the element-wise rules (and max poolings
    whose windows tile the input) run as one kernel each where the backend compiles one (see :func:`deeplift_rules`;
    ``DeepLIFT`` decides per call, ``fuse_rules``). Equal objects share one
    compiled function.

    Example:
        >>> DeepLiftBackward(True) == DeepLiftBackward(True), DeepLiftBackward(True) == DeepLiftBackward(False)
        (True, False)
        >>> DeepLiftBackward(True, group=9), DeepLiftBackward(True, fuse=False)
        (DeepLiftBackward(shared=True, group=9), DeepLiftBackward(shared=True, fuse=False))
    """

    #: The rules replace the backward pass of non-linearities only; a Conv / Dense + BatchNormalization
    #: pair between them is affine, its multiplier its gradient: the engine may run it as one layer
    #: (``propagation/bn_fold.py``), the same numbers up to float32 rounding.
    folds_batchnorm = True

    def __init__(self, shared: bool, group: int | None = None, fuse: bool = True) -> None:
        if group is not None and not shared:
            raise ValueError(f"`group` needs shared references. Received: shared={shared!r}, group={group!r}.")
        self.shared = bool(shared)
        self.group = None if group is None else Shared(group).group
        self.fuse = bool(fuse)

    def install(self, model: keras.Layer, backend: Any) -> contextlib.AbstractContextManager[int]:
        """Enter to install the rules on ``model`` for one trace."""
        return deeplift_rules(model, backend, Shared(self.group) if self.shared else False, self.fuse)

    def _key(self) -> tuple[Any, ...]:
        return (self.shared, self.group, self.fuse)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeepLiftBackward) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(("deeplift", *self._key()))

    def __repr__(self) -> str:
        group = "" if self.group is None else f", group={self.group}"
        fuse = ", fuse=False" if not self.fuse else ""
        return f"DeepLiftBackward(shared={self.shared}{group}{fuse})"
