"""What a functional model's graph says without running it: the facts a first call needs.

Before its first compiled call the engine needs three facts about a model: which softmax
layers produce the outputs (bypassed in ``"logits"`` mode), whether the explained output is
probabilities, and how many times a probed layer is called in one forward pass (shared
layers, :mod:`kerascope.core.calls`). One eager pass on one sample observes all three for any
model. For a ``Functional`` or ``Sequential`` model the node graph states them, and reading it
costs no model call (MobileNetV2: the eager pass was a fifth to a third of a first Grad-CAM
call). Every reader here answers ``None`` where the graph does not settle the fact; the
engine then runs the eager pass, so a reading is only ever the same answer, got sooner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from kerascope.core.calls import chain_ranks
from kerascope.core.layers import child_layers
from kerascope.core.probe import is_sigmoid_head

__all__ = ["call_count", "feeding", "graph_of", "output_probabilities", "output_softmax", "producing", "read_elsewhere"]


def graph_of(layer: Any) -> Any | None:
    """The ``Functional`` whose node graph runs ``layer``'s call, or ``None`` (subclassed, unbuilt ``Sequential``).

    A ``Sequential`` runs through its inner functional; a subclass that overrides ``call``
    has no graph that says what its call does.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> graph_of(m) is not None, graph_of(m.layers[0])
        (True, None)
    """
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential

    if isinstance(layer, Sequential):
        graph = getattr(layer, "_functional", None)
        return graph if type(layer).call is Sequential.call and graph is not None else None
    if isinstance(layer, Functional) and type(layer).call is Functional.call:
        return layer if getattr(layer, "_nodes_by_depth", None) else None
    return None


def _producer_tensors(tensor: Any) -> list[tuple[Any, Any]] | None:
    """``(operation, tensor)`` pairs: the operations whose output *is* ``tensor``, outermost first, each with
    that output as its own graph names it (a nested functional model's inner output tensor).

    ``None`` when the tensor has no history (not built symbolically) or a nested model
    has no readable graph.
    """
    chain = []
    while True:
        history = getattr(tensor, "_keras_history", None)
        if history is None:
            return None
        operation = history.operation
        chain.append((operation, tensor))
        if not isinstance(operation, keras.Model):
            return chain
        graph = graph_of(operation)
        if graph is None:
            return None
        outputs = keras.tree.flatten(graph.outputs)
        if not 0 <= history.tensor_index < len(outputs):
            return None
        tensor = outputs[history.tensor_index]


def _producers(tensor: Any) -> list[Any] | None:
    """The operations whose output *is* ``tensor``, outermost first, through nested functional models."""
    chain = _producer_tensors(tensor)
    return None if chain is None else [operation for operation, _ in chain]


def _graph_nodes(graph: Any) -> list[Any] | None:
    """Every node of ``graph`` and of the functional models nested in it; ``None`` where one has no readable graph."""
    nodes = []
    for depth_nodes in graph._nodes_by_depth.values():
        for node in depth_nodes:
            nodes.append(node)
            if isinstance(node.operation, keras.Model):
                inner = graph_of(node.operation)
                inner_nodes = None if inner is None else _graph_nodes(inner)
                if inner_nodes is None:
                    return None
                nodes.extend(inner_nodes)
    return nodes


def read_elsewhere(model: keras.Layer, softmax: Sequence[keras.Layer], outputs_read: bool) -> list[keras.Layer] | None:
    """The layers of ``softmax`` that bypassing would change more than the output they produce; ``None`` where unreadable.

    A softmax called more than once (its other calls would lose their softmax too), and with
    ``outputs_read`` (a callable target reads every model output: no ``output_index``) one whose
    output another layer reads (``[p, Dense(1)(p)]``: the second output would be computed from
    logits).

    Example:
        >>> import keras
        >>> x = keras.Input((3,)); s = keras.layers.Softmax(); p = s(x)
        >>> m = keras.Model(x, [p, keras.layers.Dense(1)(p)])
        >>> read_elsewhere(m, [s], outputs_read=True) == [s], read_elsewhere(m, [s], outputs_read=False)
        (True, [])
    """
    graph = graph_of(model)
    nodes = None if graph is None else _graph_nodes(graph)
    if nodes is None:
        return None
    calls: dict[int, int] = {}
    read: set[int] = set()
    for node in nodes:
        calls[id(node.operation)] = calls.get(id(node.operation), 0) + 1
        read.update(id(t) for t in node.input_tensors)
    produced: dict[int, list[Any]] = {}
    for tensor in keras.tree.flatten(graph.outputs):
        chain = _producer_tensors(tensor)
        if chain is None:
            return None
        for operation, _ in chain:
            produced.setdefault(id(operation), []).extend(t for _, t in chain)
    return [layer for layer in softmax if calls.get(id(layer), 0) > 1
            or (outputs_read and any(id(t) in read for t in produced.get(id(layer), ())))]


def output_softmax(model: keras.Layer, candidates: Sequence[keras.Layer]) -> list[keras.Layer] | None:
    """The softmax ``candidates`` whose output is one of the model's outputs, read from the graph.

    The eager pass finds the candidates whose recorded output equals a model output; the
    graph settles that only when every candidate *produces* an output (the usual final
    ``Dense(activation="softmax")`` / ``Softmax``) and none sits elsewhere (attention
    softmaxes, a softmax followed by a value-preserving layer): then ``None``.

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(2, activation="softmax")
        >>> m = keras.Sequential([keras.Input((3,)), d])
        >>> output_softmax(m, [d]) == [d], output_softmax(m, [])
        (True, [])
    """
    graph = graph_of(model)
    if graph is None:
        return None
    produced: dict[int, keras.Layer] = {}
    for tensor in keras.tree.flatten(graph.outputs):
        chain = _producers(tensor)
        if chain is None:
            return None
        produced.update((id(op), op) for op in chain)
    if any(id(layer) not in produced for layer in candidates):
        return None
    return list(candidates)


def producing(softmax: Sequence[keras.Layer], chosen: Any) -> list[keras.Layer] | None:
    """The layers of ``softmax`` that produce ``chosen`` (a symbolic model output); ``None`` where unreadable.

    A softmax whose output another model output reads (``[p, Dense(1)(p)]``, explaining the
    second) must not be bypassed: the explained output would change.

    Example:
        >>> import keras
        >>> x = keras.Input((3,)); s = keras.layers.Softmax(); p = s(x); q = keras.layers.Dense(1)(p)
        >>> producing([s], p) == [s], producing([s], q)
        (True, [])
    """
    chain = _producers(chosen)
    if chain is None:
        return None
    ids = {id(op) for op in chain}
    return [layer for layer in softmax if id(layer) in ids]


def output_probabilities(model: keras.Layer, chosen: Any, softmax: Sequence[keras.Layer]) -> bool | None:
    """Whether the explained output ``chosen`` (a symbolic model output) is probabilities, when the graph says so.

    ``True`` when one of ``softmax`` (float32, over the last axis) produces it and its rows
    have more than one entry; ``None`` otherwise (the values decide: a ``Lambda`` softmax, a
    normalisation, logits).

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(2, activation="softmax")
        >>> m = keras.Sequential([keras.Input((3,)), d])
        >>> output_probabilities(m, m.outputs[0], [d]), output_probabilities(m, m.outputs[0], [])
        (True, None)
    """
    chain = _producers(chosen)
    shape = tuple(getattr(chosen, "shape", ()))
    if chain is None or len(shape) < 2 or not isinstance(shape[-1], int) or shape[-1] < 2:
        return None
    for layer in softmax:  # (a sigmoid's units are each in (0, 1), its rows need not sum to 1: the values decide)
        if any(op is layer for op in chain) and layer.compute_dtype == "float32" and not is_sigmoid_head(layer):
            axis = getattr(layer, "axis", -1)
            if axis in (-1, len(shape) - 1):
                return True
    return None


def parent_counts(model: keras.Layer) -> dict[int, int]:
    """``{id(layer): how many layers hold it as a direct sub-layer}`` for every layer below ``model``.

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(2)
        >>> inner = keras.Sequential([keras.Input((2,)), d])
        >>> outer = keras.Sequential([keras.Input((2,)), d, inner])
        >>> parent_counts(outer)[id(d)]
        2
    """
    counts: dict[int, int] = {}
    seen: set[int] = set()
    pending = [model]
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        for child in {id(c): c for c in child_layers(layer)}.values():
            counts[id(child)] = counts.get(id(child), 0) + 1
            pending.append(child)
    return counts


def call_count(chain: Sequence[keras.Layer], parents: dict[int, int]) -> int | None:
    """Calls of ``chain[-1]`` in one forward pass of ``chain[0]``, read from the node graphs of the models on the way.

    ``chain`` is the model, the nested models on the layer's path and the layer (as
    :func:`~kerascope.core.calls.chain_ranks` takes it); ``parents`` is :func:`parent_counts`.
    ``None`` when a model on the way has no readable graph, or when the layer (or a nested
    model on the way) is also held by another layer, whose own ``call`` may call it too.

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(3, name="d")
        >>> m = keras.Sequential([keras.Input((3,)), d, d])
        >>> call_count([m, d], parent_counts(m))
        2
    """
    if len(chain) < 2 or any(graph_of(parent) is None for parent in chain[:-1]):
        return None
    if any(parents.get(id(layer), 0) != 1 for layer in chain[1:]):
        return None
    ranks = chain_ranks(list(chain))
    return None if not ranks else len(ranks)


def feeding(chosen: Any) -> set[int] | None:
    """``id``s of the layers and ops that ``chosen`` (a symbolic model output) depends on; ``None`` if unreadable.

    A nested model or a layer with sub-layers on the way counts with everything inside it.

    Example:
        >>> import keras
        >>> x = keras.Input((3,)); a = keras.layers.Dense(2); b = keras.layers.Dense(1)
        >>> used = feeding(a(x)); _ = b(x)
        >>> id(a) in used, id(b) in used
        (True, False)
    """
    from kerascope.core.layers import iter_layers

    used: set[int] = set()
    seen: set[int] = set()
    stack = list(keras.tree.flatten(chosen))
    while stack:
        history = getattr(stack.pop(), "_keras_history", None)
        if history is None:
            return None
        operation = history.operation
        nodes = getattr(operation, "_inbound_nodes", None) or []
        if not 0 <= history.node_index < len(nodes):
            return None
        node = nodes[history.node_index]
        if id(node) in seen:
            continue
        seen.add(id(node))
        used.add(id(operation))
        if isinstance(operation, keras.Layer):
            used.update(id(inner) for _, inner in iter_layers(operation))
            for _, inner in iter_layers(operation):
                used.update(id(op) for op in getattr(inner, "_operations", None) or [])
            used.update(id(op) for op in getattr(operation, "_operations", None) or [])
        stack.extend(t for t in keras.tree.flatten(node.input_tensors) if t is not None)
    return used
