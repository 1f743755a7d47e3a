"""The base class every method derives from: hyper-parameters in, Explanation out."""

from __future__ import annotations

from typing import Any, ClassVar

import keras
import numpy as np

from kerascope.core.calls import SharedLayerError, check_call_index
from kerascope.core.diagnostics import check_explanation
from kerascope.core.engine import Engine, check_finite, engine_for
from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.layers import iter_layers
from kerascope.core.precision import check_precision, model_reduced_dtype
from kerascope.core.progress import Progress, method_passes, progress_scope
from kerascope.core.threads import single_threaded_blas
from kerascope.numeric.chunking import check_batch_size


def _layer_path(layer: Any) -> str | None:
    """A layer given as an object becomes its name (engines are cached per output layer)."""
    if layer is None or isinstance(layer, str):
        return layer
    if isinstance(layer, keras.Layer):
        return layer.name
    raise TypeError(f"`output_layer` must be a layer path or a layer. Received: output_layer={layer!r}.")


def check_seed(seed: Any, name: str = "seed") -> int | None:
    """Return ``seed`` (None or a non-negative int, numpy's rule) or raise the standard error.

    Example:
        >>> check_seed(3), check_seed(None)
        (3, None)
        >>> check_seed(-1)
        Traceback (most recent call last):
        ...
        ValueError: `seed` must be None or a non-negative int. Received: seed=-1.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"`{name}` must be None or a non-negative int. Received: {name}={seed!r}.")
    return int(seed)


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an int if it is a positive int (not a bool), else raise the standard error.

    Example:
        >>> check_positive_int(3, "samples")
        3
        >>> check_positive_int(True, "steps")
        Traceback (most recent call last):
        ...
        ValueError: `steps` must be a positive int. Received: steps=True.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}.")
    return int(value)


def check_flag(value: Any, name: str) -> bool:
    """Return ``value`` if it is a bool, else raise the standard error (``None`` or ``"no"`` are not flags).

    Example:
        >>> check_flag(True, "upsample")
        True
        >>> check_flag("no", "upsample")
        Traceback (most recent call last):
        ...
        TypeError: `upsample` must be True or False. Received: upsample='no'.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be True or False. Received: {name}={value!r}.")
    return bool(value)


def check_number(value: Any, name: str, *, low: float | None = None, low_inclusive: bool = True) -> float:
    """Return ``value`` as a finite float (``>= low``, or ``> low``), or raise the standard error.

    Example:
        >>> check_number(0.5, "noise", low=0.0)
        0.5
        >>> check_number("x", "noise")
        Traceback (most recent call last):
        ...
        ValueError: `noise` must be a finite number. Received: noise='x'.
    """
    bound = "" if low is None else f" {'>=' if low_inclusive else '>'} {low:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"`{name}` must be a finite number{bound}. Received: {name}={value!r}.")
    number = float(value)
    if not np.isfinite(number) or (low is not None and (number < low or (number == low and not low_inclusive))):
        raise ValueError(f"`{name}` must be a finite number{bound}. Received: {name}={value!r}.")
    return number


class UnsupportedModelError(ValueError):
    """The method cannot explain this kind of model (e.g. DeepLIFT on max pooling).

    A ``ValueError``, so existing handlers still catch it; benchmarks report
    such methods as "not applicable" rather than failed.

    Example:
        >>> issubclass(UnsupportedModelError, ValueError)
        True
    """



def problem_path(problem: str) -> str:
    """The layer / op path a support problem names (``"'dense_1' (Dense with ...)"`` -> ``"dense_1"``).

    Example:
        >>> problem_path("'head/p' (Dense with activation 'softmax')")
        'head/p'
    """
    return problem[1:].split("'", 1)[0] if problem.startswith("'") else problem


def _float16_layers(model: keras.Layer) -> str:
    """``"['c1' (mixed_float16), ...]"``: the layers of ``model`` that compute in float16 (the first five)."""
    found = [f"{path!r} ({getattr(getattr(layer, 'dtype_policy', None), 'name', '?')})"
             for path, layer in iter_layers(model) if getattr(layer, "compute_dtype", None) == "float16"]
    return f"[{', '.join(found[:5])}{', ...' if len(found) > 5 else ''}]"



#: Why methods whose rules divide by stabilised denominators (DeepLIFT, LRP) run in bfloat16 but not float16;
#: such a method subclasses :class:`StabilisedDivisionMethod`.
STABILISED_DIVISIONS = ("Its stabilised divisions underflow in float16 (smallest normal 6.1e-5, no loss scaling) "
                        "and give NaN; bfloat16 has float32's range.")

class Method:
    """Base of all methods: ``Method(model, **params).explain(inputs, targets)``.

    Subclasses set ``name`` and ``description`` and implement
    :meth:`_explain`. A method holds hyper-parameters, not state: compiled
    functions live in the model's shared :class:`~kerascope.core.engine.Engine`.

    Common parameters:
        batch_size: samples (or noise samples / steps / masks) per compiled call.
        output: ``"logits"`` (default; bypasses a final softmax) or ``"probabilities"``.
        output_index: which output of a multi-output model (index or name).
        output_layer: explain the output of this inner layer (a path, e.g. the pre-softmax
            ``"logits"`` Dense of a subclassed model that applies ``tf.nn.softmax`` in ``call``)
            instead of the model's output; targets index that layer's output.
        call_index: which call of a shared layer (one called more than once in a forward pass: a
            Siamese model's shared ``Conv2D``, a ``Dense`` called twice in ``call()``) the method reads
            at ``layer=`` (or a CAM's default layer) and ``output_layer=``: an int, negative counts
            from the last call. Required when such a layer is called more than once (else
            :class:`~kerascope.core.calls.SharedLayerError`); for a functional model, call ``k`` is
            the ``k``-th time the layer was applied when the model was built, otherwise the order
            of the calls in the forward pass.
        progress: ``True`` for a progress bar that moves after every chunk of work (samples per
            second and ETA), or a callable receiving each
            :class:`~kerascope.core.progress.ProgressEvent`.
        jit_compile: compile with XLA where the backend supports it.
        precision: ``None`` / ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (GPUs): run the
            model's passes in that type (float32 variables and inputs cast per layer, never changing
            the model); inputs, gradients, sums over steps / samples and attributions stay float32.
            Opt-in: the error against float32 is measured per method and model in docs/performance.md
            ("Reduced precision"); methods that cannot honour it refuse it.
        scores: ``False`` skips the clean forward pass of the inputs whose only use is
            ``Explanation.scores`` (SmoothGrad, SmoothGrad², VarGrad, RISE, ExpectedGradients) when ``targets`` name the classes: ``Explanation.scores`` is then
            ``None``, the attributions are unchanged. With ``targets=None`` the pass picks the classes
            and the scores are kept; methods whose result needs the clean score (Occlusion's
            differences, IG's / DeepLIFT's completeness, the feature-mask methods' base score) or that
            get it from a pass they run anyway (Saliency, Grad-CAM, ...) return it regardless.
        fold_batchnorm: ``True`` (default) runs every Conv / Dense layer whose output only feeds a
            ``BatchNormalization`` as one layer with the fused parameters, inside the compiled passes
            on TensorFlow and PyTorch (fewer operations over the activations: ~0.8x the gradient time of
            MobileNetV2; not applied on JAX, whose XLA fuses the normalisation already; the model is never changed; only pairs that fold exactly, never a probed layer; see
            ``propagation/bn_fold.py``). The result differs from the unfolded graph by float32 rounding
            (~1e-6 relative; on an ill-conditioned random ResNet50 up to ~3e-3, as much as a change of batch size
            moves the unfolded pass there). ``False`` runs the model's own graph.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> ks.Saliency(m).explain(np.ones((1, 3)), targets=0).attributions.shape
        (1, 3)
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    #: The reduced compute types the method can run in (``precision=``), and why others are refused.
    reduced_precisions: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    precision_note: ClassVar[str] = ""

    def __init__(
        self,
        model: keras.Layer,
        *,
        batch_size: int = 32,
        output: str = "logits",
        output_index: int | str | None = None,
        progress: Progress = False,
        jit_compile: bool = False,
        output_layer: str | None = None,
        precision: str | None = None,
        call_index: int | None = None,
        scores: bool = True,
        fold_batchnorm: bool = True,
    ) -> None:
        batch_size = check_batch_size(batch_size)
        reduced = check_precision(precision)
        if reduced is not None and reduced not in self.reduced_precisions:
            raise ValueError(
                f"{type(self).__name__} cannot run in {reduced}. {self.precision_note} Received: "
                f"precision={precision!r}. Use precision={self.reduced_precisions[0]!r} or None (float32)."
            )
        if "float16" not in self.reduced_precisions and model_reduced_dtype(model) == "float16":
            # the model's own dtype policy: the same reason as precision="float16"
            raise ValueError(
                f"{type(self).__name__} cannot run on a model that computes in float16. {self.precision_note} "
                f"Received: layers computing in float16: {_float16_layers(model)}. Explain a float32 copy "
                "(rebuild it under keras.config.set_dtype_policy('float32') and copy the weights with "
                "set_weights), or use a gradient method such as IntegratedGradients."
            )
        self.model = model
        self.batch_size = batch_size
        self.output = output
        self.output_index = output_index
        self.progress = progress
        self.jit_compile = jit_compile
        self.output_layer = _layer_path(output_layer)
        self.precision = precision
        self.call_index = check_call_index(call_index)
        self.scores = check_flag(scores, "scores")
        self.fold_batchnorm = check_flag(fold_batchnorm, "fold_batchnorm")
        self.engine: Engine = engine_for(model, output, output_index, jit_compile, self.output_layer, precision,
                                         self.call_index, self.fold_batchnorm)
        if self.output_layer is not None:
            try:
                self.engine.explained_layer()  # an unknown layer fails here, with the available names
            except (TypeError, ValueError) as error:
                raise type(error)(f"Unknown `output_layer`. Received: output_layer={output_layer!r}. {error}") from None

    def params(self) -> dict[str, Any]:
        """The method's hyper-parameters (what goes into ``Explanation.params``).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> ks.Saliency(m, absolute=True).params()["absolute"]
            True
        """
        skip = {"model", "engine", "progress"}
        return {k: v for k, v in vars(self).items() if k not in skip and not k.startswith("_")}

    def resolved_params(self, inputs: Any = None) -> dict[str, Any]:
        """The hyper-parameters as they apply to ``inputs``: defaults that depend on the data resolved.

        A CAM's ``layer=None`` becomes the path of the layer it would use (found
        with one forward pass, cached on the engine). Building the method again
        with these parameters pins them, so later calls skip the resolution.
        Without ``inputs`` (or for methods with nothing to resolve) it equals
        :meth:`params`.

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")])
            >>> ks.GradCAM(m).resolved_params(np.zeros((1, 8, 8, 1)))["layer"]
            'c'
        """
        return self.params()

    def explain(self, inputs: Any, targets: Any = None) -> Explanation:
        """Explain ``inputs`` for ``targets`` (None = the predicted class).

        Example:
            >>> import keras, numpy as np, kerascope as ks
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> e = ks.GradientXInput(m).explain(np.ones((2, 3)), targets=[0, 1])
            >>> e.targets.tolist()
            [0, 1]
        """
        result = self._explain_unchecked(inputs, targets)
        check_explanation(result, self)  # a zero map or a missed completeness is said, never passed silently
        return result

    def _explain_unchecked(self, inputs: Any, targets: Any = None) -> Explanation:
        """:meth:`explain` without its warnings (for a caller that merges parts and checks the whole)."""
        self._check_call_index()
        self._check_model()  # refusals that need no call come first: the model is not even called
        # then the inputs, before any method-specific pass (the same eager pass counts the probed layer's calls)
        prepared = self.engine.check_inputs(inputs, self._probed_layers())
        with self.engine.check_on_error(prepared), single_threaded_blas(), progress_scope(
            prepared.num_samples, self.name, self.progress, passes=method_passes(self)
        ):
            return self._explain(prepared, targets)

    def _probed_layers(self) -> list[keras.Layer]:
        """The inner layer given by ``layer=`` as an object (none when absent or unknown: its error comes later)."""
        layer = getattr(self, "layer", None)
        if layer is None:
            return []
        try:
            return self.engine.resolve_layers([layer])
        except (ValueError, TypeError, KeyError):
            return []

    def _reads_layer(self) -> bool:
        """Whether the method reads an inner layer (``layer=``) that ``call_index`` can choose a call of."""
        return getattr(self, "layer", None) is not None

    def _check_call_index(self) -> None:
        """``call_index`` without any inner layer to apply to is refused (it would be silently ignored)."""
        if self.call_index is not None and self.output_layer is None and not self._reads_layer():
            raise SharedLayerError(
                f"`call_index` chooses the call of a shared layer given by `layer=` or `output_layer=`, and "
                f"{type(self).__name__} reads none here. Received: call_index={self.call_index!r}, "
                f"layer={getattr(self, 'layer', None)!r}, output_layer=None. Pass the layer, or drop `call_index`."
            )

    def _check_model(self) -> None:
        """Raise :class:`UnsupportedModelError` when the method cannot apply to the model (no call needed)."""

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        raise NotImplementedError

    def _check_finite_result(self, attributions: list[Any], scores: Any) -> None:
        """Raise :class:`~kerascope.core.engine.NonFiniteError` for NaN / infinite scores or attributions (never a silent NaN map)."""
        check_finite(scores, "the model's scores", "Check the inputs' preprocessing and the model's weights.")
        for i, values in enumerate(attributions):
            what = "the attributions" + (f" of input {i}" if len(attributions) > 1 else "")
            check_finite(values, f"{what} ({self.name})", "The model's gradients or scores overflow for these inputs.")

    def _result(
        self,
        inputs: Inputs,
        attributions: list[Any],
        scores: Any,
        targets: Any,
        layer: str | None = None,
        **extras: Any,
    ) -> Explanation:
        self._check_finite_result(attributions, scores)
        single = inputs.kind == "single" or len(attributions) == 1
        return Explanation(
            attributions=attributions[0] if single else inputs.rebuild(attributions),
            method=self.name,
            params=self.params(),
            targets=targets,
            scores=scores,
            layer=layer,
            extras=extras,
        )

    def _input_result(
        self, inputs: Inputs, wrt: list[int], attributions: list[Any], scores: Any, targets: Any, **extras: Any
    ) -> Explanation:
        """Attributions of the inputs at positions ``wrt``: one array for one input, every input in the
        user's structure, else a list in ``wrt`` order; ``extras["input_index"]`` on multi-input models."""
        if len(inputs.arrays) > 1:
            extras["input_index"] = np.asarray(wrt)
        if len(wrt) == 1 or list(wrt) == list(range(len(inputs.arrays))):
            return self._result(inputs, attributions, scores, targets, **extras)
        return Explanation(
            attributions=subset_structure(inputs, wrt, attributions), method=self.name, params=self.params(), targets=targets,
            scores=scores, extras=extras,
        )

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({params})"


def subset_structure(inputs: Inputs, positions: list[int], results: list[Any]) -> Any:
    """Results for the inputs at ``positions`` in the user's structure: every input -> the inputs' own
    structure; a dict of inputs -> a dict keyed by the chosen inputs' names; else a list in ``positions`` order.

    Example:
        >>> import numpy as np
        >>> x = Inputs({"a": np.zeros((1, 2)), "b": np.zeros((1, 3)), "c": np.zeros((1, 1))})
        >>> subset_structure(x, [2, 0], ["C", "A"])
        {'c': 'C', 'a': 'A'}
        >>> subset_structure(Inputs([np.zeros((1, 2)), np.zeros((1, 3))]), [1, 0], ["B", "A"])
        ['B', 'A']
    """
    if list(positions) == list(range(len(inputs.arrays))):
        return inputs.rebuild(list(results))
    if inputs.kind == "dict":
        return {inputs.keys[i]: r for i, r in zip(positions, results, strict=True)}
    return list(results)


class StabilisedDivisionMethod(Method):
    """Base of the methods whose rules divide by stabilised denominators (DeepLIFT, LRP): bfloat16, not float16.

    Example:
        >>> StabilisedDivisionMethod.reduced_precisions, StabilisedDivisionMethod.precision_note[:30]
        (('bfloat16',), 'Its stabilised divisions under')
    """

    reduced_precisions = ("bfloat16",)
    precision_note = STABILISED_DIVISIONS


class FunctionMethod(Method):
    """A callable ``(model, inputs, targets) -> attributions`` used as a method.

    What :func:`kerascope.methods.registry.build` returns for a callable spec, so
    every caller handles one kind of object. ``explain`` returns the callable's
    :class:`~kerascope.core.explanation.Explanation` as is, or wraps its arrays in
    one (targets: the requested class indices, ``-1`` for "predicted"; scores: NaN).

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> def ones(model, x, t):
        ...     return np.ones_like(x)
        >>> e = FunctionMethod(m, ones).explain(np.zeros((2, 3)), 1)
        >>> e.method, e.attributions.shape, e.targets.tolist()
        ('ones', (2, 3), [1, 1])
    """

    def __init__(self, model: keras.Layer, function: Any, *, batch_size: int = 32) -> None:
        self.model = model
        self.batch_size = batch_size
        self.function = function
        self.name = getattr(function, "__name__", "custom")  # type: ignore[misc]

    def params(self) -> dict[str, Any]:
        """Nothing to report: the callable holds its own parameters.

        Example:
            >>> import keras
            >>> FunctionMethod(keras.Sequential([keras.Input((1,))]), print).params()
            {}
        """
        return {}

    def explain(self, inputs: Any, targets: Any = None) -> Explanation:
        """Call the function; wrap plain attributions in an Explanation.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            >>> FunctionMethod(m, lambda model, x, t: x).explain(np.ones((1, 3))).scores.shape
            (1,)
        """
        from kerascope.core import targets as targets_lib

        result = self.function(self.model, inputs, targets)
        if isinstance(result, Explanation):
            return result
        n = Inputs(inputs).num_samples
        try:
            indices = targets_lib.encode(targets, n)[0]
        except (TypeError, ValueError):  # the callable may take targets kerascope does not: pass them on
            indices = np.full(n, targets_lib.PREDICTED)
        return Explanation(result, self.name, {}, indices.astype(np.int64), np.full(n, np.nan, np.float32))

    def __repr__(self) -> str:
        return f"FunctionMethod({self.name})"
