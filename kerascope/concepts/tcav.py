"""TCAV: testing with concept activation vectors (Kim et al. 2018).

A concept (a set of example inputs, e.g. striped textures) is a direction in a layer's
activation space: the normal of a linear classifier separating the concept's activations from
random examples' (the CAV). The TCAV score of a class is the fraction of its inputs whose class
score increases along that direction (the sign of the directional derivative). Each concept is
fitted against ``n_random`` random sets; the scores are compared with random-vs-random CAVs by a
two-sided t-test, Bonferroni-corrected over the concepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope.concepts.stats import logistic_regression, ttest_ind
from kerascope.core.engine import engine_for

MIN_EXAMPLES = 4


@dataclass
class TCAVResult:
    """What :meth:`TCAV.explain` returns (numpy arrays, concept order as given).

    ``scores`` (concepts,) is the mean TCAV score over the runs, ``runs`` (concepts, n_random) each
    run's score, ``random_scores`` (n_random,) the random-vs-random scores, ``p_values`` and
    ``significant`` the t-test against them (``p < alpha / concepts``), ``cavs``
    (concepts, n_random, features) the unit CAVs and ``accuracies`` their held-out accuracies.

    Example:
        >>> r = TCAVResult(["a"], np.array([0.9]), np.array([[0.9, 0.9]]), np.array([0.5, 0.4]),
        ...                np.array([0.01]), np.array([True]), np.zeros((1, 2, 3)), np.ones((1, 2)), np.zeros(2))
        >>> r.as_dict()["a"]["significant"]
        True
    """

    concepts: list[str]
    scores: np.ndarray
    runs: np.ndarray
    random_scores: np.ndarray
    p_values: np.ndarray
    significant: np.ndarray
    cavs: np.ndarray
    accuracies: np.ndarray
    targets: np.ndarray
    random_accuracies: np.ndarray = field(default_factory=lambda: np.zeros(0))
    random_sets: np.ndarray = field(default_factory=lambda: np.zeros((0, 2, 0), int))
    layer: str = ""
    alpha: float = 0.05

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{concept: {"score", "std", "p_value", "significant", "accuracy"}}`` as plain Python values.

        Example:
            >>> r = TCAVResult(["a"], np.array([0.9]), np.array([[0.9, 0.9]]), np.array([0.5, 0.4]),
            ...                np.array([0.01]), np.array([True]), np.zeros((1, 2, 3)), np.ones((1, 2)), np.zeros(2))
            >>> r.as_dict()["a"]["score"]
            0.9
        """
        return {
            name: {"score": float(self.scores[i]), "std": float(self.runs[i].std()),
                   "p_value": float(self.p_values[i]), "significant": bool(self.significant[i]),
                   "accuracy": float(self.accuracies[i].mean())}
            for i, name in enumerate(self.concepts)
        }

    def plot(self, ax: Any = None) -> Any:
        """Bar plot of the TCAV scores with error bars (std over runs) and the random baseline.

        Concepts that fail the test are drawn pale and marked ``n.s.``.

        Example:
            >>> r = TCAVResult(["a"], np.array([0.9]), np.array([[0.9, 0.9]]), np.array([0.5, 0.4]),
            ...                np.array([0.01]), np.array([True]), np.zeros((1, 2, 3)), np.ones((1, 2)), np.zeros(2))
            >>> r.plot().get_ylabel()
            'TCAV score'
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(1.2 + 0.9 * (len(self.concepts) + 1), 3.2))
        names = [*self.concepts, "random"]
        means = [*self.scores, self.random_scores.mean()]
        errors = [*self.runs.std(axis=1), self.random_scores.std()]
        colours = ["tab:blue" if s else "lightsteelblue" for s in self.significant] + ["lightgray"]
        ax.bar(range(len(names)), means, yerr=errors, color=colours, capsize=4)
        for i, significant in enumerate(self.significant):
            if not significant:
                ax.text(i, min(1.0, means[i] + errors[i]) + 0.02, "n.s.", ha="center", fontsize=8)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("TCAV score")
        ax.set_title(f"TCAV at {self.layer} (p < {self.alpha:g} / {len(self.concepts)})", fontsize=9)
        return ax


def _examples(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim < 2 or len(array) < MIN_EXAMPLES:
        raise ValueError(
            f"Too few examples for {name}: TCAV needs at least {MIN_EXAMPLES} (tens are usual) to fit and test a "
            f"linear classifier. Received: {name} with shape {array.shape}."
        )
    return array


def _split(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Train / test indices; ``fraction=0``: train and test on everything."""
    order = rng.permutation(n)
    held = int(round(fraction * n))
    if held == 0:
        return order, order
    return order[held:], order[:held]


def fit_cav(positive: np.ndarray, negative: np.ndarray, alpha: float, test_fraction: float,
            rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """``(unit CAV pointing to the positive examples, held-out accuracy)`` of flattened activations.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> cav, acc = fit_cav(rng.normal(size=(20, 3)) + [4, 0, 0], rng.normal(size=(20, 3)), 0.01, 0.25, rng)
        >>> bool(cav[0] > 0.9), acc
        (True, 1.0)
    """
    x = np.concatenate([positive, negative])
    y = np.concatenate([np.ones(len(positive)), np.zeros(len(negative))])
    train, test = _split(len(x), test_fraction, rng)
    w, b = logistic_regression(x[train], y[train], alpha)
    accuracy = float(np.mean(((x[test] @ w + b) > 0) == (y[test] > 0)))
    norm = np.linalg.norm(w)
    return (w / norm if norm > 0 else w), accuracy


class TCAV:
    """Concept sensitivity of a class at a layer (Kim et al. 2018).

    Args:
        model: a Keras 3 model.
        layer: path of the layer whose activation space holds the concepts.
        concepts: ``{name: examples}``, each an array of model inputs (at least 4; tens are usual).
        random: a pool of random inputs; each run draws two disjoint random sets of half its size
            (one against each concept, one more for the random-vs-random baseline).
        n_random: number of runs (random sets), at least 2 for the t-test.
        seed: seeds the random sets and train / test splits.
        alpha: significance level, divided by the number of concepts (Bonferroni).
        regularization: L2 penalty of the logistic-regression classifier (``alpha`` of
            scikit-learn's ``SGDClassifier``, Captum's default; solved exactly here).
        test_fraction: share of each CAV's examples held out for its accuracy (0: fit and score on all).
        batch_size: inputs per compiled call.

    Cost: one forward pass per concept and random example, one gradient pass per explained input,
    ``concepts x n_random + n_random`` small logistic regressions.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="h"), keras.layers.Dense(2)])
        >>> rng = np.random.default_rng(0)
        >>> t = ks.TCAV(m, layer="h", concepts={"big": rng.normal(3, 1, (8, 4))}, random=rng.normal(size=(16, 4)),
        ...             n_random=3)
        >>> r = t.explain(rng.normal(size=(5, 4)), targets=0)
        >>> r.scores.shape, r.cavs.shape
        ((1,), (1, 3, 3))
    """

    def __init__(
        self,
        model: keras.Layer,
        layer: str | keras.Layer,
        concepts: Mapping[str, Any],
        random: Any,
        n_random: int = 10,
        seed: int = 0,
        *,
        alpha: float = 0.05,
        regularization: float = 0.01,
        test_fraction: float = 0.33,
        batch_size: int = 32,
    ) -> None:
        if not isinstance(concepts, Mapping) or not concepts:
            raise ValueError(
                "`concepts` must be a non-empty dict {name: examples}. Received: "
                f"concepts of type {type(concepts).__name__}."
            )
        if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 2:
            raise ValueError(f"`n_random` must be an int >= 2 (the t-test needs two runs). Received: n_random={n_random!r}.")
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"`test_fraction` must be in [0, 1). Received: test_fraction={test_fraction!r}.")
        self.model = model
        self.engine = engine_for(model)
        self.layer = self.engine.resolve_layers([layer])[0]
        self.layer_path = self.engine.path_of(self.layer)
        self.concepts = {str(k): _examples(f"concept {k!r}", v) for k, v in concepts.items()}
        self.random = _examples("`random`", random)
        if len(self.random) < 2 * MIN_EXAMPLES:
            raise ValueError(
                f"Too few random examples: each run draws two disjoint random sets of at least {MIN_EXAMPLES}. "
                f"Received: random with {len(self.random)} examples; pass at least {2 * MIN_EXAMPLES}."
            )
        self.n_random, self.seed, self.alpha = n_random, seed, alpha
        self.regularization, self.test_fraction, self.batch_size = regularization, test_fraction, batch_size

    def activations(self, inputs: Any) -> np.ndarray:
        """The layer's activations, flattened per example ``(N, features)``.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="h"), keras.layers.Dense(2)])
            >>> z = np.zeros((8, 4))
            >>> TCAV(m, "h", {"c": z}, np.zeros((8, 4)), n_random=2).activations(z).shape
            (8, 3)
        """
        out = engine_for(self.model, output_layer=self.layer_path).forward(inputs, self.batch_size)
        return np.asarray(out, np.float64).reshape(len(out), -1)

    def explain(self, inputs: Any, targets: Any = None) -> TCAVResult:
        """TCAV scores of ``targets`` (the class of each input; ``None``: predicted) for every concept.

        Example:
            >>> import keras, numpy as np
            >>> m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="h"), keras.layers.Dense(2)])
            >>> rng = np.random.default_rng(1)
            >>> t = TCAV(m, "h", {"c": rng.normal(2, 1, (8, 4))}, rng.normal(size=(8, 4)), n_random=2)
            >>> 0.0 <= float(t.explain(rng.normal(size=(4, 4)), 1).scores[0]) <= 1.0
            True
        """
        grads = self.engine.gradients(inputs, targets, layers=[self.layer], wrt_inputs=False,
                                      batch_size=self.batch_size)
        directions = np.asarray(grads.layer_grads[0], np.float64).reshape(len(grads.scores), -1)
        rng = np.random.default_rng(self.seed)
        pool = self.activations(self.random)
        half = len(pool) // 2
        sets = np.stack([rng.permutation(len(pool))[: 2 * half].reshape(2, half) for _ in range(self.n_random)])
        names = list(self.concepts)
        cavs = np.zeros((len(names), self.n_random, pool.shape[1]))
        accuracies = np.zeros((len(names), self.n_random))
        for c, name in enumerate(names):
            acts = self.activations(self.concepts[name])
            for run in range(self.n_random):
                cavs[c, run], accuracies[c, run] = fit_cav(acts, pool[sets[run, 0]], self.regularization,
                                                           self.test_fraction, rng)
        random_cavs = np.zeros((self.n_random, pool.shape[1]))
        random_accuracies = np.zeros(self.n_random)
        for run in range(self.n_random):
            random_cavs[run], random_accuracies[run] = fit_cav(pool[sets[run, 1]], pool[sets[run, 0]],
                                                               self.regularization, self.test_fraction, rng)
        runs = np.mean(np.einsum("crf,nf->crn", cavs, directions) > 0, axis=2)
        random_scores = np.mean(random_cavs @ directions.T > 0, axis=1)
        p_values = np.array([ttest_ind(runs[c], random_scores)[1] for c in range(len(names))])
        return TCAVResult(
            concepts=names, scores=runs.mean(axis=1), runs=runs, random_scores=random_scores, p_values=p_values,
            significant=p_values < self.alpha / len(names), cavs=cavs.astype(np.float32), accuracies=accuracies,
            targets=np.asarray(grads.targets), random_accuracies=random_accuracies, random_sets=sets,
            layer=self.layer_path, alpha=self.alpha,
        )
