"""Token attributions for classifiers and any model that reads token ids: ``explain_tokens``.

A gradient method runs at the token embedding (the output of the layer that
turns ids into vectors), so only the tokens are attributed: the padding mask
and the segment ids of a KerasHub model's dict inputs are held as they are.
Each token's value is the sum over the embedding dimension (or its L2 norm);
padded positions are exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope.language.embedding import (
    TOKEN_KEYS,
    check_ids,
    token_embedding,
    token_strings,
    tokenizer_of,
    vocabulary_size,
)
from kerascope.language.reduce import reduce_embedding
from kerascope.methods.coalitions import FeatureMaskMethod


def _pad_id(tokenizer: object) -> int:
    """The tokenizer's pad id (or 0): what an absent token becomes in the perturbation methods."""
    for name in ("pad_token_id", "padding_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, (int, np.integer)):
            return int(value)
    return 0


@dataclass
class TokenExplanation:
    """Per-token attributions ``(N, T)`` with the token ids, scores and targets of the explained samples."""

    attributions: np.ndarray
    token_ids: np.ndarray
    scores: np.ndarray
    targets: np.ndarray
    method: str
    tokens: list[list[str]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        from kerascope.language.html import token_html

        parts = []
        for i, ids in enumerate(self.token_ids):
            labels = self.tokens[i] if self.tokens is not None else [str(int(t)) for t in ids]
            parts.append(f"<div>sample {i}, target {int(self.targets[i])}:</div>"
                         + token_html(labels, self.attributions[i]))
        return "".join(parts)

    def save_png(self, path: Any, sample: int = 0, dpi: int = 100) -> Any:
        """Save one sample's token heatmap (coloured text backgrounds, colour bar) as PNG; returns the path.

        See :func:`kerascope.viz.tokens.save_token_png`.
        """
        from kerascope.viz.tokens import save_token_png

        return save_token_png(self, path, what="tokens", sample=sample, dpi=dpi)


def _token_ids_and_mask(inputs: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(inputs, dict):
        key = next((k for k in TOKEN_KEYS if k in inputs), None)
        if key is None:
            raise ValueError(
                f"Token attributions read the token ids from the input 'token_ids'. Received: inputs with keys "
                f"{sorted(inputs)}. Pass KerasHub's dict (token_ids, padding_mask, ...) or one array of token ids."
            )
        ids = np.asarray(inputs[key])
        mask = np.asarray(inputs.get("padding_mask", np.ones_like(ids))).astype(bool)
        return ids, mask
    ids = np.asarray(inputs)
    return ids, np.ones(ids.shape, bool)


def explain_tokens(
    model: keras.Model,
    inputs: Any,
    targets: Any = None,
    method: Any = "integrated_gradients",
    layer: Any = None,
    reduce: str = "sum",
    **params: Any,
) -> TokenExplanation:
    """Attribute a token model's output to its input tokens with a gradient method at the token embedding.

    Args:
        model: a model reading token ids: a KerasHub ``TextClassifier`` (dict
            inputs ``token_ids``, ``padding_mask``, ``segment_ids``) or any Keras
            model with an ``Embedding``.
        inputs: token ids ``(N, T)``, or KerasHub's dict of them (strings are
            tokenized by the model's preprocessor when it has one).
        targets: as for every method (an int class, a list, None, a callable;
            ``ks.targets.position`` on per-token outputs).
        method: a gradient method (``"integrated_gradients"`` default,
            ``"saliency"``, ``"gradient_x_input"``, ``"smoothgrad"``, ...), run at
            the embedding with its parameters in ``**params``.
        layer: the token embedding; found by default (a KerasHub backbone's
            ``token_embedding``, else the ``Embedding`` with the largest
            vocabulary; a tied embedding is read at its first call).
        reduce: ``"sum"`` over the embedding dimension (signed; keeps IG's
            completeness) or ``"norm"`` (L2, unsigned).
        **params: the method's parameters. The perturbation / Shapley methods
            (``"feature_ablation"``, ``"shapley_sampling"``, ``"kernel_shap"``,
            ``"lime"``, ``"shapley_exact"``) play their game over the tokens only
            (masks and segment ids held), replacing an absent token by
            ``baseline_token`` (default: the tokenizer's pad id, else 0).

    Returns:
        :class:`TokenExplanation` with ``attributions`` of shape ``(N, T)``
        (exactly 0 where ``padding_mask`` is 0).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> keras.utils.set_random_seed(0)
        >>> m = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(30, 4),
        ...                       keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
        >>> e = ks.explain_tokens(m, np.array([[1, 2, 3, 4, 5]]), targets=1, steps=16)
        >>> e.attributions.shape, bool(abs(e.extras["completeness_error"][0]) < 1e-4)
        ((1, 5), True)
    """
    from kerascope.methods import registry

    if isinstance(inputs, (str, list)) and (isinstance(inputs, str) or (inputs and isinstance(inputs[0], str))):
        preprocessor = getattr(model, "preprocessor", None)
        if preprocessor is None:
            raise ValueError(
                f"Text inputs need the model's preprocessor, and model {model.name!r} has none. Received: "
                f"inputs={inputs!r}. Pass token ids (or KerasHub's dict of them)."
            )
        inputs = preprocessor([inputs] if isinstance(inputs, str) else inputs)
        inputs = inputs[0] if isinstance(inputs, tuple) else inputs
        inputs = {k: np.asarray(v) for k, v in inputs.items()}
    embedding, call_index = token_embedding(model, layer)
    ids, mask = _token_ids_and_mask(inputs)
    check_ids(ids, vocabulary_size(model, embedding))
    cls = registry.get(method) if isinstance(method, str) else method
    if isinstance(cls, type) and issubclass(cls, FeatureMaskMethod):  # a game over the tokens only
        baseline = params.pop("baseline_token", None)
        if baseline is None:
            baseline = _pad_id(tokenizer_of(model))
        chosen = {"input_index": "token_ids"} if isinstance(inputs, dict) else {}
        explainer = registry.build(cls, model, {**chosen, "baseline": float(baseline), **params})
        explanation = explainer.explain(inputs, targets)
        found = explanation.attributions
        found = found["token_ids"] if isinstance(found, dict) else found
        per_token = np.asarray(found[0] if isinstance(found, list) else found, np.float32)
    else:
        if "baseline_token" in params:
            raise ValueError(
                "`baseline_token` is the token that replaces absent tokens in the perturbation methods "
                f"(feature_ablation, shapley_sampling, kernel_shap, lime, shapley_exact). Received: method={method!r}; "
                "for gradient methods at the embedding pass `baseline=` (e.g. np.zeros_like(token_ids): the pad "
                "token's embedding)."
            )
        explainer = registry.build(method, model, {"layer": embedding, "call_index": call_index, **params})
        explanation = explainer.explain(inputs, targets)
        per_token = reduce_embedding(explanation.attributions, reduce)
    if per_token.shape != ids.shape:
        raise ValueError(
            f"The layer's output has {per_token.shape[1:]} positions where the inputs have {ids.shape[1:]} tokens: it "
            f"is not the token embedding. Received: layer={getattr(embedding, 'name', embedding)!r}. Pass the layer "
            "that turns the token ids into vectors."
        )
    tokenizer = tokenizer_of(model)
    strings = token_strings(tokenizer, ids)
    return TokenExplanation(
        attributions=np.where(mask, per_token, 0.0).astype(np.float32),
        token_ids=ids,
        scores=np.asarray(explanation.scores),
        targets=np.asarray(explanation.targets),
        method=explanation.method,
        tokens=None if strings is None else [strings[i * ids.shape[1]:(i + 1) * ids.shape[1]]
                                             for i in range(ids.shape[0])],
        params={**explanation.params, "reduce": reduce},
        extras={k: np.asarray(v) for k, v in (explanation.extras or {}).items()},
    )
