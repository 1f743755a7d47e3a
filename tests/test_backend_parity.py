"""Same attributions on the TensorFlow, JAX and PyTorch backends.

Keras reads ``KERAS_BACKEND`` once, at import, so each backend runs in its
own process: this test process saves a small CNN (``.keras``, weights drawn
with numpy, so identical whatever the backend) and the inputs, then one
worker process per backend (this file run as a script) explains them with
every registered method and saves the results to ``.npz``. Deterministic
methods must agree within 1e-4 of each map's scale; the seeded stochastic
methods (SmoothGrad, RISE, Expected Gradients, ...) draw their noise with
numpy in kerascope, so they must agree as well. The CLI is checked the same
way: the ``.keras`` file saved here is explained by ``kerascope explain``
under each backend.

Backends whose library is not installed are skipped (at least two are needed).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BACKENDS = tuple(
    name for name, module in (("tensorflow", "tensorflow"), ("jax", "jax"), ("torch", "torch"))
    if importlib.util.find_spec(module) is not None
)
TARGETS = [0, 1, 2, 1]
# Small but non-trivial hyper-parameters so that all methods run in seconds on every backend.
PARAMS = {"samples": 8, "steps": 8, "masks": 256, "seed": 0, "batch_size": 16}
# ShapleyExact's default 16-cell grid is 2^16 rows per sample (~460 s on PyTorch here): 2x2 cells, 16 rows
PER_METHOD = {
    "shapley_exact": {"mask": np.arange(4).reshape(2, 2).repeat(8, 0).repeat(8, 1)},
    # the conductance family attributes through a layer the user names (a unit of it, for NeuronConductance)
    "layer_conductance": {"layer": "conv2"}, "internal_influence": {"layer": "conv2"},
    "neuron_conductance": {"layer": "bn", "neuron": (4, 5, 1)},  # before any ReLU: a unit that is never dead
}
# The attention rollouts read attention maps, which this CNN has none of; tests/test_attention.py and
# tests/test_gradient_rollout.py check them on every backend against Keras' own attention scores, autodiff and numpy.
NOT_APPLICABLE = {"attention_rollout", "gradient_rollout"}
TOLERANCE = 1e-4
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(len(BACKENDS) < 2, reason=f"needs two Keras backends; installed: {BACKENDS}")


def build_model(seed: int = 0):
    """A CNN with BatchNorm (non-trainable state), average and max pooling, a ReLU layer and a fused softmax;
    numpy weights."""
    import keras

    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.AveragePooling2D(2, name="pool")(x)
    x = keras.layers.Conv2D(6, 3, padding="same", name="conv2")(x)
    x = keras.layers.ReLU(name="relu2")(x)
    x = keras.layers.MaxPooling2D(2, name="maxpool")(x)  # DeepLIFT's max-pool rule, LRP's winner-take-all
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    x = keras.layers.Dense(3, activation="softmax", name="head")(x)
    model = keras.Model(inputs, x, name="parity_cnn")
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0.0, 0.5, w.shape).astype(np.float32) for w in model.get_weights()])
    bn = model.get_layer("bn")
    gamma, beta, mean, var = (np.asarray(v) for v in bn.get_weights())
    bn.set_weights([gamma, beta, mean, np.abs(var) + 0.5])  # positive moving variance
    return model


def run_methods(model_path: str, inputs_path: str, out_path: str) -> None:
    """Worker: explain the saved inputs with every registered method on this process's backend."""
    import kerascope as ks

    model = ks.load_model(model_path)
    x = np.load(inputs_path)
    results: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    for name in ks.methods.available():
        if name in NOT_APPLICABLE:
            continue
        cls = ks.methods.get(name)
        accepted = inspect.signature(cls.__init__).parameters
        params = {k: v for k, v in PARAMS.items() if k in accepted or k == "batch_size"}
        params.update(PER_METHOD.get(name, {}))
        try:
            explanation = cls(model, **params).explain(x, targets=TARGETS)
        except Exception as error:  # reported by the test, per method
            errors[name] = f"{type(error).__name__}: {error}"
            continue
        attributions = explanation.attributions
        for i, a in enumerate(attributions if isinstance(attributions, list) else [attributions]):
            results[f"{name}/attr{i}"] = np.asarray(a, np.float32)
        results[f"{name}/targets"] = np.asarray(explanation.targets)
        results[f"{name}/scores"] = np.asarray(explanation.scores, np.float32)
    # The primitives, in chunks of 3 (a remainder chunk; weight gradients summed over chunks).
    results["primitives/input"] = ks.input_gradients(model, x, TARGETS, batch_size=3)
    acts, grads = ks.layer_gradients(model, x, "conv2", TARGETS, batch_size=3)
    results["primitives/layer_acts"], results["primitives/layer_grads"] = acts, grads
    for path, grad in ks.weight_gradients(model, x, None, TARGETS, batch_size=3).items():
        results[f"primitives/weight:{path}"] = grad
    # Weights are read at each call, never baked into the compiled function: doubling the
    # head (kernel and bias) doubles the logits and so the cached Saliency's gradients.
    head = model.get_layer("head")
    results["reuse/before"] = ks.Saliency(model).explain(x, targets=TARGETS).attributions
    head.set_weights([2.0 * w for w in head.get_weights()])
    results["reuse/after"] = ks.Saliency(model).explain(x, targets=TARGETS).attributions
    np.savez(out_path, **results)
    Path(out_path).with_suffix(".json").write_text(json.dumps(errors))


def _env(backend: str) -> dict[str, str]:
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _run_all(commands: dict[str, list[str]], timeout: float = 300) -> None:
    """Run one command per backend in parallel; fail with the stderr tail of any that failed."""
    procs = {
        b: subprocess.Popen(cmd, env=_env(b), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for b, cmd in commands.items()
    }
    failures = []
    for backend, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            failures.append(f"{backend}: timed out after {timeout}s")
            continue
        if proc.returncode != 0:
            failures.append(f"{backend}: exit {proc.returncode}\n{err[-3000:]}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parity")
    model = build_model()
    model.save(folder / "model.keras")
    x = np.random.default_rng(1).uniform(0.0, 1.0, (4, 16, 16, 3)).astype(np.float32)
    np.save(folder / "inputs.npy", x)
    return folder


@pytest.fixture(scope="module")
def per_backend(saved):
    _run_all({
        b: [sys.executable, __file__, "worker", str(saved / "model.keras"), str(saved / "inputs.npy"),
            str(saved / f"{b}.npz")]
        for b in BACKENDS
    })
    out = {}
    for b in BACKENDS:
        errors = json.loads((saved / f"{b}.json").read_text())
        with np.load(saved / f"{b}.npz") as data:
            out[b] = ({k: data[k] for k in data.files}, errors)
    return out


def _close(a: np.ndarray, b: np.ndarray) -> tuple[bool, float]:
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), 1e-12)
    error = float(np.max(np.abs(a - b))) / scale
    return error <= TOLERANCE, error


def test_every_method_runs_on_every_backend(per_backend):
    for backend, (_, errors) in per_backend.items():
        assert errors == {}, f"methods failing on {backend}: {errors}"
    names = [set(k.split("/")[0] for k in results) for results, _ in per_backend.values()]
    assert all(n == names[0] for n in names)
    assert {"saliency", "gradient_x_input", "guided_backprop", "gradcam", "guided_gradcam"} <= names[0]


def test_attributions_match_across_backends(per_backend):
    reference_backend = BACKENDS[0]
    reference, _ = per_backend[reference_backend]
    mismatches = []
    for backend in BACKENDS[1:]:
        results, _ = per_backend[backend]
        for key, expected in reference.items():
            got = results[key]
            assert got.shape == expected.shape, f"{key} on {backend}: shape {got.shape} != {expected.shape}"
            if key.endswith("/targets"):
                np.testing.assert_array_equal(got, expected, err_msg=f"{key} on {backend}")
                continue
            ok, error = _close(got, expected)
            if not ok:
                mismatches.append(f"{key}: {backend} vs {reference_backend} max error {error:.2e} of scale")
    assert not mismatches, "\n".join(mismatches)


def test_compiled_functions_read_current_weights(per_backend):
    for backend, (results, _) in per_backend.items():
        np.testing.assert_allclose(results["reuse/after"], 2.0 * results["reuse/before"], rtol=1e-5, atol=1e-7,
                                   err_msg=backend)


def test_weight_gradients_cover_every_trainable_variable(per_backend):
    for backend, (results, _) in per_backend.items():
        weights = [k for k in results if k.startswith("primitives/weight:")]
        assert len(weights) == 8, (backend, weights)  # kernel+bias of conv1, conv2, head; bn gamma+beta
        assert all(np.any(results[k] != 0) for k in weights), backend


def test_attributions_are_not_trivial(per_backend):
    results, _ = per_backend[BACKENDS[0]]
    for key, value in results.items():
        if "/attr" in key:
            assert np.any(value != 0) and np.all(np.isfinite(value)), key


def test_cli_explains_a_keras_file_saved_under_another_backend(saved):
    from PIL import Image

    rng = np.random.default_rng(3)
    images = []
    for i in range(2):
        path = saved / f"img{i}.png"
        Image.fromarray(rng.uniform(0, 255, (16, 16, 3)).astype(np.uint8)).save(path)
        images.append(str(path))
    command = [sys.executable, "-c", "from kerascope.cli import main; raise SystemExit(main())"]
    _run_all({
        b: command + ["explain", str(saved / "model.keras"), *images, "--method", "gradcam", "--method",
                      "saliency", "--out", str(saved / f"cli_{b}"), "--quiet", "--json"]
        for b in BACKENDS
    })
    for method in ("gradcam", "saliency"):
        outputs = {}
        for b in BACKENDS:
            with np.load(saved / f"cli_{b}" / f"{method}.npz") as data:
                outputs[b] = (data["attributions_0"], data["targets"])
        first = outputs[BACKENDS[0]]
        assert first[0].shape[0] == 2 and np.any(first[0] != 0)
        for b in BACKENDS[1:]:
            np.testing.assert_array_equal(outputs[b][1], first[1])
            ok, error = _close(outputs[b][0], first[0])
            assert ok, f"CLI {method}: {b} vs {BACKENDS[0]} max error {error:.2e} of scale"


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "worker":
    run_methods(*sys.argv[2:])
