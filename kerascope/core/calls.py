"""Which call of a shared layer is read: ``call_index``.

A layer object can be called more than once in one forward pass: one ``Conv2D``
applied to both inputs of a Siamese functional model, or one ``Dense`` called
twice in a subclassed ``call()``. Each call has its own activation and
gradient, so kerascope never guesses: when a probed layer (``layer=``,
``output_layer=``, a CAM's feature layer) is called more than once, the call must
be chosen with ``call_index`` (an int, negative counts from the last call like
Python indexing), else :class:`SharedLayerError` is raised.

How calls are counted:

* a layer applied at several nodes of a **functional** (or ``Sequential``) model:
  call ``k`` is the ``k``-th time the layer was applied when the model was built
  (``conv(a)`` before ``conv(b)``: ``call_index=0`` is ``a``'s), whatever order
  Keras runs the nodes in (it runs them by depth). The same holds through nested
  functional models: a Siamese model applying one ``encoder`` model to ``a`` then
  to ``b`` has ``encoder/conv`` call 0 on ``a`` (calls sorted by the encoder's
  application, then by the layer's inside the encoder);
* otherwise (a **subclassed** ``call()`` on the way): the order of the calls in the
  forward pass.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

__all__ = ["SharedLayerError", "build_ranks", "chain_ranks", "check_call_index", "choose_call"]


class SharedLayerError(ValueError):
    """A probed layer is called more than once and no (or an impossible) ``call_index`` chooses the call.

    Example:
        >>> issubclass(SharedLayerError, ValueError)
        True
    """


def check_call_index(value: Any) -> int | None:
    """Return ``value`` as ``None`` or an int (negative allowed), else raise the standard error.

    Example:
        >>> check_call_index(-1), check_call_index(None)
        (-1, None)
        >>> check_call_index("first")
        Traceback (most recent call last):
        ...
        kerascope.core.calls.SharedLayerError: `call_index` must be None or an int (which call of a shared layer; negative counts from the last call). Received: call_index='first'.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise SharedLayerError(
            "`call_index` must be None or an int (which call of a shared layer; negative counts from the "
            f"last call). Received: call_index={value!r}."
        )
    return int(value)


def build_ranks(parent: keras.Layer, layer: keras.Layer) -> list[int] | None:
    """For each call of ``layer`` in the order ``parent`` (a functional model) runs them: its build rank.

    The build rank is the order in which the layer was applied to symbolic tensors
    when ``parent`` was built. ``None`` when ``parent`` has no node graph (subclassed).

    Example:
        >>> import keras
        >>> conv = keras.layers.Dense(2, name="shared")
        >>> a, b = keras.Input((3,)), keras.Input((3,))
        >>> ya = conv(a)
        >>> yb = conv(keras.layers.Dense(3)(b))
        >>> m = keras.Model([a, b], keras.layers.Add()([ya, yb]))
        >>> sorted(build_ranks(m, conv))
        [0, 1]
    """
    graph = parent if hasattr(parent, "_nodes_by_depth") else getattr(parent, "_functional", None)
    by_depth = getattr(graph, "_nodes_by_depth", None)
    if not by_depth:
        return None
    run_order = [
        node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth]
        if node.operation is layer and not node.is_input
    ]  # the order of `Function._run_through_graph`
    inbound = list(getattr(layer, "_inbound_nodes", []))
    try:
        built = [next(i for i, node in enumerate(inbound) if node is run) for run in run_order]
    except StopIteration:
        return None
    ranks = {index: rank for rank, index in enumerate(sorted(built))}
    return [ranks[index] for index in built]


def chain_ranks(chain: list[keras.Layer]) -> list[int] | None:
    """Build ranks of the calls of ``chain[-1]`` in run order, through the models ``chain[:-1]`` (outermost first).

    Each call of the layer is keyed by the build rank of every model on its way (the
    outer model's application of a nested model first), so a nested model applied to
    two inputs orders its layer's calls by input. ``None`` when a model on the way has
    no node graph (subclassed).

    Example:
        >>> import keras
        >>> enc = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="enc")
        >>> a, b = keras.Input((3,)), keras.Input((3,))
        >>> m = keras.Model([a, b], keras.layers.Add()([enc(a), enc(b)]))
        >>> sorted(chain_ranks([m, enc, enc.get_layer("d")]))
        [0, 1]
    """
    keys: list[tuple[int, ...]] = [()]
    for parent, child in zip(chain, chain[1:]):
        ranks = build_ranks(parent, child)
        if ranks is None:
            return None
        keys = [key + (rank,) for key in keys for rank in ranks]
    order = {key: rank for rank, key in enumerate(sorted(keys))}
    return [order[key] for key in keys]


def choose_call(
    path: str, calls: int, call_index: int | None, ranks: list[int] | None = None, model: str = "the model"
) -> int | None:
    """The position (in forward order) of the chosen call of a layer seen ``calls`` times.

    ``ranks`` (from :func:`build_ranks`) maps forward order to build order for a
    functional model; ignored unless it has one entry per call. ``None`` when the
    layer is never called (the probe's own error follows).

    Example:
        >>> choose_call("shared", 2, 1), choose_call("shared", 2, -2), choose_call("shared", 2, 0, [1, 0])
        (1, 0, 1)
        >>> choose_call("d", 1, None)
        0
        >>> choose_call("shared", 2, None)
        Traceback (most recent call last):
        ...
        kerascope.core.calls.SharedLayerError: Layer 'shared' is called 2 times in one forward pass of the model (a shared layer), and each call has its own activation and gradient. Received: layer='shared', call_index=None. Choose the call with `call_index=0..1` (negative counts from the last); calls are counted in the order the forward pass makes them (for a subclassed model, the order in its `call()`).
    """
    if calls == 0:
        return None
    mapped = ranks is not None and len(ranks) == calls
    how = (
        "call k is the k-th time the layer was applied when the (functional or Sequential) model was built, "
        "nested models' applications first"
        if mapped else
        "calls are counted in the order the forward pass makes them (for a subclassed model, the order in its `call()`)"
    )
    if call_index is None:
        if calls == 1:
            return 0
        raise SharedLayerError(
            f"Layer {path!r} is called {calls} times in one forward pass of {model} (a shared layer), and each "
            f"call has its own activation and gradient. Received: layer={path!r}, call_index=None. Choose the "
            f"call with `call_index=0..{calls - 1}` (negative counts from the last); {how}."
        )
    if not -calls <= call_index < calls:
        raise SharedLayerError(
            f"`call_index` is out of range: layer {path!r} is called {calls} time{'s' if calls > 1 else ''} in one "
            f"forward pass of {model}. Received: call_index={call_index}. Expected "
            + ("None, 0 or -1." if calls == 1 else f"an int in [{-calls}, {calls - 1}]; {how}.")
        )
    wanted = call_index % calls
    return ranks.index(wanted) if mapped and ranks is not None else wanted
