"""Where a language model's tokens enter: its token embedding, and its inputs.

A KerasHub task (``GPT2CausalLM``, ``BertTextClassifier``, ...) keeps the token
embedding as ``backbone.token_embedding``; any other model's token embedding is
its ``keras.layers.Embedding`` with the largest vocabulary. GPT-2's embedding is
*tied*: the same layer also turns the last hidden states into logits (a second
call); the token embedding is its first call, read with ``call_index=0``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from kerascope.core.layers import find_layer, iter_layers

TOKEN_KEYS = ("token_ids",)
"""Input names that hold token ids (KerasHub's convention); other inputs (masks, segment ids) are held."""


class NoTokenEmbeddingError(ValueError):
    """The model has no layer that turns token ids into vectors, and ``layer=`` did not name one."""


def backbone_of(model: keras.Model) -> keras.Model | None:
    """A KerasHub task's backbone (``model.backbone``), or None for other models.

    Example:
        >>> import keras
        >>> backbone_of(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])) is None
        True
    """
    backbone = getattr(model, "backbone", None)
    return backbone if isinstance(backbone, keras.Model) else None


def token_embedding(model: keras.Model, layer: Any = None) -> tuple[keras.Layer, int]:
    """``(layer, call_index)``: the layer whose output is each token's vector, and which call of it.

    ``layer=`` (a name, a path or a layer) overrides the search. ``call_index`` is
    0 (the embedding call, the first) for a tied embedding called again for the
    logits, else 0 as well: the first call is the one that reads the token ids.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(50, 8, name="tok"),
        ...                       keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
        >>> token_embedding(m)[0].name
        'tok'
    """
    if layer is not None:
        found = layer if isinstance(layer, keras.Layer) else find_layer(model, layer)
        return found, 0
    backbone = backbone_of(model)
    found = getattr(backbone, "token_embedding", None) if backbone is not None else None
    if isinstance(found, keras.Layer):
        return found, 0
    embeddings = [candidate for _, candidate in iter_layers(model) if isinstance(candidate, keras.layers.Embedding)]
    if not embeddings:
        kinds = sorted({type(candidate).__name__ for _, candidate in iter_layers(model)})
        raise NoTokenEmbeddingError(
            f"Model {model.name!r} has no token embedding (no `keras.layers.Embedding` and no KerasHub "
            f"`backbone.token_embedding`), so there is nothing to attribute tokens at. Received: layer=None; "
            f"the model's layer types: {kinds[:12]}. Pass `layer=` naming the layer whose output holds one "
            "vector per token (list them with `kerascope.layers(model)`), or explain the model's inputs directly "
            "(e.g. `ks.Saliency(model)`) if they are not token ids."
        )
    return max(embeddings, key=lambda candidate: int(candidate.input_dim)), 0


def vocabulary_size(model: keras.Model, embedding: keras.Layer) -> int | None:
    """The number of token ids the model accepts (the embedding's ``input_dim``), or None if unknown.

    Example:
        >>> import keras
        >>> vocabulary_size(None, keras.layers.Embedding(50, 8))
        50
    """
    size = getattr(embedding, "input_dim", None)
    return int(size) if size is not None else None


def max_length(model: keras.Model) -> int | None:
    """The longest sequence the model takes (a KerasHub backbone's ``max_sequence_length``, a fixed input length).

    Example:
        >>> import keras
        >>> max_length(keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(9, 2)]))
        6
    """
    backbone = backbone_of(model)
    for owner in (backbone, model):
        value = getattr(owner, "max_sequence_length", None) if owner is not None else None
        if isinstance(value, (int, np.integer)):
            return int(value)
    try:
        spec = model.input
    except (AttributeError, ValueError):
        spec = (getattr(model, "inputs", None) or [None])[0]
    if isinstance(spec, dict):
        spec = spec.get("token_ids")
    elif isinstance(spec, (list, tuple)):
        spec = spec[0] if spec else None
    shape = getattr(spec, "shape", None)
    length = shape[1] if shape is not None and len(shape) >= 2 else None
    return int(length) if length is not None else None


def check_ids(ids: np.ndarray, vocab: int | None, what: str = "token id") -> np.ndarray:
    """Token ids as int32, refusing non-integers and ids outside ``[0, vocab)``.

    Example:
        >>> check_ids(np.array([1, 2]), 5).tolist()
        [1, 2]
        >>> check_ids(np.array([1, 7]), 5)
        Traceback (most recent call last):
        ...
        ValueError: A token id is outside the model's vocabulary of 5 ids (0..4). Received: token ids [7]. Check the tokenizer matches the model (its vocabulary size) or build the model with a larger `vocabulary_size`.
    """
    ids = np.asarray(ids)
    if ids.dtype == object or not (np.issubdtype(ids.dtype, np.integer) or (
            np.issubdtype(ids.dtype, np.floating) and np.all(ids == np.round(ids)))):
        raise TypeError(f"A {what} must be an int. Received: an array of dtype {ids.dtype}.")
    bad = ids[(ids < 0) | (ids >= (vocab if vocab is not None else np.iinfo(np.int32).max))]
    if bad.size:
        shown = sorted({int(v) for v in bad.ravel()})[:10]
        span = f"{vocab} ids (0..{vocab - 1})" if vocab is not None else "ids >= 0"
        raise ValueError(
            f"A token id is outside the model's vocabulary of {span}. Received: token ids {shown}. Check the "
            "tokenizer matches the model (its vocabulary size) or build the model with a larger `vocabulary_size`."
        )
    return ids.astype(np.int32)


def tokenizer_of(model: keras.Model, tokenizer: Any = None) -> Any:
    """The tokenizer given, else the one of the model's KerasHub preprocessor, else None.

    Example:
        >>> import keras
        >>> tokenizer_of(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])) is None
        True
    """
    if tokenizer is not None:
        return tokenizer
    preprocessor = getattr(model, "preprocessor", None)
    return getattr(preprocessor, "tokenizer", None)


def token_strings(tokenizer: Any, ids: np.ndarray) -> list[str] | None:
    """Each id's string through ``tokenizer.id_to_token`` (None without a tokenizer).

    Example:
        >>> token_strings(None, np.array([1])) is None
        True
    """
    if tokenizer is None or not hasattr(tokenizer, "id_to_token"):
        return None
    return [str(tokenizer.id_to_token(int(i))) for i in np.asarray(ids).ravel()]


def tokenize(tokenizer: Any, text: str, model: keras.Model) -> np.ndarray:
    """``text`` as a 1-D array of token ids, or a clear refusal without a tokenizer.

    Example:
        >>> import keras
        >>> tokenize(None, "hi", keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="m"))
        Traceback (most recent call last):
        ...
        ValueError: A string prompt needs a tokenizer, and model 'm' has no KerasHub preprocessor with one. Received: prompt='hi'. Pass `tokenizer=` (e.g. `keras_hub.models.GPT2Tokenizer.from_preset(...)`) or the token ids as a 1-D array.
    """
    if tokenizer is None:
        raise ValueError(
            f"A string prompt needs a tokenizer, and model {model.name!r} has no KerasHub preprocessor with one. "
            f"Received: prompt={text!r}. Pass `tokenizer=` (e.g. `keras_hub.models.GPT2Tokenizer.from_preset(...)`) "
            "or the token ids as a 1-D array."
        )
    ids = tokenizer(text)
    return np.asarray(ids).reshape(-1)
