"""Layer resolution and paths: a model's layers by path and by object, memoised per structure."""

from __future__ import annotations

from collections.abc import Sequence

import keras

from kerascope.core.layers import find_layer, iter_layers, path_of


class LayerIndex:
    """The engine's layer lookups: paths to layers and back, memoised per model structure."""

    def resolve_layers(self, layers: Sequence[str | keras.Layer]) -> list[keras.Layer]:
        """Resolve layer paths / objects to layer objects of this model.

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
            >>> [l.name for l in Engine(m).resolve_layers(["d"])]
            ['d']
        """
        index = self._layer_index()
        resolved = []
        for layer in layers:
            if isinstance(layer, keras.Layer) and id(layer) in index[1]:
                resolved.append(layer)
            elif isinstance(layer, str) and layer in index[0]:
                resolved.append(index[0][layer])
            else:  # bare names, objects of other models, unknown names: full lookup and its errors
                resolved.append(find_layer(self.model, layer))
        return resolved

    def path_of(self, layer: keras.Layer) -> str:
        """The path of a layer object of this model (from a cached index of the model's layers).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> d = keras.layers.Dense(2, name="d")
            >>> Engine(keras.Sequential([keras.Input((3,)), d])).path_of(d)
            'd'
        """
        path = self._layer_index()[1].get(id(layer))
        return path if path is not None else path_of(self.model, layer)

    def _layer_index(self) -> tuple[dict[str, keras.Layer], dict[int, str]]:
        """``({path: layer}, {id(layer): path})``, built once per model structure (top-level layer count)."""
        model = self.model

        def build() -> tuple[dict[str, keras.Layer], dict[int, str]]:
            by_path = dict(iter_layers(model))
            return by_path, {id(layer): path for path, layer in by_path.items()}

        # `_layers` (tracked sub-layers) is a plain list; the public `layers` property rebuilds one
        structure = len(getattr(model, "_layers", None) or getattr(model, "layers", None) or [])
        return self.memo(("layer_index", structure), build)

    def _structure(self) -> int:
        """The model's layer count: a memo key that changes when layers are added (as ``_layer_index``)."""
        model = self.model
        return len(getattr(model, "_layers", None) or getattr(model, "layers", None) or [])

    def _chain(self, path: str) -> list[keras.Layer]:
        """The model, the nested models on ``path`` and the layer (outermost first)."""
        by_path = self._layer_index()[0]
        parts = path.split("/")
        found = [by_path.get("/".join(parts[:i])) for i in range(1, len(parts) + 1)]
        return [self.model, *found] if all(layer is not None for layer in found) else []

    def explained_layer(self) -> keras.Layer | None:
        """The layer whose output is explained instead of the model's (``output_layer=``), or None.

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
            >>> Engine(m, output_layer="d").explained_layer().name
            'd'
        """
        if self.output_layer is None:
            return None
        return self.resolve_layers([self.output_layer])[0]
