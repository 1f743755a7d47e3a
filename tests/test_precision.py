"""``precision="bfloat16"``: reduced-precision passes, float32 results, the model never changed.

Checked against closed forms (a linear model's gradient is its weight row, rounded to
bfloat16 when the pass runs in bfloat16), float32 runs of the same method (a tolerance),
and properties: float32 outputs, the model's weights and dtype policies identical after
the call and after an exception inside the traced pass, one engine (compiled-function
cache) per precision, unknown precisions refused in the Keras style.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.engine import engine_for
from kerascope.core.precision import check_precision, reduced_precision
from kerascope.methods import registry
from kerascope.methods.base import UnsupportedModelError

# JAX compiles every function with XLA (seconds each on 2 cores): the multi-pass methods, whose swap is
# the same traced call as Saliency's, run on TensorFlow and PyTorch only
_NOT_ON_JAX = pytest.mark.skipif(keras.backend.backend() == "jax", reason="same traced call as Saliency; CI time")


def _rounded(values: np.ndarray, dtype: str = "bfloat16") -> np.ndarray:
    """``values`` rounded to ``dtype`` and back (the backend's own cast)."""
    rounded = keras.ops.cast(keras.ops.cast(np.asarray(values, "float32"), dtype), "float32")
    return keras.ops.convert_to_numpy(rounded)


def _linear() -> keras.Model:
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, name="d")], name="linear")
    rng = np.random.default_rng(0)
    model.get_layer("d").set_weights([rng.normal(size=(5, 3)).astype("float32") * 1.2345,
                                      np.zeros(3, "float32")])
    return model


def _init(seed: int) -> keras.initializers.Initializer:
    """A seeded initializer (no global seeding: later tests keep their own random state)."""
    return keras.initializers.GlorotUniform(seed=seed)


class _Block(keras.layers.Layer):
    """A subclassed layer with its own sub-layers (walked into by the policy swap)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(4, 3, padding="same", activation="tanh", name="conv", kernel_initializer=_init(11))
        self.norm = keras.layers.BatchNormalization(name="norm")

    def call(self, x):
        return self.norm(self.conv(x))


def _nested() -> keras.Model:
    inner = keras.Sequential([keras.Input((12, 12, 3)), _Block(name="block")], name="backbone")
    x_in = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(4, 3, activation="tanh", name="conv2", kernel_initializer=_init(12))(inner(x_in))
    x = keras.layers.GlobalAveragePooling2D()(x)
    head = keras.layers.Dense(3, activation="softmax", name="head", kernel_initializer=_init(13))
    return keras.Model(x_in, head(x), name="nested")


def _snapshot(model: keras.Model) -> tuple[list[np.ndarray], list[tuple[str, object]]]:
    from kerascope.core.layers import iter_layers

    layers = [model, *(layer for _, layer in iter_layers(model))]
    return [w.copy() for w in model.get_weights()], [(layer.name, layer.dtype_policy) for layer in layers]


def _same(before, after) -> bool:
    weights_a, policies_a = before
    weights_b, policies_b = after
    return (all(np.array_equal(a, b) for a, b in zip(weights_a, weights_b))
            and len(policies_a) == len(policies_b)
            and all(na == nb and pa is pb for (na, pa), (nb, pb) in zip(policies_a, policies_b)))


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_linear_gradient_is_the_weight_row_rounded(precision):
    model = _linear()
    kernel = model.get_layer("d").get_weights()[0]
    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    full = ks.Saliency(model).explain(x, 1)
    half = ks.Saliency(model, precision=precision).explain(x, 1)
    np.testing.assert_allclose(full.attributions, np.tile(kernel[:, 1], (4, 1)), rtol=1e-6)
    np.testing.assert_array_equal(half.attributions, np.tile(_rounded(kernel[:, 1], precision), (4, 1)))
    assert not np.array_equal(half.attributions, full.attributions)  # the pass really ran in bfloat16
    assert half.attributions.dtype == np.float32 and np.asarray(half.scores).dtype == np.float32
    # the score: a reduced matmul of rounded inputs and weights, within bfloat16's rounding
    expected = _rounded(x, precision) @ _rounded(kernel[:, 1], precision)
    np.testing.assert_allclose(half.scores, expected, rtol=1e-2, atol=1e-2)
    assert half.params["precision"] == precision


@pytest.mark.parametrize("name, params, tolerance", [
    ("saliency", {}, 0.03),  # measured 0.3-0.7% on this smooth (tanh) network
    ("gradcam", {"layer": "conv2"}, 0.03),
    pytest.param("integrated_gradients", {"steps": 8}, 0.03, marks=_NOT_ON_JAX),
    pytest.param("smoothgrad", {"samples": 4, "seed": 0}, 0.03, marks=_NOT_ON_JAX),
])
def test_close_to_float32_and_model_unchanged(name, params, tolerance):
    model = _nested()
    x = np.random.default_rng(2).random((3, 12, 12, 3)).astype("float32")
    before = _snapshot(model)
    full = registry.build(name, model, params).explain(x, 0)
    half = registry.build(name, model, {**params, "precision": "bfloat16"}).explain(x, 0)
    assert _same(before, _snapshot(model))
    assert half.attributions.dtype == np.float32 and np.asarray(half.scores).dtype == np.float32
    a, b = full.attributions.reshape(3, -1), half.attributions.reshape(3, -1)
    error = np.linalg.norm(b - a, axis=1) / np.linalg.norm(a, axis=1)
    assert error.max() < tolerance, error
    assert error.max() > 0  # reduced precision really applied (a float32 rerun would be identical)


class _RefusesBFloat16(keras.layers.Layer):
    """Raises while traced in bfloat16 (the eager float32 checks pass): an exception mid-swap."""

    def call(self, x):
        if self.compute_dtype == "bfloat16":
            raise RuntimeError("no bfloat16 here")
        return x


def test_policies_restored_after_an_exception():
    x_in = keras.Input((5,))
    model = keras.Model(x_in, keras.layers.Dense(2)(_RefusesBFloat16()(keras.layers.Dense(4)(x_in))))
    before = _snapshot(model)
    with pytest.raises(RuntimeError, match="no bfloat16"):
        ks.Saliency(model, precision="bfloat16").explain(np.ones((2, 5), "float32"), 0)
    assert _same(before, _snapshot(model))
    with pytest.raises(KeyError), reduced_precision(model, "bfloat16"):
        assert model.layers[1].dtype_policy.name == "mixed_bfloat16"
        raise KeyError("inside the block")
    assert _same(before, _snapshot(model))
    ks.Saliency(model).explain(np.ones((2, 5), "float32"), 0)  # float32 still works


def test_other_policies_left_alone():
    x_in = keras.Input((3,))
    model = keras.Model(x_in, keras.layers.Dense(2, dtype="float64", name="d64")(keras.layers.Dense(3, name="d")(x_in)))
    with reduced_precision(model, "bfloat16"):
        assert model.get_layer("d64").dtype_policy.name == "float64"
        assert model.get_layer("d").dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("d").dtype_policy.name == "float32"


def test_one_engine_and_cache_per_precision():
    model = _linear()
    assert engine_for(model, precision="float32") is engine_for(model)
    half = engine_for(model, precision="bfloat16")
    assert half is not engine_for(model) and half is engine_for(model, precision="bfloat16")
    x = np.ones((2, 5), "float32")
    ks.Saliency(model).explain(x, 0)
    traced = half.trace_count
    ks.Saliency(model, precision="bfloat16").explain(x, 0)
    assert half.trace_count == traced + 1  # its own compiled function, not the float32 one
    ks.Saliency(model, precision="bfloat16").explain(x, 0)
    assert half.trace_count == traced + 1  # and reused


@pytest.mark.parametrize("value", ["half", "bf16", "Float16", 16, True])
def test_unknown_precision_refused(value):
    model = _linear()
    with pytest.raises(ValueError, match=rf"Received: precision={value!r}\. Expected one of None, 'float32'"):
        ks.Saliency(model, precision=value)
    with pytest.raises(ValueError, match="Unknown `precision`"):
        registry.build("gradcam", model, {"precision": value})
    assert check_precision("float16") == "float16"


@pytest.mark.parametrize("name", ["lrp", "deeplift", "deeplift_shap"])
def test_float16_refused_where_it_gives_nan(name):
    model = _nested()
    with pytest.raises(ValueError, match=r"cannot run in float16\. Its stabilised divisions underflow.*"
                                         r"Received: precision='float16'\. Use precision='bfloat16'"):
        registry.build(name, model, {"precision": "float16"})
    if name == "deeplift_shap" or keras.backend.backend() == "jax":  # the refusal is the check (CI time)
        return
    x = np.random.default_rng(3).random((2, 12, 12, 3)).astype("float32")
    full = registry.build(name, model, {}).explain(x, 0).attributions
    half = registry.build(name, model, {"precision": "bfloat16"}).explain(x, 0).attributions
    assert np.linalg.norm(half - full) <= 0.1 * np.linalg.norm(full)  # bfloat16 runs, close to float32


def _policy_cnn(dtype: str) -> keras.Model:
    """A small CNN whose layers compute in ``dtype``'s policy (set per layer: the global policy is untouched)."""
    x_in = keras.Input((10, 10, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", dtype=dtype, kernel_initializer=_init(21), name="c1")(x_in)
    x = keras.layers.MaxPooling2D(dtype=dtype, name="pool")(x)
    x = keras.layers.Conv2D(6, 3, activation="tanh", dtype=dtype, kernel_initializer=_init(22), name="c2")(x)
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype)(x)
    return keras.Model(x_in, keras.layers.Dense(3, dtype=dtype, kernel_initializer=_init(23), name="head")(x))


@pytest.mark.parametrize("name", ["lrp", "deeplift", "deeplift_shap"])
def test_a_model_computing_in_float16_is_refused_in_bfloat16_it_runs(name):
    """A mixed_float16 model gave NaN maps (the same underflow as precision='float16'), reported as the model's
    NaN: refused up front, naming the policy. A mixed_bfloat16 model runs; DeepLIFT's summation check allows
    bfloat16's rounding (it refused the model as having hidden non-linearities)."""
    with pytest.raises(ValueError, match=r"cannot run on a model that computes in float16\. Its stabilised "
                                         r"divisions underflow.*layers computing in float16: \['c1' \(mixed_float16\).*float32 copy"):
        registry.build(name, _policy_cnn("mixed_float16"), {})
    if name == "deeplift_shap" or keras.backend.backend() == "jax":
        return
    half, full = _policy_cnn("mixed_bfloat16"), _policy_cnn("float32")
    full.set_weights(half.get_weights())
    x = np.random.default_rng(4).random((3, 10, 10, 3)).astype("float32")
    if name == "deeplift" and keras.backend.backend() == "torch":
        # torch's bfloat16 rounding puts this model's smallest f(x) - f(0) (0.006) 14% off: refused, saying why
        with pytest.raises(UnsupportedModelError, match=r"by more than bfloat16 rounding is allowed.*the model's "
                                                        r"dtype policy.*Explain in float32"):
            registry.build(name, half, {}).explain(x, [0, 1, 2])
        return
    got = np.asarray(registry.build(name, half, {}).explain(x, [0, 1, 2]).attributions, "float32")
    want = np.asarray(registry.build(name, full, {}).explain(x, [0, 1, 2]).attributions, "float32")
    assert np.all(np.isfinite(got))
    assert np.linalg.norm(got - want) <= 0.1 * np.linalg.norm(want)


def _batchnorm_cnn(dtype: str) -> keras.Model:
    """Conv2D and DepthwiseConv2D, each followed by a BatchNormalization (canonised by LRP), in ``dtype``'s policy."""
    x_in = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", dtype=dtype, kernel_initializer=_init(31), name="c1")(x_in)
    x = keras.layers.ReLU(dtype=dtype)(keras.layers.BatchNormalization(dtype=dtype, name="bn1")(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", dtype=dtype, depthwise_initializer=_init(32), name="dw")(x)
    x = keras.layers.ReLU(6.0, dtype=dtype)(keras.layers.BatchNormalization(dtype=dtype, name="bn2")(x))
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype)(x)
    return keras.Model(x_in, keras.layers.Dense(3, dtype=dtype, kernel_initializer=_init(33), name="head")(x))


@pytest.mark.parametrize("composite", ["epsilon", "epsilon_plus"])
def test_lrp_canonises_batchnorm_in_bfloat16(composite):
    """The fused kernel of a Conv + BatchNormalization pair was float32 (BatchNormalization reads its variables
    without autocast) on a bfloat16 input: a TypeError from inside the convolution, for a mixed_bfloat16 model
    and for precision='bfloat16' alike."""
    half, full = _batchnorm_cnn("mixed_bfloat16"), _batchnorm_cnn("float32")
    rng = np.random.default_rng(5)  # the same weights on every backend; BatchNormalization variances positive
    weights = [rng.uniform(0.5, 1.5, w.shape) if w.ndim == 1 else rng.normal(0, 0.5, w.shape)
               for w in full.get_weights()]
    full.set_weights([w.astype("float32") for w in weights])
    half.set_weights([w.astype("float32") for w in weights])
    x = rng.random((2, 8, 8, 3)).astype("float32")
    want = ks.LRP(full, composite=composite).explain(x, 1)
    for model, options in ((half, {}), (full, {"precision": "bfloat16"})):
        got = ks.LRP(model, composite=composite, **options).explain(x, 1)
        assert np.all(np.isfinite(got.attributions))
        # ε divides by z + ε sign(z): near-zero z amplify bfloat16's 8-bit rounding (0.145 relative L2 here, on all
        # three backends); z⁺'s denominators stay away from 0 (0.007-0.011)
        bound = 0.25 if composite == "epsilon" else 0.05
        assert np.linalg.norm(got.attributions - want.attributions) <= bound * np.linalg.norm(want.attributions)
        np.testing.assert_allclose(got.scores, want.scores, rtol=0.05, atol=0.02 * np.abs(want.scores).max())
    # the mixed_bfloat16 model's own output (its BatchNormalization computes in float32), not a refused value
    own = keras.ops.convert_to_numpy(half(x, training=False)).astype("float32")[:, 1]
    np.testing.assert_allclose(ks.LRP(half, composite=composite).explain(x, 1).scores, own, rtol=1e-2, atol=1e-3)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the CLI is backend-independent; its pass is tested above")
def test_cli_precision_flag_matches_python_api(tmp_path, capsys):
    from kerascope.cli import main
    from kerascope.data import demo_images, demo_model_path
    from kerascope.io.images import load_images

    out = tmp_path / "out"
    assert main(["explain", str(demo_model_path()), str(demo_images()[0]), "--method", "saliency", "--target", "2",
                 "--precision", "bfloat16", "--out", str(out), "--quiet"]) == 0
    model = ks.load_model(demo_model_path())
    x = load_images(demo_images()[:1], size=(64, 64)).inputs
    expected = ks.Saliency(model, precision="bfloat16").explain(x, targets=2).attributions
    saved = ks.Explanation.load(out / "saliency.npz")
    np.testing.assert_allclose(saved.attributions, expected, rtol=1e-5, atol=1e-7)
    assert saved.params["precision"] == "bfloat16"
    with pytest.raises(SystemExit):
        main(["explain", str(demo_model_path()), str(demo_images()[0]), "--precision", "half",
              "--out", str(tmp_path / "o")])
    assert "invalid choice: 'half'" in capsys.readouterr().err


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the CLI is backend-independent; its pass is tested above")
def test_cli_batch_precision_flag_is_part_of_the_run(tmp_path):
    from kerascope.cli import main

    model = keras.Sequential([keras.Input((12, 12, 3)),
                              keras.layers.Conv2D(4, 3, activation="tanh", name="conv", kernel_initializer=_init(5)),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, kernel_initializer=_init(6))])
    model.save(tmp_path / "m.keras")
    x = np.random.default_rng(4).random((3, 12, 12, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert main(["batch", str(tmp_path / "m.keras"), str(tmp_path / "x.npy"), "--method", "gradcam", "--layer", "conv",
                 "--target", "1", "--precision", "bfloat16", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert ks.batch.manifest(tmp_path / "out")["method_params"]["precision"] == "bfloat16"
    expected = ks.GradCAM(model, layer="conv", precision="bfloat16").explain(x, 1).attributions
    np.testing.assert_allclose(ks.batch.maps_to_numpy(ks.batch.read(tmp_path / "out")), expected, rtol=1e-5, atol=1e-6)


_SMALL = {  # keeps every method to a few passes
    "integrated_gradients": {"steps": 4}, "expected_gradients": {"samples": 2}, "deeplift_shap": {"samples": 2},
    "smoothgrad": {"samples": 2}, "smoothgrad_squared": {"samples": 2}, "vargrad": {"samples": 2},
    "lime": {"samples": 8}, "kernel_shap": {"samples": 8}, "shapley_sampling": {"samples": 1},
    "shapley_exact": {"mask": np.repeat(np.repeat(np.arange(4).reshape(2, 2), 4, 0), 4, 1)},
    "rise": {"masks": 4, "cell": 2}, "occlusion": {"window": 4}, "feature_ablation": {"mask": "grid"},
    "layer_conductance": {"layer": "conv", "steps": 2}, "internal_influence": {"layer": "conv", "steps": 2},
    "neuron_conductance": {"layer": "conv", "neuron": (1, 2, 0), "steps": 2}, "blur_ig": {"steps": 2, "max_sigma": 2},
    "guided_ig": {"steps": 2}, "xrai": {"steps": 2, "min_pixel_diff": 4},
}


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="one backend is enough for the method sweep")
def test_every_method_runs_in_bfloat16_and_leaves_the_model_unchanged():
    from kerascope.catalog import METHODS

    model = keras.Sequential([keras.Input((8, 8, 3)),
                              keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv",
                                                  kernel_initializer=_init(7)),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(3, activation="softmax", kernel_initializer=_init(8))])
    x = np.random.default_rng(5).random((2, 8, 8, 3)).astype("float32")
    before = _snapshot(model)
    for entry in METHODS:
        if entry.name in ("attention_rollout", "gradient_rollout"):  # they read attention maps: this CNN has none
            continue
        explanation = registry.build(entry.name, model, {**_SMALL.get(entry.name, {}), "precision": "bfloat16"}).explain(x, 1)
        attributions = explanation.attributions
        assert attributions.dtype == np.float32 and np.all(np.isfinite(attributions)), entry.name
        assert explanation.params["precision"] == "bfloat16"
    assert _same(before, _snapshot(model))
