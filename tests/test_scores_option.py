"""``scores=False``: no clean forward pass spent on ``Explanation.scores`` when the targets are given.

Checked on real tiny models: the attributions are the same numbers, the model sees exactly the
inputs' rows fewer (a layer counts the rows it is called on, in the compiled passes too), targets=None
keeps the pass and its scores, methods whose result needs the clean score keep it, and everything that
reads ``Explanation.scores`` (save / load, the notebook view, plots, the CLI, the batch worker) takes None.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import kerascope as ks  # noqa: E402

BACKGROUND = np.random.default_rng(5).random((2, 8, 8, 3)).astype(np.float32)
# the methods that skip the pass, with small settings (tolerance= and layer= take their own code paths)
SKIPPING = {
    "smoothgrad": (ks.SmoothGrad, {"samples": 4}),
    "smoothgrad_squared": (ks.SmoothGradSquared, {"samples": 4}),
    "vargrad": (ks.VarGrad, {"samples": 4}),
    "smoothgrad_tolerance": (ks.SmoothGrad, {"samples": 4, "tolerance": 0.5, "max_samples": 8}),
    "smoothgrad_layer": (ks.SmoothGrad, {"samples": 4, "layer": "conv"}),
    "rise": (ks.RISE, {"masks": 8, "cell": 2}),
    "expected_gradients": (ks.ExpectedGradients, {"samples": 4, "baseline": BACKGROUND}),
    "expected_gradients_tolerance": (
        ks.ExpectedGradients, {"samples": 4, "baseline": BACKGROUND, "tolerance": 0.5, "max_samples": 8}
    ),
}


class RowCounter(keras.layers.Layer):
    """The identity, counting the rows it is called on in Python (on TensorFlow through ``tf.numpy_function``,
    so compiled calls count too). Not a variable: kerascope refuses a model that assigns variables at inference."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.count = 0

    def _add(self, rows):
        self.count += int(rows)
        return rows

    def call(self, x):
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            tf.numpy_function(self._add, [tf.shape(x)[0]], tf.int32)  # stateful: runs in every compiled call
        else:
            self._add(x.shape[0])
        return x

    def seen(self) -> int:
        return self.count


def tiny_model(counter: keras.layers.Layer | None = None) -> keras.Model:
    layers = [keras.Input((8, 8, 3))] + ([counter] if counter is not None else [])
    layers += [keras.layers.Conv2D(4, 3, activation="relu", name="conv"), keras.layers.Flatten(),
               keras.layers.Dense(5, name="logits")]
    model = keras.Sequential(layers)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) * 0.5 for w in model.get_weights()])
    return model


X = np.random.default_rng(1).random((3, 8, 8, 3)).astype(np.float32)
TARGETS = [0, 3, 4]


@pytest.mark.parametrize("case", sorted(SKIPPING))
def test_scores_false_same_attributions_no_scores(case):
    cls, params = SKIPPING[case]
    model = tiny_model()
    kept = cls(model, **params).explain(X, TARGETS)
    skipped = cls(model, scores=False, **params).explain(X, TARGETS)
    np.testing.assert_array_equal(skipped.attributions, kept.attributions)
    assert skipped.scores is None and skipped.params["scores"] is False
    assert skipped.targets.tolist() == TARGETS == kept.targets.tolist()
    # the default is unchanged: the targets' scores of the model at the inputs (no softmax in this model)
    outputs = keras.ops.convert_to_numpy(model(X))
    np.testing.assert_allclose(kept.scores, outputs[np.arange(3), TARGETS], rtol=1e-5, atol=1e-6)
    assert kept.params["scores"] is True


@pytest.mark.parametrize("case", ["smoothgrad", "vargrad", "rise"])
def test_the_model_is_called_on_the_inputs_rows_fewer(case):
    if keras.backend.backend() == "jax":
        pytest.skip("Python code inside jax.jit runs when traced, not per call: the layer cannot count there")
    cls, params = SKIPPING[case]
    counter = RowCounter()
    model = tiny_model(counter)
    cls(model, **params).explain(X, TARGETS)  # the one-time eager probes (softmax detection) happen here
    seen = []
    for scores in (True, False):
        before = counter.seen()
        cls(model, scores=scores, **params).explain(X, TARGETS)
        seen.append(counter.seen() - before)
    variants = len(X) * (params.get("samples") or params.get("masks"))
    assert seen == [variants + len(X), variants]  # only the method's own rows are left


def test_targets_none_keeps_the_pass_and_the_scores():
    model = tiny_model()
    explanation = ks.SmoothGrad(model, samples=2, scores=False).explain(X)
    outputs = keras.ops.convert_to_numpy(model(X))
    assert explanation.targets.tolist() == outputs.argmax(axis=1).tolist()
    np.testing.assert_allclose(explanation.scores, outputs.max(axis=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, params", [
    (ks.Occlusion, {"window": 4, "stride": 4}),
    (ks.IntegratedGradients, {"steps": 4}),
    (ks.Saliency, {}),
])
def test_methods_that_need_or_already_have_the_score_keep_it(cls, params):
    model = tiny_model()
    kept = cls(model, **params).explain(X, TARGETS)
    skipped = cls(model, scores=False, **params).explain(X, TARGETS)
    np.testing.assert_array_equal(skipped.attributions, kept.attributions)
    np.testing.assert_allclose(skipped.scores, keras.ops.convert_to_numpy(model(X))[np.arange(3), TARGETS],
                               rtol=1e-5, atol=1e-6)


def test_scores_must_be_a_flag():
    with pytest.raises(TypeError, match="`scores` must be True or False. Received: scores='no'"):
        ks.SmoothGrad(tiny_model(), scores="no")


def test_explanation_without_scores_saves_loads_plots_and_renders(tmp_path):
    explanation = ks.SmoothGrad(tiny_model(), samples=2, scores=False).explain(X, TARGETS)
    loaded = ks.Explanation.load(explanation.save(tmp_path / "e.npz"))
    assert loaded.scores is None and loaded.targets.tolist() == TARGETS
    np.testing.assert_array_equal(loaded.attributions, explanation.attributions)
    html = loaded._repr_html_()
    assert "target 3" in html and "score" not in html
    figure = loaded.plot(X)
    assert len(figure.axes) >= 3
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_cli_param_scores_false(tmp_path):
    from kerascope.cli import main
    from kerascope.data import demo_images, demo_model_path

    image = str(demo_images()[0])
    common = ["explain", str(demo_model_path()), image, "--method", "smoothgrad", "--param", "samples=2",
              "--param", "scores=false", "--quiet"]
    assert main([*common, "--target", "2", "--out", str(tmp_path / "given")]) == 0
    given = ks.Explanation.load(tmp_path / "given" / "smoothgrad.npz")
    assert given.scores is None and given.params["scores"] is False and given.targets.tolist() == [2]
    assert main([*common, "--out", str(tmp_path / "predicted")]) == 0  # targets=None: the pass picks the class
    assert ks.Explanation.load(tmp_path / "predicted" / "smoothgrad.npz").scores.shape == (1,)


def test_batch_worker_fills_the_score_column_from_its_own_forward_pass(tmp_path):
    from kerascope.batch.sources import ArraySource
    from kerascope.batch.worker import BatchExplainer, WorkerConfig

    model = tiny_model()
    path = tmp_path / "tiny.keras"
    model.save(path)
    columns = []
    for scores in (True, False):
        config = WorkerConfig(str(path), ArraySource(X), method="smoothgrad",
                              method_params={"samples": 2, "scores": scores})
        columns.append(BatchExplainer(config).explain_indices(np.arange(3), np.array(TARGETS)))
    np.testing.assert_allclose(columns[1]["score"], columns[0]["score"], rtol=1e-5)
    np.testing.assert_array_equal(columns[1]["map"], columns[0]["map"])
