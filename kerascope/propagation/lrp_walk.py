"""Layer-wise Relevance Propagation installed on a model for the duration of one call.

Relevance flows backwards as the *gradient*: every layer's ``call`` is
patched (scoped, restored in ``finally``) so that its forward value is
unchanged and its vector-Jacobian product is the LRP rule. A rule is a sum of
terms, as in zennit's ``BasicHook``: term ``k`` evaluates the layer on a
modified input ``m_k(x)`` with modified parameters ``(W_k, b_k)``,
``z_k = f(m_k(x); W_k, b_k)``, and the relevance is

    ``R_in = sum_k c_k * m_k(x) * J_k^T (R_out * s_k)``,

with ``s_k`` a stopped-gradient scale (``1 / stabilize(denominator)``, times a
mask for the gamma rule). In the graph the layer's output is :func:`relevance_output`
(value ``y``, backward ``c_k * dy * s_k`` into each ``z_k``) and each ``m_k(x)``
is :func:`_modified_input` (value ``m_k(x)``, backward multiplied by ``m_k(x)``):
small custom backward passes (``custom_backward``, as the DeepLIFT rules),
written once in ``keras.ops``, the same on every backend, compiled with the
rest of the pass.

Rules for Dense / Conv layers (:class:`Epsilon`, :class:`Gamma`,
:class:`ZPlus`, :class:`AlphaBeta`, :class:`Flat`, :class:`ZBox`) follow
zennit 0.5 term by term (which parameters are clamped, which biases are
zeroed, the sign-aware stabiliser). Other layers: average pooling, ``Add`` /
``Average`` / ``Subtract``, ``Rescaling`` / ``Normalization`` get the
proportional (zennit ``Norm``) rule ``R_i = x_i * dy/dx_i * R / stabilize(y)``;
element-wise activations pass relevance through unchanged (``Pass``);
max pooling, reshapes, padding, dropout and concatenation keep their gradient
(max pooling: winner-take-all). A ``BatchNormalization`` whose input is the
output of a Dense / Conv layer with a linear activation is canonised: the
relevance rule of that layer is evaluated with the fused parameters
``W * g / sqrt(var + eps)`` and ``(b - mean) * g / sqrt(var + eps) + beta``;
any other ``BatchNormalization`` passes relevance through (zennit's ``Pass``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope import _backend
from kerascope.core.layers import iter_layers, operation_paths
from kerascope.core.probe import attribute, patched_attribute
from kerascope.propagation.affine import (
    _fused_params,
    _on_channels,
    _params,
    _types,
    affine_function,
    is_linear_activation,
)
from kerascope.propagation.deeplift_rules import ELEMENTWISE_ACTIVATIONS, _has_children, _is_builtin
from kerascope.propagation.lrp_rules import Rule, ZBox, stabilize

sg = keras.ops.stop_gradient

AFFINE_LAYERS = ("Dense", "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D")
#: Parameter-free linear layers whose relevance is split in proportion to the contributions (zennit ``Norm``).
NORM_LAYERS = (
    "AveragePooling1D", "AveragePooling2D", "AveragePooling3D", "GlobalAveragePooling1D",
    "GlobalAveragePooling2D", "GlobalAveragePooling3D", "Add", "Average", "Subtract", "Rescaling",
    "Normalization",
)
#: Layers whose ordinary gradient already redistributes relevance (max pooling: winner-take-all).
GRADIENT_LAYERS = (
    "InputLayer", "Flatten", "Reshape", "Permute", "RepeatVector", "Concatenate", "Dropout",
    "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise", "GaussianDropout",
    "AlphaDropout", "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D", "Cropping1D", "Cropping2D",
    "Cropping3D", "UpSampling1D", "UpSampling2D", "UpSampling3D", "Identity", "MaxPooling1D",
    "MaxPooling2D", "MaxPooling3D", "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D",
)
ACTIVATION_LAYERS = ("ReLU", "LeakyReLU", "ELU", "PReLU", "Activation")
ACTIVATION_OPS = frozenset({
    "Relu", "Relu6", "LeakyRelu", "Elu", "Selu", "Gelu", "Silu", "Swish", "Sigmoid", "Tanh", "Softplus",
    "HardSigmoid", "HardSilu", "HardSwish", "Mish", "Celu", "Softsign",
})
GRADIENT_OPS = frozenset({
    "Reshape", "Transpose", "Concatenate", "ExpandDims", "Squeeze", "GetItem", "Cast", "Pad", "Moveaxis",
    "Swapaxes", "Flip", "Identity", "Ravel", "Copy", "Slice",
})
NORM_OPS = frozenset({"Add", "Mean", "Average"})


# ------------------------------------------------------------------------------------------ the model walk
@dataclass
class Sites:
    """The model's layers sorted by what LRP does with them (see :func:`classify`).

    Example:
        >>> Sites().affine
        []
    """

    affine: list[tuple[str, keras.Layer]] = field(default_factory=list)
    norm: list[tuple[str, Any]] = field(default_factory=list)
    activation: list[tuple[str, Any]] = field(default_factory=list)
    batchnorm: list[tuple[str, keras.Layer]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _activation_ok(layer: Any, bypassed: list[str], path: str) -> str | None:
    """Why the layer's ``activation`` attribute is unsupported (``None``: fine)."""
    activation = attribute(layer, "activation")
    if activation is None:
        return None
    act = getattr(activation, "__name__", type(activation).__name__)
    if is_linear_activation(activation) or act in ELEMENTWISE_ACTIVATIONS or (act == "softmax" and path in bypassed):
        return None
    return f"{path!r} ({type(layer).__name__} with activation {act!r})"


def classify(model: keras.Layer, bypassed: list[str]) -> Sites:
    """Sort the layers and Functional ``keras.ops`` nodes of ``model`` into LRP rule kinds.

    ``bypassed``: paths of the final softmax layers the engine bypasses (a
    softmax anywhere else is a problem). Containers (nested models, layers
    with sub-layers) are walked into.

    Example:
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, activation="relu", name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(name="g"), keras.layers.Reshape((1, 2)),
        ...                       keras.layers.LSTM(2, name="l")])
        >>> s = classify(m, [])
        >>> [p for p, _ in s.affine], [p for p, _ in s.norm], s.problems
        (['c'], ['g'], ["'l' (LSTM)"])
    """
    affine, norm, gradient = _types(AFFINE_LAYERS), _types(NORM_LAYERS), _types(GRADIENT_LAYERS)
    activation = _types(ACTIVATION_LAYERS)
    sites = Sites()
    refused: list[str] = []
    for path, layer in iter_layers(model):
        if any(path.startswith(r + "/") for r in refused):
            continue
        if isinstance(layer, keras.Model) or (_has_children(layer) and not _is_builtin(layer)):
            continue
        kind = type(layer).__name__
        if isinstance(layer, affine):
            if getattr(layer, "padding", None) == "causal" or getattr(layer, "groups", 1) != 1:
                sites.problems.append(f"{path!r} ({kind} with causal padding or groups)")
                continue
            problem = _activation_ok(layer, bypassed, path)
            sites.affine.append((path, layer))  # listed either way: `problems` decides whether LRP runs
            if problem:
                sites.problems.append(problem)
        elif isinstance(layer, norm):
            sites.norm.append((path, layer))
        elif isinstance(layer, keras.layers.BatchNormalization):
            sites.batchnorm.append((path, layer))
        elif isinstance(layer, activation):
            problem = _activation_ok(layer, bypassed, path)
            sites.activation.append((path, layer))
            if problem:
                sites.problems.append(problem)
        elif isinstance(layer, keras.layers.Softmax) and path in bypassed:
            continue
        elif not isinstance(layer, gradient):
            sites.problems.append(f"{path!r} ({kind})")
            refused.append(path)
    for path, op in operation_paths(model):
        kind = type(op).__name__
        if kind in ACTIVATION_OPS:
            sites.activation.append((path, op))
        elif kind in NORM_OPS:
            sites.norm.append((path, op))
        elif kind not in GRADIENT_OPS:
            sites.problems.append(f"{path!r} (operation {kind})")
    return sites


# ------------------------------------------------------------------------------------------- the graph trick
# The rule's products are custom backward passes (``custom_backward``, the DeepLIFT rules' helper): the
# forward pass only forwards values (an identity), the backward pass does the one multiplication. Written
# as ``sg(v) + (x - sg(x)) * v`` they cost three element-wise ops of the forward pass per tensor (an
# exact zero, computed); with ``sg(y) + c * (z - sg(z)) * sg(s)`` per term, ~40% of LRP's element-wise
# time on the demo model.
def _times_input(dy: Any, xs: list[Any]) -> list[Any]:
    return [dy * xs[0]]


def _times_value(dy: Any, xs: list[Any]) -> list[Any]:
    return [dy * xs[1], keras.ops.zeros_like(xs[1])]


def _through(dy: Any, xs: list[Any]) -> list[Any]:
    return [dy, keras.ops.zeros_like(xs[1])]


def _op(fn: Callable[..., Any], rule: Callable[[Any, list[Any]], list[Any]], name: str) -> Callable[..., Any]:
    return _backend.get().custom_backward(fn, lambda xs, y, dy, vjp: rule(dy, xs), name)


def _modified_input(x: Any, mode: str, low: Any = None, high: Any = None, nonneg: bool = False) -> Any:
    """``m(x)`` as a value whose gradient is multiplied by ``m(x)`` (``d/dx`` is ``diag(m(x))``).

    ``nonneg``: ``x >= 0`` is known (the output of a ReLU), so ``max(x, 0)`` is ``x``.

    Example:
        >>> import numpy as np
        >>> x = keras.ops.convert_to_tensor(np.array([-1.0, 2.0], "float32"))
        >>> keras.ops.convert_to_numpy(_modified_input(x, "pos")).tolist()
        [0.0, 2.0]
    """
    x = keras.ops.convert_to_tensor(x)
    if mode == "x" or (mode == "pos" and nonneg):
        return _op(lambda v: v, _times_input, "lrp_times_input")(x)
    if mode == "pos":
        value = keras.ops.maximum(x, 0.0)
    elif mode == "neg":
        value = keras.ops.minimum(x, 0.0)
    elif mode == "ones":
        value = keras.ops.ones_like(x)
    else:
        bound = low if mode == "low" else high
        value = keras.ops.zeros_like(x) + keras.ops.cast(bound, x.dtype)
    return _op(lambda _, v: v, _times_value, "lrp_times_value")(x, sg(value))


def relevance_output(y: Any, terms: list[tuple[Any, float]], scales: list[Any]) -> Any:
    """``y`` whose vector-Jacobian product is ``sum_k c_k * J_k^T (dy * s_k)`` (terms ``(z_k, c_k)``).

    Example:
        >>> import numpy as np
        >>> x = keras.ops.convert_to_tensor(np.array([[1.0, 2.0]], "float32"))
        >>> out = relevance_output(x * 3.0, [(x * 3.0, 2.0)], [keras.ops.ones_like(x)])
        >>> keras.ops.convert_to_numpy(out).tolist()
        [[3.0, 6.0]]
    """
    count = len(terms)
    coefficients = [c for _, c in terms]

    def rule(dy: Any, xs: list[Any]) -> list[Any]:
        value, scale_list = xs[0], xs[1 + count:]
        grads = [dy * s if c == 1.0 else (c * dy) * s for c, s in zip(coefficients, scale_list, strict=True)]
        return [keras.ops.zeros_like(value), *grads, *[keras.ops.zeros_like(s) for s in scale_list]]

    scales = [sg(keras.ops.convert_to_tensor(s)) for s in scales]
    out = _op(lambda value, *_: value, rule, "lrp_relevance")(sg(y), *[z for z, _ in terms], *scales)
    return out


def passed(z: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn(z)`` whose gradient is the identity (the ``Pass`` rule of activations).

    Example:
        >>> import numpy as np
        >>> keras.ops.convert_to_numpy(passed(np.array([-1.0, 2.0], "float32"), keras.ops.relu)).tolist()
        [0.0, 2.0]
    """
    z = keras.ops.convert_to_tensor(z)
    return _op(lambda _, v: v, _through, "lrp_pass")(z, sg(fn(z)))


def _feeds_batchnorm_only(layer: keras.Layer) -> bool:
    """A linear Dense / Conv whose every use in the model graph is a ``BatchNormalization`` on its channels.

    Its own rule terms would be dead work: the BatchNormalization evaluates the rule with the fused
    parameters. Layers without graph nodes (subclassed models) keep their terms."""
    if not is_linear_activation(attribute(layer, "activation")):
        return False
    nodes = getattr(layer, "_outbound_nodes", None) or []
    for node in nodes:
        bn = node.operation
        args = keras.tree.flatten(node.arguments.args)
        if not isinstance(bn, keras.layers.BatchNormalization) or len(args) != 1:
            return False
        if not _on_channels(layer, bn, len(args[0].shape)):
            return False
    return bool(nodes)


#: Activations whose outputs are never negative (the next layer's ``min(x, 0)`` terms vanish).
NONNEGATIVE_ACTIVATIONS = frozenset({"relu", "relu6", "sigmoid", "softplus", "hard_sigmoid"})


class _Apply:
    """Evaluates a rule's terms on one call of a Dense / Conv layer."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule

    def __call__(self, layer: keras.Layer, x: Any, kernel: Any, bias: Any, y: Any = None, nonneg: bool = False,
                 activation: Callable[[Any], Any] | None = None) -> Any:
        """``activation(y)`` (``y``: the layer's linear output, computed when ``None``) carrying the rule.

        With ``nonneg`` (``x >= 0``) the terms on ``min(x, 0)`` are skipped: their value and
        relevance are exactly zero. A first term on ``x`` with the layer's own parameters (the ε
        and zᴮ rules) is also the layer's output: one evaluation, not two."""
        f = affine_function(layer)
        low = high = None
        if isinstance(self.rule, ZBox):
            low, high = np.asarray(self.rule.low, "float32"), np.asarray(self.rule.high, "float32")
        terms = self.rule.terms(kernel, bias)
        live = [not (nonneg and mode == "neg") for mode, _, _, _ in terms]
        outputs = [f(_modified_input(x, mode, low, high, nonneg), k, b) if on else None
                   for (mode, k, b, _), on in zip(terms, live, strict=True)]
        if y is None:
            mode, k, b, c = terms[0]
            own = mode == "x" and k is kernel and b is bias and c == 1.0
            y = outputs[0] if own else f(x, kernel, bias)
        y = sg(y)
        scales = self.rule.scales([0.0 if z is None else sg(z) for z in outputs], y)
        carried = [((z, c), scale) for z, (_, _, _, c), scale in zip(outputs, terms, scales, strict=True)
                   if z is not None]
        value = y if activation is None else sg(activation(y))
        return relevance_output(value, [t for t, _ in carried], [scale for _, scale in carried])


    def owns_output(self, kernel: Any, bias: Any) -> bool:
        """Whether the rule's first term is ``x`` with these parameters: the layer's output itself (ε, LRP-0, zᴮ).

        Example:
            >>> from kerascope.propagation.lrp_rules import Epsilon, ZPlus
            >>> _Apply(Epsilon()).owns_output(1.0, 0.0), _Apply(ZPlus()).owns_output(1.0, 0.0)
            (True, False)
        """
        if not self.rule.first_term_is_output:  # (no terms built for nothing: γ / αβ / flat compute kernels)
            return False
        mode, k, b, c = self.rule.terms(kernel, bias)[0]
        return mode == "x" and k is kernel and b is bias and c == 1.0


def _first(inputs: Any) -> Any:
    return keras.tree.flatten(inputs)[0] if isinstance(inputs, list | tuple | dict) else inputs


@contextlib.contextmanager
def lrp_rules(model: keras.Layer, rules: Mapping[str, Rule], stabilizer: float = 1e-6) -> Iterator[int]:
    """Install LRP on ``model`` for the block: ``rules`` maps the path of every Dense / Conv layer to its rule.

    Dense / Conv calls compute their rule's terms; a following
    ``BatchNormalization`` is canonised into them; average pooling and
    ``Add`` / ``Average`` / ``Subtract`` / ``Rescaling`` get the proportional
    rule with ``stabilizer``; activations pass relevance through. Everything
    is restored in ``finally``; yields the number of patched layers.

    Example:
        >>> from kerascope.propagation.lrp_rules import Epsilon
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="relu", name="h"),
        ...                       keras.layers.Dense(1, name="o")])
        >>> with lrp_rules(m, {"h": Epsilon(), "o": Epsilon()}) as n:
        ...     n, "call" in vars(m.get_layer("h"))
        (2, True)
        >>> "call" in vars(m.get_layer("h"))
        False
    """
    sites = classify(model, [])  # callers refuse models with problems before installing
    recorded: dict[int, tuple[Any, ...]] = {}  # id(linear output) -> (output, layer, input, rule, x >= 0)
    nonneg: dict[int, Any] = {}  # id -> tensor known to be >= 0 (kept alive so its id stays unique)
    keep: list[Any] = []  # keeps recorded tensors alive so their ids stay unique

    def known(t: Any) -> bool:
        return nonneg.get(id(t)) is t

    def mark(t: Any, positive: bool) -> Any:
        if positive:
            nonneg[id(t)] = t
        return t

    count = 0
    with contextlib.ExitStack() as stack:
        for path, layer in sites.affine:
            if path not in rules:
                continue
            apply = _Apply(rules[path])

            folded = bool(sites.batchnorm) and _feeds_batchnorm_only(layer)

            def affine_call(inputs: Any, *args: Any, __layer: keras.Layer = layer, __apply: _Apply = apply,
                            __folded: bool = folded, **kwargs: Any) -> Any:
                kernel, bias = _params(__layer)
                x = keras.ops.convert_to_tensor(inputs)
                activation = attribute(__layer, "activation")
                name = getattr(activation, "__name__", type(activation).__name__)
                if __folded:  # the BatchNormalization after it evaluates the rule with the fused parameters
                    out = affine_function(__layer)(x, kernel, bias)
                    recorded[id(out)] = (out, __layer, x, __apply, known(inputs) or known(x))
                    keep.append(out)
                    return out
                if is_linear_activation(activation):
                    out = __apply(__layer, x, kernel, bias, nonneg=known(inputs) or known(x))
                    recorded[id(out)] = (out, __layer, x, __apply, known(inputs) or known(x))
                    keep.append(out)
                    return out
                out = __apply(__layer, x, kernel, bias, nonneg=known(inputs) or known(x), activation=activation)
                return mark(out, name in NONNEGATIVE_ACTIVATIONS)

            stack.enter_context(patched_attribute(layer, "call", affine_call))
            count += 1
        for _, layer in sites.batchnorm:
            original = attribute(layer, "call")

            def bn_call(inputs: Any, *args: Any, __layer: keras.Layer = layer, __f: Callable = original,
                        **kwargs: Any) -> Any:
                entry = recorded.get(id(inputs))
                fused = None if entry is None or entry[0] is not inputs else _fused_params(entry[1], __layer, len(inputs.shape))
                if fused is None:
                    y = __f(inputs, *args, **kwargs)
                    return passed(inputs, lambda _: y)  # zennit: Pass
                _, affine, x, apply, positive = entry
                # in the pair's compute dtype (its linear output's): a mixed-precision model's BatchNormalization
                # reads its variables in float32 (no autocast), and a float32 kernel on a bfloat16 input fails
                fused = tuple(None if t is None else keras.ops.cast(t, inputs.dtype) for t in fused)
                # ε / LRP-0 / zᴮ: the first term is the pair's output, one convolution (the affine layer's own is
                # then unused); not in 16-bit, where the BatchNormalization's float32 arithmetic gives the value
                full = keras.backend.standardize_dtype(inputs.dtype) in ("float32", "float64")
                if full and apply.owns_output(*fused):
                    return apply(affine, x, *fused, nonneg=positive)
                return apply(affine, x, *fused, y=__f(inputs, *args, **kwargs), nonneg=positive)

            stack.enter_context(patched_attribute(layer, "call", bn_call))
            count += 1
        for _, obj in sites.norm:
            original = attribute(obj, "call")
            keeps_sign = not isinstance(obj, _types(("Subtract", "Rescaling", "Normalization")))

            def norm_call(*args: Any, __f: Callable = original, __keeps: bool = keeps_sign, **kwargs: Any) -> Any:
                tensors = [t for t in keras.tree.flatten(args) if _is_tensor(t)]
                ids = {id(t) for t in tensors}
                modified = keras.tree.map_structure(
                    lambda t: _modified_input(t, "x") if id(t) in ids else t, list(args))
                z = __f(*modified, **kwargs)  # its value is the layer's output
                out = relevance_output(sg(z), [(z, 1.0)], [1.0 / stabilize(sg(z), stabilizer)])
                return mark(out, __keeps and bool(tensors) and all(known(t) for t in tensors))

            stack.enter_context(patched_attribute(obj, "call", norm_call))
            count += 1
        for _, obj in sites.activation:
            original = attribute(obj, "call")
            positive = _nonnegative_layer(obj)

            def act_call(inputs: Any, *args: Any, __f: Callable = original, __positive: bool = positive,
                         **kwargs: Any) -> Any:
                y = __f(inputs, *args, **kwargs)
                return mark(passed(_first(inputs), lambda _: y), __positive)

            stack.enter_context(patched_attribute(obj, "call", act_call))
            count += 1
        for obj in _sign_keeping_layers(model):  # max pooling, reshapes, padding: x >= 0 stays known
            original = attribute(obj, "call")

            def keep_call(inputs: Any, *args: Any, __f: Callable = original, **kwargs: Any) -> Any:
                out = __f(inputs, *args, **kwargs)
                tensors = [t for t in keras.tree.flatten(inputs) if _is_tensor(t)]
                return mark(out, bool(tensors) and all(known(t) for t in tensors))

            stack.enter_context(patched_attribute(obj, "call", keep_call))
        try:
            yield count
        finally:
            recorded.clear()
            nonneg.clear()
            keep.clear()


#: Layers whose output is >= 0 wherever their input is (their gradient is their LRP rule).
SIGN_KEEPING_LAYERS = (
    "Flatten", "Reshape", "Permute", "RepeatVector", "Concatenate", "Dropout", "SpatialDropout1D",
    "SpatialDropout2D", "SpatialDropout3D", "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D", "Cropping1D",
    "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D", "UpSampling3D", "Identity", "MaxPooling1D",
    "MaxPooling2D", "MaxPooling3D", "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D",
)


def _sign_keeping_layers(model: keras.Layer) -> list[keras.Layer]:
    kinds = _types(SIGN_KEEPING_LAYERS)
    return [layer for _, layer in iter_layers(model) if type(layer) in kinds]


def _nonnegative_layer(obj: Any) -> bool:
    """Whether an activation layer's output is never negative (ReLU without a negative slope, ...)."""
    if isinstance(obj, keras.layers.ReLU):
        return not float(obj.negative_slope) and float(obj.threshold) >= 0
    if isinstance(obj, keras.layers.Activation):
        return getattr(attribute(obj, "activation"), "__name__", "") in NONNEGATIVE_ACTIVATIONS
    return type(obj).__name__ in ("Relu", "Relu6", "Sigmoid", "Softplus", "HardSigmoid")


def _is_tensor(t: Any) -> bool:
    return hasattr(t, "shape") and hasattr(t, "dtype") and not isinstance(t, np.ndarray | float | int)


class LRPBackward:
    """A backward rule for :meth:`Engine.gradients` (``rule=``): LRP with fixed per-layer rules.

    ``install(model, backend)`` is the context manager the engine enters while
    tracing. Objects with equal rules are equal (and hash alike), so the engine
    keeps one compiled function per rule assignment and input signature.

    Example:
        >>> from kerascope.propagation.lrp_rules import Epsilon
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, name="o")])
        >>> with LRPBackward({"o": Epsilon()}).install(m, None) as n:
        ...     n
        1
    """

    def __init__(self, rules: Mapping[str, Rule], stabilizer: float = 1e-6) -> None:
        self.rules = dict(rules)
        self.stabilizer = stabilizer

    def install(self, model: keras.Layer, backend: Any) -> contextlib.AbstractContextManager[int]:
        """Enter to install the rules on ``model`` (``backend`` unused: the rules are plain ``keras.ops``)."""
        return lrp_rules(model, self.rules, self.stabilizer)

    def _key(self) -> tuple[Any, ...]:
        return tuple(sorted(self.rules.items(), key=lambda item: item[0])), self.stabilizer

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LRPBackward) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"LRPBackward({self.rules!r})"
