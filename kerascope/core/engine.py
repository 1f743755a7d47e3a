"""The engine facade: one object per model and options, composed of the engine's parts.

Everything kerascope computes with gradients goes through :meth:`Engine.gradients`: scores of
the targets, gradients w.r.t. the inputs, activations and gradients at any probed layers, and
gradients w.r.t. weights. The forward function is written once in Keras terms (``core/passes.py``);
the backend module compiles it with its own autodiff (``core/compiled.py``). Each job lives in a
module named for it: ``layer_index`` (layers and paths), ``input_checks`` (inputs and targets),
``call_counting`` (shared layers), ``graph_facts`` (graph reading), ``softmax_bypass`` (logits mode,
saturation), ``passes`` (the rewrites of a traced pass), ``compiled`` (the compiled functions) and
``model_checks`` (stateless, deterministic, finite).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import keras

from kerascope._backend.errors import StatefulModelError
from kerascope.core.call_counting import CallCounting
from kerascope.core.calls import check_call_index
from kerascope.core.compiled import RULES, ChunkScorer, CompiledCalls, GradientResult, Transform
from kerascope.core.graph_facts import GraphFacts
from kerascope.core.input_checks import InputChecks
from kerascope.core.inputs import fit_structure
from kerascope.core.layer_index import LayerIndex
from kerascope.core.model_checks import (
    NonFiniteError,
    StochasticModelError,
    check_deterministic,
    check_finite,
    check_single_tensor,
    check_stateless,
    kept_variables,
)
from kerascope.core.output_space import (
    OUTPUT_SPACES,
    SATURATED_HIGH,
    SATURATED_LOW,
    OutputSpace,
    bypass_error,
)
from kerascope.core.passes import PassRewrites
from kerascope.core.precision import check_precision
from kerascope.core.probe import bypass_softmax, probe
from kerascope.core.softmax_bypass import SoftmaxBypass

__all__ = [
    "OUTPUT_SPACES", "RULES", "SATURATED_HIGH", "SATURATED_LOW", "ChunkScorer", "Engine", "GradientResult",
    "NonFiniteError", "StatefulModelError", "StochasticModelError", "Transform", "check_deterministic",
    "check_finite", "check_single_tensor", "check_stateless", "engine_for", "kept_variables",
]


class Engine(CompiledCalls, PassRewrites, InputChecks, SoftmaxBypass, GraphFacts, CallCounting, LayerIndex):
    """Compiles and runs gradient computations for one model.

    ``output="logits"`` (default) differentiates the pre-softmax logits: a
    final softmax (fused ``Dense(activation="softmax")``, ``Activation`` or
    ``Softmax`` layer) is bypassed for the duration of each call, never by
    changing the model. ``output="probabilities"`` keeps the softmax.
    ``precision="bfloat16"`` / ``"float16"`` traces every pass with the layers' mixed
    policy (``core/precision.py``; restored on exit), results float32.
    ``call_index`` chooses the call of a probed layer (or ``output_layer``) that the
    model calls more than once (a shared layer; see :mod:`kerascope.core.calls`):
    such a layer without ``call_index`` raises :class:`~kerascope.core.calls.SharedLayerError`.
    ``fold_batchnorm=True`` (default) runs each Conv / Dense layer followed only by a
    ``BatchNormalization`` as one layer inside the compiled passes on TensorFlow and PyTorch
    (``propagation/bn_fold.py``; the model is not changed; float32 rounding differs, ~1e-6 relative, see docs/performance.md);
    ``False`` runs the model's own graph.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
        >>> r = Engine(m).gradients(np.ones((1, 3)), targets=0)
        >>> r.input_grads[0].shape
        (1, 3)
    """

    def __init__(
        self,
        model: keras.Layer,
        output: str = "logits",
        output_index: int | str | None = None,
        jit_compile: bool = False,
        output_layer: str | None = None,
        precision: str | None = None,
        call_index: int | None = None,
        fold_batchnorm: bool = True,
    ) -> None:
        if not isinstance(model, keras.Layer):
            raise TypeError(
                "`model` must be a Keras 3 model or layer. Received: "
                f"model of type {type(model).__module__}.{type(model).__name__}. "
                "Load files with `kerascope.load_model(path)`."
            )
        self.space = OutputSpace(output, output_index)
        self._model_ref = weakref.ref(model)
        self.jit_compile = jit_compile
        self.output_layer = output_layer
        self.precision = check_precision(precision)  # None (float32) or the reduced compute type
        self.call_index = check_call_index(call_index)
        self.fold_batchnorm = fold_batchnorm
        self._fold_refused = False  # set when a folded pass proved inexact (see _call_model)
        self._bypass_calls: dict[int, int] = {}  # id(bypassed softmax layer) -> its calls in one model call
        self.trace_count = 0
        self._compiled: dict[Any, Callable] = {}
        self._first_row: Any = None  # one sample of the first inputs, while a graph reading awaits the values

    @property
    def output(self) -> str:
        """``"logits"`` (a final softmax bypassed) or ``"probabilities"``.

        Example:
            >>> import keras
            >>> Engine(keras.Sequential([keras.Input((1,))])).output
            'logits'
        """
        return self.space.output

    @property
    def output_index(self) -> int | str | None:
        """Which output of a multi-output model is explained (index or name; ``None``: the only one).

        Example:
            >>> import keras
            >>> Engine(keras.Sequential([keras.Input((1,))]), output_index=0).output_index
            0
        """
        return self.space.output_index

    @property
    def model(self) -> keras.Layer:
        """The explained model (held weakly, so cached engines never keep a model alive).

        Example:
            >>> import keras
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> Engine(m).model is m
            True
        """
        model = self._model_ref()
        if model is None:
            raise RuntimeError("The model explained by this engine no longer exists.")
        return model

    @property
    def cache_size(self) -> int:
        """How many compiled functions (and memoised facts) this engine holds: constant once warm.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> e = Engine(m)
            >>> sizes = [(e.scores(np.ones((1, 3)), lambda o: o[:, 1]), e.cache_size)[1] for _ in range(3)]
            >>> sizes[0] == sizes[2]
            True
        """
        return len(self._compiled)

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """Return the value cached under ``key`` for this model, computing it once.

        Used for per-input-signature facts that cost a forward pass (e.g. a
        CAM method's default layer).

        Example:
            >>> import keras
            >>> e = Engine(keras.Sequential([keras.Input((1,))]))
            >>> e.memo("answer", lambda: 42), e.memo("answer", lambda: 0)
            (42, 42)
        """
        full_key = ("memo", key)
        if full_key not in self._compiled:
            self._compiled[full_key] = compute()
        return self._compiled[full_key]

    def select(self, outputs: Any) -> Any:
        """The explained output (``output_index``) of the model's outputs.

        Example:
            >>> import keras, numpy as np
            >>> i = keras.Input((2,))
            >>> m = keras.Model(i, {"a": keras.layers.Dense(1)(i), "b": keras.layers.Dense(3)(i)})
            >>> tuple(Engine(m, output_index="b").select(m(np.ones((1, 2)))).shape)
            (1, 3)
        """
        return self.space.select(outputs, self.model)

    def call_model(self, arg: Any, stack: contextlib.ExitStack, bypass: Sequence[keras.Layer] = ()) -> Any:
        """Call the model inside ``stack`` (softmax ``bypass``) and return what is explained.

        That is the model's outputs, or the output of ``output_layer`` when set (the call chosen
        by ``call_index`` when the layer is called more than once). Usable inside compiled
        functions; probes for other layers may already be on ``stack``.

        Example:
            >>> import contextlib, keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="h"), keras.layers.Dense(2)])
            >>> with contextlib.ExitStack() as stack:
            ...     out = Engine(m, output_layer="h").call_model(np.ones((1, 3)), stack)
            >>> tuple(out.shape)
            (1, 4)
        """
        counts: dict[int, int] | None = {} if bypass else None
        stack.enter_context(bypass_softmax(list(bypass), counts))
        layer = self.explained_layer()
        recorder = stack.enter_context(probe([layer])) if layer is not None else None
        outputs = self.model(fit_structure(self.model, arg), training=False)
        for bypassed in bypass:  # a call the settled count does not show (a Lambda closing over the softmax)
            expected = self._bypass_calls.get(id(bypassed))
            if counts is not None and expected is not None and counts.get(id(bypassed), 0) != expected:
                raise bypass_error(self.model.name, [bypassed], outputs_read=False)
        if recorder is None:
            return outputs
        return recorder.call(layer, self._choose(layer, len(recorder.outputs.get(id(layer), ()))))


_ENGINES: weakref.WeakKeyDictionary[keras.Layer, dict[Any, Engine]] = weakref.WeakKeyDictionary()


def engine_for(
    model: keras.Layer,
    output: str = "logits",
    output_index: Any = None,
    jit_compile: bool = False,
    output_layer: str | None = None,
    precision: str | None = None,
    call_index: int | None = None,
    fold_batchnorm: bool = True,
) -> Engine:
    """Return the shared :class:`Engine` for this model and options (compiled functions are reused).

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> engine_for(m) is engine_for(m)
        True
    """
    precision = check_precision(precision)  # one engine (and compiled-function cache) per precision
    try:
        per_model = _ENGINES.setdefault(model, {})
    except TypeError:
        return Engine(model, output, output_index, jit_compile, output_layer, precision, call_index, fold_batchnorm)
    key = (output, output_index, jit_compile, output_layer, precision, check_call_index(call_index), bool(fold_batchnorm))
    if key not in per_model:
        per_model[key] = Engine(model, output, output_index, jit_compile, output_layer, precision, call_index,
                                bool(fold_batchnorm))
    return per_model[key]
