"""Graph reading for the engine: what a functional model's graph settles without an eager pass."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import keras

from kerascope.core.graph_reading import (
    call_count,
    feeding,
    graph_of,
    output_probabilities,
    output_softmax,
    parent_counts,
    producing,
    read_elsewhere,
)
from kerascope.core.inputs import Inputs, model_input_names
from kerascope.core.layers import iter_layers, operation_paths
from kerascope.core.output_space import bypass_error
from kerascope.core.probe import softmax_candidates


class GraphFacts:
    """Facts read from a functional / Sequential model's graph instead of an eager pass."""

    def _read_graph(self, inputs: Inputs, layers: Sequence[keras.Layer], counted: Any) -> bool:
        """Settle from the model's graph what the eager check pass observes; False (nothing settled) where it cannot.

        The softmax bypass, whether the output is probabilities (or pending, see
        :attr:`OutputSpace.probabilities_pending`) and the calls of ``layers``. Only for a
        functional / ``Sequential`` model (its inputs' shapes already checked) and no ``output_layer``.
        """
        model = self.model
        if self.output_layer is not None or model_input_names(model) is None:
            return False
        found, probabilities = None, None
        if not self.space.detected:
            found = output_softmax(model, softmax_candidates(model))
            if found is None:
                return False
            try:  # several outputs and no output_index: no output chosen, not probabilities (as eagerly)
                chosen = self.select(graph_of(model)._outputs_struct)
            except ValueError:
                chosen, probabilities = None, False
            else:  # only a softmax that produces the explained output is bypassed (another output may read it)
                found = producing(found, chosen)
                if found is None:
                    return False
                probabilities = output_probabilities(model, chosen, found)
            if found and self.space.output == "logits":  # bypassing must change nothing but the output(s) it produces
                multiple = read_elsewhere(model, found, outputs_read=False)
                if multiple is None or multiple:  # a softmax called more than once: the eager pass tells
                    return False
                clash = read_elsewhere(model, found, outputs_read=chosen is None)
                if clash:
                    raise bypass_error(model.name, clash, outputs_read=True)
        counts = ()
        if layers:
            parents = parent_counts(model)
            counts = tuple(call_count(self._chain(self.path_of(layer)), parents) for layer in layers)
            if any(not count for count in counts):  # unreadable, or never called: the eager pass (and its errors)
                return False
        if found is not None:
            self.space.settle_read(found, probabilities)
            self._bypass_calls = {id(layer): 1 for layer in found}  # read_elsewhere: each is called once
        if counts:
            self._compiled[counted] = counts
        if self.space.probabilities_pending and self._first_row is None:  # the first sample, as the eager pass
            self._first_row = (inputs.signature, inputs.model_arg([a[:1].copy() for a in inputs.arrays]))
        return True

    def feeds_explained(self) -> Callable[[str], bool]:
        """``feeds(path)``: whether the layer / op at ``path`` can reach the explained output (``True`` if unknown).

        Read from a functional model's graph: another output's head (a softmax on the policy
        head while ``output_index="value"``) does not matter to the explanation.

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> x = keras.Input((3,))
            >>> m = keras.Model(x, {"p": keras.layers.Dense(2, name="p")(x), "v": keras.layers.Dense(1, name="v")(x)})
            >>> feeds = Engine(m, output_index="v").feeds_explained()
            >>> feeds("v"), feeds("p")
            (True, False)
        """
        graph = graph_of(self.model)
        used = None
        if graph is not None and self.output_layer is None:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                used = feeding(self.select(graph._outputs_struct))
        if used is None:
            return lambda path: True
        known = {path: id(op) for path, op in iter_layers(self.model)}
        known.update((path, id(op)) for path, op in operation_paths(self.model))
        return lambda path: path not in known or known[path] in used
