"""CRAFT's peak memory at N and 4N images with a fixed ``batch_size``, in a fresh interpreter.

The child (this file run as a script, importing kerascope, keras, numpy and bench.timing's peak helpers,
so that it can measure another checkout: ``PYTHONPATH=OTHER:. python bench/scenarios/concepts_memory.py '{...}'``)
fits CRAFT once to compile, then on N and 4N images, each time resetting the kernel's peak-RSS
mark (``/proc/self/clear_refs``) and reading ``VmHWM``. Bounded memory: the 4N peak stays near
the N peak (what grows is the ``(crops, channels)`` activation matrix and the inputs themselves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def _peak_above(fn) -> int:
    """Bytes of RSS high-water mark above the RSS just before ``fn()`` (the shared helpers of bench.timing)."""
    from bench.timing import peak_kib, reset_peak

    start = reset_peak()
    fn()
    return (peak_kib() - start) * 1024


def measure(n: int, size: int, patch: int, batch_size: int) -> dict:
    """Peak RSS above the start of ``CRAFT.fit`` (MiB) at ``n`` and ``4 n`` images, and what the crops weigh."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    import kerascope as ks

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((size, size, 3)), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="feat"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4),
    ])
    x = np.random.default_rng(0).uniform(size=(4 * n, size, size, 3)).astype(np.float32)

    def fit(count: int) -> None:
        ks.CRAFT(model, layer="feat", n_concepts=4, patch_size=patch, designs=8, batch_size=batch_size).fit(
            x[:count], targets=0)

    fit(n)  # compile
    small, large = _peak_above(lambda: fit(n)), _peak_above(lambda: fit(4 * n))
    stride = max(1, int(patch * 0.8))
    boxes = len(range(0, size - patch + 1, stride)) ** 2
    crop_mib = 4 * n * boxes * size * size * 3 * 4 / 2**20  # every crop of 4N images, resized, float32
    return {"n": n, "peak_n_mib": small / 2**20, "peak_4n_mib": large / 2**20, "growth_mib": (large - small) / 2**20,
            "crops_4n_mib": crop_mib, "inputs_4n_mib": x.nbytes / 2**20, "batch_size": batch_size, "size": size,
            "patch_size": patch, "crops_per_image": boxes}


def run_child(settings: dict, pythonpath: str | None = None) -> dict:
    """:func:`measure` in a fresh interpreter (``pythonpath``: the checkout to measure, default this one)."""
    root = Path(__file__).resolve().parents[2]
    path = pythonpath or str(root)
    # the measured checkout first (its kerascope), then this one (bench.timing, should the other lack it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(root), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), json.dumps(settings)],
                          capture_output=True, text=True, env=env, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"The CRAFT memory child failed: {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # the child
    print(json.dumps(measure(**json.loads(sys.argv[1]))))
else:
    from bench.scenario import Options, scenario

    @scenario("craft-memory", "CRAFT.fit peak RSS at N and 4N images (crops of 64 px images), fixed batch_size, "
              "fresh interpreter", tags=("memory",), backend="tensorflow")
    def craft_memory(options: Options) -> list[dict]:
        settings = {"n": 8, "size": 32, "patch": 8, "batch_size": 16} if options.quick else \
            {"n": 32, "size": 64, "patch": 16, "batch_size": 32}
        return [run_child(settings)]
