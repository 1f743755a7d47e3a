"""Where a layer's activations lie on an input: images, sequences and transformer tokens.

A class-activation map is computed on a layer's output ``(N, *positions, C)``
(channels last) and shown on one of the model's inputs. This module decides
how the positions map onto that input:

- ``"image"``: a feature map ``(N, h, w, C)`` of an image input ``(N, H, W, C)``;
  maps ``(N, h, w)`` are resized bilinearly to ``(H, W)``.
- ``"sequence"``: a feature sequence ``(N, t, C)`` of a sequence input, token ids
  ``(N, T)`` or features ``(N, T, F)``; maps ``(N, t)`` are resized linearly to ``T``.
- ``"tokens"``: the tokens ``(N, T, C)`` of a vision transformer on an image
  input. They are put back on their patch grid ``(N, gh, gw, C)`` when ``T``
  (or ``T - 1``: a class token first, which is dropped) equals ``gh * gw`` for a
  grid seen in the forward pass (the patch embedding's output) or implied by
  the input with square patches; then they are an ``"image"`` map. A
  ``reshape=`` callable ``(N, T, C) -> (N, h, w, C)`` (numpy, channels last)
  overrides the automatic grid, like pytorch-grad-cam's ``reshape_transform``.

It also picks the input a map is for (:func:`choose_input`) and the default
CAM layer (:func:`default_layer`): the last layer whose output keeps an
extent > 1 along every spatial (or temporal) axis, depends on that input and
feeds the prediction. Layers inside attention layers (``mha/value``) and
``1 x 1`` maps (a classifier convolution) are never chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from kerascope.core.inputs import Inputs, fit_structure
from kerascope.core.layers import iter_layers
from kerascope.core.output_space import softmax_outputs
from kerascope.core.probe import bypass_softmax, probe, softmax_candidates
from kerascope.numeric.resize import upsample

Reshape = Callable[[np.ndarray], np.ndarray]

#: attention layers whose sub-layers (query / key / value projections, ``(N, T, heads, dim)``) are no CAM layers
_ATTENTION = tuple(
    cls for cls in (getattr(keras.layers, n, None) for n in ("MultiHeadAttention", "GroupQueryAttention"))
    if cls is not None
)


class LayoutError(ValueError):
    """A layer's output cannot be placed on the chosen input (no grid, wrong rank, ...).

    Example:
        >>> issubclass(LayoutError, ValueError)
        True
    """


# --------------------------------------------------------------------------- inputs
def input_names(model: keras.Layer, inputs: Inputs) -> list[str | None]:
    """Names of the model inputs in the order of ``inputs.arrays`` (dict keys, else the model's input names).

    Example:
        >>> import keras, numpy as np
        >>> a, b = keras.Input((2,), name="a"), keras.Input((3,), name="b")
        >>> m = keras.Model([a, b], keras.layers.Concatenate()([a, b]))
        >>> input_names(m, Inputs([np.zeros((1, 2)), np.zeros((1, 3))]))
        ['a', 'b']
    """
    if inputs.keys is not None:
        return [str(k) for k in inputs.keys]
    try:
        names = [getattr(t, "name", None) for t in model.inputs]
    except Exception:
        names = []
    if len(names) != len(inputs.arrays):
        return [None] * len(inputs.arrays)
    return names


def is_image(array: np.ndarray) -> bool:
    """An image batch: rank 4 ``(N, H, W, C)``, floating point.

    Example:
        >>> import numpy as np
        >>> is_image(np.zeros((1, 8, 8, 3), "float32")), is_image(np.zeros((1, 8), "int32"))
        (True, False)
    """
    return array.ndim == 4 and np.issubdtype(array.dtype, np.floating)


def _describe(names: list[str | None], inputs: Inputs) -> str:
    return ", ".join(
        f"{i}{'' if name is None else f' ({name!r})'}: shape={a.shape[1:]} {a.dtype.name}"
        for i, (name, a) in enumerate(zip(names, inputs.arrays))
    )


def choose_input(model: keras.Layer, inputs: Inputs, input_index: int | str | None = None) -> int:
    """The position of the input the maps are for.

    ``input_index`` is a position or an input's name; ``None`` picks the only
    input, else the only image-like input (:func:`is_image`), else raises an
    error asking to choose.

    Example:
        >>> import keras, numpy as np
        >>> t, img = keras.Input((3,), name="tab"), keras.Input((8, 8, 1), name="img")
        >>> m = keras.Model([t, img], keras.layers.Concatenate()([t, keras.layers.Flatten()(img)]))
        >>> x = Inputs([np.zeros((1, 3)), np.zeros((1, 8, 8, 1))])
        >>> choose_input(m, x), choose_input(m, x, "tab")
        (1, 0)
    """
    count = len(inputs.arrays)
    names = input_names(model, inputs)
    if input_index is None:
        if count == 1:
            return 0
        images = [i for i, a in enumerate(inputs.arrays) if is_image(a)]
        if len(images) == 1:
            return images[0]
        raise ValueError(
            f"Model {model.name!r} takes {count} inputs and {len(images) or 'none'} of them "
            f"{'is an image' if len(images) == 1 else 'are images (N, H, W, C)'}: choose the input the map is "
            f"for with `input_index=` (a position or an input name). Received: input_index=None. "
            f"Inputs: {_describe(names, inputs)}."
        )
    if isinstance(input_index, str):
        if input_index in names:
            return names.index(input_index)
        raise ValueError(
            f"Unknown input name. Received: input_index={input_index!r}. Available inputs: "
            f"{_describe(names, inputs)}."
        )
    if isinstance(input_index, (int, np.integer)) and not isinstance(input_index, bool):
        if -count <= int(input_index) < count:
            return int(input_index) % count
    raise ValueError(
        f"`input_index` must be an input position in [0, {count}) or an input name. "
        f"Received: input_index={input_index!r}. Inputs: {_describe(names, inputs)}."
    )


def input_extent(array: np.ndarray) -> tuple[int, ...]:
    """The positions of an input a map covers: ``(H, W)`` for images, ``(T,)`` for sequences.

    Token ids ``(N, T)`` and features ``(N, T, F)`` are sequences of length ``T``.

    Example:
        >>> import numpy as np
        >>> input_extent(np.zeros((2, 8, 6, 3))), input_extent(np.zeros((2, 5), "int32"))
        ((8, 6), (5,))
    """
    if array.ndim == 4:
        return tuple(array.shape[1:3])
    if array.ndim in (2, 3):
        return (array.shape[1],)
    raise LayoutError(
        f"CAM maps are drawn on images (N, H, W, C) or sequences (N, T) / (N, T, F). "
        f"Received: an input of shape {array.shape}."
    )


# --------------------------------------------------------------------------- grids
def candidate_grids(size: tuple[int, int], seen: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Patch grids for an image of ``size``: the grids ``seen`` in the forward pass, then square patches.

    Example:
        >>> candidate_grids((8, 8))[:3]
        [(8, 8), (4, 4), (2, 2)]
    """
    height, width = size
    square = [(height // p, width // p) for p in range(1, min(height, width) + 1)
              if height % p == 0 and width % p == 0]
    return list(dict.fromkeys([tuple(g) for g in seen] + square))


def token_grid(
    tokens: int, size: tuple[int, int], seen: Sequence[tuple[int, int]] = ()
) -> tuple[tuple[int, int], int]:
    """``(grid, prefix)``: the patch grid of ``tokens`` tokens and how many leading tokens to drop (0 or 1).

    ``tokens`` must be ``gh * gw`` (no class token) or ``gh * gw + 1`` (a class
    token first) for a grid of :func:`candidate_grids`; grids seen in the
    forward pass (the patch embedding) come first. Raises :class:`LayoutError`
    when none matches or when two grids of different shapes match equally well.

    Example:
        >>> token_grid(17, (16, 16), seen=[(4, 4)])
        ((4, 4), 1)
        >>> token_grid(64, (32, 32))
        ((8, 8), 0)
    """
    seen = [tuple(g) for g in seen]
    for prefix in (0, 1):
        for pool in (seen, candidate_grids(size)):
            matches = list(dict.fromkeys(g for g in pool if g[0] * g[1] == tokens - prefix))
            if len(matches) == 1:
                return matches[0], prefix
            if len(matches) > 1:
                raise LayoutError(
                    f"{tokens} tokens fit several patch grids {matches} of the {size[0]}x{size[1]} input. "
                    "Pass `reshape=` (a function (N, T, C) -> (N, h, w, C)) to say how the tokens lie."
                )
    raise LayoutError(
        f"The layer's {tokens} tokens match no patch grid of the {size[0]}x{size[1]} input "
        f"(grids seen in the model: {seen or 'none'}; expected h*w or h*w + 1 with a class token first). "
        "Pass `reshape=` (a function (N, T, C) -> (N, h, w, C), like pytorch-grad-cam's reshape_transform) "
        "or pick a convolutional or token layer with `layer=`."
    )


# --------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """How one layer's activations lie on one input.

    Attributes:
        kind: ``"image"``, ``"sequence"``, ``"tokens"`` (a grid found automatically) or ``"reshape"``.
        input_index: the input the maps are drawn on.
        extent: that input's ``(H, W)`` or ``(T,)``.
        grid: the token grid ``(gh, gw)`` (``"tokens"`` only).
        prefix: leading tokens dropped (a class token), ``"tokens"`` only.
        reshape: the user's ``reshape=`` callable (``"reshape"`` only).

    Example:
        >>> import numpy as np
        >>> lay = Layout("tokens", 0, (8, 8), grid=(2, 2), prefix=1)
        >>> lay.to_positions(np.arange(10.0).reshape(1, 5, 2)).shape
        (1, 2, 2, 2)
        >>> lay.upsample(np.ones((1, 2, 2))).shape
        (1, 8, 8)
    """

    kind: str
    input_index: int
    extent: tuple[int, ...]
    grid: tuple[int, int] | None = None
    prefix: int = 0
    reshape: Reshape | None = None

    def to_positions(self, array: np.ndarray) -> np.ndarray:
        """The layer's output ``(N, ..., C)`` as ``(N, *positions, C)`` on the input's axes.

        Example:
            >>> import numpy as np
            >>> Layout("sequence", 0, (6,)).to_positions(np.ones((1, 3, 2))).shape
            (1, 3, 2)
        """
        array = np.asarray(array)
        if self.kind == "tokens":
            n, _, channels = array.shape
            return array[:, self.prefix:].reshape(n, *self.grid, channels)
        if self.kind == "reshape":
            out = np.asarray(self.reshape(array))
            expected = len(self.extent) + 2
            if out.ndim != expected or out.shape[0] != array.shape[0] or out.shape[-1] != array.shape[-1]:
                raise LayoutError(
                    f"`reshape` must return (N, {'h, w' if expected == 4 else 't'}, C) with the batch size and "
                    f"channels of its argument {array.shape}. Received: an array of shape {out.shape}."
                )
            return out
        return array

    def upsample(self, maps: np.ndarray) -> np.ndarray:
        """Resize ``(N, *positions)`` maps to the input's extent (bilinear, or linear along time).

        Example:
            >>> import numpy as np
            >>> Layout("sequence", 0, (4,)).upsample(np.array([[0.0, 1.0]])).tolist()
            [[0.0, 0.25, 0.75, 1.0]]
        """
        return upsample(maps, self.extent)

    def mask_positions(self, positions_shape: tuple[int, ...]) -> np.ndarray:
        """Boolean ``(*layer_positions)`` mask of the layer's positions that lie on the input.

        ``False`` only for dropped leading tokens; used to perturb only those.

        Example:
            >>> Layout("tokens", 0, (8, 8), grid=(2, 2), prefix=1).mask_positions((5,)).tolist()
            [False, True, True, True, True]
        """
        mask = np.ones(positions_shape, bool)
        if self.kind == "tokens" and self.prefix:
            mask[: self.prefix] = False
        return mask


def layout_for(
    output_shape: tuple[int, ...],
    input_array: np.ndarray,
    input_index: int = 0,
    *,
    reshape: Reshape | None = None,
    seen_grids: Sequence[tuple[int, int]] = (),
    layer_name: str = "?",
) -> Layout:
    """The :class:`Layout` of a layer output of shape ``output_shape`` (batch first) on ``input_array``.

    Raises :class:`LayoutError` with the reason when the output cannot be
    placed on the input (no position axis, a rank that matches neither an
    image nor a sequence, tokens matching no patch grid).

    Example:
        >>> import numpy as np
        >>> image = np.zeros((1, 16, 16, 3), "float32")
        >>> layout_for((1, 17, 8), image, seen_grids=[(4, 4)]).kind
        'tokens'
        >>> layout_for((1, 4, 4, 8), image).kind
        'image'
    """
    extent = input_extent(input_array)
    rank = len(output_shape)
    where = f"Received: layer={layer_name!r} with output shape {tuple(output_shape)} for an input of shape "
    where += f"{tuple(input_array.shape)}."
    if rank < 3:
        raise LayoutError(
            f"CAM methods need a layer with positions: (N, h, w, C) for images, (N, t, C) for sequences "
            f"or transformer tokens. {where} Pick a convolutional, recurrent or token layer "
            "(see `kerascope.layers(model)`)."
        )
    if reshape is not None:
        if rank != 3 and len(extent) == 2 and rank != 4:
            raise LayoutError(f"`reshape` takes token outputs (N, T, C). {where}")
        return Layout("reshape", input_index, extent, reshape=reshape)
    if len(extent) == 2:  # an image input
        if rank == 4:
            return Layout("image", input_index, extent)
        if rank == 3:
            grid, prefix = token_grid(int(output_shape[1]), extent, seen_grids)
            return Layout("tokens", input_index, extent, grid=grid, prefix=prefix)
    elif rank == 3:  # a sequence input and a sequence of features
        return Layout("sequence", input_index, extent)
    raise LayoutError(
        f"The layer's output rank does not match the input: CAM maps need (N, h, w, C) for an image input "
        f"and (N, t, C) for a sequence input. {where} Pass `reshape=` to place its positions, or pick another layer."
    )


# --------------------------------------------------------------------------- default layer
def _inside_attention(model: keras.Layer) -> set[int]:
    """ids of the sub-layers of attention layers (their outputs are per-head projections)."""
    inside: set[int] = set()
    for _, layer in iter_layers(model):
        if _ATTENTION and isinstance(layer, _ATTENTION):
            inside.update(id(child) for _, child in iter_layers(layer))
    return inside


def _first(inputs: Inputs) -> list[np.ndarray]:
    return [a[:1] for a in inputs.arrays]


def _flat_numpy(outputs: Any) -> list[np.ndarray]:
    return [np.asarray(keras.ops.convert_to_numpy(o), np.float64) for o in keras.tree.flatten(outputs)]


def survey(model: keras.Layer, inputs: Inputs) -> list[tuple[keras.Layer, tuple[int, ...], np.ndarray]]:
    """One probed forward pass on the first sample: ``(layer, output shape, output)`` in call order.

    Only layers whose output is one tensor are listed; a layer called several
    times is listed at its last call.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(name="f")])
        >>> [(l.name, s) for l, s, _ in survey(m, Inputs(np.zeros((1, 4, 4, 1))))]
        [('c', (1, 2, 2, 2)), ('f', (1, 8))]
    """
    return _survey(model, inputs)[0]


def _survey(
    model: keras.Layer, inputs: Inputs
) -> tuple[list[tuple[keras.Layer, tuple[int, ...], np.ndarray]], Any, set[int]]:
    """:func:`survey`'s entries, the model's outputs of the same pass and the ids of the layers it called more
    than once (shared: a tied embedding, a block applied twice)."""
    order: list[tuple[keras.Layer, Any]] = []

    def note(_: int, layer: keras.Layer, output: Any) -> Any:
        if hasattr(output, "shape") and hasattr(output, "dtype"):
            order.append((layer, output))
        return output

    with probe([layer for _, layer in iter_layers(model)], note):
        outputs = model(fit_structure(model, inputs.model_arg(_first(inputs))), training=False)
    last = {id(layer): i for i, (layer, _) in enumerate(order)}
    entries = [
        (layer, tuple(int(d) for d in out.shape), np.asarray(keras.ops.convert_to_numpy(out)))
        for i, (layer, out) in enumerate(order) if last[id(layer)] == i
    ]
    shared = {id(layer) for i, (layer, _) in enumerate(order) if last[id(layer)] != i}
    return entries, outputs, shared


def output_softmax(
    model: keras.Layer, entries: Sequence[tuple[keras.Layer, tuple[int, ...], np.ndarray]], outputs: Any
) -> list[keras.Layer]:
    """The softmax layers whose output is the model's output, from a :func:`survey` pass and its outputs.

    :func:`feeds_prediction` makes them linear: a saturated softmax (a confident
    prediction, or an out-of-distribution input: ``[0, 0, 0, 1]`` exactly in float32)
    hides the change of the logits, so whether a layer feeds the prediction would
    depend on how saturated the sample is.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax", name="p")])
        >>> x = Inputs(np.ones((1, 3)))
        >>> [layer.name for layer in output_softmax(m, *_survey(m, x)[:2])]
        ['p']
    """
    candidates = softmax_candidates(model)
    recorded = {id(layer): [out] for layer, _, out in entries}
    return softmax_outputs(candidates, recorded, outputs)


def seen_grids(
    entries: Sequence[tuple[keras.Layer, tuple[int, ...], np.ndarray]], before: keras.Layer | None = None
) -> list[tuple[int, int]]:
    """The ``(h, w)`` grids of rank-4 outputs in a :func:`survey` (those called before ``before``), last first.

    Example:
        >>> import numpy as np
        >>> seen_grids([(None, (1, 4, 4, 8), None), (None, (1, 16, 8), None)])
        [(4, 4)]
    """
    grids = []
    for layer, shape, _ in entries:
        if before is not None and layer is before:
            break
        if len(shape) == 4 and shape[1] > 1 and shape[2] > 1:
            grids.append((shape[1], shape[2]))
    return list(dict.fromkeys(reversed(grids)))


def _dependent_on(model: keras.Layer, inputs: Inputs, index: int,
                  clean: list[tuple[keras.Layer, tuple[int, ...], np.ndarray]]) -> set[int]:
    """ids of the layers whose output changes when input ``index`` changes (one more forward pass)."""
    arrays = _first(inputs)
    value = arrays[index]
    rng = np.random.default_rng(0)
    if np.issubdtype(value.dtype, np.integer):
        changed = np.where(value > 0, value - 1, value + 1).astype(value.dtype)
    else:
        changed = (value + rng.normal(size=value.shape) * (float(np.std(value)) + 1.0)).astype(value.dtype)
    arrays[index] = changed
    perturbed = survey(model, Inputs(inputs.model_arg(arrays)))
    after = {id(layer): out for layer, _, out in perturbed}
    return {
        id(layer) for layer, _, out in clean
        if id(layer) in after and (after[id(layer)].shape != out.shape or not np.array_equal(after[id(layer)], out))
    }


def feeds_prediction(
    model: keras.Layer,
    inputs: Inputs,
    layer: keras.Layer,
    layout: Layout,
    select: Callable[[Any], Any] | None = None,
    bypass: Sequence[keras.Layer] = (),
) -> bool:
    """Whether changing ``layer``'s output at the positions on the input changes the explained output.

    One eager forward pass on the first sample with Gaussian noise (scaled to
    the output) added to the layer's output, except at dropped class tokens;
    ``select`` picks the explained output from the model's outputs (default:
    all of them). With a class-token classifier the patch tokens of the last
    block's output do not feed the prediction, so they are no CAM layer.
    The softmax layers in ``bypass`` are linear in both passes (see :func:`output_softmax`):
    the question is whether the layer feeds the logits, whatever the sample's confidence.

    Example:
        >>> import keras, numpy as np
        >>> c = keras.layers.Conv2D(2, 3, name="c")
        >>> m = keras.Sequential([keras.Input((5, 5, 1)), c, keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> x = Inputs(np.ones((1, 5, 5, 1)))
        >>> feeds_prediction(m, x, c, Layout("image", 0, (5, 5)))
        True
    """
    select = select or (lambda outputs: outputs)
    arrays = inputs.model_arg(_first(inputs))
    with bypass_softmax(list(bypass)):
        clean = _flat_numpy(select(model(fit_structure(model, arrays), training=False)))
    rng = np.random.default_rng(0)

    def perturb(_: int, __: keras.Layer, output: Any) -> Any:
        value = np.asarray(keras.ops.convert_to_numpy(output), np.float64)
        noise = rng.normal(size=value.shape) * (float(np.std(value)) + 1.0)
        if value.ndim >= 2:
            noise *= layout.mask_positions(value.shape[1:2]).reshape((1, -1) + (1,) * (value.ndim - 2))
        return output + keras.ops.cast(keras.ops.convert_to_tensor(noise), output.dtype)

    with bypass_softmax(list(bypass)), probe([layer], perturb):
        changed = _flat_numpy(select(model(fit_structure(model, arrays), training=False)))
    return any(
        a.shape != b.shape or np.max(np.abs(a - b), initial=0.0) > 1e-6 * (np.max(np.abs(a), initial=0.0) + 1e-12)
        for a, b in zip(clean, changed)
    )


def _spatial(shape: tuple[int, ...], extent: tuple[int, ...]) -> bool:
    """A rank-4 output on an image keeps an extent > 1 on both axes, roughly the input's aspect ratio."""
    if len(extent) != 2 or len(shape) != 4 or shape[1] < 2 or shape[2] < 2:
        return False
    ratio = (shape[1] / extent[0]) / (shape[2] / extent[1])
    return abs(math.log(ratio)) <= math.log(2.0)


#: padding layers: their output has positions (the added border) that are not on the input
_PADDING = (keras.layers.ZeroPadding1D, keras.layers.ZeroPadding2D, keras.layers.ZeroPadding3D)


def default_layer(
    model: keras.Layer,
    inputs: Inputs,
    input_index: int = 0,
    *,
    select: Callable[[Any], Any] | None = None,
) -> keras.Layer:
    """The default CAM layer for the input at ``input_index``.

    The last layer called in the forward pass whose output

    - has positions on the input: a feature map ``(N, h, w, C)`` with ``h, w > 1``
      (and about the input's aspect ratio) for an image input, tokens ``(N, T, C)``
      on a patch grid (:func:`token_grid`) of an image input, or ``(N, t, C)`` with
      ``t > 1`` for a sequence input;
    - is called once per forward pass (a shared layer, such as GPT-2's tied embedding that also computes
      the logits, would need a ``call_index``: pass ``layer=`` and ``call_index=`` for one);
    - is not inside an attention layer (no ``mha/value``) and is no zero-padding layer (its added
      border rows lie outside the input, so a padded map stretched over the input is shifted:
      MobileNetV3Small at 32 px would get ``expanded_conv_8_depthwise_pad``, 3 x 3 for a 2 x 2 stage);
    - depends on that input (checked when the model has several inputs);
    - feeds the prediction at those positions (:func:`feeds_prediction`): a
      transformer classifying its class token gets the input of its last
      attention block (the normalised tokens, as pytorch-grad-cam's
      ``blocks[-1].norm1``), one pooling all tokens gets its last block's output.
      The final softmax is made linear for this check (:func:`output_softmax`), so a
      saturated sample gets the same layer as any other.

    Found with eager forward passes on one sample, so subclassed and nested
    models work too. Raises a ``ValueError`` when no layer qualifies.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(keepdims=True),
        ...                       keras.layers.Conv2D(2, 1, name="logits"), keras.layers.Flatten()])
        >>> default_layer(m, Inputs(np.zeros((1, 8, 8, 1)))).name
        'c'
    """
    array = inputs.arrays[input_index]
    extent = input_extent(array)
    entries, outputs, shared = _survey(model, inputs)
    bypass = output_softmax(model, entries, outputs)
    excluded = _inside_attention(model)
    candidates = []
    for position, (layer, shape, _) in enumerate(entries):
        if id(layer) in excluded or id(layer) in shared or layer is model or isinstance(layer, _PADDING):
            continue  # (a shared layer, e.g. a tied embedding, would need a `call_index` the user never gave)
        if len(extent) == 2 and _spatial(shape, extent):
            candidates.append((layer, Layout("image", input_index, extent)))
        elif len(shape) == 3 and shape[1] > 1:
            try:
                layout = layout_for(shape, array, input_index, seen_grids=seen_grids(entries[:position]))
            except LayoutError:
                continue
            candidates.append((layer, layout))
    dependent = _dependent_on(model, inputs, input_index, entries) if len(inputs.arrays) > 1 else None
    for layer, layout in reversed(candidates):
        if dependent is not None and id(layer) not in dependent:
            continue
        if feeds_prediction(model, inputs, layer, layout, select, bypass):
            return layer
    kind = "an image (N, h, w, C) feature map with h, w > 1 or patch tokens" if len(extent) == 2 else (
        "a sequence (N, t, C) with t > 1")
    tabular = array.ndim == 2 and np.issubdtype(array.dtype, np.floating)
    advice = (
        " A tabular input (N, F) through Dense layers has no positions for a class-activation map: use "
        "Saliency, IntegratedGradients, DeepLIFT, KernelSHAP or FeatureAblation (one value per feature)."
        if tabular else " Pass `layer=` (see `kerascope.layers(model)`), or use a gradient or perturbation method."
    )
    raise LayoutError(
        f"Could not find a CAM layer in model {model.name!r} for input {input_index} of shape {array.shape}: "
        f"no layer output is {kind} that feeds the prediction. Received: layer=None.{advice}"
    )


__all__ = [
    "Layout", "LayoutError", "candidate_grids", "choose_input", "default_layer", "feeds_prediction",
    "input_extent", "input_names", "is_image", "layout_for", "output_softmax", "seen_grids", "survey", "token_grid",
]
