"""CAMs on every model kind: sequences, vision-transformer tokens, modern CNNs, multi-input models.

Backend-independent (runs on TensorFlow, JAX and PyTorch). The references are
written here without kerascope: activations from a Functional sub-model (or the
layers called directly), gradients in closed form where the head after the layer
is linear (global average pooling + Dense: ``dy_k/dA_tc = W_ck / T``), tokens
reshaped by hand, resizing with ``keras.ops.image.resize``, and the gradient at an inner
transformer layer by the backend's own autodiff (``tests/_autodiff.py``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _autodiff import gradient  # noqa: E402
from keras import layers as L  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.core import spatial  # noqa: E402
from kerascope.core.inputs import Inputs  # noqa: E402
from kerascope.methods.base import UnsupportedModelError  # noqa: E402

GRADIENT_CAMS = [ks.GradCAM, ks.GradCAMPlusPlus, ks.XGradCAM, ks.LayerCAM, ks.HiResCAM, ks.EigenCAM]


def resize(maps: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
    """Bilinear (linear for 1-D) resizing with Keras' own op, independent of kerascope's numpy resize."""
    maps = np.asarray(maps, np.float32)
    if maps.ndim == 2:  # (N, t) -> (N, t, 1, 1) resized to (T, 1)
        out = keras.ops.image.resize(maps[:, :, None, None], (size[0], 1), interpolation="bilinear", antialias=False)
        return keras.ops.convert_to_numpy(out)[:, :, 0, 0]
    out = keras.ops.image.resize(maps[..., None], size, interpolation="bilinear", antialias=False)
    return keras.ops.convert_to_numpy(out)[..., 0]


def close(actual: np.ndarray, expected: np.ndarray) -> None:
    scale = float(np.max(np.abs(expected))) + 1e-12
    assert actual.shape == expected.shape
    assert np.max(expected) > 0, "the reference map is all zero: the test would prove nothing"
    np.testing.assert_allclose(actual, expected, rtol=2e-4, atol=2e-5 * scale)


def linear_head_gradcam(activations: np.ndarray, kernel: np.ndarray, targets: list[int]) -> np.ndarray:
    """Grad-CAM when the head is GAP + Dense: the gradient at every position is ``W[:, k] / positions``."""
    positions = int(np.prod(activations.shape[1:-1]))
    weights = kernel[:, targets].T / positions  # (N, C)
    return np.maximum(np.einsum("n...c,nc->n...", activations.astype(np.float64), weights), 0.0)


# --------------------------------------------------------------------------- sequences
def text_model(seed: int = 0, vocab: int = 20, length: int = 12) -> keras.Model:
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    x = L.Embedding(vocab, 8, name="embedding")(tokens)
    x = L.LSTM(6, return_sequences=True, name="lstm")(x)
    x = L.Conv1D(5, 3, strides=2, name="conv")(x)  # 12 tokens -> 5 positions
    x = L.GlobalAveragePooling1D(name="gap")(x)
    return keras.Model(tokens, L.Dense(2, activation="softmax", name="out")(x))


def test_sequence_cam_on_token_model_matches_hand_written() -> None:
    model = text_model()
    x = np.random.default_rng(0).integers(0, 20, (3, 12)).astype("int32")
    targets = [0, 1, 1]
    features = keras.Model(model.inputs, model.get_layer("conv").output)
    a = keras.ops.convert_to_numpy(features(x))
    kernel = keras.ops.convert_to_numpy(model.get_layer("out").kernel)
    expected = linear_head_gradcam(a, kernel, targets)
    e = ks.GradCAM(model).explain(x, targets)
    assert e.layer == "conv"  # the last layer with a temporal extent > 1 that feeds the prediction
    close(e.attributions, resize(expected, (12,)))
    raw = ks.GradCAM(model, upsample=False).explain(x, targets).attributions
    close(raw, expected)
    lstm = ks.GradCAM(model, layer="lstm", upsample=False).explain(x, targets).attributions
    assert lstm.shape == (3, 12)
    for cls in GRADIENT_CAMS + [ks.AblationCAM]:
        assert cls(model, batch_size=8).explain(x, targets).attributions.shape == (3, 12), cls.__name__
    for cls in (ks.ScoreCAM, ks.GuidedGradCAM):  # both change / differentiate the input: token ids cannot
        with pytest.raises(UnsupportedModelError, match="integer inputs"):
            cls(model).explain(x, targets)


def test_sequence_cam_on_feature_series() -> None:
    keras.utils.set_random_seed(3)
    series = keras.Input((10, 2))
    h = L.Conv1D(4, 3, activation="relu", name="conv1")(series)
    h = L.Conv1D(3, 3, name="conv2")(h)
    model = keras.Model(series, L.Dense(2, name="out")(L.GlobalAveragePooling1D()(h)))
    x = np.random.default_rng(1).normal(size=(2, 10, 2)).astype("float32")
    a = keras.ops.convert_to_numpy(keras.Model(series, h)(x))
    kernel = keras.ops.convert_to_numpy(model.get_layer("out").kernel)
    e = ks.GradCAM(model).explain(x, [0, 1])
    assert e.layer == "conv2"
    close(e.attributions, resize(linear_head_gradcam(a, kernel, [0, 1]), (10,)))
    assert ks.ScoreCAM(model).explain(x, [0, 1]).attributions.shape == (2, 10)
    assert ks.GuidedGradCAM(model).explain(x, [0, 1]).attributions.shape == (2, 10, 2)


# --------------------------------------------------------------------------- vision transformer
class ClassToken(L.Layer):
    """``extra`` learned tokens put before the patch tokens (1: a class token)."""

    def __init__(self, extra: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.extra = extra

    def build(self, shape):
        self.tokens = self.add_weight(shape=(1, self.extra, shape[-1]), initializer="random_normal", name="tokens")

    def call(self, x):
        batch = keras.ops.shape(x)[0]
        return keras.ops.concatenate([keras.ops.repeat(self.tokens, batch, axis=0), x], axis=1)


class TakeFirst(L.Layer):
    def call(self, x):
        return x[:, 0]


def vit(pool: str = "cls", extra: int = 1, size: int = 16, patch: int = 4, dim: int = 8) -> keras.Model:
    """A small ViT from Keras layers: Conv2D patch embedding, class token, 2 MultiHeadAttention blocks."""
    keras.utils.set_random_seed(5)
    image = keras.Input((size, size, 3))
    x = L.Conv2D(dim, patch, strides=patch, name="patch")(image)
    x = L.Reshape((-1, dim), name="patches")(x)
    if extra:
        x = ClassToken(extra, name="cls")(x)
    for b in range(2):
        h = L.LayerNormalization(name=f"ln{b}a")(x)
        x = L.Add(name=f"add{b}a")([x, L.MultiHeadAttention(2, 4, name=f"mha_{b}")(h, h)])
        h = L.Dense(dim, activation="gelu", name=f"mlp{b}")(L.LayerNormalization(name=f"ln{b}b")(x))
        x = L.Add(name=f"add{b}b")([x, h])
    x = L.LayerNormalization(name="final_ln")(x)
    x = TakeFirst(name="take_cls")(x) if pool == "cls" else L.GlobalAveragePooling1D(name="gap")(x)
    return keras.Model(image, L.Dense(3, name="head")(x))


def test_token_cam_equals_hand_reshaped_cam() -> None:
    """Tokens pooled by mean (class token included): the last block's output is the default layer."""
    model = vit(pool="mean")
    x = np.random.default_rng(2).uniform(size=(3, 16, 16, 3)).astype("float32")
    targets = [0, 2, 1]
    tokens = keras.ops.convert_to_numpy(keras.Model(model.inputs, model.get_layer("final_ln").output)(x))
    assert tokens.shape == (3, 17, 8)
    kernel = keras.ops.convert_to_numpy(model.get_layer("head").kernel)
    grid = tokens[:, 1:].reshape(3, 4, 4, 8)  # the class token dropped, patches back on the 4x4 grid
    expected = np.maximum(np.einsum("nhwc,nc->nhw", grid.astype(np.float64), kernel[:, targets].T / 17), 0)
    e = ks.GradCAM(model).explain(x, targets)
    assert e.layer == "final_ln"
    close(e.attributions, resize(expected, (16, 16)))
    close(ks.GradCAM(model, upsample=False).explain(x, targets).attributions, expected)
    # reshape= overrides the automatic grid: a transposed grid gives the transposed map
    transposed = ks.GradCAM(
        model, upsample=False, reshape=lambda a: a[:, 1:].reshape(len(a), 4, 4, -1).transpose(0, 2, 1, 3)
    ).explain(x, targets).attributions
    close(transposed, expected.transpose(0, 2, 1))


def test_vit_default_layer_and_every_cam_on_tokens() -> None:
    """Class-token classifier: patch tokens of the last block's output do not feed the prediction, so the
    default layer is the input of the last attention block (pytorch-grad-cam's ``blocks[-1].norm1``)."""
    model = vit(pool="cls")
    x = np.random.default_rng(4).uniform(size=(3, 16, 16, 3)).astype("float32")
    assert ks.GradCAM(model).explain(x[:1]).layer == "ln1a"
    for cls in GRADIENT_CAMS + [ks.ScoreCAM, ks.AblationCAM, ks.GuidedGradCAM]:
        method = cls(model, batch_size=16)
        one = method.explain(x[:1], [2]).attributions
        three = method.explain(x, [2, 0, 1]).attributions
        shape = (16, 16, 3) if cls is ks.GuidedGradCAM else (16, 16)
        assert one.shape == (1, *shape) and three.shape == (3, *shape), cls.__name__
        np.testing.assert_allclose(one[0], three[0], rtol=1e-4, atol=1e-5 * (np.abs(three).max() + 1e-12))
    # the map of a token layer is the map of its hand-reshaped tokens (AblationCAM zeroes a channel of every
    # token, class token included, as pytorch-grad-cam's AblationLayerVit)
    eigen = ks.EigenCAM(model, layer="ln1a", upsample=False).explain(x).attributions
    tokens = keras.ops.convert_to_numpy(keras.Model(model.inputs, model.get_layer("ln1a").output)(x))
    reference = np.maximum(spatial_projection(tokens[:, 1:].reshape(3, 4, 4, -1)), 0)
    close(eigen, reference)


def spatial_projection(a: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's get_2d_projection per sample (centred SVD), sign: components summing to > 0, or
    (LayerNorm outputs, whose channel sum is constant over tokens) the largest component positive."""
    out = []
    for sample in a.astype(np.float64):
        flat = sample.reshape(-1, sample.shape[-1])
        flat = flat - flat.mean(axis=0)
        v = np.linalg.svd(flat, full_matrices=False)[2][0]
        decider = v.sum() if abs(v.sum()) > 1e-3 * np.abs(v).sum() else v[np.argmax(np.abs(v))]
        first = v * (1 if decider >= 0 else -1)
        out.append((flat @ first).reshape(sample.shape[:-1]))
    return np.stack(out)


# ~15 s of compilation on JAX (eager attention, then the hand gradient): there under -m slow
@(pytest.mark.slow if keras.backend.backend() == "jax" else lambda test: test)
def test_token_gradcam_at_inner_block_equals_hand_gradient() -> None:
    model = vit(pool="cls")
    x = np.random.default_rng(6).uniform(size=(2, 16, 16, 3)).astype("float32")
    get = model.get_layer
    t = get("cls")(get("patches")(get("patch")(x)))  # the same layers called by hand up to ln1a's output
    h = get("ln0a")(t)
    t = get("add0a")([t, get("mha_0")(h, h)])
    t = get("add0b")([t, get("mlp0")(get("ln0b")(t))])
    a, t = keras.ops.convert_to_numpy(get("ln1a")(t)), keras.ops.convert_to_numpy(t)

    def score(a):  # the rest of the model as a function of ln1a's output (the residual stream held fixed)
        u = get("add1a")([keras.ops.convert_to_tensor(t), get("mha_1")(a, a)])
        u = get("add1b")([u, get("mlp1")(get("ln1b")(u))])
        logits = get("head")(get("final_ln")(u)[:, 0])
        return keras.ops.take_along_axis(logits, keras.ops.convert_to_tensor(np.array([[1], [2]])), axis=1)

    g = gradient(score, a)[:, 1:].reshape(2, 4, 4, -1)  # the backend's own autodiff (tests/_autodiff.py)
    grid = a[:, 1:].reshape(2, 4, 4, -1)
    expected = np.maximum(np.einsum("nhwc,nc->nhw", grid, g.mean(axis=(1, 2))), 0)
    close(ks.GradCAM(model, layer="ln1a").explain(x, [1, 2]).attributions, resize(expected, (16, 16)))


def test_tokens_on_no_patch_grid_are_refused() -> None:
    model = vit(pool="cls", extra=2)  # 16 patches + 2 leading tokens: not h*w nor h*w + 1
    x = np.zeros((1, 16, 16, 3), "float32")
    with pytest.raises(ValueError, match="match no patch grid.*reshape="):
        ks.GradCAM(model, layer="ln1a").explain(x)
    e = ks.GradCAM(model, layer="ln1a", reshape=lambda a: a[:, 2:].reshape(len(a), 4, 4, -1)).explain(x)
    assert e.attributions.shape == (1, 16, 16)


# --------------------------------------------------------------------------- modern CNNs
# The default-layer search walks the Keras graph (the same on every backend), and building these
# applications costs ~50 s each on JAX/PyTorch: those two run their CAM on MobileNetV3Small only.
_ON_TF_ONLY = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                 reason="graph walk is backend-independent; checked on TensorFlow")


@pytest.mark.parametrize("name", ["MobileNetV3Small", pytest.param("EfficientNetB0", marks=_ON_TF_ONLY),
                                  pytest.param("ConvNeXtTiny", marks=_ON_TF_ONLY)])
def test_default_layer_of_applications_is_not_one_by_one(name: str) -> None:
    model = getattr(keras.applications, name)(weights=None, input_shape=(64, 64, 3), classes=4)
    x = np.random.default_rng(0).uniform(0, 255, (1, 64, 64, 3)).astype("float32")
    layer = spatial.default_layer(model, Inputs(x))
    entries = {id(entry): shape for entry, shape, _ in spatial.survey(model, Inputs(x))}
    assert entries[id(layer)][1:3] == (2, 2), layer.name  # the last map of the 64 px input, not the 1x1 head
    if name == "MobileNetV3Small":  # the 1x1 classifier convolution that was the default before
        assert entries[id(model.get_layer("logits"))][1:3] == (1, 1)
        e = ks.GradCAM(model, upsample=False).explain(x)
        assert e.layer == model.get_layer(layer.name).name
        assert np.ptp(e.attributions) > 0 and np.ptp(ks.EigenCAM(model).explain(x).attributions) > 0


def test_default_layer_is_no_zero_padding_layer() -> None:
    """A padded map has border rows outside the input: MobileNetV3Small / EfficientNetB0 at 32 px got their
    ``*_depthwise_pad`` layer (3 x 3 for a 2 x 2 stage) as default. The layer before the padding is chosen."""
    keras.utils.set_random_seed(11)
    model = keras.Sequential([
        keras.Input((8, 8, 1)), L.Conv2D(3, 3, strides=4, padding="same", name="stage"),  # 2 x 2
        L.ZeroPadding2D(((0, 1), (0, 1)), name="pad"), L.Conv2D(4, 3, strides=2, name="down"),  # 3 x 3 -> 1 x 1
        L.Flatten(), L.Dense(2, name="out")])
    x = np.random.default_rng(11).normal(size=(2, 8, 8, 1)).astype("float32")
    assert spatial.default_layer(model, Inputs(x)).name == "stage"
    e = ks.GradCAM(model, upsample=False).explain(x, [0, 1])
    assert e.layer == "stage" and e.attributions.shape == (2, 2, 2)


def test_default_layer_ignores_a_saturated_softmax() -> None:
    """The layer search compares logits, not probabilities. With the softmax saturated (a logit gap of 200:
    exactly [1, 0] in float32) no change of any layer reached the output, so the search moved to other
    layers or failed; the demo model on a random image got conv2b instead of its last convolution conv3b
    (and the ``floor-gradcam-*`` scenarios' Grad-CAM floor, found on zeros, was at conv3b: GradCAM read 1.49x)."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([
        keras.Input((8, 8, 1)), L.Conv2D(3, 3, activation="relu", name="early"), L.Conv2D(4, 3, name="late"),
        L.GlobalAveragePooling2D(), L.Dense(2, activation="softmax", name="out")])
    kernel, bias = model.get_layer("out").get_weights()
    model.get_layer("out").set_weights([kernel, np.array([200.0, 0.0], "float32")])
    x = np.random.default_rng(5).uniform(0, 1, (2, 8, 8, 1)).astype("float32")
    assert np.array_equal(keras.ops.convert_to_numpy(model(x)), [[1.0, 0.0], [1.0, 0.0]])  # saturated
    assert spatial.default_layer(model, Inputs(x)).name == "late"
    assert ks.methods.cam.default_layer(model, Inputs(x)).name == "late"  # what bench/floor.py uses
    for output in ("logits", "probabilities"):
        assert ks.GradCAM(model, output=output).resolved_params(x)["layer"] == "late"
    e = ks.GradCAM(model, upsample=False).explain(x, 1)
    assert e.layer == "late" and e.attributions.shape == (2, 4, 4) and np.ptp(e.attributions) > 0


# --------------------------------------------------------------------------- multi-input
def two_input_models() -> tuple[keras.Model, keras.Model]:
    """The same layers and weights with the image as first and as second input."""
    keras.utils.set_random_seed(8)
    image, table = keras.Input((10, 10, 2), name="image"), keras.Input((3,), name="table")
    h = L.Conv2D(4, 3, activation="relu", name="conv1")(image)
    h = L.Conv2D(3, 3, name="conv2")(h)
    merged = L.Concatenate()([L.GlobalAveragePooling2D()(h), L.Dense(4, name="tab")(table)])
    out = L.Dense(3, name="out")(merged)
    return keras.Model([image, table], out), keras.Model([table, image], out)


def test_multi_input_image_first_and_second() -> None:
    first, second = two_input_models()
    rng = np.random.default_rng(9)
    image = rng.uniform(size=(2, 10, 10, 2)).astype("float32")
    table = rng.normal(size=(2, 3)).astype("float32")
    a = keras.ops.convert_to_numpy(keras.Model(first.inputs[0], first.get_layer("conv2").output)(image))
    kernel = keras.ops.convert_to_numpy(first.get_layer("out").kernel)[:3]  # the image half of the head
    expected = resize(linear_head_gradcam(a, kernel, [0, 2]), (10, 10))
    for model, x in ((first, [image, table]), (second, [table, image])):
        e = ks.GradCAM(model).explain(x, [0, 2])
        assert e.layer == "conv2"
        close(e.attributions, expected)
        close(ks.GradCAM(model, input_index="image").explain(x, [0, 2]).attributions, expected)
    for cls in (ks.ScoreCAM, ks.AblationCAM, ks.GuidedGradCAM, ks.LayerCAM):
        one = cls(first).explain([image, table], [0, 2]).attributions
        two = cls(second).explain([table, image], [0, 2]).attributions
        assert one.shape[:3] == (2, 10, 10)
        np.testing.assert_allclose(one, two, rtol=1e-4, atol=1e-6 * (np.abs(one).max() + 1e-12))
    with pytest.raises(ValueError, match="Unknown input name.*'image'"):
        ks.GradCAM(second, input_index="img").explain([table, image])


def test_two_images_need_input_index() -> None:
    keras.utils.set_random_seed(10)
    left, right = keras.Input((8, 8, 1), name="left"), keras.Input((8, 8, 1), name="right")
    feats = [L.GlobalAveragePooling2D()(L.Conv2D(2, 3, name=f"conv_{n}")(t)) for n, t in (("l", left), ("r", right))]
    model = keras.Model([left, right], L.Dense(2)(L.Concatenate()(feats)))
    x = [np.random.default_rng(1).uniform(size=(1, 8, 8, 1)).astype("float32") for _ in range(2)]
    with pytest.raises(ValueError, match="input_index="):
        ks.GradCAM(model).explain(x)
    assert ks.GradCAM(model, input_index="left").explain(x).layer == "conv_l"  # the layer of THAT input
    assert ks.GradCAM(model, input_index=1).explain(x).layer == "conv_r"
