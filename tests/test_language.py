"""Language models: explain_generation (teacher-forced rows) and explain_tokens, on tiny random models.

References: the backend's own autodiff of the same log-probability (tests/_autodiff.py), the model's own
outputs at a zero embedding (IG completeness), and one public-API explanation per generated token (the loop
the batched rows replace).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.language import generation
from kerascope.language.embedding import NoTokenEmbeddingError
from tests._autodiff import gradient

keras_hub = pytest.importorskip("keras_hub")

VOCAB = 24
#: GPT-2 / BERT cases compile for minutes on JAX: there they run under -m slow
heavy_on_jax = pytest.mark.slow if keras.backend.backend() == "jax" else (lambda test: test)


def causal_lm(length: int | None = None) -> tuple[keras.Model, keras.Layer, callable]:
    """Embedding -> causal self-attention -> Dense logits, and ``rest(e)``: the same layers from the embedding."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((length,), dtype="int32")
    emb = keras.layers.Embedding(VOCAB, 8, name="tok")
    attention = keras.layers.MultiHeadAttention(2, 4, name="attn")
    dense = keras.layers.Dense(VOCAB, name="logits")

    def rest(e):
        return dense(e + attention(e, e, use_causal_mask=True))

    e = emb(ids)
    return keras.Model(ids, rest(e)), emb, rest


def log_prob(logits, position, token):
    return keras.ops.log_softmax(logits[:, position], axis=-1)[:, token]


@pytest.fixture(scope="module")
def lm():
    return causal_lm()


PROMPT = np.array([3, 5, 7, 2, 9])
CONT = np.array([4, 11, 6])


def test_rows_equal_hand_gradient_of_each_log_prob(lm):
    model, emb, rest = lm
    g = ks.explain_generation(model, PROMPT, CONT, method="gradient_x_input")
    seq = np.concatenate([PROMPT, CONT])[None]
    e = keras.ops.convert_to_numpy(emb(seq))
    for j, c in enumerate(CONT):
        position = len(PROMPT) - 1 + j
        grad = gradient(lambda v, p=position, c=c: log_prob(rest(v), p, c), e)
        want = (e * grad).sum(-1)[0]
        want[len(PROMPT) + j:] = 0.0
        np.testing.assert_allclose(g.token_attributions[j], want, rtol=1e-4, atol=1e-6)
        assert np.all(g.token_attributions[j, len(PROMPT) + j:] == 0.0)
    logits = keras.ops.convert_to_numpy(model(seq))
    want_lp = [log_prob(logits, len(PROMPT) - 1 + j, c)[0] for j, c in enumerate(CONT)]
    np.testing.assert_allclose(g.log_probs, keras.ops.convert_to_numpy(want_lp), rtol=1e-5)
    np.testing.assert_allclose(g.attributions, g.token_attributions.sum(0), rtol=1e-6)
    assert g.token_attributions.shape == (3, 8) and g.continuation_ids.tolist() == CONT.tolist()


@heavy_on_jax
def test_ig_rows_complete_at_default_steps(lm):
    model, emb, rest = lm
    g = ks.explain_generation(model, PROMPT, CONT)
    seq = np.concatenate([PROMPT, CONT])[None]
    at_x = keras.ops.convert_to_numpy(rest(emb(seq)))
    at_zero = keras.ops.convert_to_numpy(rest(keras.ops.zeros((1, seq.shape[1], 8))))
    for j, c in enumerate(CONT):
        p = len(PROMPT) - 1 + j
        gap = float(log_prob(at_x, p, c)[0]) - float(log_prob(at_zero, p, c)[0])
        assert abs(g.token_attributions[j].sum() - gap) <= 0.01 * abs(gap)


@heavy_on_jax
def test_batched_rows_equal_one_explanation_per_generated_token(lm):
    model, emb, _ = lm
    g = ks.explain_generation(model, PROMPT, CONT, steps=16)
    seq = np.concatenate([PROMPT, CONT])
    for j, c in enumerate(CONT):
        prefix = seq[None, : len(PROMPT) + j]
        one = ks.IntegratedGradients(model, layer="tok", steps=16).explain(
            prefix, lambda o, c=int(c): keras.ops.log_softmax(o[:, -1], axis=-1)[:, c])
        np.testing.assert_allclose(g.token_attributions[j, : prefix.shape[1]], one.attributions.sum(-1)[0],
                                   rtol=1e-5, atol=1e-5)


def test_rows_in_groups_on_cut_sequences_equal_the_per_token_loop(lm):
    """Nine rows run as two groups, each on the sequence cut after its last row's prefix."""
    model, emb, rest = lm
    cont = np.array([4, 11, 6, 1, 8, 13, 2, 20, 5])
    assert [len(g) for g in generation._row_groups(len(cont), None)] == [5, 4]
    g = ks.explain_generation(model, PROMPT, cont, method="gradient_x_input")
    seq = np.concatenate([PROMPT, cont])
    e = keras.ops.convert_to_numpy(emb(seq[None]))
    logits = keras.ops.convert_to_numpy(model(seq[None]))
    for j, c in enumerate(cont):
        n = len(PROMPT) + j
        grad = gradient(lambda v, c=c: log_prob(rest(v), -1, c), e[:, :n])
        np.testing.assert_allclose(g.token_attributions[j, :n], (e[:, :n] * grad).sum(-1)[0], rtol=1e-5, atol=1e-5)
        assert np.all(g.token_attributions[j, n:] == 0.0)
        np.testing.assert_allclose(g.log_probs[j], log_prob(logits, n - 1, c)[0], rtol=1e-5)
    assert g.token_attributions.shape == (9, 14) and g.log_probs.shape == (9,)
    ig = ks.explain_generation(model, PROMPT, cont, steps=16)
    assert ig.extras["completeness_error"].shape == (9,) and ig.extras["baseline_scores"].shape == (9,)
    gap = ig.log_probs - ig.extras["baseline_scores"]
    np.testing.assert_allclose(ig.token_attributions.sum(1), gap + ig.extras["completeness_error"], atol=1e-4)


def test_greedy_continuation_is_the_argmax_chain(lm):
    model, _, _ = lm
    g = ks.explain_generation(model, PROMPT, max_new_tokens=4, method="saliency")
    seq = list(PROMPT)
    for _ in range(4):
        seq.append(int(np.argmax(keras.ops.convert_to_numpy(model(np.array([seq])))[0, -1])))
    assert g.continuation_ids.tolist() == seq[len(PROMPT):]
    assert g.token_attributions.shape == (4, 9) and g.tokens is None


def tiny_gpt2():
    keras.utils.set_random_seed(0)
    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3, "Ġ": 4, "Ġa": 5, "Ġb": 6, "ab": 7, "Ġc": 8}
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocab, merges=["Ġ a", "Ġ b", "a b", "Ġ c"])
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocab), num_layers=2, num_heads=2, hidden_dim=16,
                                             intermediate_dim=32, max_sequence_length=12)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=12)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor), tokenizer


@heavy_on_jax
def test_keras_hub_gpt2_tied_embedding_strings_and_dict_prompts():
    model, tokenizer = tiny_gpt2()
    g = ks.explain_generation(model, "ab a b", continuation=" c a", steps=16)
    assert g.tokens == ["ab", "Ġa", "Ġb", "Ġc", "Ġa"]
    seq = g.token_ids
    for j, c in enumerate(g.continuation_ids):
        n = len(g.prompt_ids) + j
        prefix = {"token_ids": seq[None, :n], "padding_mask": np.ones((1, n), "int32")}
        one = ks.IntegratedGradients(model, layer=model.backbone.token_embedding, call_index=0, steps=16).explain(
            prefix, lambda o, c=int(c): keras.ops.log_softmax(o[:, -1], axis=-1)[:, c])
        np.testing.assert_allclose(g.token_attributions[j, :n], one.attributions.sum(-1)[0], rtol=1e-5, atol=1e-5)
    padded = {"token_ids": np.array([[7, 5, 6, 0, 0]]), "padding_mask": np.array([[1, 1, 1, 0, 0]])}
    again = ks.explain_generation(model, padded, continuation=g.continuation_ids, steps=16)
    np.testing.assert_allclose(again.token_attributions, g.token_attributions, atol=1e-6)
    assert np.abs(g.extras["completeness_error"]).max() <= 0.01 * np.abs(g.log_probs).max()


def test_bad_inputs_are_refused_clearly(lm):
    model, _, _ = lm
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="plain")
    with pytest.raises(NoTokenEmbeddingError, match="no token embedding"):
        ks.explain_generation(dense, PROMPT, CONT)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        ks.explain_generation(model, "hello", CONT)
    with pytest.raises(ValueError, match="outside the model's vocabulary of 24"):
        ks.explain_generation(model, PROMPT, np.array([4, 30]))
    gpt2, _ = tiny_gpt2()
    with pytest.raises(ValueError, match="maximum length of 12"):
        ks.explain_generation(gpt2, np.array([1, 2, 3]), np.arange(10) % 8)
    with pytest.raises(ValueError, match="maximum length of 12"):
        ks.explain_generation(gpt2, np.array([1, 2, 3]), max_new_tokens=10)
    with pytest.raises(ValueError, match=r"ks\.targets\.position"):
        ks.Saliency(model, layer="tok").explain(PROMPT[None], 3)
    # the classifier entry point refuses the same inputs in the same words
    with pytest.raises(NoTokenEmbeddingError, match="Pass `layer=`"):
        ks.explain_tokens(dense, np.ones((1, 4)), targets=0)
    with pytest.raises(ValueError, match="Text inputs need the model's preprocessor.*Received: inputs='hi'"):
        ks.explain_tokens(model, "hi", targets=0)
    with pytest.raises(ValueError, match=r"vocabulary of 24 ids \(0..23\). Received: token ids \[-1, 24\]"):
        ks.explain_tokens(model, np.array([[1, 24, -1]]), targets=0)


def tiny_bert():
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=16,
                                             intermediate_dim=32, max_sequence_length=10)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=None)


@heavy_on_jax
def test_classifier_tokens_only_padding_exactly_zero_and_complete():
    model = tiny_bert()
    x = {"token_ids": np.array([[2, 5, 9, 4, 0, 0], [2, 8, 3, 7, 6, 1]]),
         "padding_mask": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]),
         "segment_ids": np.array([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]])}
    e = ks.explain_tokens(model, x, targets=[1, 2])
    assert e.attributions.shape == (2, 6)
    assert np.all(e.attributions[0, 4:] == 0.0) and np.all(e.attributions[1] != 0.0)
    gap = e.scores - e.extras["baseline_scores"]
    np.testing.assert_allclose(e.attributions.sum(1), gap, rtol=0.01)
    other_pad = dict(x, token_ids=np.where(x["padding_mask"] == 1, x["token_ids"], 17))
    np.testing.assert_allclose(ks.explain_tokens(model, other_pad, targets=[1, 2]).attributions, e.attributions,
                               atol=1e-6)
    norm = ks.explain_tokens(model, x, targets=[1, 2], method="saliency", reduce="norm")
    assert np.all(norm.attributions >= 0) and np.all(norm.attributions[0, 4:] == 0.0)


def test_classifier_gradient_x_input_equals_hand_gradient_at_the_embedding():
    keras.utils.set_random_seed(2)
    emb = keras.layers.Embedding(VOCAB, 6, name="tok")
    pool, head = keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3, activation="tanh")
    ids = keras.Input((5,), dtype="int32")
    model = keras.Model(ids, head(pool(emb(ids))))
    x = np.array([[1, 2, 3, 4, 5], [7, 7, 0, 9, 1]])
    e = keras.ops.convert_to_numpy(emb(x))
    want = (e * gradient(lambda v: head(pool(v))[:, 2], e)).sum(-1)
    got = ks.explain_tokens(model, x, targets=2, method="gradient_x_input").attributions
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@heavy_on_jax
def test_shapley_over_tokens_only_efficiency_and_padding_zero():
    keras.utils.set_random_seed(7)
    ids = keras.Input((5,), dtype="int32", name="token_ids")
    mask = keras.Input((5,), dtype="int32", name="padding_mask")
    h = keras.layers.Embedding(VOCAB, 4)(ids) * keras.ops.expand_dims(keras.ops.cast(mask, "float32"), -1)
    model = keras.Model({"token_ids": ids, "padding_mask": mask},
                        keras.layers.Dense(2)(keras.layers.Flatten()(keras.layers.Dense(3, activation="tanh")(h))))
    x = {"token_ids": np.array([[4, 9, 2, 0, 0]]), "padding_mask": np.array([[1, 1, 1, 0, 0]])}
    e = ks.explain_tokens(model, x, targets=1, method="shapley_exact", baseline_token=0)
    assert e.attributions.shape == (1, 5) and np.all(e.attributions[0, 3:] == 0.0)
    empty = dict(x, token_ids=np.zeros_like(x["token_ids"]))
    gap = keras.ops.convert_to_numpy(model(x))[0, 1] - keras.ops.convert_to_numpy(model(empty))[0, 1]   # efficiency: all tokens -> pad
    np.testing.assert_allclose(e.attributions.sum(), gap, rtol=1e-5, atol=1e-6)


@heavy_on_jax
def test_gemma_style_rmsnorm_needs_a_baseline_token_and_is_complete_with_one():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=32, num_layers=2, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=16, intermediate_dim=32, head_dim=8)
    gemma = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    prompt, cont = np.array([3, 5, 7]), np.array([7, 2, 9])
    with pytest.warns(RuntimeWarning, match="baseline_token"):  # RMSNorm after a zero embedding: a jump
        ks.explain_generation(gemma, prompt, cont, steps=8)
    g = ks.explain_generation(gemma, prompt, cont, baseline_token=0)
    seq = np.concatenate([prompt, cont])[None]

    def lps(tokens):
        logits = keras.ops.convert_to_numpy(gemma({"token_ids": tokens, "padding_mask": np.ones_like(tokens)}))
        return [float(log_prob(logits, len(prompt) - 1 + j, c)[0]) for j, c in enumerate(cont)]

    gap = keras.ops.convert_to_numpy(lps(seq)) - keras.ops.convert_to_numpy(lps(np.zeros_like(seq)))
    np.testing.assert_allclose(g.token_attributions.sum(1), gap, rtol=0.01)
    np.testing.assert_allclose(g.log_probs, lps(seq), rtol=1e-5)


def test_html_token_heatmaps_escape_tokens_and_keep_signs(lm):
    model, _, _ = lm
    g = ks.explain_generation(model, PROMPT, CONT, method="gradient_x_input")
    page = g._repr_html_()
    assert page.count("<tr>") == 1 + len(CONT) and page.count("<span class='tk ") >= len(PROMPT) + len(CONT)
    top = int(np.argmax(np.abs(g.attributions)))
    colour = "#67001f" if g.attributions[top] > 0 else "#053061"   # RdBu_r's ends
    assert f"background:{colour};" in page   # the largest |value| gets the full colour of its sign
    from kerascope.language.html import token_html

    assert "&lt;pad&gt;" in token_html(["<pad>"], np.array([0.0]))
