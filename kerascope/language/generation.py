"""Which prompt tokens made a language model write its continuation: ``explain_generation``.

Teacher forcing: the prompt and the continuation form one sequence, and one
forward pass of it gives the log-probability of every continuation token
``log p(c_j | prompt, c_<j)``. Each row ``j`` is one sample of a batch (the
sequence repeated, the row's position and token as extra inputs), so a gradient
method folds rows x its own steps into the batch axis and runs them
``batch_size`` at a time: never one pass per generated token.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope.core.diagnostics import check_explanation
from kerascope.language.embedding import (
    backbone_of,
    check_ids,
    max_length,
    token_embedding,
    token_strings,
    tokenize,
    tokenizer_of,
    vocabulary_size,
)
from kerascope.language.reduce import reduce_embedding
from kerascope.language.segments import (
    PERTURBATIONS,
    coalitions,
    perturbed_sequences,
    segment_labels,
    segment_values,
)

ROW_KEYS = ("kerascope_position", "kerascope_token")


class LogProbModel(keras.Model):
    """``log p(token | sequence up to position)`` of a causal LM, one scalar per sample: ``(N, 1)``.

    A view of the user's model (its layers and weights, never changed): the
    model's own inputs plus ``kerascope_position`` (where the next-token logits
    are read) and ``kerascope_token`` (which token's log-probability).

    Example:
        >>> import keras, numpy as np
        >>> lm = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(9, 4),
        ...                        keras.layers.Dense(9)])
        >>> view = LogProbModel(lm)
        >>> x = {"token_ids": np.array([[1, 2, 3, 4]]), "kerascope_position": np.array([1]),
        ...      "kerascope_token": np.array([3])}
        >>> logits = np.asarray(lm(x["token_ids"]))[0, 1]
        >>> want = logits[3] - np.log(np.exp(logits).sum())
        >>> bool(np.isclose(float(np.asarray(view(x))[0, 0]), want, atol=1e-5))
        True
    """

    def __init__(self, lm: keras.Model, **kwargs: Any) -> None:
        super().__init__(name=f"log_prob_of_{lm.name}", **kwargs)
        self.lm = lm
        self.takes_dict = isinstance(getattr(lm, "input", None), dict) or backbone_of(lm) is not None

    def call(self, inputs: dict[str, Any]) -> Any:
        own = {k: keras.ops.cast(v, "int32") for k, v in inputs.items() if k not in ROW_KEYS}
        logits = self.lm(own if self.takes_dict else own["token_ids"], training=False)
        if isinstance(logits, dict):
            logits = logits.get("logits", next(iter(logits.values())))
        position = keras.ops.cast(inputs["kerascope_position"], "int32")
        token = keras.ops.cast(inputs["kerascope_token"], "int32")
        at = keras.ops.take_along_axis(logits, keras.ops.reshape(position, (-1, 1, 1)), axis=1)[:, 0]
        log_probs = keras.ops.log_softmax(keras.ops.cast(at, "float32"), axis=-1)
        return keras.ops.take_along_axis(log_probs, keras.ops.reshape(token, (-1, 1)), axis=1)


_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_VIEWS_LOCK = threading.Lock()


def log_prob_model(lm: keras.Model) -> LogProbModel:
    """One :class:`LogProbModel` per user model, so its compiled functions are reused across calls."""
    with _VIEWS_LOCK:
        view = _VIEWS.get(lm)
        if view is None:
            view = LogProbModel(lm)
            _VIEWS[lm] = view
        return view


@dataclass
class GenerationExplanation:
    """The attribution of a continuation to the tokens before it.

    ``token_attributions[j, i]``: token ``i``'s part in ``log p(c_j | prompt, c_<j)``
    (zero for ``i >= len(prompt_ids) + j``); ``attributions[i]``: its part in the
    whole continuation's log-probability (the rows' sum). ``tokens`` are the
    strings of ``token_ids`` when a tokenizer is known.
    """

    token_attributions: np.ndarray
    attributions: np.ndarray
    token_ids: np.ndarray
    prompt_ids: np.ndarray
    continuation_ids: np.ndarray
    log_probs: np.ndarray
    tokens: list[str] | None
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def log_prob(self) -> float:
        """The continuation's log-probability given the prompt (the sum of ``log_probs``)."""
        return float(np.sum(self.log_probs))

    @property
    def prompt_length(self) -> int:
        return int(len(self.prompt_ids))

    def _repr_html_(self) -> str:
        from kerascope.language.html import matrix_html, token_html

        labels = self.tokens if self.tokens is not None else [str(int(i)) for i in self.token_ids]
        start = self.prompt_length
        return (
            f"<div><b>{self.method}</b>: the continuation's log-probability {self.log_prob:.4g} per token</div>"
            + token_html(labels, self.attributions, what="the continuation's log-probability")
            + matrix_html(labels[start:], labels, self.token_attributions, start)
        )

    def save_png(self, path: Any, what: str = "matrix", dpi: int = 100) -> Any:
        """Save the generated x earlier token matrix (``what="matrix"``) or the token heatmap (``"tokens"``).

        See :func:`kerascope.viz.tokens.save_token_png`; returns the path.
        """
        from kerascope.viz.tokens import save_token_png

        return save_token_png(self, path, what=what, dpi=dpi)


def _prompt_ids(model: keras.Model, prompt: Any, tokenizer: Any) -> np.ndarray:
    if isinstance(prompt, str):
        return tokenize(tokenizer, prompt, model)
    if isinstance(prompt, dict):
        if "token_ids" not in prompt:
            raise ValueError(
                f"A dict prompt holds KerasHub's inputs for one prompt. Received: keys {sorted(prompt)}. "
                "Expected: 'token_ids' (and optionally 'padding_mask')."
            )
        ids = np.asarray(prompt["token_ids"])
        mask = np.asarray(prompt.get("padding_mask", np.ones_like(ids))).astype(bool)
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids, mask = ids[0], mask.reshape(ids.shape)[0]
        if ids.ndim != 1 or mask.shape != ids.shape:
            raise ValueError(
                f"explain_generation takes one prompt. Received: token_ids of shape {ids.shape} and padding_mask "
                f"of shape {mask.shape}. Explain several prompts one call each."
            )
        return ids[mask]
    ids = np.asarray(prompt)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1:
        raise ValueError(
            f"`prompt` must be a string, a 1-D array of token ids or KerasHub's dict for one prompt. Received: an "
            f"array of shape {ids.shape}. Explain several prompts one call each."
        )
    return ids


def _model_inputs(view: LogProbModel, sequences: np.ndarray, length: int | None) -> dict[str, np.ndarray]:
    """The model's inputs for sequences of equal length (right-padded to a fixed input length)."""
    n, size = sequences.shape
    if length is not None and not view.takes_dict and size < length:  # a fixed-length causal model: pad after
        sequences = np.concatenate([sequences, np.zeros((n, length - size), sequences.dtype)], axis=1)
    inputs = {"token_ids": sequences}
    if view.takes_dict:
        inputs["padding_mask"] = np.ones_like(sequences)
    return inputs


def _generate(view: LogProbModel, prompt: np.ndarray, steps: int, stop: int | None) -> np.ndarray:
    """Greedy continuation: the most likely next token, ``steps`` times (stops after ``stop``)."""
    from kerascope.core.engine import engine_for

    engine = engine_for(view.lm)
    length = len(prompt) + steps
    fixed = _fixed_length(view.lm)
    buffer = np.zeros((1, max(length, fixed or 0)), np.int32)
    buffer[0, : len(prompt)] = prompt
    out = []
    for step in range(steps):  # one forward per new token: generating is sequential, attributing is not
        current = len(prompt) + step
        inputs = {"token_ids": buffer} if view.takes_dict else buffer
        if view.takes_dict:
            inputs["padding_mask"] = (np.arange(buffer.shape[1]) < current)[None].astype(np.int32)
        logits = engine.forward(inputs, batch_size=1)
        logits = logits.get("logits", next(iter(logits.values()))) if isinstance(logits, dict) else logits
        token = int(np.argmax(np.asarray(logits)[0, current - 1]))
        buffer[0, current] = token
        out.append(token)
        if stop is not None and token == stop:
            break
    return np.asarray(out, np.int32)


def _fixed_length(lm: keras.Model) -> int | None:
    if backbone_of(lm) is not None:
        return None
    return max_length(lm)


def explain_generation(
    model: keras.Model,
    prompt: Any,
    continuation: Any = None,
    method: Any = "integrated_gradients",
    layer: Any = None,
    max_new_tokens: int = 16,
    **params: Any,
) -> GenerationExplanation:
    """Attribute each continuation token's log-probability to the prompt and earlier continuation tokens.

    Args:
        model: a causal language model: a KerasHub ``CausalLM`` (dict inputs
            ``token_ids`` / ``padding_mask``) or any Keras model mapping token ids
            ``(N, T)`` to next-token logits ``(N, T, V)``.
        prompt: a string (tokenized by ``tokenizer=`` or the model's preprocessor),
            a 1-D array of token ids, or KerasHub's dict for one prompt (padded
            positions dropped).
        continuation: the tokens to explain (a string or 1-D ids); ``None``
            generates ``max_new_tokens`` greedily (stopping at the tokenizer's end
            token).
        method: a gradient method run at the token embedding
            (``"integrated_gradients"``, ``"saliency"``, ``"gradient_x_input"``,
            ``"smoothgrad"``, ... or a Method class), or ``"feature_ablation"`` /
            ``"shapley_sampling"`` over prompt segments (``segments=None``: tokens,
            ``"words"``, or ``(start, end)`` spans; ``baseline_token=`` replaces a
            segment's tokens; ``samples=``, ``seed=`` for Shapley sampling).
        layer: the token embedding (found by default: a KerasHub backbone's
            ``token_embedding``, else the largest ``Embedding``; a tied embedding is
            read at its first call).
        max_new_tokens: tokens generated when ``continuation`` is None.
        **params: the method's parameters (``steps``, ``batch_size``, ...), plus
            ``tokenizer=``, ``reduce="sum"`` (per token: the sum over the
            embedding dimension) or ``"norm"`` (its L2 norm, unsigned), and
            ``baseline_token=`` (IG family: the path starts at this token's
            embedding at every position instead of zeros; needed where a
            normalisation follows the embedding, as Gemma's RMSNorm, whose
            output jumps at zero: a ``RuntimeWarning`` says so when a row misses
            completeness by more than 1%).

    Returns:
        A :class:`GenerationExplanation`: ``token_attributions`` of shape
        ``(continuation tokens, prompt + continuation tokens)``, ``attributions``
        (the whole continuation's log-probability per token), ``log_probs``,
        ``token_ids`` / ``tokens``, ``continuation_ids``, ``extras`` (the method's,
        per row, e.g. IG's ``completeness_error``).

    Cost: ``continuation tokens x method passes`` samples, ``batch_size`` at a time
    (IG: ``steps`` passes per row), in up to 8 groups of consecutive rows (at least
    4 rows each), each on the sequence cut after its last row's prefix (a causal
    model's row reads nothing later); a new prompt length compiles once per group.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> keras.utils.set_random_seed(0)
        >>> lm = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(20, 8),
        ...                        keras.layers.Dense(20)])
        >>> g = ks.explain_generation(lm, np.array([3, 5, 7]), max_new_tokens=2, steps=8)
        >>> g.token_attributions.shape, g.continuation_ids.shape
        ((2, 5), (2,))
    """
    from kerascope.methods import registry

    tokenizer = tokenizer_of(model, params.pop("tokenizer", None))
    reduce = params.pop("reduce", "sum")
    baseline_token = params.pop("baseline_token", None)
    segments = params.pop("segments", None)
    name = registry.get(method).name if isinstance(method, str) else getattr(method, "name", None)
    if segments is not None and name not in PERTURBATIONS:
        raise ValueError(f"`segments` are played over by {PERTURBATIONS}. Received: method={method!r}.")
    embedding, call_index = token_embedding(model, layer)
    vocab = vocabulary_size(model, embedding)
    prompt_ids = check_ids(_prompt_ids(model, prompt, tokenizer), vocab, "prompt token id")
    if len(prompt_ids) == 0:
        raise ValueError("The prompt is empty. Received: no tokens. The first continuation token needs a prompt.")
    limit = max_length(model)
    view = log_prob_model(model)
    if continuation is None:
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be an int >= 1. Received: max_new_tokens={max_new_tokens!r}.")
        _check_length(limit, len(prompt_ids), int(max_new_tokens), "max_new_tokens")
        stop = getattr(tokenizer, "end_token_id", None)
        continuation_ids = _generate(view, prompt_ids, int(max_new_tokens), stop)
    else:
        raw = tokenize(tokenizer, continuation, model) if isinstance(continuation, str) else np.asarray(continuation)
        continuation_ids = check_ids(raw.reshape(-1), vocab, "continuation token id")
        if len(continuation_ids) == 0:
            raise ValueError("The continuation is empty. Received: no tokens. Pass continuation=None to generate.")
        _check_length(limit, len(prompt_ids), len(continuation_ids), "continuation")
    sequence = np.concatenate([prompt_ids, continuation_ids]).astype(np.int32)
    rows, size, start = len(continuation_ids), len(sequence), len(prompt_ids)
    if name in PERTURBATIONS:
        return _by_segments(view, name, sequence, prompt_ids, continuation_ids, segments, baseline_token,
                            tokenizer, vocab, params)
    filler = None if baseline_token is None else check_ids(np.asarray([baseline_token]), vocab, "baseline_token")[0]
    parts, explainer = [], None
    groups = _row_groups(rows, _fixed_length(model))
    for group in groups:
        length = start + int(group[-1])  # causal: row j reads the tokens before position start + j only
        inputs = _model_inputs(view, np.repeat(sequence[None, :length], len(group), axis=0), _fixed_length(model))
        inputs["kerascope_position"] = (start - 1 + group).astype(np.int32)
        inputs["kerascope_token"] = continuation_ids[group].astype(np.int32)
        given = dict(params)
        if filler is not None:  # the path starts at this token's embedding, at every position
            given["baseline"] = {**inputs, "token_ids": np.full_like(inputs["token_ids"], filler)}
        explainer = registry.build(method, view, {"layer": embedding, "call_index": call_index, **given})
        parts.append(explainer._explain_unchecked(inputs, 0))
    explanation = _merged(parts)
    check_explanation(explanation, explainer)  # once, row numbers of the whole continuation
    _check_completeness(explanation, baseline_token)
    per_token = reduce_embedding(explanation.attributions, reduce)[:, :size]
    per_token = np.pad(per_token, [(0, 0), (0, size - per_token.shape[1])])  # (the last token: read by no row)
    later = np.arange(size)[None, :] >= (start + np.arange(rows))[:, None]
    per_token = np.where(later, 0.0, per_token).astype(np.float32)  # causal: exactly 0, not float dust
    return GenerationExplanation(
        token_attributions=per_token,
        attributions=per_token.sum(axis=0),
        token_ids=sequence,
        prompt_ids=prompt_ids,
        continuation_ids=continuation_ids,
        log_probs=np.asarray(explanation.scores, np.float32),
        tokens=token_strings(tokenizer, sequence),
        method=explanation.method,
        params={**explanation.params, "reduce": reduce},
        extras={k: np.asarray(v) for k, v in (explanation.extras or {}).items()},
    )


#: at most this many groups of consecutive rows (of at least ``_GROUP_ROWS`` rows each), each explained on the
#: sequence cut after its last row's prefix (a causal model's row j reads only the tokens before its position):
#: fewer token-passes (tiny GPT-2, 32 + 32 tokens: ~30% less time) for a few more compiled shapes
_GROUPS, _GROUP_ROWS = 8, 4


def _row_groups(rows: int, fixed: int | None) -> list[np.ndarray]:
    """Consecutive row indices per group: one group for a fixed-length model (padded anyway) or few rows."""
    count = 1 if fixed is not None else max(1, min(_GROUPS, rows // _GROUP_ROWS))
    return np.array_split(np.arange(rows), count)


def _merged(parts: list[Any]) -> Any:
    """The groups' explanations as one: per-row arrays concatenated, zero-padded along the cut sequence
    (the positions a group did not read), anything else as the first group has it."""
    if len(parts) == 1:
        return parts[0]
    sizes = [len(np.asarray(p.scores)) for p in parts]

    def joined(values: list[Any]) -> Any:
        arrays = [np.asarray(v) for v in values]
        if not all(a.ndim >= 1 and len(a) == n for a, n in zip(arrays, sizes, strict=True)):
            return values[0]
        widest = np.max([a.shape for a in arrays], axis=0)
        return np.concatenate([np.pad(a, [(0, 0)] + [(0, int(w) - d) for w, d in zip(widest[1:], a.shape[1:],
                                                                                      strict=True)])
                               for a in arrays])

    extras = {key: joined([p.extras[key] for p in parts]) for key in (parts[0].extras or {})}
    return dataclasses.replace(parts[0], attributions=joined([p.attributions for p in parts]),
                               scores=joined([p.scores for p in parts]), targets=joined([p.targets for p in parts]),
                               extras=extras)


def _by_segments(view: LogProbModel, name: str, sequence: np.ndarray, prompt_ids: np.ndarray,
                 continuation_ids: np.ndarray, segments: Any, baseline_token: Any, tokenizer: Any, vocab: int | None,
                 params: dict[str, Any]) -> GenerationExplanation:
    """Ablation / Shapley sampling over prompt segments: every coalition x row scored in one batched pass."""
    from kerascope.core.engine import engine_for
    from kerascope.language.tokens import _pad_id

    batch_size = params.pop("batch_size", 32)
    samples, seed = params.pop("samples", 25), params.pop("seed", 0)
    if params:
        raise ValueError(f"Unknown parameters for {name} over prompt segments. Received: {sorted(params)}. "
                         "Expected: segments, baseline_token, batch_size, samples, seed, tokenizer.")
    if not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ValueError(f"`samples` (permutations) must be an int >= 1. Received: samples={samples!r}.")
    baseline = _pad_id(tokenizer) if baseline_token is None else baseline_token
    baseline = int(check_ids(np.asarray([baseline]), vocab, "baseline_token")[0])
    start, rows, size = len(prompt_ids), len(continuation_ids), len(sequence)
    labels = segment_labels(start, segments, token_strings(tokenizer, prompt_ids))
    k = int(labels.max()) + 1
    present, orders = coalitions(name, k, int(samples), seed)
    tiled = np.repeat(perturbed_sequences(sequence, labels, present, baseline), rows, axis=0)  # coalition-major
    inputs = _model_inputs(view, tiled, _fixed_length(view.lm))
    inputs["kerascope_position"] = np.tile(start - 1 + np.arange(rows), len(present)).astype(np.int32)
    inputs["kerascope_token"] = np.tile(continuation_ids, len(present)).astype(np.int32)
    scores = engine_for(view).scores(inputs, 0, batch_size)[0].reshape(len(present), rows).astype(np.float64)
    values = segment_values(name, scores, orders, k)
    per_token = np.zeros((rows, size), np.float32)
    per_token[:, :start] = np.where(labels >= 0, values[:, np.maximum(labels, 0)], 0.0)
    extras = {"segment_attributions": values.astype(np.float32), "segment_labels": labels}
    if orders is not None:
        extras["base_scores"] = scores[0].astype(np.float32)  # every segment replaced
    full = scores[0] if orders is None else scores[k]
    return GenerationExplanation(
        token_attributions=per_token, attributions=per_token.sum(axis=0), token_ids=sequence, prompt_ids=prompt_ids,
        continuation_ids=continuation_ids, log_probs=full.astype(np.float32),
        tokens=token_strings(tokenizer, sequence), method=name,
        params={"segments": segments, "baseline_token": baseline, "samples": samples, "seed": seed}, extras=extras,
    )


def _check_completeness(explanation: Any, baseline_token: Any) -> None:
    error = (explanation.extras or {}).get("completeness_error")
    base = (explanation.extras or {}).get("baseline_scores")
    if error is None or base is None:
        return
    gap = np.abs(np.asarray(explanation.scores, np.float64) - np.asarray(base, np.float64))
    relative = np.abs(np.asarray(error, np.float64)) / np.maximum(gap, 1e-12)
    bad = np.flatnonzero(relative > 0.01)
    if bad.size:
        fix = ("pass `baseline_token=` (e.g. the pad id) so the path does not start at the zero embedding, where "
               "a normalisation after the embedding (RMSNorm, LayerNorm) jumps" if baseline_token is None else
               "raise `steps=`")
        warnings.warn(
            f"The attributions of continuation rows {bad[:10].tolist()} miss completeness by up to "
            f"{float(relative.max()):.0%} of |log p(x) - log p(baseline)| (extras['completeness_error']): "
            f"{fix}.", RuntimeWarning, stacklevel=3)


def _check_length(limit: int | None, prompt: int, more: int, what: str) -> None:
    if limit is not None and prompt + more > limit:
        raise ValueError(
            f"The prompt ({prompt} tokens) and the {what} ({more} tokens) are longer than the model's maximum "
            f"length of {limit} tokens. Received: {what} of {more} tokens. Shorten the prompt or the continuation "
            f"(at most {max(limit - prompt, 0)} tokens after this prompt)."
        )
