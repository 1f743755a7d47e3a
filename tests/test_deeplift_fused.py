"""DeepLIFT's rescale rules as one XLA kernel each (``fuse_rules``, TensorFlow).

The numbers of the fused rules are checked against closed forms and Captum with the rest
(tests/test_deeplift.py, tests/test_captum_crosscheck.py: both run with ``fuse_rules=True``);
here: which sites fuse, that equal sites share one kernel (one compilation per shape), the
max-pool rule on tiling windows (one kernel from the windows, against the routed rule), the
default's row threshold, reduced precision left to the separate ops, and that the kernel cache
keeps no user model alive.
"""

from __future__ import annotations

import gc
import weakref

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.inputs import Inputs
from kerascope.methods import deeplift as deeplift_module
from kerascope.propagation import deeplift_rules, fuse_tier

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the fused rules are TensorFlow's")

if keras.backend.backend() == "tensorflow":
    from kerascope._backend import tf_fused


def relu_stack(max_value: float, seed: int = 0) -> keras.Model:
    """Three ReLU layers of one configuration and one shape between dense layers."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((5,))]
    for i in range(3):
        layers += [keras.layers.Dense(7, name=f"d{i}"), keras.layers.ReLU(max_value=max_value, name=f"r{i}")]
    return keras.Sequential([*layers, keras.layers.Dense(2, name="out")])


class Counting:
    """``tf_fused.kernel`` that also records the keys it is asked for (the real kernels are returned)."""

    def __init__(self) -> None:
        self.keys: list = []
        self.kernel = tf_fused.kernel

    def __call__(self, key, fn, backward):
        self.keys.append(key)
        return self.kernel(key, fn, backward)


def test_equal_sites_share_one_kernel_compiled_once_per_shape():
    model = relu_stack(max_value=5.25)  # a setting no other test uses: a key of its own
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    fused = ks.DeepLIFT(model, fuse_rules=True).explain(x, 1)
    plain = ks.DeepLIFT(model, fuse_rules=False).explain(x, 1)
    np.testing.assert_allclose(fused.attributions, plain.attributions, rtol=1e-6, atol=1e-7)
    keys = [k for k in tf_fused._KERNELS if k[1][0] == "layer" and ("max_value", 5.25) in k[1][2]]
    assert len(keys) == 1  # three layers, one kernel
    # traced once, inside the pass (rows unknown there); XLA compiles it per number of rows when run
    assert tf_fused._KERNELS[keys[0]].experimental_get_tracing_count() == 1
    again = ks.DeepLIFT(model, fuse_rules=True).explain(x[:2], 1)
    np.testing.assert_allclose(again.attributions, plain.attributions[:2], rtol=1e-6, atol=1e-7)
    assert tf_fused._KERNELS[keys[0]].experimental_get_tracing_count() == 1


def test_default_fuses_from_the_row_threshold(monkeypatch):
    counting = Counting()
    monkeypatch.setattr(tf_fused, "kernel", counting)
    monkeypatch.setattr(deeplift_module, "FUSE_MIN_ROWS", 6)
    model = relu_stack(max_value=4.0, seed=1)
    x = np.random.default_rng(1).normal(size=(6, 5)).astype(np.float32)
    few = ks.DeepLIFT(model).explain(x[:5], 0)
    assert counting.keys == []
    many = ks.DeepLIFT(model).explain(x, 0)
    assert counting.keys and all(k[0] == "deeplift_rescale" for k in counting.keys)
    np.testing.assert_allclose(many.attributions[:5], few.attributions, rtol=1e-5, atol=1e-7)
    # DeepLiftShap counts inputs x background rows: 2 x 3 >= 6
    counting.keys.clear()
    background = np.random.default_rng(2).normal(size=(3, 5)).astype(np.float32)
    ks.DeepLiftShap(model, baseline=background).explain(x[:2], 0)
    assert counting.keys
    counting.keys.clear()
    ks.DeepLiftShap(model, baseline=background, fuse_rules=False).explain(x[:2], 0)
    assert counting.keys == []


def test_repeated_calls_fuse_once_their_saved_time_pays_for_it(monkeypatch):
    """The default's ski rental (propagation/fuse_tier.py) on a real model: separate ops until the time the fused
    rules would have saved reaches the price of fusing, then fused, with the same numbers; ``False`` never."""
    decided: list[bool] = []  # each call's choice, as the runner records it
    finish = deeplift_module._Runner.finish

    def recording(runner):
        decided.append(runner.fuse)
        return finish(runner)
    monkeypatch.setattr(deeplift_module._Runner, "finish", recording)
    model = relu_stack(max_value=3.5, seed=5)
    x = np.random.default_rng(5).normal(size=(3, 5)).astype(np.float32)
    plain = ks.DeepLIFT(model, fuse_rules=False).explain(x, 1)
    background = np.random.default_rng(6).normal(size=(2, 5)).astype(np.float32)
    shap_plain = ks.DeepLiftShap(model, baseline=background, fuse_rules=False).explain(x[:1], 1)
    # a rule that pays at once (any steady time x 1e9 exceeds the price): a steady time is still needed first
    monkeypatch.setattr(fuse_tier, "SAVED_FRACTION", 1e9)
    explainer = ks.DeepLIFT(model)
    decided.clear()
    reported = []
    for _ in range(4):
        result = explainer.explain(x, 1)
        np.testing.assert_allclose(result.attributions, plain.attributions, rtol=1e-6, atol=1e-7)
        reported.append(result.extras["fused_rules"])
    assert decided == reported == [False, False, True, True]
    tier = explainer.engine.memo(("deeplift_fuse_tier",), lambda: None)
    assert tier is not None and tier.kernels == 1  # three ReLU layers of one setting and shape: one kernel
    # another number of inputs is another shape: separate until it pays there (the fused pass is traced now)
    decided.clear()
    for _ in range(3):
        np.testing.assert_allclose(explainer.explain(x[:2], 1).attributions, plain.attributions[:2],
                                   rtol=1e-6, atol=1e-7)
    assert decided == [False, False, True]
    # another layout is another graph: DeepLiftShap's groups of 2 rows (1 input + its reference) count apart
    decided.clear()
    shap = ks.DeepLiftShap(model, baseline=background)
    for _ in range(3):
        np.testing.assert_allclose(shap.explain(x[:1], 1).attributions, shap_plain.attributions,
                                   rtol=1e-6, atol=1e-7)
    assert decided == [False, False, True]
    # fuse_rules=False never fuses, whatever the rule says
    decided.clear()
    ks.DeepLIFT(model, fuse_rules=False).explain(x, 1)
    assert decided == [False]
    # a rule that never pays: the default stays separate
    monkeypatch.setattr(fuse_tier, "SAVED_FRACTION", 0.0)
    decided.clear()
    for _ in range(3):
        ks.DeepLIFT(model).explain(x[:1], 1)
    assert decided == [False, False, False]


@pytest.mark.parametrize("activation", ["gelu", "swish", "tanh", "softplus"])
def test_grouped_and_paired_passes_fused_equal_the_separate_ops(activation):
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, activation=activation),
                              keras.layers.LeakyReLU(0.05), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(3)])
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 6, 6, 2)).astype(np.float32)
    background = rng.normal(size=(3, 6, 6, 2)).astype(np.float32)  # 2 inputs + 1 reference: 10 groups per pass
    for make in (lambda f: ks.DeepLiftShap(model, baseline=background, fuse_rules=f),
                 lambda f: ks.DeepLIFT(model, baseline=background[:2], fuse_rules=f)):  # pairs
        fused, plain = make(True).explain(x, [0, 2]), make(False).explain(x, [0, 2])
        scale = np.abs(plain.attributions).max()
        np.testing.assert_allclose(fused.attributions, plain.attributions, rtol=0, atol=1e-6 * scale)
        np.testing.assert_allclose(fused.extras["completeness_error"], plain.extras["completeness_error"],
                                   atol=1e-6 * np.abs(plain.scores).max())


def pooled(pool: keras.Layer, shape: tuple[int, ...], seed: int = 7) -> keras.Model:
    """conv(relu) -> ``pool`` -> conv(relu) -> global max pool -> dense: two max-pool rules per pass."""
    keras.utils.set_random_seed(seed)
    conv = keras.layers.Conv1D if len(shape) == 2 else keras.layers.Conv2D
    gmax = keras.layers.GlobalMaxPooling1D if len(shape) == 2 else keras.layers.GlobalMaxPooling2D
    return keras.Sequential([keras.Input(shape), conv(4, 3, padding="same", activation="relu"), pool,
                             conv(5, 3, padding="same", activation="relu"), gmax(), keras.layers.Dense(3)])


@pytest.mark.parametrize("pool, shape", [
    (keras.layers.MaxPooling2D(2), (13, 11, 3)),  # "valid": the last row and column in no window
    (keras.layers.MaxPooling2D(3, padding="same"), (13, 11, 3)),
    (keras.layers.MaxPooling2D((3, 2)), (12, 10, 3)),
    (keras.layers.MaxPooling1D(2, padding="same"), (9, 3)),
], ids=["2x2 valid", "3x3 same", "3x2", "1d same"])
def test_tiling_max_poolings_fuse_and_equal_the_separate_ops(pool, shape):
    counting = Counting()
    model = pooled(pool, shape)
    rng = np.random.default_rng(8)
    x = np.round(rng.normal(0, 1.5, (5, *shape))).astype(np.float32)  # tied maxima in many windows
    background = np.round(rng.normal(0, 1.5, (3, *shape))).astype(np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tf_fused, "kernel", counting)
        for make in (lambda f: ks.DeepLIFT(model, fuse_rules=f),
                     lambda f: ks.DeepLiftShap(model, baseline=background, fuse_rules=f)):  # one pass of 3 groups
            counting.keys.clear()
            fused, plain = make(True).explain(x, [0, 1, 2, 0, 1]), make(False).explain(x, [0, 1, 2, 0, 1])
            pools = [k for k in counting.keys if k[0] == "deeplift_maxpool"]
            assert len(pools) == 1  # the pooling; not the global one (below)
            np.testing.assert_allclose(fused.attributions, plain.attributions, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(fused.extras["completeness_error"], plain.extras["completeness_error"],
                                       atol=1e-5 * np.abs(plain.scores).max())


@pytest.mark.parametrize("pool", [
    keras.layers.MaxPooling2D(3, strides=2),  # overlapping windows
    keras.layers.MaxPooling2D(2, data_format="channels_first"),
    keras.layers.MaxPooling3D(2),  # rank-8 windows: past TensorFlow's broadcasting kernels
    keras.layers.GlobalMaxPooling2D(),  # a max reduction: its gradient splits ties evenly
    keras.layers.AveragePooling2D(2),  # linear: no rule at all
    type("MyPool", (keras.layers.MaxPooling2D,), {})(2),  # a subclass may pool differently
], ids=["overlapping", "channels first", "3d", "global", "average", "subclass"])
def test_other_max_poolings_keep_the_routed_rule(pool):
    assert deeplift_rules.pooling_windows(pool) is None
    assert deeplift_rules.fusable(pool, "maxpool") is None


def test_a_tie_in_a_global_max_pooling_splits_as_its_gradient_does():
    # max(2, 2, 0) - max(0, 0, 0) = 2: TensorFlow's (and JAX's) gradient of a max reduction gives each tied
    # input half; a fused pooling would give the first all of it. Fused or not, the numbers must not change.
    model = keras.Sequential([keras.Input((3, 1)), keras.layers.GlobalMaxPooling1D(),
                              keras.layers.Dense(1, use_bias=False, name="w")])
    model.get_layer("w").set_weights([np.ones((1, 1), np.float32)])
    x = np.array([2.0, 2.0, 0.0], np.float32).reshape(1, 3, 1)
    for fuse in (True, False):
        np.testing.assert_allclose(ks.DeepLIFT(model, fuse_rules=fuse).explain(x, 0).attributions.ravel(),
                                   [1.0, 1.0, 0.0])


def test_paired_references_keep_the_routed_max_pool_rule():
    counting = Counting()
    model = pooled(keras.layers.MaxPooling2D(2), (8, 8, 2), seed=9)
    rng = np.random.default_rng(9)
    x, per_sample = rng.normal(size=(2, 8, 8, 2)).astype(np.float32), rng.normal(size=(2, 8, 8, 2)).astype(np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tf_fused, "kernel", counting)
        fused = ks.DeepLIFT(model, baseline=per_sample, fuse_rules=True).explain(x, 1)
    assert counting.keys and not [k for k in counting.keys if k[0] == "deeplift_maxpool"]
    plain = ks.DeepLIFT(model, baseline=per_sample, fuse_rules=False).explain(x, 1)
    np.testing.assert_allclose(fused.attributions, plain.attributions, rtol=1e-6, atol=1e-7)


def test_other_backends_and_reduced_precision_run_one_pass_kind():
    """``fuse_rules`` changes nothing where nothing fuses: one compiled pass, not two (no second trace)."""
    model = relu_stack(max_value=1.5, seed=5)
    inputs = Inputs([np.zeros((1, 5), np.float32)])
    explainer = ks.DeepLIFT(model, fuse_rules=None, precision="bfloat16")
    def fuses(method: ks.DeepLIFT, comparisons: int) -> bool:  # the first pass's rule decides
        return deeplift_module._Runner(method, inputs, 0, [0], comparisons).rule(True).fuse

    assert fuses(explainer, 10_000) is False
    assert fuses(ks.DeepLIFT(model), 10_000) is True
    assert fuses(ks.DeepLIFT(model), 31) is False


def test_xla_probe_only_when_fusing_is_wanted(monkeypatch):
    """XLA's probe (``rules_fuse``: one tiny compilation, ~0.1 s) is not paid by calls that do not fuse."""
    asked = []

    def counting_rules_fuse():
        asked.append(True)
        return deeplift_rules.rules_fuse()
    monkeypatch.setattr(deeplift_module, "rules_fuse", counting_rules_fuse)
    model = relu_stack(max_value=2.5, seed=7)
    x = np.random.default_rng(7).normal(size=(3, 5)).astype(np.float32)
    ks.DeepLIFT(model).explain(x, 0)  # a small default call: separate ops, no probe
    ks.DeepLIFT(model, fuse_rules=False).explain(x, 0)
    assert asked == []
    assert ks.DeepLIFT(model, fuse_rules=True).explain(x, 0).extras["fused_rules"] and asked == [True]


def test_only_keras_own_activations_fuse():
    class Doubled(keras.layers.ReLU):  # a subclass may compute anything: not fused
        def call(self, inputs):
            return 2.0 * super().call(inputs)

    def relu(x):  # a user function named like Keras' relu
        return keras.ops.relu(x) * 3.0

    assert deeplift_rules.fusable(Doubled(), "elementwise") is None
    assert deeplift_rules.fusable(keras.layers.Dense(2, activation=relu), "activation") is None
    key, fn, exact = deeplift_rules.fusable(keras.layers.Dense(2, activation="gelu"), "activation")
    assert key == ("activation", "gelu") and fn is keras.activations.gelu and not exact
    assert deeplift_rules.fusable(keras.layers.ReLU(negative_slope=0.1), "elementwise")[2] is False
    # the user's function is still rescaled (by the separate ops), with its own values
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="o")(keras.layers.Dense(4, activation=relu)(inputs)))
    x = np.random.default_rng(3).normal(size=(3, 3)).astype(np.float32)
    e = ks.DeepLIFT(model, fuse_rules=True).explain(x, 0)
    np.testing.assert_allclose(e.attributions.sum(axis=1), e.scores - e.extras["baseline_scores"], rtol=1e-4,
                               atol=1e-5)


def test_reduced_precision_keeps_the_separate_ops(monkeypatch):
    counting = Counting()
    monkeypatch.setattr(tf_fused, "kernel", counting)
    model = relu_stack(max_value=3.0, seed=2)
    x = np.random.default_rng(4).normal(0, 20, size=(3, 5)).astype(np.float32)
    # target 0: f(x) - f(0) is 0.2-0.9 for every sample (target 1's 0.02 for sample 0 did not survive
    # bfloat16 rounding within the summation check's bound on a CPU without native bfloat16 arithmetic)
    fused = ks.DeepLIFT(model, fuse_rules=True, precision="bfloat16").explain(x, 0)
    plain = ks.DeepLIFT(model, fuse_rules=False, precision="bfloat16").explain(x, 0)
    assert counting.keys == []
    np.testing.assert_array_equal(fused.attributions, plain.attributions)


def test_the_kernel_cache_keeps_no_model_alive(unchanged):
    model = relu_stack(max_value=2.5, seed=3)
    check = unchanged(model)
    x = np.random.default_rng(5).normal(size=(2, 5)).astype(np.float32)
    explainer = ks.DeepLIFT(model, fuse_rules=True)
    explainer.explain(x, 0)
    check()
    assert any(k[1][0] == "layer" and ("max_value", 2.5) in k[1][2] for k in tf_fused._KERNELS)
    dead = weakref.ref(model)
    del model, explainer, check
    gc.collect()
    assert dead() is None


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_fuse_rules_must_be_a_bool_or_none(value):
    with pytest.raises(ValueError, match=r"`fuse_rules` must be True, False or None.*Received: fuse_rules="):
        ks.DeepLIFT(relu_stack(max_value=6.0), fuse_rules=value)


def test_the_kernel_cache_keeps_the_most_recent(monkeypatch):
    monkeypatch.setattr(tf_fused, "MAX_KERNELS", 2)
    for k in range(4):
        tf_fused.kernel(("lru-test", k), lambda v: v, lambda xs, y, dy, vjp: [dy])
    assert [k for k in tf_fused._KERNELS if k[0] == "lru-test"] == [("lru-test", 2), ("lru-test", 3)]
