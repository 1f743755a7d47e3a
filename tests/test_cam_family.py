"""The CAM family against its published formulas, written independently here.

pytorch-grad-cam cannot be installed beside the test environment (it imports
torchvision, which only comes as a 5.5 GB CUDA torch pair), so its formulas
(``pytorch_grad_cam/{grad_cam_plusplus,xgrad_cam,layer_cam,hirescam,eigen_cam,
score_cam,ablation_cam}.py`` and ``utils/svd_on_activations.py``) are
reproduced below from a hand-split model: ``A = features(x)`` and
``logits = head(A)`` with the layers called directly, gradients from a
``tf.GradientTape``, ScoreCAM / AblationCAM from per-channel loops. Only
pytorch-grad-cam's display post-processing (min-max scaling, cv2 resize) is
left out: kerascope returns raw maps and resizes bilinearly (half-pixel).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import math  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.core.layers import iter_layers  # noqa: E402
from kerascope.methods import cam_perturbation  # noqa: E402
from kerascope.methods.cam_variants import principal_projection  # noqa: E402

SIZE = 12
CLASSES = 3
TARGETS = [0, 2, 1, 2]
METHODS = {
    "gradcam_plusplus": ks.GradCAMPlusPlus,
    "xgradcam": ks.XGradCAM,
    "layercam": ks.LayerCAM,
    "hirescam": ks.HiResCAM,
    "eigencam": ks.EigenCAM,
    "scorecam": ks.ScoreCAM,
    "ablationcam": ks.AblationCAM,
}


# --------------------------------------------------------------------------- models
@dataclass
class Case:
    model: keras.Model
    layer: str
    conv1: keras.Layer
    conv: keras.Layer
    head_conv: keras.Layer
    dense: keras.layers.Dense

    def features(self, x: Any) -> np.ndarray:
        return self.conv(self.conv1(tf.convert_to_tensor(x)))

    def head(self, a: Any) -> tf.Tensor:
        """Logits by hand (the Dense's softmax, if any, is not applied)."""
        flat = tf.reshape(self.head_conv(a), (tf.shape(a)[0], -1))
        return tf.matmul(flat, self.dense.kernel) + self.dense.bias


def _layers(seed: int) -> tuple[keras.Layer, ...]:
    keras.utils.set_random_seed(seed)
    init = {"bias_initializer": keras.initializers.RandomNormal(stddev=0.1, seed=seed)}
    return (
        keras.layers.Conv2D(4, 3, activation="relu", name="conv1", **init),
        keras.layers.Conv2D(5, 3, activation="relu", name="conv", **init),
        keras.layers.Conv2D(4, 3, activation="relu", name="head_conv", **init),
        keras.layers.Dense(CLASSES, activation="softmax", name="dense", **init),
    )


def functional_case() -> Case:
    conv1, conv, head_conv, dense = _layers(1)
    inputs = keras.Input((SIZE, SIZE, 3))
    outputs = dense(keras.layers.Flatten()(head_conv(conv(conv1(inputs)))))
    return Case(keras.Model(inputs, outputs, name="functional"), "conv", conv1, conv, head_conv, dense)


def nested_case() -> Case:
    conv1, conv, head_conv, dense = _layers(2)
    inputs = keras.Input((SIZE, SIZE, 3))
    inner = keras.Model(inputs, keras.layers.Flatten()(head_conv(conv(conv1(inputs)))), name="inner")
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3)), inner, dense], name="nested")
    return Case(model, "inner/conv", conv1, conv, head_conv, dense)


class Net(keras.Model):
    def __init__(self, layers: tuple[keras.Layer, ...]) -> None:
        super().__init__(name="subclassed")
        self.conv1, self.conv, self.head_conv, self.dense = layers
        self.flat = keras.layers.Flatten()

    def call(self, x: Any) -> Any:
        return self.dense(self.flat(self.head_conv(self.conv(self.conv1(x)))))


def subclassed_case() -> Case:
    layers = _layers(3)
    layers[3].activation = keras.activations.linear  # built before use: the model outputs logits
    model = Net(layers)
    model(np.zeros((1, SIZE, SIZE, 3), "float32"))
    return Case(model, "conv", *layers)


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    built = {"functional": functional_case(), "nested": nested_case(), "subclassed": subclassed_case()}
    for case in built.values():
        case.model(np.zeros((1, SIZE, SIZE, 3), "float32"))
    return built


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(4, SIZE, SIZE, 3)).astype("float32")


# ------------------------------------------------------------- independent references
def tape_grads(case: Case, x: np.ndarray, targets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    a = case.features(x)
    with tf.GradientTape() as tape:
        tape.watch(a)
        logits = case.head(a)
        score = tf.reduce_sum(tf.gather(logits, targets, axis=1, batch_dims=1))
    return a.numpy().astype(np.float64), tape.gradient(score, a).numpy().astype(np.float64)


def resize(maps: np.ndarray) -> np.ndarray:
    return tf.image.resize(maps[..., None].astype("float32"), (SIZE, SIZE), method="bilinear").numpy()[..., 0]


def weighted(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("nhwc,nc->nhw", a, w)


def ref_gradcam_plusplus(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a, g = tape_grads(case, x, t)
    # Chattopadhay et al. eq. 19 with Y = exp(S), as pytorch_grad_cam/grad_cam_plusplus.py
    sum_a = a.sum(axis=(1, 2))[:, None, None, :]
    alpha = g**2 / (2 * g**2 + sum_a * g**3 + 1e-6)
    alpha = np.where(g != 0, alpha, 0)
    w = (np.maximum(g, 0) * alpha).sum(axis=(1, 2))
    return weighted(a, w)


def ref_xgradcam(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a, g = tape_grads(case, x, t)
    w = (g * a / (a.sum(axis=(1, 2))[:, None, None, :] + 1e-7)).sum(axis=(1, 2))
    return weighted(a, w)


def ref_layercam(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a, g = tape_grads(case, x, t)
    return (np.maximum(g, 0) * a).sum(axis=-1)


def ref_hirescam(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a, g = tape_grads(case, x, t)
    return (g * a).sum(axis=-1)


def pgc_projection(a_chw: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's get_2d_projection for one sample (channels first), sign left to LAPACK."""
    reshaped = a_chw.reshape(a_chw.shape[0], -1).transpose()
    reshaped = reshaped - reshaped.mean(axis=0)
    _, _, vt = np.linalg.svd(reshaped, full_matrices=True)
    return (reshaped @ vt[0, :]).reshape(a_chw.shape[1:]), reshaped


def ref_eigencam(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a = case.features(x).numpy().astype(np.float64)
    maps = []
    for sample in a:  # loops are fine in tests
        projection, centred = pgc_projection(np.transpose(sample, (2, 0, 1)))
        # kerascope's documented sign: positively correlated with the channel-summed map
        if np.sum(projection.ravel() * centred.sum(axis=1)) < 0:
            projection = -projection
        maps.append(projection)
    return np.stack(maps)


def ref_scorecam(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a = case.features(x).numpy()
    weights = np.zeros((a.shape[0], a.shape[-1]))
    for i in range(len(x)):
        scores = []
        for c in range(a.shape[-1]):
            mask = resize(a[i : i + 1, :, :, c])[0]
            mask = (mask - mask.min()) / (mask.max() - mask.min() + 1e-8)
            masked = x[i : i + 1] * mask[None, :, :, None]
            scores.append(float(case.head(case.features(masked))[0, t[i]]))
        scores = np.array(scores, np.float64)
        weights[i] = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    return weighted(a.astype(np.float64), weights)


def ref_ablationcam(case: Case, x: np.ndarray, t: list[int]) -> np.ndarray:
    a = case.features(x).numpy()
    weights = np.zeros((a.shape[0], a.shape[-1]))
    for i in range(len(x)):
        y = float(case.head(a[i : i + 1])[0, t[i]])
        for c in range(a.shape[-1]):
            ablated = a[i : i + 1].copy()
            ablated[..., c] = 0.0
            weights[i, c] = (y - float(case.head(ablated)[0, t[i]])) / y
    return weighted(a.astype(np.float64), weights)


REFERENCES = {
    "gradcam_plusplus": ref_gradcam_plusplus,
    "xgradcam": ref_xgradcam,
    "layercam": ref_layercam,
    "hirescam": ref_hirescam,
    "eigencam": ref_eigencam,
    "scorecam": ref_scorecam,
    "ablationcam": ref_ablationcam,
}


def reference(name: str, case: Case, x: np.ndarray, t: list[int], up: bool = True) -> np.ndarray:
    cams = np.maximum(REFERENCES[name](case, x, t), 0.0)
    return resize(cams) if up else cams


def assert_maps_close(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-4) -> None:
    assert actual.shape == expected.shape
    assert np.max(np.abs(expected)) > 0, "degenerate reference (all-zero map)"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.max(np.abs(expected)))


def snapshot(model: keras.Model) -> tuple[list[np.ndarray], list[tuple[str, dict[str, Any]]]]:
    layers = [("", model)] + list(iter_layers(model))
    return [np.array(w) for w in model.weights], [(path, dict(vars(layer))) for path, layer in layers]


def assert_unchanged(model: keras.Model, before: Any) -> None:
    weights, attrs = snapshot(model)
    for old, new in zip(before[0], weights, strict=True):
        np.testing.assert_array_equal(old, new)
    for (path, old), (_, new) in zip(before[1], attrs, strict=True):
        assert old.keys() == new.keys(), (path, set(old) ^ set(new))
        for key in old:
            assert old[key] is new[key] or old[key] == new[key], (path, key)


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", ["functional", "nested", "subclassed"])
@pytest.mark.parametrize("name", list(METHODS))
def test_matches_published_formula(cases: dict[str, Case], x: np.ndarray, name: str, kind: str) -> None:
    case = cases[kind]
    before = snapshot(case.model)
    explanation = METHODS[name](case.model, layer=case.layer, batch_size=7).explain(x, TARGETS)
    assert_unchanged(case.model, before)
    assert explanation.attributions.shape == (4, SIZE, SIZE)
    assert explanation.layer == case.layer
    assert explanation.targets.tolist() == TARGETS
    logits = case.head(case.features(x)).numpy()
    np.testing.assert_allclose(explanation.scores, logits[np.arange(4), TARGETS], rtol=1e-5, atol=1e-5)
    assert_maps_close(explanation.attributions, reference(name, case, x, TARGETS))


@pytest.mark.parametrize("name", list(METHODS))
def test_no_upsampling_and_predicted_targets(cases: dict[str, Case], x: np.ndarray, name: str) -> None:
    case = cases["functional"]
    explanation = METHODS[name](case.model, layer=case.layer, upsample=False).explain(x)
    predicted = np.argmax(case.head(case.features(x)).numpy(), axis=1).tolist()
    assert explanation.targets.tolist() == predicted
    assert explanation.attributions.shape == (4, 8, 8)
    assert_maps_close(explanation.attributions, reference(name, case, x, predicted, up=False))


@pytest.mark.parametrize("name", list(METHODS))
def test_batch_invariance(cases: dict[str, Case], x: np.ndarray, name: str) -> None:
    case = cases["subclassed"]
    method = METHODS[name](case.model, layer=case.layer, batch_size=3)
    together = method.explain(x, TARGETS).attributions
    alone = np.concatenate([method.explain(x[i : i + 1], TARGETS[i]).attributions for i in range(4)])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6 * np.max(np.abs(together)))


def test_eigencam_projection_is_pytorch_grad_cam_up_to_sign(cases: dict[str, Case], x: np.ndarray) -> None:
    a = cases["functional"].features(x).numpy()
    ours = principal_projection(a)
    for i in range(len(a)):
        theirs, centred = pgc_projection(np.transpose(a[i].astype(np.float64), (2, 0, 1)))
        sign = np.sign(np.sum(ours[i] * theirs))
        np.testing.assert_allclose(ours[i], sign * theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max())
        # documented convention: positively correlated with the channel-summed activation map
        assert np.sum(ours[i].ravel() * centred.sum(axis=1)) > 0


def test_perturbation_cams_with_callable_target(cases: dict[str, Case], x: np.ndarray) -> None:
    case = cases["nested"]
    margin = lambda outputs: outputs[:, 1] - outputs[:, 0]  # noqa: E731  (logits: softmax bypassed)
    logits = case.head(case.features(x)).numpy()
    for cls in (ks.ScoreCAM, ks.AblationCAM):
        explanation = cls(case.model, layer=case.layer, upsample=False, batch_size=8).explain(x, margin)
        np.testing.assert_allclose(explanation.scores, logits[:, 1] - logits[:, 0], rtol=1e-5, atol=1e-5)
        a = case.features(x).numpy().astype(np.float64)
        # Reference: the same loops, with score = logit1 - logit0.
        weights = np.zeros((a.shape[0], a.shape[-1]))
        for i in range(len(x)):
            if cls is ks.AblationCAM:
                y = np.diff(case.head(a[i : i + 1]).numpy()[0, :2])[0]
                for c in range(a.shape[-1]):
                    ablated = a[i : i + 1].copy()
                    ablated[..., c] = 0
                    weights[i, c] = (y - np.diff(case.head(ablated).numpy()[0, :2])[0]) / y
            else:
                scores = []
                for c in range(a.shape[-1]):
                    mask = resize(a[i : i + 1, :, :, c])[0]
                    mask = (mask - mask.min()) / (mask.max() - mask.min() + 1e-8)
                    out = case.head(case.features(x[i : i + 1] * mask[None, :, :, None])).numpy()[0]
                    scores.append(out[1] - out[0])
                e = np.exp(np.array(scores) - max(scores))
                weights[i] = e / e.sum()
        assert_maps_close(explanation.attributions, np.maximum(weighted(a, weights), 0))


@pytest.mark.parametrize("cls", [ks.ScoreCAM, ks.AblationCAM])
def test_variants_are_scored_in_chunks_of_batch_size(
    cases: dict[str, Case], x: np.ndarray, cls: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = cam_perturbation.compile_scorer

    def counting(*args: Any, **kwargs: Any) -> Any:
        scorer = real(*args, **kwargs)

        def run(arrays: list[np.ndarray], *rest: Any) -> Any:
            calls.append(len(arrays[0]))
            return scorer(arrays, *rest)

        return run

    monkeypatch.setattr(cam_perturbation, "compile_scorer", counting)
    case = cases["functional"]
    explanation = cls(case.model, layer=case.layer, batch_size=6).explain(x, TARGETS)
    channels = 5
    rows = 4 * (channels + (cls is ks.AblationCAM))
    assert sum(calls) == rows
    assert len(calls) == math.ceil(rows / 6)
    assert max(calls) <= 6
    assert explanation.extras["channel_weights"].shape == (4, channels)


def test_ablationcam_leaves_model_unchanged_when_forward_raises(
    cases: dict[str, Case], x: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = cases["nested"]
    before = snapshot(case.model)

    def exploding(output: Any, channel: Any) -> Any:
        raise RuntimeError("boom inside the ablated forward pass")

    with monkeypatch.context() as patch:
        patch.setattr(cam_perturbation, "zero_channel", exploding)
        with pytest.raises(RuntimeError, match="boom"):
            ks.AblationCAM(case.model, layer=case.layer).explain(x, TARGETS)
    assert_unchanged(case.model, before)
    assert "call" not in vars(case.conv)
    # still correct afterwards
    after = ks.AblationCAM(case.model, layer=case.layer).explain(x, TARGETS).attributions
    assert_maps_close(after, reference("ablationcam", case, x, TARGETS))


def test_registry_and_exports() -> None:
    for name, cls in METHODS.items():
        assert ks.methods.get(name) is cls
        assert cls.__doc__ and "Example" in cls.__doc__
    assert ks.methods.get("gradcam++") is ks.GradCAMPlusPlus
    assert ks.methods.get("score-cam") is ks.ScoreCAM


def test_hirescam_equals_gradcam_for_global_average_pooling() -> None:
    """Draelos & Carin: with GAP + Dense the gradients are spatially constant."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(CLASSES),
    ])
    x = np.random.default_rng(1).normal(size=(2, SIZE, SIZE, 3)).astype("float32")
    hires = ks.HiResCAM(model, layer="conv").explain(x, [0, 1]).attributions
    grad = ks.GradCAM(model, layer="conv").explain(x, [0, 1]).attributions
    assert np.max(hires) > 0
    np.testing.assert_allclose(hires, grad, rtol=1e-4, atol=1e-6 * np.max(hires))


def test_sequence_model_rank3_layer() -> None:
    """Conv1D feature maps (N, t, C): maps are (N, t), upsampled linearly to the input length."""
    keras.utils.set_random_seed(7)
    conv = keras.layers.Conv1D(3, 3, activation="relu", name="conv", bias_initializer="ones")
    dense = keras.layers.Dense(2, name="dense")
    model = keras.Sequential([keras.Input((10, 2)), conv, keras.layers.Flatten(), dense])
    x = np.random.default_rng(2).normal(size=(2, 10, 2)).astype("float32")
    a = conv(x).numpy().astype(np.float64)
    flat_kernel = dense.kernel.numpy().reshape(8, 3, 2)
    y = np.einsum("ntc,tck->nk", a, flat_kernel) + dense.bias.numpy()
    for cls in METHODS.values():
        attributions = cls(model, layer="conv", batch_size=4).explain(x, [0, 1]).attributions
        assert attributions.shape == (2, 10) and np.all(np.isfinite(attributions))
    hires = ks.HiResCAM(model, layer="conv", upsample=False).explain(x, [0, 1]).attributions
    g = np.stack([flat_kernel[..., 0], flat_kernel[..., 1]])  # linear head: dy/dA is the kernel
    assert_maps_close(hires, np.maximum((g * a).sum(-1), 0))
    ablation = ks.AblationCAM(model, layer="conv", upsample=False).explain(x, [0, 1]).attributions
    t = np.array([0, 1])
    score = y[np.arange(2), t]
    drops = np.einsum("ntc,ntc->nc", a, g)  # zeroing channel c removes its linear contribution
    assert_maps_close(ablation, np.maximum(np.einsum("ntc,nc->nt", a, drops / score[:, None]), 0))


@pytest.mark.parametrize("name", ["gradcam_plusplus", "xgradcam", "layercam"])
def test_weighting_in_the_compiled_function_equals_the_host_path(cases: dict[str, Case], x: np.ndarray, name: str) -> None:
    """The weighting runs inside the compiled function on an image layer and eagerly on the placed arrays
    with ``reshape=`` (here the identity): both against the float64 reference, and against each other."""
    case = cases["functional"]
    device = METHODS[name](case.model, layer=case.layer).explain(x, TARGETS).attributions
    host = METHODS[name](case.model, layer=case.layer, reshape=lambda a: a).explain(x, TARGETS).attributions
    assert_maps_close(device, reference(name, case, x, TARGETS))
    assert_maps_close(host, reference(name, case, x, TARGETS))
    np.testing.assert_allclose(device, host, rtol=1e-5, atol=1e-6 * np.max(np.abs(host)))


def test_cam_instances_share_one_compiled_function(x: np.ndarray) -> None:
    """The map is computed on the device by a function cached per CAM class, not per instance (no retrace)."""
    case = functional_case()  # a model of its own: no function compiled for it by the other tests
    engine = ks.GradCAMPlusPlus(case.model, layer=case.layer).engine
    ks.GradCAMPlusPlus(case.model, layer=case.layer).explain(x, TARGETS)
    traces = engine.trace_count
    again = ks.GradCAMPlusPlus(case.model, layer=case.layer).explain(x, TARGETS).attributions
    assert engine.trace_count == traces
    ks.XGradCAM(case.model, layer=case.layer).explain(x, TARGETS)  # another weighting: its own function
    assert engine.trace_count == traces + 1
    assert_maps_close(again, reference("gradcam_plusplus", case, x, TARGETS))
