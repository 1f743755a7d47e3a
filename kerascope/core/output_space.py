"""Output-space policy: which model output is explained, and whether a final softmax is bypassed.

:class:`OutputSpace` holds the three decisions the :class:`~kerascope.core.engine.Engine`
applies to every model call, separate from compiling and caching:

* **output selection**: which output of a multi-output model (``output_index``);
* **softmax bypass**: in ``"logits"`` mode, the softmax layers whose output *is*
  the model output (a fused ``Dense(activation="softmax")``, an ``Activation`` or a
  ``Softmax`` layer; a final sigmoid likewise) are found once, from a functional model's graph
  (``core/graph_reading.py``) or else with one probed forward pass on one sample,
  and made linear for the duration of each call (never by changing the model);
* **saturation check**: when the model outputs probabilities and no softmax could
  be found to bypass, saturated scores (gradients vanish in float32) raise a warning.

Only decisions live here (numpy in, numpy out); calling the model stays in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from kerascope.core.probe import is_sigmoid_head

OUTPUT_SPACES = ("logits", "probabilities")
SATURATED_LOW = 1e-12
"""Target probabilities at or below this are saturated: their gradients are ~1e-12 x the logits'."""
SATURATED_HIGH = 1e-6
"""Target probabilities within this of 1 are saturated: ``1 - p`` is at float32 rounding level."""


class OutputSpace:
    """The output space of one engine: ``output`` (``"logits"`` / ``"probabilities"``) and ``output_index``.

    The engine calls the model (one probed pass on one sample) and hands what it
    saw to :meth:`settle`, or what a functional model's graph says to :meth:`settle_read`;
    this class only decides.

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(2, activation="softmax", name="d")
        >>> space = OutputSpace("logits")
        >>> space.settle([d], np.array([[0.5, 0.5]]))
        >>> [layer.name for layer in space.bypass()], space.gives_probabilities
        (['d'], False)
    """

    def __init__(self, output: str = "logits", output_index: int | str | None = None) -> None:
        if output not in OUTPUT_SPACES:
            raise ValueError(f"Unknown output space. Received: output={output!r}. Expected one of {OUTPUT_SPACES}.")
        if isinstance(output_index, np.integer):
            output_index = int(output_index)
        if output_index is not None and (isinstance(output_index, bool) or not isinstance(output_index, (int, str))):
            raise TypeError(
                "`output_index` must be an output position (int), an output name (str) or None. "
                f"Received: output_index={output_index!r} of type {type(output_index).__name__}."
            )
        self.output = output
        self.output_index = output_index
        self.softmax_layers: list[keras.Layer] | None = None  # None: not detected yet
        self.probabilities_out: bool | None = False  # None: read from the graph, the values not seen yet

    @property
    def detected(self) -> bool:
        """True once :meth:`detect` has run.

        Example:
            >>> OutputSpace().detected
            False
        """
        return self.softmax_layers is not None

    def bypass(self) -> list[keras.Layer]:
        """The softmax layers to make linear during a call (none in ``"probabilities"`` mode).

        Example:
            >>> OutputSpace("probabilities").bypass()
            []
        """
        return list(self.softmax_layers or []) if self.output == "logits" else []

    @property
    def gives_probabilities(self) -> bool:
        """True when calls in this space return probabilities (no softmax bypassed, rows sum to 1).

        Example:
            >>> OutputSpace().gives_probabilities
            False
        """
        return bool(self.probabilities_out) and not (self.output == "logits" and self.softmax_layers)

    @property
    def probabilities_pending(self) -> bool:
        """True when whether the explained output is probabilities matters and only its values can tell.

        That is after :meth:`settle_read` left it open (``probabilities_out is None``) and no
        bypassed softmax makes it moot: the engine settles it from the first values it sees.

        Example:
            >>> s = OutputSpace(); s.settle_read([], None)
            >>> s.probabilities_pending, s.gives_probabilities
            (True, False)
        """
        return self.probabilities_out is None and not (self.output == "logits" and self.softmax_layers)

    def select(self, outputs: Any, model: keras.Layer | None = None) -> Any:
        """The explained output of a (possibly multi-output) model's outputs.

        ``model`` gives the output names for a list output chosen by name.

        Example:
            >>> import numpy as np
            >>> OutputSpace(output_index="b").select({"a": np.zeros(1), "b": np.ones(1)}).tolist()
            [1.0]
        """
        if isinstance(outputs, dict):
            keys = list(outputs)
            key = self.output_index
            if key is None:
                if len(keys) > 1:
                    raise ValueError(
                        f"The model has several outputs {keys}; choose one with `output_index=` "
                        f"(CLI: `--param output_index={keys[0]}`) or pass a callable target. "
                        "Received: output_index=None."
                    )
                key = keys[0]
            if isinstance(key, int):
                if not -len(keys) <= key < len(keys):
                    raise ValueError(
                        f"Unknown output. Received: output_index={key}. The model has {len(keys)} outputs: {keys}."
                    )
                key = keys[key]
            if key not in outputs:
                raise ValueError(f"Unknown output. Received: output_index={key!r}. Available outputs: {keys}.")
            return outputs[key]
        if isinstance(outputs, (list, tuple)):
            index = self.output_index
            if isinstance(index, str):
                names = list(getattr(model, "output_names", []) or [])
                if index not in names:
                    raise ValueError(
                        f"Unknown output. Received: output_index={index!r}. Available outputs: {names}."
                    )
                index = names.index(index)
            if index is None:
                if len(outputs) > 1:
                    raise ValueError(
                        f"The model has {len(outputs)} outputs; choose one with `output_index=` "
                        "(an index or an output name; CLI: `--param output_index=0`) or pass a callable "
                        "target. Received: output_index=None."
                    )
                index = 0
            if not isinstance(index, int) or not -len(outputs) <= index < len(outputs):
                names = list(getattr(model, "output_names", []) or [])
                raise ValueError(
                    f"Unknown output. Received: output_index={index!r}. The model has {len(outputs)} outputs"
                    + (f": {names}." if names else ".")
                )
            return outputs[index]
        index = self.output_index  # one output: only its position or its name can choose it
        names = list(getattr(model, "output_names", []) or [])
        if index is None or index in (0, -1) or (isinstance(index, str) and index in names):
            return outputs
        raise ValueError(
            f"Unknown output. Received: output_index={index!r}. The model has 1 output"
            + (f": {names}" if names else "") + ". Pass output_index=None (or 0)."
        )

    def settle(self, softmax_layers: list[keras.Layer], chosen: Any) -> None:
        """Record what detection found: the softmax layers to bypass and the explained output's values.

        ``chosen`` is the explained output on one sample (``None`` when it cannot be
        chosen without a callable target); it decides whether the model outputs
        probabilities (non-negative rows summing to 1).

        Example:
            >>> import numpy as np
            >>> s = OutputSpace(); s.settle([], np.array([[0.25, 0.75]]))
            >>> s.detected, s.probabilities_out
            (True, True)
        """
        self.softmax_layers = list(softmax_layers)
        self.probabilities_out = is_probabilities(chosen)

    def settle_read(self, softmax_layers: list[keras.Layer], probabilities: bool | None) -> None:
        """Record what the model's graph says (``core/graph_reading.py``), no call made.

        ``probabilities`` is ``None`` when only the output's values can tell (settled later
        from the first values, see :attr:`probabilities_pending`).

        Example:
            >>> s = OutputSpace(); s.settle_read([], True)
            >>> s.detected, s.gives_probabilities
            (True, True)
        """
        self.softmax_layers = list(softmax_layers)
        self.probabilities_out = probabilities

    def saturated(
        self, scores: np.ndarray, input_grads: Sequence[np.ndarray] = (), assume_probabilities: bool = False
    ) -> np.ndarray:
        """Indices of the samples whose explained probabilities are saturated (empty when none or n/a).

        Only where logits were asked for, none could be reached (no softmax found) and
        the model outputs probabilities. The gradient of a probability ``p`` is
        proportional to ``p`` (and to ``1 - p`` for the winning class): below
        ``SATURATED_LOW`` or above ``1 - SATURATED_HIGH`` the float32 backward pass
        loses the map. A sample whose whole input gradient is below ``1e-30`` also counts.
        ``assume_probabilities`` answers as if the output were probabilities (while it is pending).

        Example:
            >>> import numpy as np
            >>> s = OutputSpace(); s.settle([], np.array([[0.5, 0.5]]))
            >>> s.saturated(np.array([0.5, 1.0, 1e-20])).tolist()
            [1, 2]
        """
        if self.output != "logits" or self.softmax_layers or not (self.probabilities_out or assume_probabilities):
            return np.zeros(0, np.int64)
        scores = np.asarray(scores)
        low = scores <= SATURATED_LOW
        high = scores >= 1.0 - SATURATED_HIGH
        for grad in input_grads:
            flat = np.abs(np.asarray(grad, np.float64)).reshape(len(grad), -1)
            if flat.shape == (len(scores), flat.shape[1]) and flat.size:
                low |= flat.max(axis=1) < 1e-30
        return np.flatnonzero(low | high)


def softmax_outputs(
    candidates: Sequence[keras.Layer], recorded: dict[int, list[Any]], outputs: Any
) -> list[keras.Layer]:
    """The candidate softmax layers whose recorded output *is* one of the model's ``outputs``.

    Example:
        >>> import numpy as np, keras
        >>> d = keras.layers.Dense(2)
        >>> [l is d for l in softmax_outputs([d], {id(d): [np.ones((1, 2))]}, np.ones((1, 2)))]
        [True]
    """
    flat_outputs = [keras.ops.convert_to_numpy(o) for o in keras.tree.flatten(outputs)]
    found = []
    for layer in candidates:
        for seen in recorded.get(id(layer), []):
            value = keras.ops.convert_to_numpy(seen)
            if any(o.shape == value.shape and np.allclose(o, value) for o in flat_outputs):
                found.append(layer)
                break
    return found


def is_probabilities(chosen: Any) -> bool:
    """Whether ``chosen`` (the explained output on one sample) is probabilities: non-negative rows summing to 1.

    ``None`` (no output could be chosen) is not.

    Example:
        >>> import numpy as np
        >>> is_probabilities(np.array([[0.25, 0.75]])), is_probabilities(np.array([[2.0, -1.0]])), is_probabilities(None)
        (True, False, False)
    """
    if chosen is None:
        return False
    chosen = np.asarray(chosen)
    return bool(
        chosen.ndim >= 2
        and chosen.shape[-1] > 1
        and np.all(chosen >= 0)
        and np.allclose(chosen.sum(axis=-1), 1.0, atol=1e-3)
    )


def is_softmax_of(value: np.ndarray, probabilities: np.ndarray) -> bool:
    """True when ``softmax(value)`` equals ``probabilities`` and ``value`` is not itself them (logits).

    Example:
        >>> import numpy as np
        >>> is_softmax_of(np.array([[0.0, np.log(3.0)]]), np.array([[0.25, 0.75]]))
        True
    """
    value = np.asarray(value, np.float64)
    if value.shape != probabilities.shape or value.ndim < 2:
        return False
    shifted = np.exp(value - value.max(axis=-1, keepdims=True))
    soft = shifted / shifted.sum(axis=-1, keepdims=True)
    return bool(np.allclose(soft, probabilities, rtol=1e-3, atol=1e-6) and not np.allclose(value, probabilities))


def saturation_message(
    model_name: str, scores: np.ndarray, bad: np.ndarray, logits_layer: str | None, first: int = 0
) -> str:
    """The warning for saturated probabilities, with advice naming the logits layer when found.

    ``first``: the position of ``scores[0]`` among the samples of the user's call (a chunk's start), so the
    samples named are the user's.

    Example:
        >>> saturation_message("m", np.array([1.0]), np.array([0]), "dense")[:31]
        "Model 'm' outputs saturated pro"
    """
    advice = (
        f"Explain the layer before the softmax with `output_layer={logits_layer!r}` (its output looks "
        "like the logits)"
        if logits_layer is not None
        else "Explain the layer that computes the logits with `output_layer='<layer path>'` "
        "(see `kerascope.layers(model)`)"
    )
    return (
        f"Model {model_name!r} outputs saturated probabilities (target scores like "
        f"{float(scores[bad[0]]):.3g} for samples {(np.asarray(bad) + first).tolist()[:10]}) and kerascope found no "
        "softmax layer or activation to bypass (e.g. `tf.nn.softmax` inside a subclassed `call`). "
        "Gradients of saturated probabilities vanish or underflow in float32, so the map is "
        f"meaningless. {advice}, or apply the softmax outside the model."
    )


_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def _softmax(values: np.ndarray, axis: int) -> np.ndarray:
    shifted = values - values.max(axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=axis, keepdims=True)


def _sigmoid(values: np.ndarray, axis: int) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * values))  # (no overflow warning for large logits)


def bypass_is_local(layer: keras.Layer, produced: Sequence[Any], before: Any, after: Any) -> bool:
    """Whether bypassing ``layer``'s softmax (or sigmoid) changed the outputs ``before`` -> ``after`` only where it produces them.

    ``before`` / ``after``: the explained outputs on one sample without / with the bypass;
    ``produced``: ``layer``'s outputs in the unmodified pass (one per call). An output equal to
    one of them must come back as logits whose softmax (sigmoid) is that output (no other call of the
    layer upstream changed it); every other output must be unchanged (nothing else reads it).

    Example:
        >>> import numpy as np, keras
        >>> s = keras.layers.Softmax()
        >>> z = np.array([[1.0, 2.0]]); p = np.exp(z) / np.exp(z).sum()
        >>> bypass_is_local(s, [p], [p, p.sum(1)], [z, p.sum(1)]), bypass_is_local(s, [p], [p, p.sum(1)], [z, z.sum(1)])
        (True, False)
    """
    axis = getattr(layer, "axis", -1) if isinstance(layer, keras.layers.Softmax) else -1
    squash = _sigmoid if is_sigmoid_head(layer) else _softmax
    own = [np.asarray(keras.ops.convert_to_numpy(v), np.float64) for v in produced]
    for old, new in zip(keras.tree.flatten(before), keras.tree.flatten(after), strict=True):
        eps = _EPS.get(keras.backend.standardize_dtype(getattr(old, "dtype", "float32")), _EPS["float32"])
        old = np.asarray(keras.ops.convert_to_numpy(old), np.float64)
        new = np.asarray(keras.ops.convert_to_numpy(new), np.float64)
        if new.shape != old.shape:
            return False
        if any(v.shape == old.shape and np.allclose(old, v) for v in own):
            # the model's softmax in its own precision against the exact one (mixed_bfloat16: eps 2**-7)
            if not np.allclose(squash(new, axis), old, rtol=max(1e-4, 8 * eps), atol=max(1e-6, eps)):
                return False
        elif not np.array_equal(new, old, equal_nan=True):
            return False
    return True


def bypass_error(model_name: str, layers: Sequence[keras.Layer], outputs_read: bool) -> ValueError:
    """The refusal when bypassing an output softmax (``output="logits"``) would change more than its own output.

    Example:
        >>> import keras
        >>> str(bypass_error("m", [keras.layers.Softmax(name="sm")], True)).split(" would")[0]
        "Model 'm' cannot be explained in logits: bypassing the softmax of layer 'sm'"
    """
    names = ", ".join(repr(layer.name) for layer in layers)
    received = ("several outputs and no output_index (a callable target reads them all)" if outputs_read
                else "an output produced by a softmax layer that the model also calls elsewhere")
    return ValueError(
        f"Model {model_name!r} cannot be explained in logits: bypassing the softmax of layer {names} would "
        "change more than the output it produces (another output reads it, or the layer is called again "
        f"upstream), so the explanation would be of a different function. Received: {received}. Pass "
        "output_index= to explain one output's logits, or output='probabilities' to explain the outputs "
        "as the model computes them."
    )
