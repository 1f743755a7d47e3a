"""TCAV: Captum's TCAV on a torch twin, a planted concept, the statistics, errors.

The Captum cross-check runs on the torch backend's reference only once (TensorFlow run, torch twin);
the planted-concept and error tests run on every backend.
"""

from __future__ import annotations

import collections

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.concepts.stats import logistic_regression, ttest_ind

D_IN, HIDDEN, CLASSES = 6, 8, 3


def _mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((D_IN,)), keras.layers.Dense(HIDDEN, activation="relu", name="hidden"),
                             keras.layers.Dense(5, activation="tanh", name="fc"),
                             keras.layers.Dense(CLASSES, activation="softmax", name="out")])


def _planted_model() -> keras.Model:
    """logit_0 = 2 h_0 + 3 h_4 h_5: the concept along h_0 drives class 0; along h_5 it pushes half the inputs
    up and half down (the sign of h_4), so it has no consistent effect."""
    x = keras.Input((D_IN,))
    hidden = keras.layers.Dense(D_IN, kernel_initializer="identity", name="hidden")(x)
    out = keras.layers.Lambda(lambda h: keras.ops.stack([2 * h[:, 0] + 3 * h[:, 4] * h[:, 5], h[:, 1]], axis=1),
                              name="head")(hidden)
    return keras.Model(x, out)


def test_planted_concept_scores_near_one_and_is_significant_next_to_an_irrelevant_one():
    rng = np.random.default_rng(0)
    random = rng.normal(size=(40, D_IN)).astype(np.float32)
    planted = rng.normal(size=(20, D_IN)).astype(np.float32)
    planted[:, 0] += 3.0
    irrelevant = rng.normal(size=(20, D_IN)).astype(np.float32)
    irrelevant[:, 5] += 3.0
    model = _planted_model()
    inputs = rng.normal(size=(30, D_IN)).astype(np.float32)
    tcav = ks.TCAV(model, layer="hidden", concepts={"planted": planted, "irrelevant": irrelevant}, random=random,
                   n_random=10, seed=0)
    r = tcav.explain(inputs, targets=0)
    assert r.concepts == ["planted", "irrelevant"]
    assert r.scores[0] > 0.95 and r.significant[0] and r.p_values[0] < 0.05 / 2
    assert not r.significant[1] and r.p_values[1] > 0.05 / 2
    assert r.accuracies[0].mean() > 0.9
    assert r.cavs.shape == (2, 10, D_IN) and np.allclose(np.linalg.norm(r.cavs, axis=2), 1.0, atol=1e-5)
    assert r.cavs[0, :, 0].min() > 0.8  # the planted CAV points along h_0
    same = ks.TCAV(model, layer="hidden", concepts={"planted": planted, "irrelevant": irrelevant}, random=random,
                   n_random=10, seed=0).explain(inputs, targets=0)
    np.testing.assert_array_equal(same.runs, r.runs)
    ax = r.plot()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["planted", "irrelevant", "random"]


def test_statistics_match_scipy_and_scikit_learn():
    stats = pytest.importorskip("scipy.stats")
    linear_model = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(1)
    for n1, n2 in [(10, 10), (5, 12)]:
        a, b = rng.uniform(size=n1), rng.uniform(0.2, 1.0, size=n2)
        t, p = ttest_ind(a, b)
        reference = stats.ttest_ind(a, b)
        np.testing.assert_allclose([t, p], [reference.statistic, reference.pvalue], rtol=1e-9)
    x = rng.normal(size=(30, 50))
    y = (x[:, 3] + 0.5 * rng.normal(size=30) > 0).astype(int)
    w, b = logistic_regression(x, y, alpha=0.01)
    ref = linear_model.LogisticRegression(C=1 / (0.01 * 30), tol=1e-12, max_iter=100000).fit(x, y)
    np.testing.assert_allclose(w, ref.coef_[0], atol=1e-5)
    np.testing.assert_allclose(b, ref.intercept_[0], atol=1e-5)


def test_clear_errors():
    model = _mlp()
    ok = np.zeros((10, D_IN), np.float32)
    with pytest.raises(ValueError, match=r"Too few examples for concept 'c'.*at least 4"):
        ks.TCAV(model, layer="hidden", concepts={"c": ok[:2]}, random=ok)
    with pytest.raises(ValueError, match="Too few random examples"):
        ks.TCAV(model, layer="hidden", concepts={"c": ok}, random=ok[:6])
    with pytest.raises(ValueError, match="n_random"):
        ks.TCAV(model, layer="hidden", concepts={"c": ok}, random=ok, n_random=1)
    with pytest.raises(ValueError, match="non-empty dict"):
        ks.TCAV(model, layer="hidden", concepts={}, random=ok)
    with pytest.raises(ValueError, match="Received: layer='hiden'"):
        ks.TCAV(model, layer="hiden", concepts={"c": ok}, random=ok)


# ------------------------------------------------------------------ Captum on a torch twin
def _torch_twin(model: keras.Model):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(collections.OrderedDict([
        ("hidden", torch.nn.Linear(D_IN, HIDDEN)), ("relu", torch.nn.ReLU()),
        ("fc", torch.nn.Linear(HIDDEN, 5)), ("tanh", torch.nn.Tanh()),
        ("out", torch.nn.Linear(5, CLASSES)),  # logits: kerascope bypasses the final softmax
    ]))
    for name in ("hidden", "fc", "out"):
        kernel, bias = model.get_layer(name).get_weights()
        layer = getattr(net, name)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            layer.bias.copy_(torch.from_numpy(bias))
    return net.eval()


@pytest.mark.captum
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="reference cross-check: run once, on TensorFlow")
def test_scores_and_p_values_equal_captums_tcav_on_a_torch_twin(tmp_path):
    torch = pytest.importorskip("torch")
    concept_mod = pytest.importorskip("captum.concept")
    classifier_mod = pytest.importorskip("captum.concept._utils.classifier")
    linear_model = pytest.importorskip("sklearn.linear_model")
    stats = pytest.importorskip("scipy.stats")
    alpha = 0.01

    class SameLogisticRegression(classifier_mod.Classifier):
        """kerascope's classifier settings in scikit-learn: L2 logistic regression, C = 1 / (alpha n), all examples."""

        def __init__(self):
            self._w, self._classes = None, None

        def train_and_eval(self, dataloader, **kwargs):
            xs, ys = zip(*dataloader)
            x, y = torch.cat(xs).numpy().astype(np.float64), torch.cat(ys).numpy()
            self._classes = sorted(set(y.tolist()))
            fit = linear_model.LogisticRegression(C=1 / (alpha * len(x)), tol=1e-12, max_iter=100000)
            fit.fit(x, (y == self._classes[1]).astype(int))
            self._w = torch.tensor(fit.coef_[0], dtype=torch.float32)
            return {"accs": fit.score(x, (y == self._classes[1]).astype(int))}

        def weights(self):
            return torch.stack([-self._w, self._w])  # as Captum's DefaultClassifier for two classes

        def classes(self):
            return self._classes

    model = _mlp(3)
    net = _torch_twin(model)
    rng = np.random.default_rng(2)
    stripes = (rng.normal(size=(12, D_IN)) + [2, 0, 0, -1, 0, 0]).astype(np.float32)
    dots = (rng.normal(size=(12, D_IN)) + [0, 0, 1.5, 0, 0, 1]).astype(np.float32)
    random = rng.normal(size=(24, D_IN)).astype(np.float32)
    inputs = rng.normal(size=(16, D_IN)).astype(np.float32)
    n_random = 4
    ours = ks.TCAV(model, layer="hidden", concepts={"stripes": stripes, "dots": dots}, random=random,
                   n_random=n_random, seed=5, regularization=alpha, test_fraction=0.0).explain(inputs, targets=1)

    def concept(cid, name, data):
        return concept_mod.Concept(cid, name, [torch.from_numpy(np.ascontiguousarray(data))])

    sets = ours.random_sets
    randoms = [concept(100 + i, f"random_{i}", random[sets[i, 0]]) for i in range(n_random)]
    others = [concept(200 + i, f"other_{i}", random[sets[i, 1]]) for i in range(n_random)]
    named = [concept(0, "stripes", stripes), concept(1, "dots", dots)]
    experimental = [[c, r] for c in named for r in randoms] + [[o, r] for o, r in zip(others, randoms)]
    tcav = concept_mod.TCAV(net, ["relu"], classifier=SameLogisticRegression(), save_path=str(tmp_path) + "/")
    result = tcav.interpret(torch.from_numpy(inputs), experimental, target=1)
    key = lambda pair: "-".join(str(c.id) for c in pair)  # noqa: E731
    captum = np.array([[float(result[key(pair)]["relu"]["sign_count"][0]) for pair in experimental]])
    captum_runs = captum[0, : 2 * n_random].reshape(2, n_random)
    captum_random = captum[0, 2 * n_random:]
    np.testing.assert_allclose(ours.runs, captum_runs, atol=1e-6)
    np.testing.assert_allclose(ours.random_scores, captum_random, atol=1e-6)
    expected_p = [stats.ttest_ind(captum_runs[c], captum_random).pvalue for c in range(2)]
    np.testing.assert_allclose(ours.p_values, np.nan_to_num(expected_p, nan=1.0), rtol=1e-6)
    # and the CAVs themselves: Captum's concept row of the classifier weights, normalised
    for c in range(2):
        for i in range(n_random):
            stored = tcav.cavs[key(experimental[c * n_random + i])]["relu"].stats["weights"][0].numpy()
            np.testing.assert_allclose(ours.cavs[c, i], stored / np.linalg.norm(stored), atol=1e-4)
