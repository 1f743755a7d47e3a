"""Targets on outputs with positions: int / None refused, ks.targets.position and ks.targets.region.

References are the model's own outputs and the backend's own autodiff (tests/_autodiff.py).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kerascope as ks
from kerascope.catalog import METHODS
from tests._autodiff import gradient


def segmenter() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 2)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c"),
        keras.layers.Conv2D(3, 1, name="head"),
    ])


def sequence_model(steps: int = 5, classes: int = 6) -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((steps, 3)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(classes)])


@pytest.fixture(scope="module")
def seg():
    x = np.random.RandomState(0).rand(2, 8, 8, 2).astype("float32")
    return segmenter(), x


COALITIONS = ("feature_ablation", "shapley_exact", "shapley_sampling", "kernel_shap", "lime")


def _params(name: str) -> dict:
    if name in COALITIONS:  # 4 features (2 x 2 cells): 16 coalitions, not the default grid's 65536
        return {"mask": np.kron(np.arange(4).reshape(2, 2), np.ones((4, 4), int))}
    if name in ("layer_conductance", "internal_influence"):
        return {"layer": "c", "steps": 4}
    if name == "neuron_conductance":
        return {"layer": "c", "neuron": (1, 2, 0), "steps": 4}
    return {"layer": "c"} if "cam" in name else {}


# every method that explains a model without attention layers (the attention rollouts read attention maps)
@pytest.mark.parametrize("name", [e.name for e in METHODS if e.name not in ("attention_rollout", "gradient_rollout")])
def test_every_method_refuses_an_int_or_none_target_on_a_map_and_honours_region(seg, name):
    model, x = seg
    for flat in (2, None, [0, 1]):
        with pytest.raises(ValueError, match=r"ks\.targets\.position\(t, c\)"):
            ks.explain(model, x, method=name, targets=flat, **_params(name))
    mask = np.zeros((8, 8))
    mask[2:5, 3:7] = 1
    target = ks.targets.region(1, mask)
    result = ks.explain(model, x, method=name, targets=target, **_params(name))
    want = np.sum(keras.ops.convert_to_numpy(model(x))[..., 1] * mask, axis=(1, 2))
    np.testing.assert_allclose(result.scores, want, rtol=1e-5, atol=1e-5)
    assert np.all(np.isfinite(result.attributions))


def test_region_saliency_equals_hand_gradient_with_a_weighted_mask(seg):
    model, x = seg
    masks = np.random.RandomState(3).rand(8, 8)
    got = ks.Saliency(model, absolute=False).explain(x, ks.targets.region(2, masks)).attributions
    want = gradient(lambda v: keras.ops.sum(model(v)[..., 2] * keras.ops.convert_to_tensor(masks.astype("float32"))), x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@given(t=st.integers(-5, 4), c=st.integers(0, 5))
@settings(max_examples=4, deadline=None)
def test_position_saliency_equals_hand_gradient(t, c):
    model = _SEQ
    x = np.random.RandomState(t + 7).rand(3, 5, 3).astype("float32")
    got = ks.Saliency(model, absolute=False).explain(x, ks.targets.position(t, c)).attributions
    want = gradient(lambda v: model(v)[:, t, c], x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


_SEQ = sequence_model()


def test_position_on_a_map_and_predicted_class_at_a_position(seg):
    model, x = seg
    out = keras.ops.convert_to_numpy(model(x))
    scores = ks.GradientXInput(model).explain(x, ks.targets.position((-2, 3), 1)).scores
    np.testing.assert_allclose(scores, out[:, -2, 3, 1], rtol=1e-6)
    best = ks.Saliency(model).explain(x, ks.targets.position((1, 1))).scores
    np.testing.assert_allclose(best, out[:, 1, 1].max(-1), rtol=1e-6)


@given(shape=st.sampled_from([(4, 3), (2, 3, 3), (3, 2, 2, 2)]), flat=st.sampled_from([0, 1, None]))
@settings(max_examples=3, deadline=None)
def test_sequence_outputs_refuse_flat_targets_and_single_position_is_accepted(shape, flat):
    inputs = keras.Input((*shape[:-1], 2))
    model = keras.Model(inputs, keras.layers.Dense(shape[-1])(inputs))
    x = np.ones((1, *shape[:-1], 2), "float32")
    with pytest.raises(ValueError, match="positions"):
        ks.Saliency(model).explain(x, flat)
    single = keras.Sequential([keras.Input((1, 2)), keras.layers.Dense(3)])  # (N, 1, C): nothing to mix up
    assert ks.Saliency(single).explain(np.ones((2, 1, 2)), 2).scores.shape == (2,)


def test_bad_positions_and_masks_are_refused_clearly(seg):
    model, x = seg
    with pytest.raises(ValueError, match="Position out of range"):
        ks.Saliency(model).explain(x, ks.targets.position((8, 0), 1))
    with pytest.raises(ValueError, match="one position per axis"):
        ks.Saliency(model).explain(x, ks.targets.position(3, 1))
    with pytest.raises(ValueError, match="classes per position"):
        ks.Saliency(model).explain(x, ks.targets.position((0, 0), 3))
    with pytest.raises(ValueError, match="must cover the output's positions"):
        ks.Saliency(model).explain(x, ks.targets.region(0, np.ones((4, 4))))
    with pytest.raises(ValueError, match="its own"):
        ks.Saliency(model).explain(x, ks.targets.region(0, np.ones((2, 8, 8))))
    with pytest.raises(TypeError, match="`t` must be an int"):
        ks.targets.position(1.5, 0)
    with pytest.raises(TypeError, match="`mask`"):
        ks.targets.region(0, "everything")


def test_equal_targets_share_one_compiled_function(seg):
    from kerascope.core.targets import callable_key

    mask = np.eye(8)
    assert callable_key(ks.targets.region(1, mask)) == callable_key(ks.targets.region(1, mask.copy()))
    assert callable_key(ks.targets.position(-1, 2)) != callable_key(ks.targets.position(-1, 3))
