"""Which model inputs a gradient method attributes (``input_index=``).

A gradient map exists only for float inputs. On a model with several inputs the
map a user wants is usually the one of its image (an image next to a table of
metadata, token ids next to pixels); the other inputs are held at their values,
as Captum's ``additional_forward_args``. ``input_index`` is a position, an input
name, or a list of them (several maps, e.g. ``[0, 1]`` for every input).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.inputs import Inputs
from kerascope.core.spatial import choose_input, input_names, is_image
from kerascope.methods.base import UnsupportedModelError


def _describe(model: keras.Layer, inputs: Inputs) -> str:
    names = input_names(model, inputs)
    return ", ".join(
        f"{i}{'' if name is None else f' ({name!r})'}: shape={a.shape[1:]} {a.dtype.name}"
        for i, (name, a) in enumerate(zip(names, inputs.arrays))
    )


def gradient_inputs(model: keras.Layer, inputs: Inputs, input_index: Any = None) -> list[int]:
    """Positions of the inputs to differentiate, in the order the attributions are returned.

    ``None``: the only input; on a multi-input model the only image-like input
    (float ``(N, H, W, C)``), else the only float input, else an error asking to
    choose. An int or an input name chooses one input; a list / tuple of them
    chooses several. Integer inputs (token ids) are refused with the way out:
    ``layer=`` at their embedding.

    Example:
        >>> import keras, numpy as np
        >>> t, img = keras.Input((3,), name="tab"), keras.Input((8, 8, 1), name="img")
        >>> m = keras.Model([t, img], keras.layers.Concatenate()([t, keras.layers.Flatten()(img)]))
        >>> x = Inputs([np.zeros((1, 3)), np.zeros((1, 8, 8, 1))])
        >>> gradient_inputs(m, x), gradient_inputs(m, x, "tab"), gradient_inputs(m, x, [0, "img"])
        ([1], [0], [0, 1])
    """
    count = len(inputs.arrays)
    if input_index is None:
        if count == 1:
            return [_differentiable(inputs, 0, input_index)]
        floats = [i for i, a in enumerate(inputs.arrays) if np.issubdtype(a.dtype, np.floating)]
        images = [i for i in floats if is_image(inputs.arrays[i])]
        if len(images) == 1:
            return images
        if len(floats) == 1 and not images:
            return floats
        raise ValueError(
            f"Model {getattr(model, 'name', 'model')!r} takes {count} inputs, "
            f"{len(images) or 'none'} of them image-like and {len(floats)} with float values: choose the "
            "input(s) to attribute with `input_index=` (a position, an input name, or a list such as "
            f"{list(range(count))} for every input; the others are held fixed). Received: input_index=None. "
            f"Inputs: {_describe(model, inputs)}."
        )
    many = isinstance(input_index, (list, tuple))
    chosen = [choose_input(model, inputs, i) for i in (input_index if many else [input_index])]
    if not chosen or len(set(chosen)) < len(chosen):
        raise ValueError(
            f"`input_index` must name distinct inputs. Received: input_index={input_index!r}. "
            f"Inputs: {_describe(model, inputs)}."
        )
    return [_differentiable(inputs, i, input_index) for i in chosen]


def _differentiable(inputs: Inputs, i: int, input_index: Any) -> int:
    refuse_integer_input(
        inputs, i, "Gradient methods do not apply to integer inputs (token ids): they have no gradient",
        "Attribute at the layer that embeds them with `layer=` (e.g. layer='embedding'; "
        "Explanation.per_position() then gives one value per token), choose a float input, or use "
        "FeatureAblation / KernelSHAP, which replace tokens by a pad id.",
        received=f", input_index={input_index!r}",
    )
    return i


def refuse_integer_input(inputs: Inputs, index: int, refusal: str, advice: str, received: str = "") -> None:
    """Raise ``UnsupportedModelError`` when input ``index`` holds integer ids (nothing to mask or differentiate).

    The message reads ``"{refusal}. Received: input {index} of dtype ... and shape ...{received}. {advice}"``.

    Example:
        >>> import numpy as np
        >>> refuse_integer_input(Inputs(np.zeros((1, 4), "int32")), 0, "No", "Use floats.")
        Traceback (most recent call last):
        ...
        kerascope.methods.base.UnsupportedModelError: No. Received: input 0 of dtype int32 and shape (1, 4). Use floats.
    """
    array = inputs.arrays[index]
    if not np.issubdtype(array.dtype, np.floating):
        raise UnsupportedModelError(
            f"{refusal}. Received: input {index} of dtype {array.dtype.name} and shape {array.shape}{received}. "
            f"{advice}"
        )
