"""Zero maps and missed completeness are said with an ExplanationWarning naming the user's samples."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import kerascope as ks


def _caught(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in seen if issubclass(w.category, ks.ExplanationWarning)]


def _sign_model() -> keras.Model:
    """Half of the input passes keras.ops.sign (zero gradient); a variant mixes it with a smooth path."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    h = keras.layers.Lambda(keras.ops.sign)(inputs)
    return keras.Model(inputs, keras.layers.Dense(2)(h))


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "smoothgrad"])
def test_a_zero_gradient_op_gives_a_warning(method):
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    e, seen = _caught(lambda: ks.explain(_sign_model(), x, method=method, targets=0))
    assert np.all(e.attributions == 0)  # the map really is zero: the warning says why
    assert seen and any("identically zero" in str(w.message) and "[0, 1, 2]" in str(w.message) for w in seen)
    assert any("sign" in str(w.message) for w in seen)
    if method == "integrated_gradients":  # f(x) - f(0) != 0 while the attributions sum to 0
        assert any("completeness" in str(w.message) for w in seen)


def test_only_the_zero_samples_are_named():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    kernel, bias = model.layers[0].get_weights()
    model.layers[0].set_weights([np.abs(kernel), np.zeros_like(bias)])
    x = np.array([[1.0, 2.0, 0.5], [-1.0, -2.0, -0.5], [0.3, 0.1, 0.2]], "float32")  # sample 1: every ReLU off
    e, seen = _caught(lambda: ks.Saliency(model).explain(x, 0))
    assert np.all(e.attributions[1] == 0) and np.any(e.attributions[0] != 0)
    assert len(seen) == 1 and "sample(s) [1] (of 3)" in str(seen[0].message)


def test_a_saturated_sigmoid_head_is_not_silent():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    logit = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(200.0))(inputs)
    model = keras.Model(inputs, keras.ops.sigmoid(logit))  # a sigmoid no layer shows
    x = np.ones((2, 3), "float32")
    e, seen = _caught(lambda: ks.Saliency(model, output="probabilities").explain(x, 0))
    assert np.all(e.attributions == 0)
    assert seen and "output_layer=" in str(seen[0].message)


def test_cam_whose_relu_clips_every_position_warns():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 6, 1))
    feat = keras.layers.Conv2D(2, 3, padding="same", activation="relu", name="feat",
                               kernel_initializer="ones")(inputs)
    pooled = keras.layers.GlobalAveragePooling2D()(feat)
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(-1.0))(pooled)  # negative weights
    model = keras.Model(inputs, out)
    x = np.random.default_rng(0).uniform(0.1, 1.0, size=(2, 6, 6, 1)).astype("float32")
    e, seen = _caught(lambda: ks.GradCAM(model, layer="feat").explain(x, 0))
    assert np.all(e.attributions == 0)
    assert seen and "layer 'feat'" in str(seen[0].message) and "layer=" in str(seen[0].message)


def test_no_warning_for_an_ordinary_map():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    x = np.random.default_rng(0).normal(size=(2, 3)).astype("float32")
    for method in ("saliency", "integrated_gradients"):
        _, seen = _caught(lambda m=method: ks.explain(model, x, method=m, targets=0, **(
            {"steps": 64} if m == "integrated_gradients" else {})))
        assert not seen, [str(w.message) for w in seen]


class SoftmaxInside(keras.Model):
    """A softmax written in call(): nothing to bypass, so saturation is warned about."""

    def __init__(self) -> None:
        super().__init__(name="softmax_inside")
        self.conv = keras.layers.Conv2D(2, 3, padding="same", name="conv")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(2)

    def call(self, x):
        return keras.ops.softmax(self.head(self.pool(self.conv(x))))


@pytest.mark.parametrize("method,params", [("gradcam", {"layer": "conv"}), ("saliency", {})])
def test_the_saturation_warning_names_the_users_samples(method, params):
    keras.utils.set_random_seed(5)
    model = SoftmaxInside()
    x = np.zeros((4, 6, 6, 1), "float32")
    x[2:] = 1.0  # samples 2 and 3 saturate, 0 and 1 give 0.5 / 0.5
    model(x)
    model.head.set_weights([np.array([[400.0, -400.0], [400.0, -400.0]], "float32"), np.zeros(2, "float32")])
    model.conv.set_weights([np.ones((3, 3, 1, 2), "float32"), np.zeros(2, "float32")])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ks.explain(model, x, method=method, targets=0, batch_size=2, **params)
    messages = [str(w.message) for w in seen if "saturated probabilities" in str(w.message)]
    assert messages and all("samples [2, 3]" in m for m in messages), messages
