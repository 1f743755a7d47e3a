"""Perturbation over prompt segments in ``explain_generation`` (Captum's ``LLMAttribution`` with FeatureAblation /
ShapleyValueSampling): ablation against a hand loop over ``model(...)`` and ``log_softmax``, Shapley sampling's
efficiency per row, held tokens, words from a tokenizer's strings, and the refusals.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks

VOCAB = 20
PROMPT = np.array([3, 5, 7, 2, 9, 4])
CONTINUATION = np.array([6, 1, 8])
BASELINE = 0
#: compile-heavy on JAX: there it runs under -m slow (one lighter test per feature stays in the fast run)
heavy_on_jax = pytest.mark.slow if keras.backend.backend() == "jax" else (lambda test: test)


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((None,), dtype="int32"), keras.layers.Embedding(VOCAB, 8),
        keras.layers.Conv1D(8, 3, padding="causal", activation="tanh"),
        keras.layers.Conv1D(8, 3, padding="causal", activation="tanh"),
        keras.layers.Dense(VOCAB),
    ])


def log_p(lm, prompt, row):
    """``log p(c_row | prompt, c_<row)`` by hand: one call of the model, a numpy log-softmax."""
    sequence = np.concatenate([prompt, CONTINUATION])[None].astype("int32")
    logits = keras.ops.convert_to_numpy(lm(sequence))[0, len(prompt) - 1 + row].astype(np.float64)
    return logits[CONTINUATION[row]] - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


def replaced(prompt, tokens):
    out = prompt.copy()
    out[list(tokens)] = BASELINE
    return out


@heavy_on_jax
def test_ablation_over_tokens_and_spans_equals_a_hand_loop(lm):
    g = ks.explain_generation(lm, PROMPT, CONTINUATION, method="feature_ablation", batch_size=4)
    assert g.token_attributions.shape == (3, 9)
    for j in range(3):
        full = log_p(lm, PROMPT, j)
        assert abs(g.log_probs[j] - full) < 1e-4
        want = [full - log_p(lm, replaced(PROMPT, [i]), j) for i in range(len(PROMPT))]
        np.testing.assert_allclose(g.token_attributions[j, :6], want, rtol=1e-4, atol=1e-5)
    assert np.all(g.token_attributions[:, 6:] == 0.0)  # the continuation is never replaced
    spans = [(0, 2), (3, 6)]
    s = ks.explain_generation(lm, PROMPT, CONTINUATION, method="feature_ablation", segments=spans)
    for j in range(3):
        full = log_p(lm, PROMPT, j)
        want = [full - log_p(lm, replaced(PROMPT, range(a, b)), j) for a, b in spans]
        np.testing.assert_allclose(s.extras["segment_attributions"][j], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(s.token_attributions[j, :6], [want[0]] * 2 + [0.0] + [want[1]] * 3,
                                   rtol=1e-4, atol=1e-5)
    assert np.all(s.token_attributions[:, 2] == 0.0)  # in no span: held


def test_shapley_sampling_is_efficient_per_row_and_batch_size_independent(lm):
    spans = [(0, 2), (2, 3), (3, 6)]
    g = ks.explain_generation(lm, PROMPT, CONTINUATION, method="shapley_sampling", segments=spans, samples=5,
                              seed=1, batch_size=7)
    for j in range(3):
        full, empty = log_p(lm, PROMPT, j), log_p(lm, replaced(PROMPT, range(6)), j)
        assert abs(g.log_probs[j] - full) < 1e-4 and abs(g.extras["base_scores"][j] - empty) < 1e-4
        assert abs(g.extras["segment_attributions"][j].sum() - (full - empty)) < 1e-4
    other = ks.explain_generation(lm, PROMPT, CONTINUATION, method="shapley_sampling", segments=spans, samples=5,
                                  seed=1, batch_size=64)
    np.testing.assert_allclose(other.token_attributions, g.token_attributions, rtol=1e-5, atol=1e-6)


class Strings:
    """A user's tokenizer: each id's string (GPT-2 style: a word starts with the byte-level space)."""

    pad_token_id = 0

    def id_to_token(self, i):
        return {3: "The", 5: "\u0120ca", 7: "t", 2: "\u0120sat", 9: "\u0120do", 4: "wn"}.get(i, f"\u0120w{i}")


def test_words_from_the_tokenizer_and_refusals(lm):
    g = ks.explain_generation(lm, PROMPT, CONTINUATION, method="feature_ablation", segments="words",
                              tokenizer=Strings())
    assert g.extras["segment_labels"].tolist() == [0, 1, 1, 2, 3, 3]
    for j in range(3):
        want = log_p(lm, PROMPT, j) - log_p(lm, replaced(PROMPT, [1, 2]), j)
        assert abs(g.extras["segment_attributions"][j, 1] - want) < 1e-4
    with pytest.raises(ValueError, match="needs the token strings"):
        ks.explain_generation(lm, PROMPT, CONTINUATION, method="feature_ablation", segments="words")
    with pytest.raises(ValueError, match="not overlap"):
        ks.explain_generation(lm, PROMPT, CONTINUATION, method="feature_ablation", segments=[(0, 3), (2, 4)])
    with pytest.raises(ValueError, match="segments"):
        ks.explain_generation(lm, PROMPT, CONTINUATION, method="saliency", segments=[(0, 2)])
