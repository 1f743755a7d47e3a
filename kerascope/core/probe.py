"""Scoped interception of layer calls: probes, softmax bypass, gradient rules.

Keras 3 has no forward hooks. Inside a ``with`` block these helpers wrap a
layer *instance*'s ``call`` (or swap its ``activation``) and always put the
original back in ``finally``, so the user's model is unchanged afterwards,
even when the forward pass raised. Nothing is rebuilt, which is why they work
for nested and subclassed models where ``keras.Model(inputs, layer.output)``
fails.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras

_MISSING = object()


class _Slot:
    """One patched attribute of one object: the dispatcher installed there and who uses it."""

    def __init__(self, obj: Any, name: str) -> None:
        self.obj, self.name = obj, name
        self.previous = obj.__dict__.get(name, _MISSING)  # the instance's own state, put back at the end
        self.original = getattr(obj, name)  # what threads without a patch of their own get
        self.users = 0
        slot = self

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            stack = _thread_stacks().get(id(slot))
            return (stack[-1] if stack else slot.original)(*args, **kwargs)

        with contextlib.suppress(AttributeError, TypeError):
            functools.update_wrapper(dispatch, self.original)
        dispatch._kerascope_slot = self  # type: ignore[attr-defined]
        self.dispatch = dispatch


_SLOTS: dict[tuple[int, str], _Slot] = {}
_SLOTS_LOCK = threading.Lock()
_LOCAL = threading.local()


def _thread_stacks() -> dict[int, list[Any]]:
    stacks = getattr(_LOCAL, "stacks", None)
    if stacks is None:
        stacks = _LOCAL.stacks = {}
    return stacks


def attribute(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name`` as the current thread sees it: its own scoped patch if any, else the unpatched value.

    Read a layer's ``call`` / ``activation`` with it (not ``obj.name``) where a
    :func:`patched_attribute` block may be open: the instance attribute itself is then a
    dispatcher shared by every thread.

    Example:
        >>> class A:
        ...     def f(self): return "class"
        >>> a = A()
        >>> with patched_attribute(a, "f", lambda: "patched"):
        ...     attribute(a, "f")()
        'patched'
        >>> attribute(a, "f")()
        'class'
    """
    value = getattr(obj, name, default)
    slot = getattr(value, "_kerascope_slot", None)
    if slot is None or slot.obj is not obj or slot.name != name:
        return value
    stack = _thread_stacks().get(id(slot))
    return stack[-1] if stack else slot.original


def own_patch(obj: Any, name: str) -> Any:
    """The value the current thread's open :func:`patched_attribute` block gave ``obj.name``, else ``None``.

    Example:
        >>> class A:
        ...     def g(self): return 0
        >>> a = A(); f = lambda: 1
        >>> with patched_attribute(a, "g", f):
        ...     own_patch(a, "g") is f
        True
        >>> own_patch(a, "g") is None
        True
    """
    slot = getattr(obj.__dict__.get(name), "_kerascope_slot", None)
    stack = _thread_stacks().get(id(slot)) if slot is not None and slot.obj is obj else None
    return stack[-1] if stack else None


@contextlib.contextmanager
def patched_attribute(obj: Any, name: str, value: Callable[..., Any]) -> Iterator[None]:
    """Make ``obj.name`` behave as ``value`` for the block, in the calling thread only.

    The instance attribute becomes a dispatcher (installed once, under a lock, and
    removed when the last thread using it leaves): a call from the thread inside the
    block runs ``value``; every other thread, and this one after the block, run the
    original. So a probe, a softmax bypass or a rule override of one explanation is
    invisible to a ``model.predict`` running at the same time in another thread. If
    ``obj`` had no instance attribute ``name`` before (e.g. ``call`` that lives on the
    class), it has none afterwards: ``vars(obj)`` is identical before and after.
    ``value`` must be callable (a ``call``, an ``activation``, a ``convolution_op``).
    Read the value the thread sees with :func:`attribute`.

    Example:
        >>> class A:
        ...     def f(self): return "class"
        >>> a = A()
        >>> with patched_attribute(a, "f", lambda: "patched"):
        ...     a.f()
        'patched'
        >>> a.f(), "f" in vars(a)
        ('class', False)
    """
    if not callable(value):
        raise TypeError(f"A scoped patch needs a callable. Received: {name}={value!r}.")
    key = (id(obj), name)
    with _SLOTS_LOCK:
        slot = _SLOTS.get(key)
        if slot is None or slot.obj is not obj:
            slot = _SLOTS[key] = _Slot(obj, name)
            object.__setattr__(obj, name, slot.dispatch)
        slot.users += 1
    stack = _thread_stacks().setdefault(id(slot), [])
    stack.append(value)
    try:
        yield
    finally:
        for i in range(len(stack) - 1, -1, -1):  # this block's entry (blocks of one thread nest)
            if stack[i] is value:
                del stack[i]
                break
        if not stack:
            _thread_stacks().pop(id(slot), None)
        with _SLOTS_LOCK:
            slot.users -= 1
            if slot.users == 0:
                _SLOTS.pop(key, None)
                if slot.previous is _MISSING:
                    obj.__dict__.pop(name, None)
                else:
                    object.__setattr__(obj, name, slot.previous)


class Recorder:
    """Holds what probes saw during one forward pass: ``{layer_id: [outputs]}``.

    Example:
        >>> r = Recorder()
        >>> r.outputs
        {}
    """

    def __init__(self) -> None:
        self.outputs: dict[int, list[Any]] = {}

    def last(self, layer: keras.Layer) -> Any:
        """Return the output of the last call of ``layer`` in the forward pass.

        Example:
            >>> import keras
            >>> r = Recorder(); d = keras.layers.Dense(1)
            >>> r.outputs[id(d)] = ["y"]
            >>> r.last(d)
            'y'
        """
        calls = self.outputs.get(id(layer))
        if not calls:
            raise ValueError(
                f"Layer {layer.name!r} ({type(layer).__name__}) was not called during the "
                "forward pass, so it has no activation or gradient. Received: "
                f"layer={layer.name!r}. Pick a layer on the path from the inputs to the "
                "output (see `kerascope.layers(model)`)."
            )
        return calls[-1]

    def call(self, layer: keras.Layer, position: int | None) -> Any:
        """Return the output of call ``position`` of ``layer`` (in forward order; ``None``: the last).

        Example:
            >>> import keras
            >>> r = Recorder(); d = keras.layers.Dense(1)
            >>> r.outputs[id(d)] = ["first", "second"]
            >>> r.call(d, 0), r.call(d, None)
            ('first', 'second')
        """
        last = self.last(layer)  # raises the error of a layer never called
        calls = self.outputs[id(layer)]
        if position is None:
            return last
        if not -len(calls) <= position < len(calls):
            raise ValueError(
                f"Layer {layer.name!r} was called {len(calls)} time(s) in this pass, so it has no call "
                f"{position}. Received: call position {position}. A layer called inside a loop (an RNN cell) "
                "is called a different number of times eagerly and when compiled, and its calls cannot be told "
                "apart: probe the layer that contains the loop (e.g. the LSTM layer, not its cell)."
            )
        return calls[position]


@contextlib.contextmanager
def probe(
    layers: Sequence[keras.Layer],
    transform: Callable[[int, keras.Layer, Any], Any] | None = None,
    positions: Sequence[int | None] | None = None,
) -> Iterator[Recorder]:
    """Record (and optionally transform) the outputs of ``layers`` for the block.

    ``transform(i, layer, output)`` may return a replacement output, e.g.
    ``output + delta_i`` (to differentiate w.r.t. ``delta_i``) or the same
    tensor after ``tape.watch``. The recorded value is the returned one.
    ``positions`` (one per layer) limits the transform of a layer called several
    times (a shared layer) to one call, counted in forward order from 0; ``None``
    (the default, or for one layer) transforms every call.

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(2)
        >>> m = keras.Sequential([keras.Input((3,)), d])
        >>> with probe([d]) as rec:
        ...     _ = m(np.ones((1, 3)))
        >>> tuple(rec.last(d).shape)
        (1, 2)
    """
    recorder = Recorder()
    if positions is not None and len(positions) != len(layers):
        raise ValueError(
            f"`positions` needs one entry per probed layer. Received: {len(positions)} positions for "
            f"{len(layers)} layers."
        )
    chosen = dict(zip((id(layer) for layer in layers), positions or [None] * len(layers)))
    with contextlib.ExitStack() as stack:
        for index, layer in enumerate(dict.fromkeys(layers)):
            original = attribute(layer, "call")

            def wrapper(*args: Any, __i: int = index, __l: keras.Layer = layer,
                        __f: Callable = original, **kwargs: Any) -> Any:
                out = __f(*args, **kwargs)
                at = chosen[id(__l)]
                if transform is not None and (at is None or at == len(recorder.outputs.get(id(__l), ()))):
                    out = transform(__i, __l, out)
                recorder.outputs.setdefault(id(__l), []).append(out)
                return out

            functools.update_wrapper(wrapper, original)
            stack.enter_context(patched_attribute(layer, "call", wrapper))
        yield recorder


def _activation_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


HEAD_ACTIVATIONS = ("softmax", "sigmoid")
"""Activations that squash logits into probabilities: bypassed when they produce the explained output."""


def is_sigmoid_head(layer: keras.Layer) -> bool:
    """Whether ``layer`` applies a sigmoid as its last step (``activation="sigmoid"``, ``Activation("sigmoid")``).

    Example:
        >>> import keras
        >>> is_sigmoid_head(keras.layers.Dense(1, activation="sigmoid")), is_sigmoid_head(keras.layers.Softmax())
        (True, False)
    """
    return _activation_name(attribute(layer, "activation")) == "sigmoid"


def softmax_candidates(model: keras.Layer) -> list[keras.Layer]:
    """Layers that apply a softmax or a sigmoid as their last step (bypassable without rebuilding).

    These are layers with ``activation=softmax`` / ``activation=sigmoid`` (``Dense``,
    ``Conv2D``, ...), ``Activation("softmax")`` / ``Activation("sigmoid")`` and ``Softmax``
    layers. Only those whose output is the explained output are bypassed.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax", name="p")])
        >>> [l.name for l in softmax_candidates(m)]
        ['p']
    """
    from kerascope.core.layers import iter_layers

    found = []
    for _, layer in iter_layers(model):
        if isinstance(layer, keras.layers.Softmax):
            found.append(layer)
        elif _activation_name(attribute(layer, "activation")) in HEAD_ACTIVATIONS:
            found.append(layer)
    return found


def _identity_call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
    return inputs


@contextlib.contextmanager
def bypass_softmax(layers: Sequence[keras.Layer], counts: dict[int, int] | None = None) -> Iterator[None]:
    """Make the softmax (or sigmoid) of ``layers`` linear for the block (logits come out).

    ``counts``, when given, is filled with ``{id(layer): calls}`` for the block: a call that no
    graph shows (a ``Lambda`` closing over the layer) is bypassed too, and the engine compares.

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(2, activation="softmax")
        >>> m = keras.Sequential([keras.Input((3,)), d])
        >>> calls = {}
        >>> with bypass_softmax([d], calls):
        ...     logits = m(np.ones((1, 3)))
        >>> d.activation.__name__, calls[id(d)]
        ('softmax', 1)
    """
    with contextlib.ExitStack() as stack:
        for layer in layers:
            if isinstance(layer, keras.layers.Softmax):
                inner = _identity_call
            else:
                stack.enter_context(patched_attribute(layer, "activation", keras.activations.linear))
                inner = attribute(layer, "call")
            if counts is None:
                if inner is _identity_call:
                    stack.enter_context(patched_attribute(layer, "call", _identity_call))
                continue

            def counted(*args: Any, __inner: Any = inner, __key: int = id(layer), **kwargs: Any) -> Any:
                counts[__key] = counts.get(__key, 0) + 1
                return __inner(*args, **kwargs)

            stack.enter_context(patched_attribute(layer, "call", counted))
        yield


_RELU_NAMES = {"relu", "relu6"}


def relu_sites(model: keras.Layer) -> list[tuple[keras.Layer, str]]:
    """Find the ReLU non-linearities that a modified backward rule can override.

    Returns ``(layer, kind)`` with kind ``"activation"`` (a layer whose
    ``activation`` is relu/relu6, including ``Activation("relu")``) or
    ``"layer"`` (a ``ReLU`` layer).

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="relu", name="h")])
        >>> [(l.name, k) for l, k in relu_sites(m)]
        [('h', 'activation')]
    """
    from kerascope.core.layers import iter_layers

    sites = []
    for _, layer in iter_layers(model):
        if isinstance(layer, keras.layers.ReLU):
            sites.append((layer, "layer"))
        elif _activation_name(attribute(layer, "activation")) in _RELU_NAMES:
            sites.append((layer, "activation"))
    return sites


_LINEAR_NAMES = {"linear", "softmax", "sigmoid", "identity", "log_softmax"}


def other_activations(model: keras.Layer) -> dict[str, int]:
    """Non-linear activations of ``model`` that are not ReLUs, with how many layers use each.

    These keep their ordinary gradient under the guided / deconvnet rules (the
    final ``softmax`` / ``sigmoid`` and ``linear`` are not counted).
    ``Activation``, ``Dense(activation=...)`` etc. and the ``GELU``-like layers
    (``ELU``, ``LeakyReLU``, ``PReLU``) are seen; activations written as
    functions inside a subclassed ``call`` are not.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="gelu")])
        >>> other_activations(m)
        {'gelu': 1}
    """
    from kerascope.core.layers import iter_layers

    found: dict[str, int] = {}
    for _, layer in iter_layers(model):
        if isinstance(layer, keras.layers.ReLU):
            continue
        if type(layer).__name__ in ("ELU", "LeakyReLU", "PReLU"):
            name = type(layer).__name__.lower()
        else:
            fn = attribute(layer, "activation")
            if fn is None or not callable(fn):
                continue
            name = _activation_name(fn)
            if name in _RELU_NAMES or name in _LINEAR_NAMES:
                continue
        found[name] = found.get(name, 0) + 1
    return found


@contextlib.contextmanager
def override_relu_gradients(
    model: keras.Layer, wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]
) -> Iterator[int]:
    """Replace every ReLU of ``model`` by ``wrap(relu)`` for the block.

    ``wrap`` receives the original element-wise function and returns one with
    the same forward value and a modified gradient (guided backprop,
    deconvnet). Yields the number of ReLUs overridden.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="relu")])
        >>> with override_relu_gradients(m, lambda f: f) as n:
        ...     n
        1
    """
    sites = relu_sites(model)
    with contextlib.ExitStack() as stack:
        for layer, kind in sites:
            if kind == "activation":
                stack.enter_context(patched_attribute(layer, "activation", wrap(attribute(layer, "activation"))))
            else:
                original_call = attribute(layer, "call")

                def relu_fn(x: Any, __f: Callable = original_call) -> Any:
                    return __f(x)

                wrapped = wrap(relu_fn)
                stack.enter_context(
                    patched_attribute(layer, "call", lambda inputs, *a, __w=wrapped, **k: __w(inputs))
                )
        yield len(sites)
