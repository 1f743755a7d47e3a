"""Addressing layers by path through nested and subclassed models.

A path is the chain of layer names from the model down to the layer,
joined by ``/``: ``"inception_v3/mixed10"`` names the layer ``mixed10`` of
the model ``inception_v3`` that is itself a layer of the outer model. Inside
a subclassed model the names are those of the tracked sub-layers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import keras


def child_layers(layer: keras.Layer) -> list[keras.Layer]:
    """Return the direct sub-layers of ``layer`` (tracked attributes included).

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
        >>> [l.name for l in child_layers(m)]
        ['d']
    """
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return []
    return [
        child
        for child in flatten(include_self=False, recursive=False)
        if not isinstance(child, keras.layers.InputLayer)
    ]


@dataclass(frozen=True)
class LayerInfo:
    """One addressable layer: its path, the object, its class and output shape.

    Example:
        >>> info = LayerInfo("block/conv", None, "Conv2D", "(None, 8, 8, 4)")
        >>> info.path
        'block/conv'
    """

    path: str
    layer: keras.Layer | None
    class_name: str
    output_shape: str


def iter_layers(model: keras.Layer, prefix: str = "") -> Iterator[tuple[str, keras.Layer]]:
    """Yield ``(path, layer)`` for every layer below ``model``, depth first.

    Example:
        >>> import keras
        >>> inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="inner")
        >>> outer = keras.Sequential([keras.Input((3,)), inner])
        >>> [p for p, _ in iter_layers(outer)]
        ['inner', 'inner/d']
    """
    seen: set[int] = set()

    def walk(layer: keras.Layer, pre: str) -> Iterator[tuple[str, keras.Layer]]:
        for child in child_layers(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{pre}{child.name}"
            yield path, child
            yield from walk(child, path + "/")

    yield from walk(model, prefix)


def _output_shape(layer: keras.Layer) -> str:
    try:
        return str(layer.output.shape)
    except Exception:  # subclassed internals and never-called layers have no symbolic output
        try:
            return str(layer.output_shape)
        except Exception:
            return "?"


def layers(model: keras.Layer) -> list[LayerInfo]:
    """List every addressable layer of ``model`` with its path and output shape.

    Nested models are walked into, so ``"inception_v3/mixed10"`` appears for
    ``Sequential([InceptionV3(...), Dense(2)])``. Layers of subclassed models
    are listed under their names; their output shape is ``"?"`` when the model
    has no graph.

    Example:
        >>> import keras, kerascope as ks
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="fc")])
        >>> [(i.path, i.output_shape) for i in ks.layers(m)]
        [('fc', '(None, 2)')]
    """
    return [
        LayerInfo(path, layer, type(layer).__name__, _output_shape(layer))
        for path, layer in iter_layers(model)
    ]


def find_layer(model: keras.Layer, layer: str | keras.Layer) -> keras.Layer:
    """Resolve ``layer`` (a path, a bare name or a layer object) inside ``model``.

    A bare name that is unique anywhere in the tree is accepted; an ambiguous
    one must be given as a full path. Unknown names raise a ``ValueError``
    listing the closest available paths.

    Example:
        >>> import keras
        >>> inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="inner")
        >>> outer = keras.Sequential([keras.Input((3,)), inner])
        >>> find_layer(outer, "inner/d").name
        'd'
    """
    entries = list(iter_layers(model))
    if isinstance(layer, keras.Layer):
        if layer is model or any(found is layer for _, found in entries):
            return layer
        raise ValueError(
            f"The layer object is not part of the model. Received: layer={layer.name!r} "
            f"({type(layer).__name__}), model={model.name!r}. Pass a layer of this model, "
            "or its path as listed by `kerascope.layers(model)`."
        )
    if not isinstance(layer, str):
        raise TypeError(
            "`layer` must be a layer path (str) or a keras.Layer. "
            f"Received: layer={layer!r} of type {type(layer).__name__}."
        )
    by_path = dict(entries)
    if layer in by_path:
        return by_path[layer]
    matches = [(p, found) for p, found in entries if p.split("/")[-1] == layer]
    if len(matches) == 1:
        return matches[0][1]
    if len(matches) > 1:
        raise ValueError(
            f"Layer name {layer!r} is ambiguous in model {model.name!r}. "
            f"Received: layer={layer!r}. Use one of the full paths: "
            f"{[p for p, _ in matches]}."
        )
    paths = [p for p, _ in entries]
    close = difflib.get_close_matches(layer, paths, n=5, cutoff=0.5)
    leaf = layer.split("/")[-1]
    containing = [p for p in paths if leaf and leaf in p][:10]
    hint = close or containing
    suggestion = (
        f"Closest available layers: {hint}." if hint else f"Available layers: {paths[:20]}"
        + (" ..." if len(paths) > 20 else ".")
    )
    raise ValueError(
        f"No layer {layer!r} in model {model.name!r}. Received: layer={layer!r}. "
        f"{suggestion} List all with `kerascope.layers(model)` or `kerascope layers MODEL_FILE`."
    )


def path_of(model: keras.Layer, layer: keras.Layer) -> str:
    """Return the path of a layer object inside ``model``.

    Example:
        >>> import keras
        >>> d = keras.layers.Dense(2, name="d")
        >>> m = keras.Sequential([keras.Input((3,)), d])
        >>> path_of(m, d)
        'd'
    """
    if layer is model:
        return model.name
    for path, found in iter_layers(model):
        if found is layer:
            return path
    return layer.name


def operation_paths(model: keras.Layer) -> Iterator[tuple[str, Any]]:
    """``(path, op)`` for the raw ``keras.ops`` operations (not layers) of every Functional graph in ``model``."""
    containers = [("", model)] + [(p + "/", layer) for p, layer in iter_layers(model)]
    for prefix, container in containers:
        if not isinstance(container, keras.Model):
            continue
        for op in getattr(container, "_operations", None) or []:
            if not isinstance(op, keras.Layer):
                yield f"{prefix}{op.name}", op
