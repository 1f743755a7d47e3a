"""Checks that a model can be explained: no state, no randomness, variables kept, values finite."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import numpy as np

from kerascope._backend.errors import StatefulModelError
from kerascope.core.inputs import Inputs
from kerascope.core.layers import iter_layers
from kerascope.core.rows import describe_rows


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
        kerascope.core.model_checks.StochasticModelError: Model 'm' is random at inference: two calls with training=False on the same sample differ (largest difference 1 of output values up to 2). Received: a model whose call() draws random numbers whatever `training` says (e.g. `Dropout(...)(x, training=True)` or noise written inside `call`), or that keeps state from one call to the next. Its explanations would be one random draw each, different on every call. Let the random layers follow `training` (`self.dropout(x, training=training)`) to explain the model as `predict()` uses it; to explain MC-dropout, make the randomness explicit and average the maps yourself over fixed seeds.
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
        kerascope.core.model_checks.NonFiniteError: NaN or infinite values in the model's scores: 1 value(s), samples [1]. Received: 0 NaN, 1 infinite.
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
