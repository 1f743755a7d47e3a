"""The softmax / sigmoid bypass of logits mode and the saturation checks of probabilities."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core.call_counting import _concrete
from kerascope.core.inputs import Inputs, fit_structure
from kerascope.core.layers import iter_layers
from kerascope.core.output_space import (
    bypass_error,
    bypass_is_local,
    is_probabilities,
    is_softmax_of,
    saturation_message,
    softmax_outputs,
)
from kerascope.core.probe import probe, softmax_candidates


class SoftmaxBypass:
    """Which softmax the logits mode bypasses, whether outputs are probabilities, and saturation warnings."""

    @property
    def forward_gives_probabilities(self) -> bool:
        """True when :meth:`forward` returns probabilities (no softmax bypassed, outputs sum to 1).

        Known after the first call (for a model read from its graph, the first values settle it).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
            >>> e = Engine(m); _ = e.forward(np.ones((1, 3)))
            >>> e.forward_gives_probabilities
            False
        """
        if self.space.probabilities_pending:
            self._settle_probabilities()
        return self.space.gives_probabilities

    def _settle_probabilities(self, explained: Any = None) -> None:
        """Settle a pending ``probabilities_out`` from the unmodified model's output on one sample.

        ``explained``: that output, or one eager call on the first sample read (as the check pass would).
        """
        if explained is None:
            if self._first_row is None:  # no inputs read yet that the model takes: still pending
                return
            with contextlib.ExitStack() as stack:  # the unmodified model (no bypass), as the eager check pass
                explained = self.call_model(self._first_row[1], stack)
        try:
            chosen = keras.ops.convert_to_numpy(self.select(explained))
        except ValueError:
            chosen = None
        self.space.probabilities_out, self._first_row = is_probabilities(chosen), None

    def _detect_softmax(self, inputs: Inputs) -> None:
        """Probe the softmax candidates in one eager pass on 1 sample; the output space decides."""
        if self.space.detected:
            return
        candidates = softmax_candidates(self.model)
        first = [a[:1] for a in inputs.arrays]
        with contextlib.ExitStack() as stack:
            rec = stack.enter_context(probe(candidates))
            explained = self.call_model(inputs.model_arg(first), stack)
        self._settle_softmax(candidates, rec.outputs, explained, inputs.model_arg(first))

    def _settle_softmax(
        self, candidates: Sequence[keras.Layer], recorded: dict[int, list[Any]], explained: Any, sample: Any
    ) -> None:
        """Let the output space decide from one probed pass on ``sample``: which softmax is bypassed, probabilities or not.

        A softmax to bypass that the model calls more than once, or (several outputs, no
        ``output_index``) any softmax to bypass, is checked by one more eager call with the bypass:
        if it changed anything but its own outputs (by more than the softmax), it is refused.
        """
        # output_layer: its output is explained as it is, nothing bypassed
        try:  # several outputs and no output_index: only a callable target can say which one
            chosen = keras.ops.convert_to_numpy(self.select(explained))
        except ValueError:
            chosen = None
        # only a softmax whose output is the explained output is bypassed: another output may read it
        explained_outputs = explained if chosen is None else chosen
        recorded = {key: _concrete(values) for key, values in recorded.items()}  # not a build's symbolic call
        found = [] if self.output_layer is not None else softmax_outputs(candidates, recorded, explained_outputs)
        clash = []
        for layer in found if self.space.output == "logits" else ():
            calls = recorded.get(id(layer), ())
            if chosen is None or len(calls) > 1:
                with contextlib.ExitStack() as stack:
                    bypassed = self.call_model(sample, stack, [layer])
                before, after = (explained, bypassed) if chosen is None else ([chosen], [self.select(bypassed)])
                if not bypass_is_local(layer, calls, before, after):
                    clash.append(layer)
        if clash:
            raise bypass_error(self.model.name, clash, outputs_read=chosen is None)
        self.space.settle(found, chosen)
        self._bypass_calls = {id(layer): len(recorded.get(id(layer), ())) for layer in found}

    def _check_saturation(
        self, scores: np.ndarray, inputs: Inputs, input_grads: Sequence[np.ndarray] = (), raw: bool = False
    ) -> None:
        """Warn when the explained probabilities are saturated (see :meth:`OutputSpace.saturated`).

        ``raw``: the scores are entries of the explained output (class targets, not a callable's),
        so a score outside [0, 1] shows that the output is not probabilities, with no call.
        """
        if self.space.probabilities_pending:
            values = np.asarray(scores, np.float64)
            if raw and values.size and not np.all((values >= 0) & (values <= 1)):
                self.space.probabilities_out, self._first_row = False, None
            elif len(self.space.saturated(scores, input_grads, assume_probabilities=True)):
                self._settle_probabilities()  # the warning depends on it: one eager call on the first sample
        bad = self.space.saturated(scores, input_grads)
        if len(bad):
            message = saturation_message(self.model.name, scores, bad, self._logits_layer(inputs),
                                         getattr(inputs, "first_index", 0))
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _logits_layer(self, inputs: Inputs) -> str | None:
        """Path of the last layer whose output, softmaxed, equals the model's output (or None)."""
        candidates = [layer for _, layer in iter_layers(self.model) if layer is not self.model]
        with probe(candidates) as rec:
            outputs = self.model(fit_structure(self.model, inputs.model_arg([a[:1] for a in inputs.arrays])),
                                 training=False)
        try:
            probs = keras.ops.convert_to_numpy(self.select(outputs)).astype(np.float64)
        except ValueError:
            return None
        found = None
        for layer_id, calls in rec.outputs.items():
            try:
                value = keras.ops.convert_to_numpy(calls[-1])
            except Exception:
                continue
            if is_softmax_of(value, probs):
                found = next(layer for layer in candidates if id(layer) == layer_id)
        return None if found is None else self.path_of(found)

    @property
    def bypassed_layers(self) -> list[str]:
        """Paths of the softmax layers bypassed in ``"logits"`` mode (after the first call).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> Engine(m).bypassed_layers
            []
        """
        return [self.path_of(layer) for layer in self.space.softmax_layers or []]
