"""The gradient engine: one compiled forward+backward per request, reused.

Everything kerascope computes with gradients goes through
:meth:`Engine.gradients`: scores of the targets, gradients w.r.t. the inputs,
activations and gradients at any probed layers, and gradients w.r.t. weights.
The forward function is written once here in Keras terms; the backend module
compiles it with its own autodiff.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope import _backend
from kerascope.core import targets as targets_lib
from kerascope.core.inputs import Inputs, check_against_model
from kerascope.core.layers import find_layer, iter_layers, path_of
from kerascope.core.probe import bypass_softmax, override_relu_gradients, probe, softmax_candidates
from kerascope.core.progress import progress_bar

OUTPUT_SPACES = ("logits", "probabilities")
RULES = (None, "guided", "deconvnet", "deeplift")


@dataclass
class GradientResult:
    """What one engine call returns, as numpy, in the order it was asked for.

    ``input_grads`` has one array per model input; ``activations`` and
    ``layer_grads`` one per requested layer; ``weight_grads`` one per
    requested variable (the gradient of the *sum* of the samples' scores).

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


class Engine:
    """Compiles and runs gradient computations for one model.

    ``output="logits"`` (default) differentiates the pre-softmax logits: a
    final softmax (fused ``Dense(activation="softmax")``, ``Activation`` or
    ``Softmax`` layer) is bypassed for the duration of each call, never by
    changing the model. ``output="probabilities"`` keeps the softmax.

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
    ) -> None:
        if not isinstance(model, keras.Layer):
            raise TypeError(
                "`model` must be a Keras 3 model or layer. Received: "
                f"model of type {type(model).__module__}.{type(model).__name__}. "
                "Load files with `kerascope.load_model(path)`."
            )
        if output not in OUTPUT_SPACES:
            raise ValueError(f"Unknown output space. Received: output={output!r}. Expected one of {OUTPUT_SPACES}.")
        self._model_ref = weakref.ref(model)
        self.output = output
        self.output_index = output_index
        self.jit_compile = jit_compile
        self.trace_count = 0
        self._compiled: dict[Any, Callable] = {}
        self._bypassed: list[keras.Layer] | None = None
        self._probabilities_out = False

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

        Only known after the first call.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
            >>> e = Engine(m); _ = e.forward(np.ones((1, 3)))
            >>> e.forward_gives_probabilities
            False
        """
        return self._probabilities_out and not (self.output == "logits" and self._bypassed)

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

    def _select(self, outputs: Any) -> Any:
        if isinstance(outputs, dict):
            keys = list(outputs)
            key = self.output_index
            if key is None:
                if len(keys) > 1:
                    raise ValueError(
                        f"The model has several outputs {keys}; choose one with `output_index=` "
                        "or pass a callable target. Received: output_index=None."
                    )
                key = keys[0]
            if isinstance(key, int):
                key = keys[key]
            if key not in outputs:
                raise ValueError(f"Unknown output. Received: output_index={key!r}. Available outputs: {keys}.")
            return outputs[key]
        if isinstance(outputs, (list, tuple)):
            index = self.output_index
            if isinstance(index, str):
                names = list(getattr(self.model, "output_names", []) or [])
                if index not in names:
                    raise ValueError(
                        f"Unknown output. Received: output_index={index!r}. Available outputs: {names}."
                    )
                index = names.index(index)
            if index is None:
                if len(outputs) > 1:
                    raise ValueError(
                        f"The model has {len(outputs)} outputs; choose one with `output_index=` "
                        "or pass a callable target. Received: output_index=None."
                    )
                index = 0
            return outputs[index]
        return outputs

    def _detect_softmax(self, inputs: Inputs) -> None:
        """Find the softmax layers whose output *is* a model output (one eager pass on 1 sample)."""
        if self._bypassed is not None:
            return
        candidates = softmax_candidates(self.model)
        first = [a[:1] for a in inputs.arrays]
        with probe(candidates) as rec:
            outputs = self.model(inputs.model_arg(first), training=False)
        flat_outputs = [keras.ops.convert_to_numpy(o) for o in keras.tree.flatten(outputs)]
        bypassed = []
        for layer in candidates:
            for seen in rec.outputs.get(id(layer), []):
                value = keras.ops.convert_to_numpy(seen)
                if any(o.shape == value.shape and np.allclose(o, value) for o in flat_outputs):
                    bypassed.append(layer)
                    break
        self._bypassed = bypassed
        chosen = keras.ops.convert_to_numpy(self._select(outputs)) if not callable(self.output_index) else flat_outputs[0]
        self._probabilities_out = bool(
            chosen.ndim >= 2
            and chosen.shape[-1] > 1
            and np.all(chosen >= 0)
            and np.allclose(chosen.sum(axis=-1), 1.0, atol=1e-3)
        )

    def _check_saturation(self, scores: np.ndarray) -> None:
        if self.output != "logits" or self._bypassed or not self._probabilities_out:
            return
        if np.any(scores >= 1.0 - 1e-6) or np.any(scores <= 1e-30):
            warnings.warn(
                f"Model {self.model.name!r} outputs saturated probabilities (scores like "
                f"{float(np.max(scores)):.7g}) and kerascope found no softmax layer or activation to "
                "bypass (e.g. `tf.nn.softmax` inside a subclassed `call`). Gradients of saturated "
                "probabilities vanish in float32. Remove the softmax from `call` and apply it "
                "outside, or pass a callable target that computes the logits.",
                RuntimeWarning,
                stacklevel=3,
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
        return [self.path_of(layer) for layer in self._bypassed or []]

    # ------------------------------------------------------------------- core
    def _build(
        self,
        inputs: Inputs,
        layers: tuple[keras.Layer, ...],
        wrt_inputs: bool,
        weights: tuple[Any, ...],
        rule: str | None,
        target_fn: Callable | None,
    ) -> Callable:
        backend = _backend.get()
        bypass = list(self._bypassed or []) if self.output == "logits" else []
        owner = weakref.ref(self)
        layer_names = [self.path_of(layer) for layer in layers]
        model_arg = inputs.structurer()

        def forward(arrays: list[Any], indices: Any, transform: Callable) -> tuple[Any, Any, list[Any]]:
            model = owner().model
            with contextlib.ExitStack() as stack:
                if rule is not None:
                    stack.enter_context(
                        override_relu_gradients(model, lambda f: backend.modified_relu(f, rule))
                    )
                stack.enter_context(bypass_softmax(bypass))
                recorder = stack.enter_context(probe(layers, transform))
                outputs = model(model_arg(arrays), training=False)
            if target_fn is not None:
                scores = keras.ops.reshape(target_fn(outputs), (-1,))
                resolved = indices
            else:
                scores, resolved = targets_lib.class_scores(owner()._select(outputs), indices)
            return scores, resolved, [recorder.last(layer) for layer in layers]

        def on_trace() -> None:
            engine = owner()
            if engine is not None:
                engine.trace_count += 1

        return backend.compile_gradients(
            forward,
            input_specs=inputs.specs,
            wrt_inputs=wrt_inputs,
            layer_names=layer_names,
            weights=[getattr(w, "value", w) for w in weights],
            jit_compile=self.jit_compile,
            on_trace=on_trace,
        )

    def gradients(
        self,
        inputs: Any,
        targets: Any = None,
        *,
        layers: Sequence[str | keras.Layer] = (),
        wrt_inputs: bool = True,
        weights: Sequence[Any] = (),
        rule: str | None = None,
        batch_size: int = 32,
        progress: bool = False,
    ) -> GradientResult:
        """Scores, input gradients, layer activations/gradients and weight gradients.

        Args:
            inputs: array, list or dict of arrays with a leading batch axis.
            targets: int, list of ints, None (predicted class) or callable.
            layers: layers (paths or objects) to record activations and gradients at.
            wrt_inputs: also return gradients w.r.t. the inputs.
            weights: variables to differentiate w.r.t. (gradient of the summed score).
            rule: ``None``, ``"guided"``, ``"deconvnet"`` or ``"deeplift"`` backward rule for
                ReLUs (``"deeplift"``: rescale rule; the batch is inputs then their references).
            batch_size: samples per compiled call; bounds memory.
            progress: show a progress bar over the chunks.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False, name="d")])
            >>> m.get_layer("d").set_weights([np.array([[2.0], [3.0]])])
            >>> Engine(m).gradients(np.ones((1, 2)), targets=0).input_grads[0].tolist()
            [[2.0, 3.0]]
        """
        if rule not in RULES:
            raise ValueError(f"Unknown backward rule. Received: rule={rule!r}. Expected one of {RULES}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}.")
        prepared = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
        check_against_model(self.model, prepared)
        resolved_layers = tuple(self.resolve_layers(layers))
        indices, target_fn = targets_lib.encode(targets, prepared.batch_size)
        self._detect_softmax(prepared)
        if target_fn is None:
            self._check_target_range(prepared, indices)
        key = (
            resolved_layers, wrt_inputs, tuple(id(w) for w in weights), rule, target_fn,
            tuple((s[1:], d) for s, d in prepared.specs),
        )
        fn = self._compiled.get(key)
        if fn is None:
            fn = self._build(prepared, resolved_layers, wrt_inputs, tuple(weights), rule, target_fn)
            self._compiled[key] = fn
        parts: list[dict[str, Any]] = []
        for part, arrays in progress_bar(
            list(prepared.chunks(batch_size)), enabled=progress, desc="explaining", unit="batch"
        ):
            parts.append(fn(arrays, indices[part]))
        result = _merge(parts, wrt_inputs)
        self._check_saturation(result.scores)
        _check_finite(result)
        return result

    def _check_target_range(self, inputs: Inputs, indices: np.ndarray) -> None:
        key = ("output_shape", tuple((s[1:], d) for s, d in inputs.specs))
        if key not in self._compiled:  # symbolic shape inference once per input signature
            try:
                spec = self.model.compute_output_spec(inputs.model_arg(
                    [keras.KerasTensor((None, *a.shape[1:]), a.dtype.name) for a in inputs.arrays]))
                self._compiled[key] = self._select(spec).shape
            except Exception:
                self._compiled[key] = None
        shape = self._compiled[key]
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
        prepared = inputs if isinstance(inputs, Inputs) else Inputs(inputs)
        check_against_model(self.model, prepared)
        self._detect_softmax(prepared)
        key = ("forward", tuple((s[1:], d) for s, d in prepared.specs))
        fn = self._compiled.get(key)
        if fn is None:
            bypass = list(self._bypassed or []) if self.output == "logits" else []
            owner = weakref.ref(self)
            model_arg = prepared.structurer()

            def run(arrays: list[Any]) -> Any:
                with bypass_softmax(bypass):
                    return owner().model(model_arg(arrays), training=False)

            fn = _backend.get().compile_forward(run, input_specs=prepared.specs, jit_compile=self.jit_compile)
            self._compiled[key] = fn
        outs = [fn(arrays) for _, arrays in prepared.chunks(batch_size)]
        return keras.tree.map_structure(lambda *xs: np.concatenate(xs, axis=0), *outs)


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
    )


def _check_finite(result: GradientResult) -> None:
    if not np.all(np.isfinite(result.scores)):
        raise FloatingPointError(
            "The model produced NaN or infinite scores for some inputs "
            f"(samples {np.flatnonzero(~np.isfinite(result.scores)).tolist()[:10]}). "
            "Check the inputs' preprocessing and the model's weights."
        )


_ENGINES: weakref.WeakKeyDictionary[keras.Layer, dict[Any, Engine]] = weakref.WeakKeyDictionary()


def engine_for(model: keras.Layer, output: str = "logits", output_index: Any = None, jit_compile: bool = False) -> Engine:
    """Return the shared :class:`Engine` for this model and options (compiled functions are reused).

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> engine_for(m) is engine_for(m)
        True
    """
    try:
        per_model = _ENGINES.setdefault(model, {})
    except TypeError:
        return Engine(model, output, output_index, jit_compile)
    key = (output, output_index, jit_compile)
    if key not in per_model:
        per_model[key] = Engine(model, output, output_index, jit_compile)
    return per_model[key]
