"""The gradient engine: one compiled forward+backward per request, reused.

Everything kerascope computes with gradients goes through
:meth:`Engine.gradients`: scores of the targets, gradients w.r.t. the inputs,
activations and gradients at any probed layers, and gradients w.r.t. weights.
The forward function is written once here in Keras terms; the backend module
compiles it with its own autodiff.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope import _backend
from kerascope._backend.errors import StatefulModelError
from kerascope.core import targets as targets_lib
from kerascope.core.calls import SharedLayerError, chain_ranks, check_call_index, choose_call
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
from kerascope.core.inputs import Inputs, check_against_model, fit_structure, model_input_names
from kerascope.core.layers import find_layer, iter_layers, operation_paths, path_of
from kerascope.core.output_space import (
    OUTPUT_SPACES,
    SATURATED_HIGH,
    SATURATED_LOW,
    OutputSpace,
    bypass_error,
    bypass_is_local,
    is_probabilities,
    is_softmax_of,
    saturation_message,
    softmax_outputs,
)
from kerascope.core.positions import TargetError, check_no_positions
from kerascope.core.precision import (
    UNIT_ROUNDOFF,
    check_precision,
    model_reduced_dtype,
    reduced_precision,
    to_float32,
)
from kerascope.core.probe import (
    bypass_softmax,
    other_activations,
    override_relu_gradients,
    probe,
    relu_sites,
    softmax_candidates,
)
from kerascope.core.progress import Progress, progress_scope
from kerascope.core.rows import describe_rows
from kerascope.numeric.chunking import check_batch_size
from kerascope.propagation.bn_fold import FOLD_BACKENDS, FoldMismatch, fold_batchnorm, foldable_pairs
from kerascope.propagation.conv_backward import cheaper_backward, conv_ops
from kerascope.propagation.deeplift_rules import deeplift_rules

__all__ = [
    "OUTPUT_SPACES", "RULES", "SATURATED_HIGH", "SATURATED_LOW", "ChunkScorer", "Engine", "GradientResult",
    "NonFiniteError", "StatefulModelError", "StochasticModelError", "Transform", "check_finite", "engine_for",
]

RULES = (None, "guided", "deconvnet", "deeplift")

Transform = Callable[[Any, Any], Any]
"""``transform(layer_output, extra)``: what a layer's output becomes in :meth:`Engine.scorer`."""
ChunkScorer = Callable[..., tuple[np.ndarray, np.ndarray]]
"""``(arrays, indices, extra=None) -> (scores, resolved_targets)`` for one chunk (see :meth:`Engine.scorer`)."""


class NonFiniteError(ValueError):
    """The model's scores or the attributions hold NaN or infinite values (never returned silently).

    Example:
        >>> issubclass(NonFiniteError, ValueError)
        True
    """


class StochasticModelError(ValueError):
    """The model gives different outputs for the same input at inference (``training=False``).

    An explanation of one random draw of such a model (Dropout or noise called with
    ``training=True`` inside ``call``, a random op that ignores ``training``) is noise: every pass
    of a method sees another draw, so a perturbation's effect, a path integral or a gradient is
    mixed with the randomness. kerascope refuses instead of returning that map.

    Example:
        >>> issubclass(StochasticModelError, ValueError)
        True
    """


def check_stateless(model: keras.Layer) -> None:
    """Refuse a model with ``stateful=True`` layers: each call would read and advance their state.

    Its outputs depend on what was called before (not only on the inputs), every pass of a
    method would start from another state, and the explanation would advance the user's state.

    Example:
        >>> import keras
        >>> check_stateless(keras.Sequential([keras.Input((5, 2), batch_size=1), keras.layers.LSTM(3)]))
        >>> check_stateless(keras.Sequential([keras.Input((5, 2), batch_size=1),
        ...                                   keras.layers.LSTM(3, stateful=True, name="rnn")], name="m"))
        Traceback (most recent call last):
        ...
        kerascope._backend.errors.StatefulModelError: Model 'm' carries state between calls. Received: stateful=True layers ['rnn']. Its outputs depend on the calls before, every pass of a method would start from another state, and explaining would advance that state. Explain a copy built with stateful=False (same weights: `copy.set_weights(model.get_weights())`), which starts each sequence from zero state, or pass the state as an input.
    """
    stateful = [path for path, layer in iter_layers(model) if getattr(layer, "stateful", False) is True]
    if stateful:
        raise StatefulModelError(
            f"Model {model.name!r} carries state between calls. Received: stateful=True layers {stateful[:10]}"
            f"{' ...' if len(stateful) > 10 else ''}. Its outputs depend on the calls before, every pass of a "
            "method would start from another state, and explaining would advance that state. Explain a copy "
            "built with stateful=False (same weights: `copy.set_weights(model.get_weights())`), which starts "
            "each sequence from zero state, or pass the state as an input."
        )


def _inference_state(layers: Sequence[keras.Layer]) -> list[Any]:
    """The variables an inference call could assign: those the layers created non-trainable, their metrics' and seed states.

    Not ``model.non_trainable_variables``: a frozen layer (``trainable=False``) lists all its
    weights there, and copying a frozen backbone's (~100 MB for ResNet50) on every first call
    would cost more than the check (a layer without the private list: its own list, all of it).
    """
    seen: set[int] = set()
    found: list[Any] = []
    for layer in layers:
        own = getattr(layer, "_non_trainable_variables", None)
        if own is None:
            own = layer.non_trainable_variables
        metrics = [v for metric in getattr(layer, "_metrics", ()) for v in getattr(metric, "variables", ())]
        for variable in [*own, *metrics, *(g.state for g in getattr(layer, "_seed_generators", ()))]:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


@contextlib.contextmanager
def kept_variables(model: keras.Layer) -> Iterator[list[str]]:
    """Restore ``model``'s non-trainable variables on exit; yields the paths of those the block changed.

    Layers update non-trainable variables when called in training mode (BatchNormalization's
    moving statistics, a counter); an inference call must not, and kerascope never leaves the
    model changed. Only the variables layers create as non-trainable are kept (no inference call
    assigns a weight; a frozen layer's weights are not copied). A seed
    generator's state, which every random draw advances, is restored but not listed (randomness is
    :func:`check_deterministic`'s to report).

    Example:
        >>> import keras, numpy as np
        >>> bn = keras.layers.BatchNormalization()
        >>> m = keras.Sequential([keras.Input((2,)), bn])
        >>> with kept_variables(m) as changed:
        ...     _ = bn(np.ones((4, 2)), training=True)
        >>> [p.split("/")[-1] for p in changed], float(np.abs(keras.ops.convert_to_numpy(bn.moving_mean)).max())
        (['moving_mean', 'moving_variance'], 0.0)
    """
    layers = [model, *(layer for _, layer in iter_layers(model))]
    seeds = {id(g.state) for layer in layers for g in getattr(layer, "_seed_generators", ())}
    saved = [(v, np.array(keras.ops.convert_to_numpy(v))) for v in _inference_state(layers)]
    changed: list[str] = []
    try:
        yield changed
    finally:
        for variable, value in saved:
            now = np.asarray(keras.ops.convert_to_numpy(variable))
            if now.shape == value.shape and now.tobytes() == value.tobytes():  # bits: NaN == NaN, any dtype
                continue
            variable.assign(value)
            path = getattr(variable, "path", variable.name)
            if id(variable) not in seeds and not path.endswith("seed_generator_state"):
                changed.append(path)  # (a random draw advances a seed state: restored, and not a change of the model)


def check_deterministic(name: str, first: Any, second: Any, relative: float = 1e-4) -> None:
    """Raise :class:`StochasticModelError` when two inference calls on the same sample differ.

    By more than ``relative`` of the outputs' largest magnitude (plus 1e-6): a deterministic
    model's two calls agree to rounding (a GPU may pick another convolution algorithm for the
    second call), a random one differs by a large part of its output.

    Example:
        >>> import numpy as np
        >>> check_deterministic("m", [np.ones(3)], [np.ones(3)])
        >>> check_deterministic("m", [np.ones(3)], [np.array([1.0, 2.0, 1.0])])
        Traceback (most recent call last):
        ...
        kerascope.core.engine.StochasticModelError: Model 'm' is random at inference: two calls with training=False on the same sample differ (largest difference 1 of output values up to 2). Received: a model whose call() draws random numbers whatever `training` says (e.g. `Dropout(...)(x, training=True)` or noise written inside `call`), or that keeps state from one call to the next. Its explanations would be one random draw each, different on every call. Let the random layers follow `training` (`self.dropout(x, training=training)`) to explain the model as `predict()` uses it; to explain MC-dropout, make the randomness explicit and average the maps yourself over fixed seeds.
    """
    pairs = list(zip(keras.tree.flatten(first), keras.tree.flatten(second), strict=True))
    largest, scale = 0.0, 0.0
    for a, b in pairs:
        a = np.asarray(keras.ops.convert_to_numpy(a), np.float64)
        b = np.asarray(keras.ops.convert_to_numpy(b), np.float64)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            continue  # (NaN / inf: the finiteness checks say what is wrong)
        largest = max(largest, float(np.max(np.abs(a - b), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(a), initial=0.0)), float(np.max(np.abs(b), initial=0.0)))
    if largest > relative * scale + 1e-6:
        raise StochasticModelError(
            f"Model {name!r} is random at inference: two calls with training=False on the same sample differ "
            f"(largest difference {largest:.3g} of output values up to {scale:.3g}). Received: a model whose "
            "call() draws random numbers whatever `training` says (e.g. `Dropout(...)(x, training=True)` or "
            "noise written inside `call`), or that keeps state from one call to the next. Its explanations "
            "would be one random draw each, different on every call. Let the random layers follow `training` "
            "(`self.dropout(x, training=training)`) to explain the model as `predict()` uses it; to explain "
            "MC-dropout, make the randomness explicit and average the maps yourself over fixed seeds."
        )


def check_finite(values: Any, what: str, advice: str = "") -> None:
    """Raise :class:`NonFiniteError` naming ``what`` and the samples when ``values`` (batch first) is not finite.

    The samples are the user's (:func:`kerascope.core.rows.rows_of`: a noisy copy, a path point or
    a reference row of an inner pass is named by the sample it belongs to).

    Example:
        >>> import numpy as np
        >>> check_finite(np.array([1.0, np.inf]), "the model's scores")
        Traceback (most recent call last):
        ...
        kerascope.core.engine.NonFiniteError: NaN or infinite values in the model's scores: 1 value(s), samples [1]. Received: 0 NaN, 1 infinite.
    """
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating) or np.all(np.isfinite(array)):
        return
    bad = ~np.isfinite(array)
    rows = np.flatnonzero(bad.reshape(len(array), -1).any(axis=1)) if array.ndim else np.array([0])
    nans = int(np.isnan(array).sum())
    raise NonFiniteError(
        f"NaN or infinite values in {what}: {int(bad.sum())} value(s), "
        f"{describe_rows(rows, len(array) if array.ndim else 1)}. "
        f"Received: {nans} NaN, {int(bad.sum()) - nans} infinite." + (f" {advice}" if advice else "")
    )


@dataclass
class GradientResult:
    """What one engine call returns, as numpy, in the order it was asked for.

    ``input_grads`` has one array per differentiated input (every model input,
    or those listed in ``wrt_inputs``, in that order); ``activations`` and
    ``layer_grads`` one per requested layer; ``weight_grads`` one per
    requested variable (the gradient of the *sum* of the samples' scores).
    ``reduced`` holds what a ``reduce=`` function computed from the activations and
    layer gradients inside the compiled function (those two lists are then empty).

    Example:
        >>> import numpy as np
        >>> r = GradientResult(scores=np.zeros(2), targets=np.zeros(2, int))
        >>> r.input_grads
        []
    """

    scores: np.ndarray
    targets: np.ndarray
    input_grads: list[np.ndarray] = field(default_factory=list)
    activations: list[Any] = field(default_factory=list)
    layer_grads: list[np.ndarray] = field(default_factory=list)
    weight_grads: list[np.ndarray] = field(default_factory=list)
    reduced: Any = None



def check_single_tensor(value: Any, path: str) -> None:
    """Refuse a layer output made of several tensors (an ``LSTM(return_state=True)``, a layer returning a dict).

    Example:
        >>> import numpy as np
        >>> check_single_tensor((np.zeros(2), np.zeros(2)), "lstm")
        Traceback (most recent call last):
        ...
        ValueError: Layer 'lstm' returns several tensors (a tuple of 2); gradients and maps are taken at a layer with one output tensor. Received: layer='lstm'. Pick the layer that produces the tensor you mean (e.g. the layer after it, or one with return_state=False).
    """
    if isinstance(value, (list, tuple, dict)):
        raise ValueError(
            f"Layer {path!r} returns several tensors (a {type(value).__name__} of {len(value)}); gradients and "
            f"maps are taken at a layer with one output tensor. Received: layer={path!r}. Pick the layer that "
            "produces the tensor you mean (e.g. the layer after it, or one with return_state=False)."
        )

class Engine:
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
    def forward_gives_probabilities(self) -> bool:
        """True when :meth:`forward` returns probabilities (no softmax bypassed, outputs sum to 1).

        Known after the first call (for a model read from its graph, the first values settle it).

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
            >>> e = Engine(m); _ = e.forward(np.ones((1, 3)))
            >>> e.forward_gives_probabilities
            False
        """
        if self.space.probabilities_pending:
            self._settle_probabilities()
        return self.space.gives_probabilities

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

    # ----------------------------------------------------------------- helpers
    def resolve_layers(self, layers: Sequence[str | keras.Layer]) -> list[keras.Layer]:
        """Resolve layer paths / objects to layer objects of this model.

        Example:
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

    def prepare(self, inputs: Any, targets: Any = None) -> tuple[Inputs, np.ndarray, Callable | None]:
        """Validate ``inputs`` against the model and encode ``targets``: ``(inputs, indices, target_fn)``.

        ``indices`` holds one class index per sample (``-1``: the predicted class)
        and ``target_fn`` is the callable target (else ``None``). Class indices are
        checked against the explained output's size, and the output space's softmax
        detection runs once (one forward pass on one sample).

        Example:
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

    def explained_layer(self) -> keras.Layer | None:
        """The layer whose output is explained instead of the model's (``output_layer=``), or None.

        Example:
            >>> import keras
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
            >>> Engine(m, output_layer="d").explained_layer().name
            'd'
        """
        if self.output_layer is None:
            return None
        return self.resolve_layers([self.output_layer])[0]

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

    def _choose(self, layer: keras.Layer, calls: int) -> int | None:
        """Forward-order position of the ``call_index`` call of ``layer`` seen ``calls`` times (see ``core.calls``)."""
        path = self.path_of(layer)
        ranks = self.memo(("build_ranks", id(layer)), lambda: chain_ranks(self._chain(path))) if calls > 1 else None
        return choose_call(path, calls, self.call_index, ranks, f"model {self.model.name!r}")

    def _chain(self, path: str) -> list[keras.Layer]:
        """The model, the nested models on ``path`` and the layer (outermost first)."""
        by_path = self._layer_index()[0]
        parts = path.split("/")
        found = [by_path.get("/".join(parts[:i])) for i in range(1, len(parts) + 1)]
        return [self.model, *found] if all(layer is not None for layer in found) else []

    def call_positions(self, inputs: Inputs, layers: Sequence[keras.Layer]) -> tuple[int | None, ...]:
        """Which call of each layer is read (forward order), from one eager probed pass on one sample.

        A layer called once gives 0; a shared layer the call chosen by ``call_index``
        (:class:`~kerascope.core.calls.SharedLayerError` without one). Memoised per layers
        and input signature.

        Example:
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

    @contextlib.contextmanager
    def check_on_error(self, inputs: Inputs) -> Iterator[None]:
        """Inside: an error, when these inputs were checked from the model's graph only, is first checked eagerly.

        The eager call on one sample then raises kerascope's message if the model cannot take
        the inputs (as :meth:`check_inputs` does for a model without a readable graph);
        otherwise the error is raised as it was.

        Example:
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

    def _check_relus(self, rule: str) -> None:
        """Warn when a ReLU backward rule would silently give the plain gradient (no ReLU reached)."""
        relus, others = self.memo("activations", lambda: (len(relu_sites(self.model)), other_activations(self.model)))
        listed = ", ".join(f"{name} ({count} layer{'s' if count > 1 else ''})" for name, count in others.items())
        if relus == 0:
            warnings.warn(
                f"Model {self.model.name!r} has no ReLU that the {rule!r} backward rule can reach"
                + (f" (its activations: {listed})" if listed else "")
                + f". The {rule!r} rule changes only ReLU backward passes, so this result EQUALS the plain "
                "gradient (Saliency, or Grad-CAM x gradient for GuidedGradCAM). Use Saliency, "
                "IntegratedGradients or SmoothGrad for models with GELU / swish activations.",
                UserWarning,
                stacklevel=4,
            )
        elif others:
            warnings.warn(
                f"The {rule!r} backward rule applies to the {relus} ReLU(s) of model {self.model.name!r}; "
                f"its other activations keep their plain gradient: {listed}.",
                UserWarning,
                stacklevel=4,
            )

    @property
    def bypassed_layers(self) -> list[str]:
        """Paths of the softmax layers bypassed in ``"logits"`` mode (after the first call).

        Example:
            >>> import keras
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> Engine(m).bypassed_layers
            []
        """
        return [self.path_of(layer) for layer in self.space.softmax_layers or []]

    def feeds_explained(self) -> Callable[[str], bool]:
        """``feeds(path)``: whether the layer / op at ``path`` can reach the explained output (``True`` if unknown).

        Read from a functional model's graph: another output's head (a softmax on the policy
        head while ``output_index="value"``) does not matter to the explanation.

        Example:
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

    # ------------------------------------------------------------------- core
    def _call_model(
        self,
        model_arg: Callable[[list[Any]], Any],
        arrays: list[Any],
        bypass: Sequence[keras.Layer],
        layers: Sequence[keras.Layer] = (),
        transform: Callable[[int, keras.Layer, Any], Any] | None = None,
        rule: str | None = None,
        positions: Sequence[int | None] | None = None,
        fold: bool = True,
        input_gradients: bool = False,
    ) -> tuple[Any, Any]:
        """What every compiled function (gradients, forward, scorer) traces: ``(explained, recorder)``.

        ``layers`` are probed (outputs recorded, replaced by ``transform(i, layer, output)``
        when given, at the call ``positions`` chooses) and ReLU gradients overridden by ``rule``,
        then :meth:`call_model` (the
        softmax layers in ``bypass`` made linear, ``output_layer`` read); all undone on return.
        With ``fold`` (and the engine's ``fold_batchnorm``, no ``rule`` or one whose ``folds_batchnorm``
        is true, float32) every Conv / Dense +
        BatchNormalization pair that neither is probed nor is ``output_layer`` runs as one layer
        (``propagation/bn_fold.py``: exact up to float32 rounding). A folded layer called apart from its
        BatchNormalization (code outside the graph, e.g. a ``Lambda`` closure) makes the pass rerun
        unfolded, and this engine folds no more. With ``input_gradients`` (the pass differentiates w.r.t.
        the model's inputs; float32, not for weight gradients) the convolutions of :meth:`conv_ops` run
        with their cheaper exact input gradient (``propagation/conv_backward.py``); passes without an input
        gradient would only pay for tracing it.
        """
        try:
            return self._call_model_once(model_arg, arrays, bypass, layers, transform, rule, positions, fold,
                                         input_gradients)
        except FoldMismatch:
            self._fold_refused = True
            return self._call_model_once(model_arg, arrays, bypass, layers, transform, rule, positions, False,
                                         input_gradients)

    def _call_model_once(
        self,
        model_arg: Callable[[list[Any]], Any],
        arrays: list[Any],
        bypass: Sequence[keras.Layer],
        layers: Sequence[keras.Layer],
        transform: Callable[[int, keras.Layer, Any], Any] | None,
        rule: str | None,
        positions: Sequence[int | None] | None,
        fold: bool,
        input_gradients: bool = False,
    ) -> tuple[Any, Any]:
        """One pass of :meth:`_call_model` (folding as ``fold`` says)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(reduced_precision(self.model, self.precision))  # restored on exit
            if rule == "deeplift":
                stack.enter_context(deeplift_rules(self.model, _backend.get()))
            elif rule is not None and not isinstance(rule, str):  # a rules object (e.g. LRP)
                stack.enter_context(rule.install(self.model, _backend.get()))
            elif rule is not None:
                backend = _backend.get()
                stack.enter_context(override_relu_gradients(self.model, lambda f: backend.modified_relu(f, rule)))
            folds = rule is None or getattr(rule, "folds_batchnorm", False)  # a rule on non-linearities only
            if fold and folds and self.precision is None:  # (folded_pairs: none with fold_batchnorm=False)
                stack.enter_context(fold_batchnorm(self.folded_pairs(layers)))  # restored on exit
            if input_gradients and self.precision is None:  # every rule differentiates convolutions as they are
                stack.enter_context(cheaper_backward(self.conv_ops(layers)))  # restored on exit
            recorder = stack.enter_context(probe(layers, transform, positions))
            outputs = self.call_model(model_arg(arrays), stack, bypass)
        return outputs, recorder

    def folded_pairs(self, probed: Sequence[keras.Layer] = ()) -> list[tuple[keras.Layer, keras.Layer]]:
        """The ``(Conv / Dense, BatchNormalization)`` pairs run as one layer in a float32 pass that probes ``probed``.

        Empty with ``fold_batchnorm=False`` and on JAX (``propagation.bn_fold.FOLD_BACKENDS``: XLA fuses the
        normalisation already). A pair with a probed layer (or ``output_layer``) is not
        folded, so what the method reads there is the layer's own output (see ``propagation/bn_fold.py``).

        Example:
            >>> import keras
            >>> x = keras.Input((4,))
            >>> bn = keras.layers.BatchNormalization(name="bn")
            >>> m = keras.Model(x, bn(keras.layers.Dense(2, name="d")(x)))
            >>> [(a.name, b.name) for a, b in Engine(m).folded_pairs()], Engine(m).folded_pairs([bn])
            ([('d', 'bn')], [])
        """
        if not self.fold_batchnorm or self._fold_refused or keras.backend.backend() not in FOLD_BACKENDS:
            return []
        skip = self._kept_as_they_are(probed)
        model = self.model
        pairs = self.memo(("batchnorm_pairs", self._structure()), lambda: foldable_pairs(model))
        return [pair for pair in pairs if id(pair[0]) not in skip and id(pair[1]) not in skip]

    def _kept_as_they_are(self, probed: Sequence[keras.Layer]) -> set[int]:
        """Ids of the layers a pass must run as the model does: the probed ones and ``output_layer``."""
        explained = self.explained_layer()
        return {id(layer) for layer in probed} | ({id(explained)} if explained is not None else set())

    def _structure(self) -> int:
        """The model's layer count: a memo key that changes when layers are added (as ``_layer_index``)."""
        model = self.model
        return len(getattr(model, "_layers", None) or getattr(model, "layers", None) or [])

    def conv_ops(self, probed: Sequence[keras.Layer] = ()) -> list[tuple[keras.Layer, Callable[[Any, Any], Any]]]:
        """The convolutions run with a cheaper exact backward in a float32 pass that probes ``probed``.

        ``propagation/conv_backward.py``: on TensorFlow without a GPU, stem and 1x1 ``Conv2D`` layers
        (``_backend/tf_conv.py``); none elsewhere. A probed layer (or ``output_layer``) keeps its own op.

        Example:
            >>> import keras
            >>> m = keras.Sequential([keras.Input((9, 9, 3)), keras.layers.Conv2D(2, 3, strides=2, name="stem")])
            >>> [layer.name for layer, _ in Engine(m).conv_ops()] in ([], ["stem"])
            True
        """
        skip = self._kept_as_they_are(probed)
        model = self.model
        ops = self.memo(("conv_ops", self._structure()), lambda: conv_ops(model, _backend.get()))
        return [(layer, op) for layer, op in ops if id(layer) not in skip]

    def _target_scores(self, outputs: Any, indices: Any, target_fn: Callable | None) -> tuple[Any, Any]:
        """``(scores, resolved targets)`` of the model outputs (inside a compiled function)."""
        if target_fn is not None:
            return targets_lib.callable_scores(target_fn, outputs), indices
        return targets_lib.class_scores(self.select(outputs), indices)

    def _build(
        self,
        inputs: Inputs,
        layers: tuple[keras.Layer, ...],
        wrt_inputs: tuple[int, ...],
        weights: tuple[Any, ...],
        rule: str | None,
        target_fn: Callable | None,
        replace_specs: Sequence[tuple[tuple[int, ...], str]] = (),
        positions: Sequence[int | None] = (),
        counts: Sequence[int] = (),
        reduce_slot: _ThreadSlot | None = None,
    ) -> Callable:
        replace = len(replace_specs)
        bypass = self.space.bypass()
        owner = weakref.ref(self)
        layer_names = [self.path_of(layer) for layer in layers]
        model_arg = inputs.structurer()

        def forward(arrays: list[Any], indices: Any, transform: Callable) -> tuple[Any, Any, list[Any]]:
            engine = owner()
            if replace:  # the last `replace` arrays replace the outputs of the first probed layers
                arrays, values = arrays[: len(arrays) - replace], arrays[len(arrays) - replace:]

                def replaced(i: int, layer: keras.Layer, output: Any) -> Any:
                    if i < replace:
                        output = keras.ops.cast(values[i], keras.backend.standardize_dtype(output.dtype))
                    return transform(i, layer, output)
            else:
                replaced = transform
            outputs, recorder = engine._call_model(model_arg, arrays, bypass, layers, replaced, rule, positions,
                                                   fold=not weights, input_gradients=bool(wrt_inputs) and not weights)
            engine._check_traced_calls(recorder, layers, counts)
            scores, resolved = engine._target_scores(outputs, indices, target_fn)
            acts = [recorder.call(layer, at) for layer, at in zip(layers, positions, strict=True)]
            for name, act in zip(layer_names, acts, strict=True):
                check_single_tensor(act, name)
            return scores, resolved, acts

        def on_trace() -> None:
            engine = owner()
            if engine is not None:
                engine.trace_count += 1

        def post(out: dict[str, Any]) -> dict[str, Any]:
            # the reduce function of the current call (the slot is set for the call only: the compiled
            # function, cached and shared by equal keys, holds no method instance)
            reduced = reduce_slot[0](out["acts"], out["layer_grads"])
            return {**out, "acts": [], "layer_grads": [], "reduced": reduced}

        return _backend.get().compile_gradients(
            forward,
            input_specs=inputs.specs + list(replace_specs),
            wrt_inputs=wrt_inputs,
            layer_names=layer_names,
            weights=[getattr(w, "value", w) for w in weights],
            jit_compile=self.jit_compile,
            on_trace=on_trace,
            post=None if reduce_slot is None else post,
        )

    def gradients(
        self,
        inputs: Any,
        targets: Any = None,
        *,
        layers: Sequence[str | keras.Layer] = (),
        wrt_inputs: bool | Sequence[int] = True,
        weights: Sequence[Any] = (),
        rule: str | None = None,
        replace: Sequence[np.ndarray] = (),
        batch_size: int = 32,
        progress: Progress = False,
        reduce: Callable[[list[Any], list[Any]], Any] | None = None,
        reduce_key: Any = None,
    ) -> GradientResult:
        """Differentiate: scores, input gradients, layer activations/gradients and weight gradients.

        Args:
            inputs: array, list or dict of arrays with a leading batch axis.
            targets: int, list of ints, None (predicted class) or callable.
            layers: layers (paths or objects) to record activations and gradients at.
            wrt_inputs: also return gradients w.r.t. the inputs: ``True`` every model input,
                ``False`` none, or a sequence of input positions (e.g. ``[1]``: only the second
                input; the others, token ids for instance, are held fixed and need no gradient).
            weights: variables to differentiate w.r.t. (gradient of the summed score).
            rule: ``None``, ``"guided"``, ``"deconvnet"`` or ``"deeplift"`` backward rule for
                ReLUs (``"deeplift"``: rescale rule; the batch is inputs then their references), or
                an object whose ``install(model, backend)`` context manager patches the model for
                the trace (``propagation.lrp_walk.LRPBackward``; one compiled function per equal object).
            replace: arrays (batch first) that REPLACE the outputs of the first ``len(replace)``
                ``layers`` during the forward pass (the chosen call of a shared layer); activations and
                gradients are then those at the given values (layer attribution: IG or SmoothGrad
                at a layer interpolate or noise the layer's activation).
            batch_size: samples per compiled call; bounds memory.
            progress: a progress bar (``True``) or callback over the chunks (see
                :func:`~kerascope.core.progress.progress_scope`); inside a method's own scope it adds nothing.
            reduce: ``reduce(activations, layer_grads) -> tensor(s)`` (batch first), written with
                ``keras.ops`` and run inside the compiled function on the probed layers' float32
                activations and gradients; the result's ``reduced`` holds its output and
                ``activations`` / ``layer_grads`` stay empty (e.g. a CAM's map, so that the
                ``(N, h, w, C)`` arrays never leave the device).
            reduce_key: hashable identity of ``reduce`` for the cache of compiled functions
                (functions with equal keys must compute the same thing); default: ``reduce`` itself.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, name="d")])
            >>> m.get_layer("d").set_weights([np.array([[2.0], [3.0]])])
            >>> Engine(m).gradients(np.ones((1, 2)), targets=0).input_grads[0].tolist()
            [[2.0, 3.0]]
            >>> r = Engine(m).gradients(np.ones((1, 2)), 0, layers=["d"], wrt_inputs=False,
            ...                         reduce=lambda acts, grads: acts[0] * grads[0])
            >>> r.reduced.tolist(), r.activations
            ([[5.0]], [])
        """
        if rule not in RULES and not callable(getattr(rule, "install", None)):
            raise ValueError(
                f"Unknown backward rule. Received: rule={rule!r}. Expected one of {RULES} or an object with "
                "an `install(model, backend)` context manager (e.g. `propagation.lrp_walk.LRPBackward`)."
            )
        if rule in ("guided", "deconvnet"):
            self._check_relus(rule)
        check_batch_size(batch_size)
        prepared = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
        check_against_model(self.model, prepared)
        resolved_layers = tuple(self.resolve_layers(layers))
        replace = [np.asarray(r) for r in replace]
        if len(replace) > len(resolved_layers) or any(len(r) != prepared.num_samples for r in replace):
            raise ValueError(
                "`replace` needs one array per probed layer (at most), with the inputs' batch size. "
                f"Received: {[r.shape for r in replace]} for {len(resolved_layers)} layer(s) and "
                f"{prepared.num_samples} samples."
            )
        replace_specs = tuple((r.shape, r.dtype.name) for r in replace)
        count = len(prepared.arrays)
        wrt = tuple(range(count) if wrt_inputs is True else () if wrt_inputs is False else wrt_inputs)
        if any(not isinstance(i, (int, np.integer)) or not 0 <= i < count for i in wrt) or len(set(wrt)) < len(wrt):
            raise ValueError(
                f"`wrt_inputs` must be True, False or distinct input positions in [0, {count}). "
                f"Received: wrt_inputs={wrt_inputs!r}."
            )
        wrt = tuple(int(i) for i in wrt)
        self._check_call(prepared, resolved_layers)  # the input check also counts the probed layers' calls
        prepared, indices, target_fn = self.prepare(prepared, targets)
        _check_differentiable(prepared, wrt)
        positions, counts = self._calls(prepared, resolved_layers)
        key = (
            resolved_layers, wrt, tuple(id(w) for w in weights), rule, _target_key(target_fn),
            prepared.signature, tuple((s[1:], d) for s, d in replace_specs), positions, self.call_index,
            None if reduce is None else ("reduce", reduce if reduce_key is None else reduce_key),
        )
        entry = self._compiled.get(key)
        if entry is None:
            slot: _ThreadSlot | None = None if reduce is None else _ThreadSlot()
            with self.check_on_error(prepared):  # (JAX traces when compiling, TensorFlow on the first call)
                fn = self._build(prepared, resolved_layers, wrt, tuple(weights), rule, target_fn, replace_specs,
                                 positions, counts, slot)
            entry = self._compiled[key] = (fn, slot)
        fn, slot = entry
        parts: list[dict[str, Any]] = []
        try:
            if slot is not None:
                slot[0] = reduce
            with self.check_on_error(prepared), progress_scope(prepared.num_samples, "explaining", progress):
                for part, arrays in prepared.chunks(batch_size):  # (the progress scope: a no-op inside a method's)
                    parts.append(fn(arrays + [r[part] for r in replace], indices[part]))
        finally:
            if slot is not None:
                slot[0] = None
        result = _merge(parts, bool(wrt))
        self._check_saturation(result.scores, prepared, result.input_grads, raw=target_fn is None)
        _check_finite(result)
        return result

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

    def forward(self, inputs: Any, batch_size: int = 32) -> Any:
        """Model outputs in this engine's output space (logits unless told otherwise).

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
            >>> e = Engine(m)
            >>> out = e.forward(np.ones((1, 3)))
            >>> bool(np.isclose(out.sum(), 1.0))
            False
        """
        prepared = self.check_inputs(inputs)
        self._detect_softmax(prepared)
        key = ("forward", prepared.signature)
        fn = self._compiled.get(key)
        with self.check_on_error(prepared):  # (JAX traces when compiling, TensorFlow on the first call)
            if fn is None:
                bypass = self.space.bypass()
                owner = weakref.ref(self)
                model_arg = prepared.structurer()

                def run(arrays: list[Any]) -> Any:
                    return to_float32(owner()._call_model(model_arg, arrays, bypass)[0])

                fn = _backend.get().compile_forward(run, input_specs=prepared.specs, jit_compile=self.jit_compile)
                self._compiled[key] = fn
            outs = [fn(arrays) for _, arrays in prepared.chunks(batch_size)]
        merged = keras.tree.map_structure(lambda *xs: np.concatenate(xs, axis=0), *outs)
        if self.space.probabilities_pending:  # nothing bypassed: these are the explained output's values
            self._settle_probabilities(keras.tree.map_structure(lambda a: a[:1], merged))  # one sample, as eagerly
        return merged

    def scorer(
        self,
        inputs: Inputs,
        *,
        target_fn: Callable[[Any], Any] | None = None,
        layer: keras.Layer | None = None,
        transform: Transform | None = None,
        extra_spec: tuple[tuple[int | None, ...], str] | None = None,
    ) -> ChunkScorer:
        """Compiled ``(arrays, indices, extra) -> (scores, resolved_targets)``: target scores, forward only.

        ``arrays`` are the model inputs of one chunk (rows = variants), ``indices``
        the class index per row (``-1``: predicted class) and ``extra`` the rows of
        the extra input described by ``extra_spec`` (``(shape, dtype)``, batch axis
        first) that ``transform(layer_output, extra)`` reads: ``layer``'s output is
        replaced for the call (e.g. one channel zeroed per row; of a shared layer, only the call
        chosen by ``call_index``), the model is never
        modified. With ``target_fn`` (a callable target ``outputs -> (batch,)``)
        ``indices`` are passed through. One compiled function per (layer, transform,
        target, shapes) is cached, with a ``None`` batch dimension (no retracing per
        chunk size); ``transform`` should be a module-level function so the cache can
        reuse it.

        Example:
            >>> import keras, numpy as np
            >>> d = keras.layers.Dense(2, use_bias=False, kernel_initializer="ones", name="d")
            >>> m = keras.Sequential([keras.Input((2,)), d, keras.layers.Dense(1, kernel_initializer="ones")])
            >>> def scale(output, factor):
            ...     return output * keras.ops.expand_dims(factor, -1)
            >>> x = Inputs(np.ones((2, 2)))
            >>> fn = Engine(m).scorer(x, layer=d, transform=scale, extra_spec=((None,), "float32"))
            >>> fn(x.arrays, np.zeros(2, "int32"), np.array([1.0, 0.0], "float32"))[0].tolist()
            [4.0, 0.0]
        """
        if (layer is None) != (transform is None):
            raise ValueError(
                "`layer` and `transform` go together. Received: "
                f"layer={getattr(layer, 'name', layer)!r}, transform={transform!r}."
            )
        self._detect_softmax(inputs)
        extra_key = None if extra_spec is None else (tuple(extra_spec[0][1:]), extra_spec[1])
        probed = [layer] if layer is not None else []
        positions, counts = self._calls(inputs, probed)
        key = ("intervene", layer, transform, _target_key(target_fn), inputs.signature, extra_key, positions,
               self.call_index)
        cached = self._compiled.get(key)
        if cached is not None:
            return cached

        bypass = self.space.bypass()
        owner = weakref.ref(self)
        model_arg = inputs.structurer()
        count = len(inputs.arrays)

        def run(flat: list[Any]) -> dict[str, Any]:
            engine = owner()
            arrays, indices = flat[:count], flat[count]
            extra = flat[count + 1] if extra_spec is not None else None
            replace = None if transform is None else (lambda _i, _l, out: transform(out, extra))
            outputs, recorder = engine._call_model(model_arg, arrays, bypass, probed, replace, None, positions)
            engine._check_traced_calls(recorder, probed, counts)
            scores, resolved = engine._target_scores(outputs, indices, target_fn)
            return {"scores": keras.ops.cast(scores, "float32"), "targets": resolved}

        all_specs = list(inputs.specs) + [((None,), "int32")] + ([extra_spec] if extra_spec is not None else [])
        compiled = _backend.get().compile_forward(run, input_specs=all_specs, jit_compile=self.jit_compile)

        def scorer(arrays: list[np.ndarray], indices: np.ndarray, extra: np.ndarray | None = None) -> tuple[
            np.ndarray, np.ndarray
        ]:
            flat = list(arrays) + [np.asarray(indices, np.int32)]
            if extra_spec is not None:
                if extra is None:
                    raise ValueError(
                        "This scorer was compiled with `extra_spec`; pass `extra` rows. Received: extra=None."
                    )
                flat.append(np.asarray(extra, dtype=extra_spec[1]))
            out = compiled(flat)
            return np.asarray(out["scores"], np.float32), np.asarray(out["targets"]).astype(np.int64)

        scorer.engine = self  # type: ignore[attr-defined]  # keeps its engine alive (a collectable cycle)
        self._compiled[key] = scorer
        return scorer

    def scores(self, inputs: Any, targets: Any = None, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
        """Score: the targets' scores and the resolved targets, from forward passes only (no gradients).

        ``targets`` as everywhere (int, list, None = predicted class, callable).
        Returns ``(scores (N,), targets (N,))``; scores are picked inside the
        compiled forward pass, so only ``(rows,)`` values come back per chunk.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, use_bias=False)])
            >>> m.layers[0].set_weights([np.array([[1.0, 0.0], [0.0, 2.0]])])
            >>> s, t = Engine(m).scores(np.ones((1, 2)))
            >>> s.tolist(), t.tolist()
            ([2.0], [1])
        """
        check_batch_size(batch_size)
        prepared, indices, target_fn = self.prepare(inputs, targets)
        scores, resolved = [], []
        with self.check_on_error(prepared):  # (JAX traces when compiling, TensorFlow on the first call)
            scorer = self.scorer(prepared, target_fn=target_fn)
            for part, arrays in prepared.chunks(batch_size):
                s, t = scorer(arrays, indices[part])
                scores.append(s)
                resolved.append(indices[part] if target_fn is not None else t)
        return np.concatenate(scores), np.concatenate(resolved).astype(np.int64)


def _check_differentiable(inputs: Inputs, wrt: Sequence[int]) -> None:
    """Gradients w.r.t. inputs need floating-point inputs: refuse others eagerly, before tracing."""
    for i in wrt:
        array = inputs.arrays[i]
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(
                "Gradients w.r.t. the inputs need floating-point inputs. Received: input "
                f"{inputs.keys[i] if inputs.keys else i!r} of dtype {array.dtype.name}. Cast images to "
                "float (`x.astype('float32')`); for token ids, attribute at the embedding layer with `layer=`."
            )


def _target_key(target_fn: Callable | None) -> Any:
    """Cache-key part of a target: equivalent callables (a new lambda per call) share one compiled function."""
    return None if target_fn is None else targets_lib.callable_key(target_fn)


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


class _ThreadSlot(threading.local):
    """``slot[0]``: a value set for one call of a shared compiled function, seen by the calling thread only."""

    value: Any = None

    def __getitem__(self, index: int) -> Any:
        return self.value

    def __setitem__(self, index: int, value: Any) -> None:
        self.value = value


def _merge(parts: list[dict[str, Any]], wrt_inputs: bool) -> GradientResult:
    def cat(values: list[Any]) -> Any:
        if len(values) == 1:  # one chunk: nothing to join; copy only read-only arrays (JAX's)
            return keras.tree.map_structure(lambda x: x if x.flags.writeable else np.array(x), values[0])
        return keras.tree.map_structure(lambda *xs: np.concatenate(xs, axis=0), *values)

    first = parts[0]
    return GradientResult(
        scores=np.concatenate([p["scores"] for p in parts]),
        targets=np.concatenate([p["targets"] for p in parts]).astype(np.int64),
        input_grads=[cat([p["input_grads"][i] for p in parts]) for i in range(len(first["input_grads"]))]
        if wrt_inputs
        else [],
        activations=[cat([p["acts"][i] for p in parts]) for i in range(len(first["acts"]))],
        layer_grads=[cat([p["layer_grads"][i] for p in parts]) for i in range(len(first["layer_grads"]))],
        weight_grads=[sum(p["weight_grads"][i] for p in parts) for i in range(len(first["weight_grads"]))],
        reduced=cat([p["reduced"] for p in parts]) if "reduced" in first else None,
    )


_SCORE_ADVICE = "Check the inputs' preprocessing, the model's weights and the target (a callable's arithmetic)."


def _check_finite(result: GradientResult) -> None:
    check_finite(result.scores, "the model's scores", _SCORE_ADVICE)
    for i, grads in enumerate(result.input_grads):
        check_finite(grads, f"the gradients w.r.t. input {i}", "The model's gradient overflows for these inputs.")
    for i, grads in enumerate(result.layer_grads):
        check_finite(grads, f"the gradients at probed layer {i}", "The model's gradient overflows for these inputs.")
    for i, values in enumerate(keras.tree.flatten(result.reduced)):
        check_finite(values, f"the values reduced from the probed layers ({i})",
                     "The model's gradient overflows for these inputs, or the reduce function divides by zero.")


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
