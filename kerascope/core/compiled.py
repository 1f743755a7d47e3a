"""Compiling and running the gradient, forward and scorer functions, chunk by chunk."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope import _backend
from kerascope.core import targets as targets_lib
from kerascope.core.inputs import Inputs, check_against_model
from kerascope.core.model_checks import _check_differentiable, check_finite, check_single_tensor
from kerascope.core.precision import to_float32
from kerascope.core.progress import Progress, progress_scope
from kerascope.numeric.chunking import check_batch_size

RULES = (None, "guided", "deconvnet", "deeplift")

Transform = Callable[[Any, Any], Any]
"""``transform(layer_output, extra)``: what a layer's output becomes in :meth:`Engine.scorer`."""
ChunkScorer = Callable[..., tuple[np.ndarray, np.ndarray]]
"""``(arrays, indices, extra=None) -> (scores, resolved_targets)`` for one chunk (see :meth:`Engine.scorer`)."""


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


def _target_key(target_fn: Callable | None) -> Any:
    """Cache-key part of a target: equivalent callables (a new lambda per call) share one compiled function."""
    return None if target_fn is None else targets_lib.callable_key(target_fn)


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


class CompiledCalls:
    """The public ways in: gradients, forward, scorer and scores, each compiled once per request and cached."""

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
            >>> from kerascope.core.engine import Engine
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

    def forward(self, inputs: Any, batch_size: int = 32) -> Any:
        """Model outputs in this engine's output space (logits unless told otherwise).

        Example:
            >>> from kerascope.core.engine import Engine
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

    def layer_output_function(self, inputs: Inputs, layer: keras.Layer, position: int | None,
                              check: Callable[[Any], Any] | None = None) -> Callable[[list[Any]], Any]:
        """A compiled forward pass returning ``layer``'s output at call ``position``, cached per layer and
        input signature. No softmax bypass and no BatchNormalization folding: the model's own values there.
        ``check`` sees the traced value (e.g. to refuse a layer with several output tensors).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras, numpy as np
            >>> d = keras.layers.Dense(2, kernel_initializer="ones", name="d")
            >>> m = keras.Sequential([keras.Input((3,)), d, keras.layers.Dense(1)])
            >>> e = Engine(m)  # the engine holds the model weakly: keep a reference
            >>> x = e.check_inputs(np.ones((2, 3)))
            >>> np.asarray(e.layer_output_function(x, d, None)(x.arrays)).tolist()
            [[3.0, 3.0], [3.0, 3.0]]
        """
        key = ("layer output", layer, position, inputs.signature)
        fn = self._compiled.get(key)
        if fn is None:
            owner = weakref.ref(self)
            model_arg = inputs.structurer()

            def run(arrays: list[Any]) -> Any:
                _, recorder = owner()._call_model(model_arg, arrays, (), [layer], None, None, [position], fold=False)
                value = recorder.call(layer, position)
                if check is not None:
                    check(value)
                return value

            fn = _backend.get().compile_forward(run, input_specs=inputs.specs, jit_compile=self.jit_compile)
            self._compiled[key] = fn
        return fn

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
            >>> from kerascope.core.engine import Engine
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
            >>> from kerascope.core.engine import Engine
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
