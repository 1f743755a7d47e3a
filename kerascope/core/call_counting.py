"""Call counting for shared layers: which call of a probed layer a pass reads."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import keras

from kerascope.core.calls import chain_ranks, choose_call
from kerascope.core.inputs import Inputs
from kerascope.core.probe import probe


def _concrete_calls(values: Sequence[Any]) -> int:
    """How many recorded calls hold numbers (a structured output, e.g. an RNN cell's, by its first tensor):
    an unbuilt subclassed model's first call also makes a symbolic build call."""
    count = 0
    for value in values:
        leaves = keras.tree.flatten(value)
        try:
            if leaves:
                keras.ops.convert_to_numpy(leaves[0])
        except Exception:  # noqa: BLE001 (any backend's "symbolic tensor" error)
            continue
        count += 1
    return count


def _concrete(values: Sequence[Any]) -> list[Any]:
    """The recorded values that hold numbers: a subclassed model's first call also records the symbolic
    call Keras makes to build it (a graph tensor, no values)."""
    kept = []
    for value in values:
        try:
            kept.append(keras.ops.convert_to_numpy(value))
        except Exception:  # noqa: BLE001 (any backend's "symbolic tensor" error)
            continue
    return kept


class CallCounting:
    """Which call of each probed (possibly shared) layer a pass reads, and that a compiled pass calls it as often."""

    def _choose(self, layer: keras.Layer, calls: int) -> int | None:
        """Forward-order position of the ``call_index`` call of ``layer`` seen ``calls`` times (see ``core.calls``)."""
        path = self.path_of(layer)
        ranks = self.memo(("build_ranks", id(layer)), lambda: chain_ranks(self._chain(path))) if calls > 1 else None
        return choose_call(path, calls, self.call_index, ranks, f"model {self.model.name!r}")

    def call_positions(self, inputs: Inputs, layers: Sequence[keras.Layer]) -> tuple[int | None, ...]:
        """Which call of each layer is read (forward order), from one eager probed pass on one sample.

        A layer called once gives 0; a shared layer the call chosen by ``call_index``
        (:class:`~kerascope.core.calls.SharedLayerError` without one). Memoised per layers
        and input signature.

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras, numpy as np
            >>> d = keras.layers.Dense(3, name="d")
            >>> m = keras.Sequential([keras.Input((3,)), d, d])
            >>> x = Inputs(np.ones((1, 3)))
            >>> Engine(m, call_index=-1).call_positions(x, [d])
            (1,)
        """
        return self._calls(inputs, layers)[0]

    def _calls(self, inputs: Inputs, layers: Sequence[keras.Layer]) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
        """``(positions, eager call counts)`` of ``layers``, memoised per layers and input signature."""
        if not layers:
            return (), ()

        ids = tuple(id(layer) for layer in layers)

        def count() -> tuple[tuple[int | None, ...], tuple[int, ...]]:
            counts = self._compiled.pop(("call_counts", ids, inputs.signature), None)  # from the input check
            if counts is None:
                with contextlib.ExitStack() as stack:
                    rec = stack.enter_context(probe(layers))
                    self.call_model(inputs.model_arg([a[:1] for a in inputs.arrays]), stack)
                counts = tuple(_concrete_calls(rec.outputs.get(id(layer), ())) for layer in layers)
            return tuple(self._choose(layer, n) for layer, n in zip(layers, counts, strict=True)), counts

        return self.memo(("call_positions", ids, inputs.signature), count)

    def _check_traced_calls(self, recorder: Any, layers: Sequence[keras.Layer], counts: Sequence[int]) -> None:
        """A shared layer must be called as often when compiled as eagerly, else its calls cannot be matched."""
        for layer, eager in zip(layers, counts, strict=True):
            traced = len(recorder.outputs.get(id(layer), ()))
            if eager == 1 and traced > 1:  # a call the graph (or the eager count) did not show
                raise ValueError(
                    f"Layer {self.path_of(layer)!r} is called {traced} times in the compiled forward pass, but the "
                    f"model's graph shows 1 call: another layer calls it from its own code (e.g. a Lambda that "
                    f"closes over it), so its calls cannot be told apart. Received: layer={self.path_of(layer)!r}, "
                    f"call_index={self.call_index!r}. Probe a layer that only the model's graph calls."
                )
            if eager > 1 and traced != eager:  # a plain ValueError: the TF backend re-raises it unwrapped
                raise ValueError(
                    f"Layer {self.path_of(layer)!r} is called {eager} times in an eager forward pass but {traced} "
                    f"times in the compiled one (a layer called inside a loop, such as an RNN cell), so its calls "
                    f"cannot be told apart. Received: layer={self.path_of(layer)!r}, call_index={self.call_index!r}. "
                    "Probe the layer that contains the loop (e.g. the LSTM layer, not its cell)."
                )
