"""``input_index=`` for the rule-based methods (DeepLIFT, DeepLiftShap, LRP) on two-input models.

The chosen input is attributed; the other is held at its value in the input and in the
reference (Captum's ``additional_forward_args``). Checked against the closed form of a linear
model (``w * (x - b)`` for the chosen input) and against Captum's ``DeepLift`` /
``DeepLiftShap`` on identical weights for a non-linear two-input model.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402

RNG = np.random.default_rng(11)
A, B, CLASSES = 4, 3, 3


def linear_model(bias: bool) -> keras.Model:
    a, b = keras.Input((A,), name="a"), keras.Input((B,), name="b")
    out = keras.layers.Dense(CLASSES, use_bias=bias, name="out")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], out)
    model.set_weights([RNG.normal(0, 1, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def two_inputs(n: int) -> list[np.ndarray]:
    return [RNG.uniform(0.1, 1, (n, A)).astype(np.float32), RNG.uniform(0.1, 1, (n, B)).astype(np.float32)]


def test_linear_model_closed_form_for_the_chosen_input():
    model = linear_model(bias=True)
    w = model.get_layer("out").get_weights()[0]
    x, t = two_inputs(3), np.array([0, 2, 1])
    for index, position, part in ((0, 0, slice(0, A)), ("b", 1, slice(A, A + B))):
        weights = w[part][:, t].T  # (n, features): the target column
        e = ks.DeepLIFT(model, baseline=0.5, input_index=index).explain(x, t)
        np.testing.assert_allclose(e.attributions, weights * (x[position] - 0.5), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(e.extras["input_index"], [position])
        assert np.all(np.abs(e.extras["completeness_error"]) < 1e-4)
        # the reference holds the other input: f(x) - f(baseline) moves only the chosen part
        np.testing.assert_allclose(e.attributions.sum(axis=1), e.scores - e.extras["baseline_scores"], atol=1e-5)
        background = RNG.uniform(0, 1, (5, x[position].shape[1])).astype(np.float32)
        shap = ks.DeepLiftShap(model, baseline=background, input_index=index).explain(x, t)
        expected = weights * (x[position] - background.mean(axis=0))
        np.testing.assert_allclose(shap.attributions, expected, rtol=1e-5, atol=1e-5)
        # per-sample references (the 2N layout) give the same closed form
        refs = RNG.uniform(0, 1, x[position].shape).astype(np.float32)
        paired = ks.DeepLIFT(model, baseline=refs, input_index=index).explain(x, t)
        np.testing.assert_allclose(paired.attributions, weights * (x[position] - refs), rtol=1e-5, atol=1e-5)


def test_lrp_epsilon_on_a_bias_free_linear_model_is_weight_times_input():
    model = linear_model(bias=False)
    w = model.get_layer("out").get_weights()[0]
    x, t = two_inputs(2), np.array([1, 2])
    both = ks.LRP(model, composite="epsilon", epsilon=0.0).explain(x, t)
    one = ks.LRP(model, composite="epsilon", epsilon=0.0, input_index="b").explain(x, t)
    np.testing.assert_allclose(one.attributions, w[A:][:, t].T * x[1], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(one.attributions, both.attributions[1], rtol=1e-6)
    np.testing.assert_array_equal(one.extras["input_index"], [1])
    # relevance of both inputs sums to the logit (conservation); the held input's share is not returned
    np.testing.assert_allclose(both.extras["conservation"], 1.0, atol=1e-4)
    np.testing.assert_allclose(one.extras["relevance_sum"], (w[A:][:, t].T * x[1]).sum(axis=1), rtol=1e-4)


def test_refusals_name_the_inputs():
    model = linear_model(bias=True)
    x = two_inputs(1)
    for method in (ks.DeepLIFT(model, input_index="c"), ks.LRP(model, input_index=5)):
        with pytest.raises(ValueError, match="Received"):
            method.explain(x, 0)


# --------------------------------------------------------------- Captum, identical weights
def nonlinear_pair(seed: int = 0):
    torch = pytest.importorskip("torch")
    a, b = keras.Input((A,), name="a"), keras.Input((B,), name="b")
    ha = keras.layers.Dense(5, activation="relu", name="ha")(a)
    hb = keras.layers.Dense(5, activation="tanh", name="hb")(b)
    h = keras.layers.Dense(4, activation="relu", name="h")(keras.layers.Concatenate()([ha, hb]))
    model = keras.Model([a, b], keras.layers.Dense(CLASSES, name="out")(h))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.8, w.shape).astype(np.float32) for w in model.get_weights()])

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ha, self.hb = torch.nn.Linear(A, 5), torch.nn.Linear(B, 5)
            self.h, self.out = torch.nn.Linear(10, 4), torch.nn.Linear(4, CLASSES)
            self.ra, self.tb, self.rh = torch.nn.ReLU(), torch.nn.Tanh(), torch.nn.ReLU()

        def forward(self, xa, xb):
            z = torch.cat([self.ra(self.ha(xa)), self.tb(self.hb(xb))], dim=1)
            return self.out(self.rh(self.h(z)))

    net = Net()
    for name in ("ha", "hb", "h", "out"):
        kernel, bias = model.get_layer(name).get_weights()
        with torch.no_grad():
            getattr(net, name).weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            getattr(net, name).bias.copy_(torch.from_numpy(bias))
    return model, net.eval(), torch


@pytest.mark.captum
def test_captum_deeplift_and_deepliftshap_on_one_of_two_inputs():
    captum_attr = pytest.importorskip("captum.attr")
    model, net, torch = nonlinear_pair()
    x, t = two_inputs(4), np.array([0, 1, 2, 1])
    tx = [torch.from_numpy(v) for v in x]
    target = torch.from_numpy(t)
    np.testing.assert_allclose(ks.Engine(model).forward(x), net(*tx).detach().numpy(), rtol=1e-5, atol=1e-5)
    background = RNG.uniform(0, 1, (3, B)).astype(np.float32)
    for chosen, held in ((0, 1), (1, 0)):
        order = (lambda c, h: (c, h)) if chosen == 0 else (lambda c, h: (h, c))

        def forward(c, h, _order=order):
            return net(*_order(c, h))

        class Wrapped(torch.nn.Module):  # Captum attributes the first forward argument
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, c, h):
                return forward(c, h)

        inputs = tx[chosen].clone().requires_grad_(True)
        reference = torch.full_like(inputs, 0.3)
        theirs = captum_attr.DeepLift(Wrapped()).attribute(
            inputs, baselines=reference, target=target, additional_forward_args=(tx[held],)).detach().numpy()
        ours = ks.DeepLIFT(model, baseline=0.3, input_index=chosen).explain(x, t).attributions
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())
        if chosen == 1:
            shap = captum_attr.DeepLiftShap(Wrapped()).attribute(
                inputs, baselines=torch.from_numpy(background), target=target,
                additional_forward_args=(tx[held],)).detach().numpy()
            ours = ks.DeepLiftShap(model, baseline=background, input_index="b").explain(x, t).attributions
            np.testing.assert_allclose(ours, shap, rtol=0, atol=1e-4 * np.abs(shap).max())
