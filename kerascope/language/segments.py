"""Perturbation over prompt segments for ``explain_generation`` (as Captum's ``LLMAttribution``).

Each row ``j`` scores ``log p(c_j | prompt, c_<j)`` with some prompt segments
replaced by a baseline token: every coalition x row is one sample of one batch,
scored ``batch_size`` at a time (forward passes only, never one per row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PERTURBATIONS = ("feature_ablation", "shapley_sampling")
_WORD_MARKS = (" ", "\u0120", "\u2581")  # a space, GPT-2's byte-level space, SentencePiece's space


def segment_labels(prompt_length: int, segments: Any, strings: list[str] | None) -> np.ndarray:
    """The segment of each prompt token (``-1``: held, never replaced), segments numbered ``0 .. k-1``.

    ``segments``: ``None`` (one per token), ``"words"`` (from the tokenizer's
    strings: a word starts at a token beginning with a space marker, or at every
    token not starting with ``##`` when no token has one) or ``(start, end)``
    token spans (end excluded; tokens in no span are held).

    Example:
        >>> segment_labels(4, [(0, 2), (3, 4)], None).tolist()
        [0, 0, -1, 1]
        >>> segment_labels(3, "words", ["the", "\u0120ca", "t"]).tolist()
        [0, 1, 1]
    """
    if segments is None:
        return np.arange(prompt_length)
    if isinstance(segments, str):
        if segments != "words":
            raise ValueError(f'`segments` must be None, "words" or (start, end) spans. Received: segments={segments!r}.')
        if strings is None:
            raise ValueError(
                'segments="words" needs the token strings, and no tokenizer is known. Received: segments="words". '
                "Pass `tokenizer=` or (start, end) token spans."
            )
        marked = any(s.startswith(_WORD_MARKS) for s in strings)
        starts = [i == 0 or (not s.startswith("##") and (s.startswith(_WORD_MARKS) or not marked))
                  for i, s in enumerate(strings)]
        return np.cumsum(starts) - 1
    labels = np.full(prompt_length, -1)
    try:
        spans = [(int(a), int(b)) for a, b in segments]
    except (TypeError, ValueError):
        raise ValueError(f"`segments` spans must be (start, end) pairs of ints. Received: segments={segments!r}.") from None
    for k, (a, b) in enumerate(spans):
        if not 0 <= a < b <= prompt_length or np.any(labels[a:b] >= 0):
            raise ValueError(
                f"Each span must satisfy 0 <= start < end <= {prompt_length} (the prompt's tokens) and not overlap "
                f"another. Received: segments={segments!r}."
            )
        labels[a:b] = k
    if not spans:
        raise ValueError("`segments` needs at least one span. Received: an empty list.")
    return labels


def coalitions(method: str, k: int, samples: int, seed: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(present (m, k) bool, permutations (samples, k) or None)`` for the method's game.

    Ablation: everything present, then each segment absent alone. Shapley
    sampling: per permutation, nothing present and the segments added one by
    one (``k + 1`` coalitions each).

    Example:
        >>> coalitions("feature_ablation", 2, 0, None)[0].astype(int).tolist()
        [[1, 1], [0, 1], [1, 0]]
    """
    if method == "feature_ablation":
        return np.vstack([np.ones((1, k), bool), ~np.eye(k, dtype=bool)]), None
    rng = np.random.default_rng(seed)
    orders = np.stack([rng.permutation(k) for _ in range(samples)])
    ranks = np.argsort(orders, axis=1)  # (samples, k): when each segment joins
    present = ranks[:, None, :] < np.arange(k + 1)[None, :, None]  # (samples, k + 1, k)
    return present.reshape(-1, k), orders


def segment_values(method: str, scores: np.ndarray, orders: np.ndarray | None, k: int) -> np.ndarray:
    """Per row, each segment's value ``(rows, k)`` from the coalitions' scores ``(m, rows)``.

    Example:
        >>> segment_values("feature_ablation", np.array([[3.0], [1.0], [2.0]]), None, 2).tolist()
        [[2.0, 1.0]]
    """
    if method == "feature_ablation":
        return (scores[:1] - scores[1:]).T
    per = scores.reshape(len(orders), k + 1, -1)  # (samples, k + 1, rows)
    gains = per[:, 1:] - per[:, :-1]  # the segment added at each step
    values = np.zeros((per.shape[-1], k))
    for step in range(k):  # k steps (not samples): each step's segments, all permutations at once
        np.add.at(values.T, orders[:, step], gains[:, step])
    return values / len(orders)


def perturbed_sequences(sequence: np.ndarray, labels: np.ndarray, present: np.ndarray, baseline: int) -> np.ndarray:
    """``(m, size)``: ``sequence`` with the prompt tokens of absent segments replaced by ``baseline``.

    Example:
        >>> perturbed_sequences(np.array([5, 6, 7]), np.array([0, 1]), np.array([[True, False]]), 0).tolist()
        [[5, 0, 7]]
    """
    out = np.repeat(sequence[None], len(present), axis=0)
    prompt = len(labels)
    held = labels < 0
    absent = ~present[:, np.where(held, 0, labels)] & ~held[None]
    out[:, :prompt] = np.where(absent, baseline, out[:, :prompt])
    return out
