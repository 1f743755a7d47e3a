"""The Python API causes no Keras/TensorFlow warnings of its own on healthy models.

A model built with a named input in a list or dict (like an ``.hdf5`` model saved by tf.keras)
used to make Keras warn "The structure of `inputs` doesn't match the expected structure" on
every call, and a few explainers in one script made TensorFlow log "N out of the last N calls
... triggered tf.function retracing" (kerascope compiles one function per configuration, each
traced once). Several explainers run here in one process with every warning recorded.
"""

from __future__ import annotations

import logging
import warnings

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.inputs import fit_structure

METHODS = ["gradcam", "saliency", "smoothgrad", "deeplift"]


def named(kind: str, seed: int = 0) -> tuple[keras.Model, keras.Model]:
    """A model whose input is named 'face', built as a list or dict, and the same layers as a plain model."""
    keras.utils.set_random_seed(seed)
    face = keras.Input((12, 12, 1), name="face")
    h = keras.layers.Conv2D(3, 3, activation="relu", name="conv")(face)
    h = keras.layers.GlobalAveragePooling2D()(h)
    out = keras.layers.Dense(4, activation="softmax", name="out")(h)
    structured = keras.Model([face] if kind == "list" else {"face": face}, out, name=f"fer_{kind}")
    return structured, keras.Model(face, out, name="plain")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_several_explainers_on_named_inputs_warn_nothing():
    x = np.random.default_rng(0).random((3, 12, 12, 1)).astype(np.float32)
    records = _Records()
    logger = logging.getLogger("tensorflow")
    logger.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = {}
            for kind in ("list", "dict"):
                model, plain = named(kind)
                for method in METHODS:
                    results[kind, method] = ks.explain(model, x, method=method, batch_size=2).attributions
                # same layers, same weights, a bare-tensor model: kerascope's structure change changes no number
                np.testing.assert_allclose(results[kind, "saliency"],
                                           ks.explain(plain, x, method="saliency").attributions, rtol=1e-5, atol=1e-7)
            for seed in range(6):  # new models in a loop: a new compiled function each, each traced once
                ks.explain(named("list", seed)[0], x[:1], method="saliency")
    finally:
        logger.removeHandler(records)
    ours = [w for w in caught if "structure of `inputs`" in str(w.message) or "retracing" in str(w.message)]
    assert ours == [], [str(w.message)[:120] for w in ours]
    assert [m for m in records.messages if "retracing" in m or "AutoGraph" in m] == []
    np.testing.assert_allclose(results["list", "gradcam"], results["dict", "gradcam"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_fit_structure_matches_the_models_inputs(kind):
    model, _ = named(kind)
    x = np.zeros((1, 12, 12, 1), np.float32)
    fitted = fit_structure(model, x)
    assert (fitted[0] is x) if kind == "list" else (fitted == {"face": x})
    assert fit_structure(model, {"face": x}) == ({"face": x} if kind == "dict" else [x])
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert fit_structure(plain, x) is x  # nothing to match: unchanged


def test_the_test_commands_stderr_filter_drops_tensorflows_start_up_lines_only() -> None:
    """TensorFlow writes absl / cudart start-up lines to descriptor 2 before it reads ``TF_CPP_MIN_LOG_LEVEL``;
    scripts/test.sh pipes every pytest run's standard error through ``filter_stdin``."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    code = "import sys, tensorflow; print('kept line', file=sys.stderr)"
    raw = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stderr
    filtered = subprocess.run(
        [sys.executable, "-c", "from kerascope.cli.quiet import filter_stdin; filter_stdin()"],
        input=raw, capture_output=True, text=True, env=env,
    )
    assert filtered.returncode == 0, filtered.stderr
    assert filtered.stdout.strip() == "kept line"
    assert "kept line" in raw


def test_the_test_command_runs_pytest_through_the_filter() -> None:
    from pathlib import Path

    script = (Path(__file__).resolve().parents[1] / "scripts" / "test.sh").read_text()
    runs = [line for line in script.splitlines() if "-m pytest" in line and not line.lstrip().startswith("#")]
    assert len(runs) == 2 and all(" quiet " in f" {line.split('-m pytest')[0]}" for line in runs), runs
