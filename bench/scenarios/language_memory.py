"""Peak memory of ``ks.explain_generation`` against ``batch_size``: a 512-token prompt, a 64-token continuation.

Every row (continuation token) x IG step is one sample of the full 576-token sequence; the samples run
``batch_size`` at a time, so the working memory (attention probabilities ``batch x heads x T x T``, logits
``batch x T x V`` and their gradients) must grow with ``batch_size`` and not with ``rows x steps``. Each batch
size runs in a fresh process (the peak starts from a fresh allocator) on a tiny random GPT-2 (2 layers, width
32, vocabulary 256): ``VmHWM`` over the RSS just before the call, for the first call (tracing included) and a
second, warm one. Settings: ``batch_sizes`` (``4,32``), ``steps`` (8), ``prompt`` (512), ``continuation`` (64).

    PYTHONPATH=$PWD python -m bench lm-generation-memory
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.scenario import Options, scenario, settings


@dataclass(frozen=True)
class MemorySettings:
    batch_sizes: tuple[str, ...] = ("4", "32")
    steps: int = 8
    prompt: int = 512
    continuation: int = 64


def measure(batch_size: int, steps: int, prompt_len: int, cont_len: int) -> dict:
    """One batch size, in this (fresh) process."""
    import keras
    import keras_hub
    import numpy as np

    import kerascope as ks
    from bench.timing import peak_kib, reset_peak

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=256, num_layers=2, num_heads=2, hidden_dim=32,
                                             intermediate_dim=64, max_sequence_length=prompt_len + cont_len)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    prompt, continuation = rng.integers(1, 256, prompt_len), rng.integers(1, 256, cont_len)
    row = {"backend": keras.backend.backend(), "batch_size": batch_size, "steps": steps, "prompt": prompt_len,
           "continuation": cont_len, "samples": cont_len * steps}
    for call in ("first", "warm"):
        start = reset_peak()
        began = time.perf_counter()
        g = ks.explain_generation(model, prompt, continuation, steps=steps, batch_size=batch_size)
        row[f"{call}_s"] = time.perf_counter() - began
        row[f"{call}_peak_delta_mib"] = (peak_kib() - start) / 1024
    row["rss_after_mib"] = reset_peak() / 1024
    row["shape"] = list(g.token_attributions.shape)
    return row


@scenario("lm-generation-memory",
          "peak RSS of explain_generation (512-token prompt, 64-token continuation) at two batch sizes, tiny GPT-2")
def generation_memory(options: Options) -> list[dict]:
    quick = {"prompt": 64, "continuation": 8, "steps": 4} if options.quick else {}
    args = settings(MemorySettings, options, **quick)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    rows = []
    for batch_size in (int(b) for b in args.batch_sizes):
        call = json.dumps({**asdict(args), "batch_size": batch_size})
        done = subprocess.run([sys.executable, "-m", "bench.scenarios.language_memory", call], capture_output=True,
                              text=True, env=env, cwd=root)
        if done.returncode != 0:
            raise RuntimeError(f"The memory child failed: {done.stderr.strip()[-600:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


if __name__ == "__main__":  # the child of generation_memory
    spec = json.loads(sys.argv[1])
    print(json.dumps(measure(spec["batch_size"], spec["steps"], spec["prompt"], spec["continuation"])))
