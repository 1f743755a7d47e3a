"""Reading a functional model's graph gives what the eager check pass observes, or nothing.

``core/graph_reading.py`` lets a functional / ``Sequential`` model's first call skip the eager
one-sample pass. Each reading is checked against the observation itself (the probed eager
pass: which softmax output equals a model output, how often a layer is called), and where the
graph cannot settle a fact the reading must say ``None``. Then the behaviours the eager pass
carried: kerascope's message for inputs a model refuses, the saturation warning of a model
whose probabilities come from no softmax layer, identical maps.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402
from kerascope.core.graph_reading import (  # noqa: E402
    call_count,
    output_probabilities,
    output_softmax,
    parent_counts,
)
from kerascope.core.output_space import softmax_outputs  # noqa: E402
from kerascope.core.probe import probe, softmax_candidates  # noqa: E402

CALLS: list[int] = []


class CountCalls(keras.layers.Layer):
    """Identity that records each Python execution of ``call`` (eager runs and traces)."""

    def call(self, x):
        CALLS.append(1)
        return x


def _x(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(0, 1, (1, *shape)).astype(np.float32)


def _observed_softmax(model: keras.Model, x: np.ndarray) -> list[str]:
    candidates = softmax_candidates(model)
    with probe(candidates) as rec:
        outputs = model(x, training=False)
    return sorted(layer.name for layer in softmax_outputs(candidates, rec.outputs, outputs))


def _softmax_models() -> dict[str, tuple[keras.Model, tuple[int, ...]]]:
    keras.utils.set_random_seed(0)
    i = keras.Input((4,))
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Activation("softmax", name="act")])
    both = keras.layers.Dense(3, name="logits")(i)
    tokens = keras.Input((5, 4))
    attended = keras.layers.MultiHeadAttention(2, 2)(tokens, tokens)
    return {
        "dense": (keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax", name="p")]), (4,)),
        "layer": (keras.Model(i, keras.layers.Softmax(name="s")(keras.layers.Dense(3)(i))), (4,)),
        "nested": (keras.Model(i, inner(i)), (4,)),
        "none": (keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]), (4,)),
        "two_heads": (keras.Model(i, [keras.layers.Dense(3, activation="softmax", name="h")(i), both]), (4,)),
        "then_dropout": (keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax", name="p"),
                                           keras.layers.Dropout(0.5)]), (4,)),
        "attention": (keras.Model(tokens, keras.layers.GlobalAveragePooling1D()(attended)), (5, 4)),
    }


@pytest.mark.parametrize("name", sorted(_softmax_models()))
def test_softmax_read_from_the_graph_is_the_one_observed_or_none(name: str) -> None:
    model, shape = _softmax_models()[name]
    read = output_softmax(model, softmax_candidates(model))
    observed = _observed_softmax(model, _x(*shape))
    if name in ("then_dropout", "attention"):  # a softmax the graph does not place at an output: not settled
        assert read is None
        assert observed == (["p"] if name == "then_dropout" else [])
    else:
        assert sorted(layer.name for layer in read) == observed
        assert observed == {"dense": ["p"], "layer": ["s"], "nested": ["act"], "none": [], "two_heads": ["h"]}[name]


def test_probabilities_read_only_where_a_float32_last_axis_softmax_makes_them() -> None:
    models = _softmax_models()
    dense = models["dense"][0]
    assert output_probabilities(dense, dense.outputs[0], [dense.layers[-1]]) is True
    none = models["none"][0]
    assert output_probabilities(none, none.outputs[0], []) is None  # logits: only the values can tell
    i = keras.Input((2, 3))
    over_rows = keras.layers.Softmax(axis=1)
    model = keras.Model(i, over_rows(i))
    assert output_probabilities(model, model.output, [over_rows]) is None  # rows along the last axis don't sum to 1
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        half = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert output_probabilities(half, half.outputs[0], [half.layers[-1]]) is None  # float16 sums: the values decide


def _observed_calls(model: keras.Model, layer: keras.Layer, x: np.ndarray) -> int:
    with probe([layer]) as rec:
        model(x, training=False)
    return len(rec.outputs.get(id(layer), ()))


class Holder(keras.layers.Layer):
    """A layer whose call also calls a layer of the model's graph: its calls are not all graph nodes."""

    def __init__(self, inner: keras.Layer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, x):
        return self.inner(x)


def test_call_counts_read_from_the_graph_equal_the_observed_ones_or_none() -> None:
    shared = keras.layers.Dense(4, name="shared")
    a, b = keras.Input((4,)), keras.Input((4,))
    siamese = keras.Model([a, b], keras.layers.Add()([shared(a), shared(b)]))
    encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d")], name="enc")
    twice = keras.Model([a, b], keras.layers.Add()([encoder(a), encoder(b)]))
    d = keras.layers.Dense(4, name="d2")
    held = keras.Model(a, Holder(d)(d(a)))
    t = keras.Input((3, 4))
    lstm = keras.layers.LSTM(2, name="lstm")
    recurrent = keras.Model(t, lstm(t))
    x2 = [_x(4), _x(4)]
    cases = [
        (siamese, [siamese, shared], x2, 2),
        (twice, [twice, encoder, encoder.get_layer("d")], x2, 2),
        (held, [held, d], _x(4), None),  # also held by `Holder`, whose call calls it: observed 2, not readable
        (recurrent, [recurrent, lstm, lstm.cell], _x(3, 4), None),  # the cell runs in the LSTM's loop
        (recurrent, [recurrent, lstm], _x(3, 4), 1),
    ]
    for model, chain, x, expected in cases:
        read = call_count(chain, parent_counts(model))
        assert read == expected, (model.name, chain[-1].name)
        if read is not None:
            assert read == _observed_calls(model, chain[-1], x)
    assert _observed_calls(held, d, _x(4)) == 2


def _reshaping_model() -> keras.Model:
    i = keras.Input((None, 3))
    h = CountCalls()(keras.layers.Reshape((4, 3))(i))
    return keras.Model(i, keras.layers.Dense(2)(keras.layers.Flatten()(h)))


@pytest.mark.parametrize("call", ["saliency", "gradcam", "forward", "scores"])
def test_inputs_a_read_model_refuses_fail_with_kerascopes_message(call: str) -> None:
    """The shapes match the model's input ``(None, None, 3)`` but its Reshape refuses 5 rows: the compiled call fails,
    then the eager check pass gives kerascope's message (as before the graph reading), not the trace's error."""
    model = _reshaping_model()
    x = np.zeros((2, 5, 3), np.float32)
    run = {
        "saliency": lambda: ks.Saliency(model).explain(x, targets=0),
        "gradcam": lambda: ks.GradCAM(model, layer=model.layers[2]).explain(x, targets=0),
        "forward": lambda: ks.Saliency(model).engine.forward(x),
        "scores": lambda: ks.Saliency(model).engine.scores(x, targets=0),
    }[call]
    with pytest.raises(ValueError, match=r"Model '.*' cannot be called on these inputs\. Received: inputs as a single"):
        run()
    ks.Saliency(model).explain(np.zeros((2, 4, 3), np.float32), targets=0)  # the shapes it takes still work


def test_probabilities_without_a_softmax_layer_still_warn_when_saturated() -> None:
    """A functional model ending in a Lambda softmax: nothing to bypass and the graph cannot say whether it outputs
    probabilities; the saturated scores make kerascope look (one eager call) and warn as before."""
    keras.utils.set_random_seed(1)
    i = keras.Input((5,))
    logits = keras.layers.Dense(2)(i)
    model = keras.Model(i, keras.layers.Lambda(lambda t: keras.ops.softmax(t * 100.0))(logits))
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    method = ks.Saliency(model)
    with pytest.warns(RuntimeWarning, match="saturated probabilities"):
        method.explain(x, targets=0)
    assert method.engine.forward_gives_probabilities is True
    assert method.engine.bypassed_layers == []


def test_logits_model_settles_not_probabilities_without_calling_it() -> None:
    """Scores outside [0, 1] show that the output is no probabilities: no eager pass is made to find out."""
    keras.utils.set_random_seed(2)
    i = keras.Input((4,))
    model = keras.Model(i, keras.layers.Dense(3, bias_initializer="ones")(CountCalls()(i)))
    method = ks.Saliency(model)
    before = len(CALLS)
    method.explain(np.ones((2, 4), np.float32) * 3.0, targets=[0, 1])
    traced = len(CALLS) - before
    if keras.backend.backend() == "tensorflow":
        assert traced == 1  # the trace only (JAX traces its function more than once)
    assert method.engine.forward_gives_probabilities is False
    assert len(CALLS) - before == traced  # settled by the scores: no call to find out


def test_read_and_observed_first_calls_give_identical_maps() -> None:
    """The same functional model explained through the graph reading and through the eager pass (forced by an
    ``output_layer`` equal to the output, which is never read from the graph)."""
    keras.utils.set_random_seed(3)
    i = keras.Input((8, 8, 2))
    h = keras.layers.Conv2D(4, 3, activation="relu", padding="same", name="conv")(i)
    out = keras.layers.Dense(3, name="logits")(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(i, keras.layers.Softmax(name="soft")(out))
    x = np.random.default_rng(1).uniform(0, 1, (3, 8, 8, 2)).astype(np.float32)
    read = ks.GradCAM(model, layer="conv").explain(x, targets=[0, 1, 2])
    observed = ks.GradCAM(model, layer="conv", output_layer="logits").explain(x, targets=[0, 1, 2])
    np.testing.assert_allclose(read.attributions, observed.attributions, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(read.scores, observed.scores, rtol=1e-5, atol=1e-6)
    assert ks.GradCAM(model, layer="conv").engine.bypassed_layers == ["soft"]


# ------------------------------------------------------- a softmax another explained output reads
class Wrapper(keras.Model):
    """Subclassed: its softmax is found by the eager pass, not from a graph."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def call(self, x):
        return self.inner(x)


def _probs_and_head():
    keras.utils.set_random_seed(0)
    x = keras.Input((4,))
    p = keras.layers.Softmax(name="sm")(keras.layers.Dense(3, name="logits")(x))
    return keras.Model(x, [p, keras.layers.Dense(1, name="q")(p)])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the reference uses tf.GradientTape")
@pytest.mark.parametrize("wrap", [False, True], ids=["functional", "subclassed"])
def test_a_softmax_read_by_the_explained_output_is_not_bypassed(wrap):
    import tensorflow as tf

    model = _probs_and_head()
    explained = Wrapper(model) if wrap else model
    v = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    xt = tf.constant(v)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        logits = model.get_layer("logits")(xt)
        q = model(xt)[1][:, 0]
        z = logits[:, 0]
    expected_q, expected_logit = tape.gradient(q, xt).numpy(), tape.gradient(z, xt).numpy()
    head = ks.Saliency(explained, output_index=1).explain(v, targets=0)
    np.testing.assert_allclose(head.attributions, expected_q, rtol=1e-5, atol=1e-7)
    assert ks.Saliency(explained, output_index=1).engine.space.bypass() == []
    # the softmax output itself is still explained as logits
    probs = ks.Saliency(explained, output_index=0).explain(v, targets=0)
    np.testing.assert_allclose(probs.attributions, expected_logit, rtol=1e-5, atol=1e-7)


# ------------------------------------------- a bypass that would change more than the output it produces
@pytest.mark.parametrize("wrap", [False, True], ids=["functional", "subclassed"])
def test_a_callable_over_all_outputs_refuses_a_softmax_another_output_reads(wrap, unchanged):
    """``[p, Dense(1)(p)]`` with a callable target and no output_index: bypassing ``p``'s softmax would compute the
    second output from logits (the map was that of a different function, off by 15x its scale). Refused; the
    two ways out the message names give the model's own gradients."""
    model = _probs_and_head()
    explained = Wrapper(model) if wrap else model
    check = unchanged(model)
    v = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    with pytest.raises(ValueError, match=r"cannot be explained in logits.*layer 'sm'.*no output_index"):
        ks.Saliency(explained).explain(v, targets=lambda outputs: outputs[1][:, 0])
    check()
    kept = ks.Saliency(explained, output="probabilities").explain(v, targets=lambda outputs: outputs[1][:, 0])
    one = ks.Saliency(explained, output_index=1).explain(v, targets=0)
    np.testing.assert_allclose(kept.attributions, one.attributions, rtol=1e-5, atol=1e-7)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(v)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            q = tf.reduce_sum(model(xt)[1][:, 0])
        np.testing.assert_allclose(one.attributions, tape.gradient(q, xt).numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("wrap", [False, True], ids=["functional", "subclassed"])
def test_a_callable_over_independent_outputs_still_bypasses_the_softmax(wrap):
    """Not over-refusing: a softmax output that nothing else reads is bypassed for a callable over all outputs."""
    keras.utils.set_random_seed(1)
    x = keras.Input((4,))
    logits = keras.layers.Dense(3, name="logits")(x)
    model = keras.Model(x, [keras.layers.Softmax(name="sm")(logits), keras.layers.Dense(1, name="q")(x)])
    explained = Wrapper(model) if wrap else model
    v = np.random.default_rng(2).normal(size=(2, 4)).astype("float32")
    both = ks.Saliency(explained).explain(v, targets=lambda outputs: outputs[0][:, 1] + outputs[1][:, 0])
    kernel = keras.ops.convert_to_numpy(model.get_layer("logits").kernel)[:, 1]
    head = keras.ops.convert_to_numpy(model.get_layer("q").kernel)[:, 0]
    np.testing.assert_allclose(both.attributions, np.tile(kernel + head, (2, 1)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wrap", [False, True], ids=["functional", "subclassed"])
def test_a_softmax_layer_called_again_upstream_is_refused(wrap):
    """One ``Softmax`` instance normalising a hidden layer and the output: bypassing it changes both calls."""
    keras.utils.set_random_seed(2)
    x = keras.Input((4,))
    shared = keras.layers.Softmax(name="shared_sm")
    hidden = keras.layers.Dense(3, name="h2")(shared(keras.layers.Dense(4, name="h1")(x)))
    model = keras.Model(x, shared(hidden))
    explained = Wrapper(model) if wrap else model
    v = np.random.default_rng(3).normal(size=(2, 4)).astype("float32")
    with pytest.raises(ValueError, match=r"layer 'shared_sm'.*calls elsewhere"):
        ks.Saliency(explained).explain(v, targets=0)
    assert ks.Saliency(explained, output="probabilities").explain(v, targets=0).attributions.shape == (2, 4)


@pytest.mark.parametrize("policy, tol", [("float32", {"rtol": 1e-5, "atol": 1e-6}),
                                         ("mixed_float16", {"rtol": 2e-2, "atol": 2e-3}),
                                         ("mixed_bfloat16", {"rtol": 2e-2, "atol": 2e-3})])
def test_a_shared_softmax_head_explains_one_of_its_outputs_as_logits(policy, tol):
    """A softmax head called on two inputs, each call an output: explaining one output bypasses it (not refused).
    The eager check compares the model's softmax in its own precision (bfloat16 rounds at 2**-7)."""
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(4)
        a, b = keras.Input((16,)), keras.Input((16,))
        head = keras.layers.Dense(10, activation="softmax", name="head")
        model = keras.Model([a, b], [head(a), head(b)])
    finally:
        keras.config.set_dtype_policy("float32")
    v = np.random.default_rng(4).normal(size=(2, 16)).astype("float32")
    got = ks.Saliency(model, output_index=0, input_index=0).explain([v, 2 * v], targets=1).attributions
    kernel = keras.ops.convert_to_numpy(keras.ops.cast(head.kernel, "float32"))[:, 1]
    np.testing.assert_allclose(got, np.tile(kernel, (2, 1)), **tol)


def test_a_softmax_also_called_from_a_lambda_closure_is_refused():
    """No graph shows a call from a Lambda's own code: the bypassed calls are counted in the pass."""
    keras.utils.set_random_seed(0)
    sm = keras.layers.Softmax(name="sm")
    x = keras.Input((4,))
    h = keras.layers.Lambda(lambda t: sm(t), name="normalise")(keras.layers.Dense(4, name="h1")(x))
    model = keras.Model(x, sm(keras.layers.Dense(3, name="logits")(h)))
    v = np.random.default_rng(0).normal(size=(2, 4)).astype("float32")
    with pytest.raises(ValueError, match=r"layer 'sm'.*calls elsewhere"):
        ks.Saliency(model).explain(v, targets=0)
    assert ks.Saliency(model, output="probabilities").explain(v, targets=0).attributions.shape == (2, 4)


def test_an_unbuilt_subclassed_model_is_explained_in_logits():
    """Its first call also records Keras's symbolic build call, which holds no values."""
    keras.utils.set_random_seed(5)

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(3, name="z")
            self.soft = keras.layers.Softmax(name="soft")

        def call(self, x):
            return self.soft(self.hidden(x))

    model = Net()
    v = np.random.default_rng(5).normal(size=(2, 4)).astype("float32")
    got = ks.Saliency(model).explain(v, targets=2).attributions
    kernel = keras.ops.convert_to_numpy(model.hidden.kernel)[:, 2]
    np.testing.assert_allclose(got, np.tile(kernel, (2, 1)), rtol=1e-5, atol=1e-6)
