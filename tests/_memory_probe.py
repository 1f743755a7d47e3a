"""Peak memory of methods at N and 4N samples with a fixed batch_size (run by tests/test_hardening.py).

Run in its own process: ``python tests/_memory_probe.py N BATCH method[:k=v,...] ...``. For each
method it explains N samples once (compiling), then N and 4N samples, each time resetting the
kernel's peak-RSS mark (``/proc/self/clear_refs``) and reading ``VmHWM``; prints one JSON line
per method: peak RSS (bytes) above the RSS before the call, for N and 4N, the whole process's
peaks, and the size of the 4N attributions.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_of(fn, *args) -> tuple[int, int, object]:
    """(peak RSS above the RSS before the call, the process's peak RSS, fn's result)."""
    _reset_peak()
    before = _status("VmRSS")
    result = fn(*args)
    peak = _status("VmHWM")
    return peak - before, peak, result


def model():
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((64, 64, 1))
    h = keras.layers.Conv2D(64, 1, activation="relu", name="wide")(x)  # 1 MiB of features per sample
    h = keras.layers.Conv2D(64, 1, activation="relu", name="last")(h)
    return keras.Model(x, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h)))


def main() -> None:
    from kerascope.methods import registry

    n, batch_size = int(sys.argv[1]), int(sys.argv[2])
    m = model()
    x = np.random.default_rng(0).uniform(size=(4 * n, 64, 64, 1)).astype("float32")
    for spec in sys.argv[3:]:
        name, _, rest = spec.partition(":")
        params = {k: json.loads(v) for k, v in (p.split("=") for p in rest.split(",") if p)}
        if params.get("mask") == "quadrants":  # 4 features (ShapleyExact's default grid is 2^16 rows per sample)
            params["mask"] = np.arange(4).reshape(2, 2).repeat(32, 0).repeat(32, 1)
        method = registry.build(name, m, {**params, "batch_size": batch_size})
        method.explain(x[:n], 0)  # compile
        small, small_total, _ = peak_of(method.explain, x[:n], 0)
        large, large_total, e = peak_of(method.explain, x, 0)
        print(json.dumps({"method": name, "n": small, "4n": large, "n_total": small_total,
                          "4n_total": large_total, "maps": int(np.asarray(e.attributions).nbytes)}), flush=True)


if __name__ == "__main__":
    main()
