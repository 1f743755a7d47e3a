"""Generated-text attribution: ``ks.explain_generation`` (rows batched) against one explanation per token.

The loop is what Captum's ``LLMAttribution`` does: for each continuation token, one integrated-gradients
attribution of ``log p(c_j | prompt, c_<j)`` on the prefix (here through kerascope's public API with a callable
target, so both sides share the compiled engine). Both sides are warmed first (every prefix length compiled
once), so the rounds time steady-state work.

Where the time went before the layer's activations were read by a compiled pass (cProfile, TensorFlow,
32 + 32 tokens, 50 steps, batch_size 256): 85-90% in the compiled forward+backward calls, ~8% in an eager pass
that read the embedding's output (the whole model run eagerly once per explain call), ~2% in the two end-score
passes. Both sides now read the activations from a compiled probed pass (the layer's output only), and the
batched side runs its rows in groups of consecutive rows, each on the sequence cut after its last row's
prefix (-30% time against one group on the full sequence, results equal to ~4e-9). The per-token loop got
the compiled activation read too, which removed most of its per-call cost: both sides now do about the same
token-passes (the loop's prefixes average 48 tokens, the groups' cut sequences ~49), so the ratio is close to
1 on CPU; the batched side's gain left is fewer, larger compiled calls. A larger gain needs the rows of one
group to share their forward pass (equal path points; only the differentiated position differs).
"""

from __future__ import annotations

import statistics

from bench.scenario import Options, scenario
from bench.timing import rotating_times


def _model(hidden: int, vocab: int, length: int):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=vocab, num_layers=2, num_heads=2, hidden_dim=hidden,
                                             intermediate_dim=2 * hidden, max_sequence_length=length)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


@scenario("lm-generation-rows-vs-token-loop",
          "explain_generation (rows x IG steps batched) vs one IG attribution per generated token, tiny GPT-2")
def generation_rows_vs_loop(options: Options) -> list[dict]:
    import keras
    import numpy as np

    import kerascope as ks

    prompt_len, cont_len = (8, 8) if options.quick else (32, 32)
    steps, batch_size = (16 if options.quick else 50), 256
    model = _model(32, 256, prompt_len + cont_len)
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, 256, prompt_len)
    continuation = rng.integers(1, 256, cont_len)
    sequence = np.concatenate([prompt, continuation])
    embedding = model.backbone.token_embedding

    def batched():
        return ks.explain_generation(model, prompt, continuation, steps=steps, batch_size=batch_size)

    explainer = ks.IntegratedGradients(model, layer=embedding, call_index=0, steps=steps, batch_size=batch_size)

    def loop():
        rows = []
        for j, c in enumerate(continuation):
            n = prompt_len + j
            prefix = {"token_ids": sequence[None, :n], "padding_mask": np.ones((1, n), "int32")}
            rows.append(explainer.explain(prefix, lambda o, c=int(c): keras.ops.log_softmax(o[:, -1], -1)[:, c]))
        return rows

    first = batched()
    rows = loop()  # warm: every prefix length compiled once
    gap = max(float(np.abs(first.token_attributions[j, : prompt_len + j]
                           - r.attributions.sum(-1)[0]).max()) for j, r in enumerate(rows))
    times = rotating_times({"batched": batched, "loop": loop}, rounds=options.repeats)
    ratios = [b / a for a, b in zip(times["batched"], times["loop"])]
    return [{
        "backend": keras.backend.backend(), "prompt": prompt_len, "continuation": cont_len, "steps": steps,
        "batch_size": batch_size, "batched_median_s": statistics.median(times["batched"]),
        "loop_median_s": statistics.median(times["loop"]), "speedup_median": statistics.median(ratios),
        "speedup_min": min(ratios), "speedup_max": max(ratios), "max_abs_difference": gap,
    }]
