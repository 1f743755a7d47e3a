"""Input preparation and checks: inputs validated against the model, targets encoded, the eager check pass."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np

from kerascope._backend.errors import StatefulModelError
from kerascope.core import targets as targets_lib
from kerascope.core.call_counting import _concrete_calls
from kerascope.core.calls import SharedLayerError
from kerascope.core.inputs import Inputs, check_against_model, fit_structure
from kerascope.core.model_checks import check_deterministic, check_stateless, kept_variables
from kerascope.core.positions import TargetError, check_no_positions
from kerascope.core.precision import UNIT_ROUNDOFF, model_reduced_dtype
from kerascope.core.probe import probe, softmax_candidates


class InputChecks:
    """Inputs checked against the model once per signature (an eager pass or the graph), targets encoded and checked."""

    def prepare(self, inputs: Any, targets: Any = None) -> tuple[Inputs, np.ndarray, Callable | None]:
        """Validate ``inputs`` against the model and encode ``targets``: ``(inputs, indices, target_fn)``.

        ``indices`` holds one class index per sample (``-1``: the predicted class)
        and ``target_fn`` is the callable target (else ``None``). Class indices are
        checked against the explained output's size, and the output space's softmax
        detection runs once (one forward pass on one sample).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> x, indices, fn = Engine(m).prepare(np.ones((2, 3)), None)
            >>> indices.tolist(), fn
            ([-1, -1], None)
        """
        prepared = self.check_inputs(inputs)
        indices, target_fn = targets_lib.encode(targets, prepared.num_samples)
        self._detect_softmax(prepared)
        if target_fn is None:
            self._check_target_range(prepared, indices, targets)
        else:
            self._check_callable(prepared, target_fn)
        return prepared, indices, target_fn

    def _check_callable(self, inputs: Inputs, target_fn: Callable) -> None:
        """Call a callable target eagerly on 3 and on 2 rows: it must return one score per sample.

        Two row counts, so a function that returns something of a fixed size (one sample's class
        scores, ``o[0]``) cannot pass by matching the class count.
        """
        key = ("callable_ok", targets_lib.callable_key(target_fn), inputs.signature)
        if key in self._compiled:
            return
        for count in (3, 2):
            rows = [np.concatenate([a[:1]] * count) for a in inputs.arrays]
            with contextlib.ExitStack() as stack:
                outputs = self.call_model(inputs.model_arg(rows), stack, self.space.bypass())
                try:
                    values = target_fn(outputs)
                except TargetError:
                    raise
                except Exception as error:
                    raise TypeError(
                        f"The callable target raised {type(error).__name__}: {error}. Received: "
                        f"targets={getattr(target_fn, '__name__', target_fn)!r}, called with the model's outputs "
                        f"{keras.tree.map_structure(lambda t: tuple(t.shape), outputs)}. A callable target "
                        "takes the outputs (batch first) and returns one score per sample."
                    ) from error
            targets_lib.check_scores_shape(values, count)
        self._compiled[key] = True

    def check_inputs(self, inputs: Any, layers: Sequence[keras.Layer] = ()) -> Inputs:
        """Validate ``inputs`` against the model: shapes, then one call on one sample (or the model's graph).

        The call runs once per input structure and signature (memoised), so a model
        that cannot take the inputs fails here with kerascope's message, never inside
        a compiled function. Returns the inputs as :class:`Inputs`. The same call counts
        the calls of ``layers`` (those a method will probe: shared layers, see
        :meth:`call_positions`), so that a first call needs no second eager pass for them.
        A functional or ``Sequential`` model whose graph states what that call would observe
        is not called (``core/graph_reading.py``): its shapes were checked, and an error of a
        later call on these inputs is checked by the eager call then (:meth:`check_on_error`).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> Engine(m).check_inputs(np.ones((2, 3))).num_samples
            2
        """
        prepared = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
        check_against_model(self.model, prepared)
        self._check_call(prepared, layers)
        return prepared

    def _check_call(self, inputs: Inputs, layers: Sequence[keras.Layer] = (), read: bool = True) -> None:
        """Call the model eagerly on one sample, once per input structure and signature.

        Subclassed models declare no input shapes, and a functional model can still refuse
        the inputs (a dict with other keys, a list for a single-input ``call``): their error
        comes here, eagerly and in kerascope's words, instead of from inside a compiled function.
        The same pass counts the calls of ``layers`` (the layers a method is about to probe,
        read by :meth:`_calls`), so a first call makes one eager pass, not two. With ``read``,
        a model whose graph states all of this is not called (:meth:`_read_graph`).
        """
        self.memo("stateless", lambda: check_stateless(self.model))  # before any call could advance a state
        key = ("model_accepts", inputs.signature)
        counted = ("call_counts", tuple(id(layer) for layer in layers), inputs.signature)
        if not layers or ("memo", key) in self._compiled or ("memo", ("call_positions", *counted[1:])) in self._compiled:
            layers = ()

        def call() -> bool | str:
            if read and self._read_graph(inputs, layers, counted):
                return "read"  # not called yet: check_on_error calls it if a later call fails
            # the output space's softmax detection rides on this pass (one eager pass fewer on the first call)
            candidates = [] if self.space.detected else softmax_candidates(self.model)
            sample = inputs.model_arg([a[:1] for a in inputs.arrays])
            # Two calls, each keeping the variables (restored even when the model refuses the inputs). The
            # second also refuses a model random at inference (each pass would see another draw; a functional
            # model's Keras layers follow training=False) and sees the variables a first call only created.
            try:
                with kept_variables(self.model) as first_changes:  # (nested: the second call sees the first's draw)
                    with contextlib.ExitStack() as stack:
                        rec = stack.enter_context(probe([*candidates, *layers]))
                        explained = self.call_model(sample, stack)
                    with kept_variables(self.model) as changed, contextlib.ExitStack() as stack:
                        again = self.call_model(sample, stack)
            except SharedLayerError:  # the inputs are fine: `output_layer` needs a `call_index`
                raise
            except Exception as error:
                reason = str(error).strip().splitlines()
                received = {k: (a.shape, a.dtype.name) for k, a in zip(inputs.keys or range(len(inputs.arrays)), inputs.arrays)}
                raise ValueError(
                    f"Model {self.model.name!r} cannot be called on these inputs. Received: inputs as a "
                    f"{inputs.kind} with (shape, dtype) {received}. Pass what the model's call() takes; "
                    f"the model said: {type(error).__name__}: {' '.join(line.strip() for line in reason if line.strip())[:400]}"
                ) from error
            changed = list(dict.fromkeys([*first_changes, *changed]))
            if changed:
                raise StatefulModelError(
                    f"Model {self.model.name!r} changes its variables when called at inference (training=False). "
                    f"Received: a call that assigned {changed[:5]}{' ...' if len(changed) > 5 else ''} (e.g. "
                    "BatchNormalization called with training=True inside call(): its moving statistics). Explaining "
                    "would change your model (and with BatchNormalization in training mode, each sample's map would "
                    "depend on the other samples of its batch). "
                    "The variables were restored. Let such layers follow `training` "
                    "(`self.bn(x, training=training)`) to explain the model as `predict()` uses it."
                )
            reduced = model_reduced_dtype(self.model)  # float16 / bfloat16 compute: 32 units of that rounding
            compared = (explained, again)
            if self.output_layer is None:  # the explained output only: another may be random by design (a VAE's z)
                try:
                    compared = (self.select(explained), self.select(again))
                except ValueError:
                    pass  # (no output chosen: all of them)
            check_deterministic(self.model.name, *compared, 32 * UNIT_ROUNDOFF.get(reduced, 1e-4 / 32))
            if not self.space.detected:
                self._settle_softmax(candidates, rec.outputs, explained, sample)
            elif self.space.probabilities_pending:  # read from the graph for other inputs: these values settle it
                self._settle_probabilities(explained)
            if layers:
                # (concrete calls only: an unbuilt subclassed model's first call also makes a symbolic build call)
                self._compiled[counted] = tuple(_concrete_calls(rec.outputs.get(id(layer), ())) for layer in layers)
            return True

        self.memo(key, call)

    @contextlib.contextmanager
    def check_on_error(self, inputs: Inputs) -> Iterator[None]:
        """Inside: an error, when these inputs were checked from the model's graph only, is first checked eagerly.

        The eager call on one sample then raises kerascope's message if the model cannot take
        the inputs (as :meth:`check_inputs` does for a model without a readable graph);
        otherwise the error is raised as it was.

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> e = Engine(m); x = e.check_inputs(np.ones((1, 3)))
            >>> with e.check_on_error(x):
            ...     e.forward(x).shape
            (1, 2)
        """
        key = ("memo", ("model_accepts", inputs.signature))
        error = None
        try:
            yield
        except Exception as caught:
            if self._compiled.get(key) != "read":
                raise
            error = caught
        if error is not None:  # out of the except block: kerascope's message is not chained to this error
            del self._compiled[key]
            try:
                self._check_call(inputs, read=False)  # kerascope's message when the model refuses the inputs
            except ValueError:
                if self._first_row is not None and self._first_row[0] == inputs.signature:
                    self._first_row = None  # not a sample the model takes: the next inputs read give one
                raise
            raise error

    def _check_target_range(self, inputs: Inputs, indices: np.ndarray, targets: Any = None) -> None:
        key = ("output_shape", inputs.signature)
        if key not in self._compiled:  # symbolic shape inference once per input signature
            try:
                if self.output_layer is not None:  # no symbolic pass reaches an inner layer: one eager sample
                    with contextlib.ExitStack() as stack:
                        out = self.call_model(inputs.model_arg([a[:1] for a in inputs.arrays]), stack)
                else:
                    out = self.model.compute_output_spec(fit_structure(self.model, inputs.model_arg(
                        [keras.KerasTensor((None, *a.shape[1:]), a.dtype.name) for a in inputs.arrays])))
            except Exception:
                out = None
            if out is None:  # no symbolic pass (some subclassed models): one eager sample
                try:
                    with contextlib.ExitStack() as stack:
                        out = self.call_model(inputs.model_arg([a[:1] for a in inputs.arrays]), stack)
                except Exception:
                    out = None
            # choosing the output here, eagerly, raises kerascope's own message (not wrapped in a trace)
            self._compiled[key] = None if out is None else tuple(self.select(out).shape)
        shape = self._compiled[key]
        if shape is not None:
            check_no_positions(shape, targets)
        if shape is not None and len(shape) >= 2 and all(d is not None for d in shape[1:]):
            targets_lib.check_range(indices, int(np.prod(shape[1:])))
