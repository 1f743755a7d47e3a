"""DeepLIFT's backward rules, installed on a model for the duration of one call.

The batch holds the inputs in its first half and their references
(baselines) in its second half, row for row. Every non-linearity the model
has gets a backward pass that multiplies by DeepLIFT's *multipliers*
(Shrikumar et al. 2017, as in Captum's ``DeepLift``), computed from the
paired rows; linear layers keep their ordinary gradient, which is already
their multiplier. The rules are written once in ``keras.ops``; the backends
only provide ``custom_backward`` (a custom vector-Jacobian product).

The multipliers themselves (rescale, max pooling, product) are in
:mod:`kerascope.propagation.deeplift_multipliers`; this module sorts a model's layers and
operations into them (:func:`classify`), decides which fuse into one kernel, and installs them.

With these, the attributions ``(x - x') * m`` sum to ``f(x) - f(x')``
(summation-to-delta). Everything is scoped: the model's attributes are put
back in ``finally``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import keras

from kerascope import _backend
from kerascope.core.layers import iter_layers, operation_paths
from kerascope.core.probe import attribute, patched_attribute
from kerascope.propagation.deeplift_multipliers import (
    Shared,
    _layout,
    _name,
    _rescaled,
    maxpool_backward,
    maxpool_shared_backward,
    maxpool_windows_backward,
    pooling_windows,
    product,
    rescale_backward,
)

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
