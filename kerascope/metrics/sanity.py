"""Sanity checks (Adebayo et al. 2018): does the explanation depend on what the model learned?

* Model-parameter randomisation: re-initialise the model's layers, from the
  top down one after another (``"cascading"``) or one at a time
  (``"independent"``), and compare the explanations before and after. A method
  whose maps barely change is not explaining the model.
* Data-label randomisation: compare explanations of the model with those of
  a model retrained on shuffled labels (the user trains and supplies it).

Randomisation always happens on an in-memory **copy** of the model; the
user's model, its weights and its layers are never touched. Similarity is
the Spearman rank correlation and the SSIM of the 2-D maps, per sample.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np

from kerascope.core.inputs import fit_structure
from kerascope.core.layers import child_layers, find_layer, iter_layers
from kerascope.metrics._common import Scorer, gaussian_blur, to_maps

MODES = ("cascading", "independent")


# ----------------------------------------------------------------------------- similarity
def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Row-wise ranks with ties given their average rank (like ``scipy.stats.rankdata``)."""
    n, d = values.shape
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    new_group = np.ones((n, d), bool)
    new_group[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = np.cumsum(new_group, axis=1) - 1 + (np.arange(n) * d)[:, None]
    positions = np.broadcast_to(np.arange(1, d + 1, dtype=np.float64), (n, d))
    sums = np.bincount(group.ravel(), weights=positions.ravel(), minlength=n * d)
    counts = np.bincount(group.ravel(), minlength=n * d)
    avg = (sums[group] / counts[group])
    ranks = np.empty((n, d), np.float64)
    np.put_along_axis(ranks, order, avg, axis=1)
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-sample Spearman rank correlation between maps ``a`` and ``b`` (``(N, ...)``), ties averaged.

    When a map is constant the correlation is undefined; it is reported as 1.0
    if both maps are constant (identical rankings) and 0.0 otherwise.

    Example:
        >>> import numpy as np
        >>> spearman(np.array([[1.0, 2.0, 3.0]]), np.array([[10.0, 20.0, 15.0]])).tolist()
        [0.5]
    """
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    va, vb = (ra * ra).sum(1), (rb * rb).sum(1)
    ok = (va > 0) & (vb > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (ra * rb).sum(1) / np.sqrt(np.where(ok, va * vb, 1.0))
    both_constant = (va == 0) & (vb == 0)
    return np.where(ok, rho, np.where(both_constant, 1.0, 0.0))


def _unit(maps: np.ndarray) -> np.ndarray:
    n = len(maps)
    flat = maps.reshape(n, -1)
    lo, hi = flat.min(1), flat.max(1)
    scale = np.where(hi > lo, hi - lo, 1.0)
    return ((flat - lo[:, None]) / scale[:, None]).reshape(maps.shape).astype(np.float32)


def ssim(a: np.ndarray, b: np.ndarray, sigma: float = 1.5) -> np.ndarray:
    """Per-sample structural similarity (Wang et al. 2004) of ``(N, H, W)`` maps, each min-max scaled to [0, 1].

    Gaussian window (``sigma``), ``K1=0.01``, ``K2=0.03``, data range 1; the
    mean SSIM over pixels. Two constant maps score 1.

    Example:
        >>> import numpy as np
        >>> m = np.random.default_rng(0).random((2, 8, 8))
        >>> np.round(ssim(m, m), 6).tolist()
        [1.0, 1.0]
    """
    x, y = _unit(np.asarray(a, np.float32))[..., None], _unit(np.asarray(b, np.float32))[..., None]
    c1, c2 = 0.01**2, 0.03**2
    mx, my = gaussian_blur(x, sigma), gaussian_blur(y, sigma)
    sxx = gaussian_blur(x * x, sigma) - mx * mx
    syy = gaussian_blur(y * y, sigma) - my * my
    sxy = gaussian_blur(x * y, sigma) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return s.reshape(len(s), -1).mean(1).astype(np.float64)


# ----------------------------------------------------------------------------- model copies
def _same_outputs(a: keras.Layer, b: keras.Layer, sample: Any) -> bool:
    try:
        out_a = keras.tree.flatten(a(fit_structure(a, sample), training=False))
        out_b = keras.tree.flatten(b(fit_structure(b, sample), training=False))
    except Exception:
        return False
    return len(out_a) == len(out_b) and all(
        np.allclose(keras.ops.convert_to_numpy(p), keras.ops.convert_to_numpy(q), rtol=1e-5, atol=1e-6)
        for p, q in zip(out_a, out_b, strict=True)
    )


def _independent(copy: keras.Layer, model: keras.Layer) -> bool:
    ids = {id(v) for v in model.weights}
    return not any(id(v) in ids for v in copy.weights)


def copy_model(model: keras.Layer, sample: Any) -> keras.Layer:
    """An independent copy of ``model`` with the same weights (nothing shared with the original).

    Uses ``keras.models.clone_model`` + ``set_weights``; where that does not give
    an identical model (e.g. some subclassed models), an in-memory ``.keras``
    round trip. ``sample`` (a batch of inputs) builds the copy and checks that
    its outputs match the original's.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> c = copy_model(m, np.ones((1, 3)))
        >>> c is m, bool(np.allclose(c.get_weights()[0], m.get_weights()[0]))
        (False, True)
    """
    first = keras.tree.map_structure(lambda a: np.asarray(a)[:1], sample)
    try:
        clone = keras.models.clone_model(model)
        if len(clone.weights) != len(model.weights):
            clone(fit_structure(clone, first), training=False)
        clone.set_weights(model.get_weights())
        if _independent(clone, model) and _same_outputs(model, clone, first):
            return clone
    except Exception:  # noqa: BLE001 - fall back to the serialisation round trip below
        pass
    from keras.src.saving import saving_lib

    buffer = io.BytesIO()
    saving_lib.save_model(model, buffer)
    buffer.seek(0)
    clone = saving_lib.load_model(buffer, compile=False, safe_mode=False)
    if not (_independent(clone, model) and _same_outputs(model, clone, first)):
        raise ValueError(
            f"Could not make an independent copy of model {model.name!r} for the sanity checks. "
            "Received: a model that neither `keras.models.clone_model` nor a `.keras` round trip "
            "reproduces. Register custom layers with `keras.saving.register_keras_serializable` "
            "and implement `get_config`."
        )
    return clone


def weighted_layers(model: keras.Layer) -> list[str]:
    """Paths of the leaf layers that own weights, in forward (definition) order.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="a"),
        ...                       keras.layers.ReLU(), keras.layers.Dense(2, name="b")])
        >>> weighted_layers(m)
        ['a', 'b']
    """
    return [path for path, layer in iter_layers(model) if not child_layers(layer) and layer.weights]


def randomise_layer(layer: keras.Layer, seed: int) -> None:
    """Re-initialise ``layer``'s variables in place with its own initializers, seeded.

    A variable ``v`` uses ``layer.<v.name>_initializer`` (``kernel_initializer``,
    ``bias_initializer``, ``gamma_initializer``, ...) with ``seed``; a variable
    without one is replaced by a seeded random permutation of its values.
    Only ever called on a copy of the user's model.

    Example:
        >>> import keras, numpy as np
        >>> d = keras.layers.Dense(4); d.build((None, 3)); before = d.get_weights()[0].copy()
        >>> randomise_layer(d, seed=1)
        >>> bool(np.allclose(before, d.get_weights()[0]))
        False
    """
    rng = np.random.default_rng(seed)
    for i, variable in enumerate(layer.weights):
        short = variable.name.split("/")[-1].split(":")[0]
        init = getattr(layer, f"{short}_initializer", None)
        values = None
        if isinstance(init, keras.initializers.Initializer):
            config = dict(init.get_config())
            if "seed" in config:
                config["seed"] = (int(seed) * 1009 + i) % (2**31 - 1)
            values = np.asarray(keras.ops.convert_to_numpy(
                type(init).from_config(config)(tuple(variable.shape), dtype=variable.dtype)))
        if values is None:
            current = np.asarray(keras.ops.convert_to_numpy(variable.value))
            values = rng.permutation(current.ravel()).reshape(current.shape)
        variable.assign(values)


# ----------------------------------------------------------------------------- results
@dataclass
class SanityResult:
    """Similarity between original and randomised explanations, per randomisation step and sample.

    ``steps`` names what was randomised at each step (a layer path, or
    ``"labels"`` for data randomisation); in cascading mode step ``j`` has
    every layer up to and including ``steps[j]`` randomised. ``spearman`` and
    ``ssim`` are ``(steps, N)``; ``maps`` (when kept) is ``(steps + 1, N, H, W)``
    with the original maps first. **Lower similarity is better**: the
    explanation depends on the learned weights.

    Example:
        >>> import numpy as np
        >>> r = SanityResult("saliency", "cascading", ["d"], np.array([[0.1, 0.3]]),
        ...                  np.array([[0.2, 0.2]]), np.array([0, 1]))
        >>> r.spearman_mean.round(2).tolist(), round(r.final_spearman, 2)
        ([0.2], 0.2)
    """

    method: str
    mode: str
    steps: list[str]
    spearman: np.ndarray
    ssim: np.ndarray
    targets: np.ndarray
    maps: np.ndarray | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def spearman_mean(self) -> np.ndarray:
        """Mean Spearman correlation per step.

        Example:
            >>> import numpy as np
            >>> SanityResult("m", "cascading", ["a"], np.array([[1.0, 0.0]]), np.ones((1, 2)),
            ...              np.zeros(2)).spearman_mean.tolist()
            [0.5]
        """
        return np.asarray(self.spearman, np.float64).mean(axis=1)

    @property
    def ssim_mean(self) -> np.ndarray:
        """Mean SSIM per step.

        Example:
            >>> import numpy as np
            >>> SanityResult("m", "cascading", ["a"], np.ones((1, 2)), np.array([[1.0, 0.0]]),
            ...              np.zeros(2)).ssim_mean.tolist()
            [0.5]
        """
        return np.asarray(self.ssim, np.float64).mean(axis=1)

    @property
    def final_spearman(self) -> float:
        """Mean Spearman correlation at the last step (all layers randomised, in cascading mode).

        Example:
            >>> import numpy as np
            >>> SanityResult("m", "cascading", ["a", "b"], np.array([[1.0], [0.25]]), np.ones((2, 1)),
            ...              np.zeros(1)).final_spearman
            0.25
        """
        return float(self.spearman_mean[-1])

    @property
    def final_ssim(self) -> float:
        """Mean SSIM at the last step.

        Example:
            >>> import numpy as np
            >>> SanityResult("m", "cascading", ["a"], np.ones((1, 1)), np.array([[0.5]]),
            ...              np.zeros(1)).final_ssim
            0.5
        """
        return float(self.ssim_mean[-1])

    def as_rows(self) -> list[dict[str, Any]]:
        """One dict per step: ``step``, ``spearman``, ``ssim`` (means over samples).

        Example:
            >>> import numpy as np
            >>> SanityResult("m", "cascading", ["a"], np.ones((1, 1)), np.ones((1, 1)),
            ...              np.zeros(1)).as_rows()
            [{'step': 'a', 'spearman': 1.0, 'ssim': 1.0}]
        """
        return [
            {"step": s, "spearman": float(r), "ssim": float(q)}
            for s, r, q in zip(self.steps, self.spearman_mean, self.ssim_mean, strict=True)
        ]


# ----------------------------------------------------------------------------- checks
Explainer = Callable[[keras.Layer, Any, Any], Any]


def _explainer(method: Any, batch_size: int, method_kwargs: dict[str, Any] | None) -> tuple[str, Explainer]:
    from kerascope.methods.base import Method
    from kerascope.methods.registry import build, method_name, resolve

    spec = resolve(method) if isinstance(method, (str, type)) or callable(method) else None
    if spec is None or isinstance(spec, Method):  # the check re-builds the method on randomised copies
        raise TypeError(
            "`method` must be a registered method name, a Method class, or a callable "
            f"(model, inputs, targets) -> attributions. Received: method={method!r}."
        )
    if not isinstance(spec, type):
        return method_name(spec), spec
    kwargs = dict(method_kwargs or {})

    def run(model: keras.Layer, inputs: Any, targets: Any) -> Any:
        return build(spec, model, kwargs, common={"batch_size": batch_size}).explain(inputs, targets).attributions

    return method_name(spec), run


def model_randomisation(
    model: keras.Layer,
    method: Any,
    inputs: Any,
    targets: Any = None,
    *,
    mode: str = "cascading",
    layers: Sequence[str] | None = None,
    seed: int = 0,
    reduce: str = "abs_sum",
    batch_size: int = 32,
    method_kwargs: dict[str, Any] | None = None,
    keep_maps: bool = True,
) -> SanityResult:
    """Model-parameter randomisation test (Adebayo et al. 2018), on a copy of ``model``.

    ``mode="cascading"`` randomises the weighted layers from the output down,
    cumulatively, explaining after each; ``"independent"`` randomises one layer
    at a time (the others keep their trained weights). Targets are fixed to
    the original model's (None = its predicted classes), so every step explains
    the same class.

    Args:
        method: a registered method name / class (built as ``cls(copy, batch_size=..., **method_kwargs)``)
            or a callable ``(model, inputs, targets) -> attributions``.
        layers: paths of the layers to randomise (default: every leaf layer with weights).
        reduce: channel reduction for ``(N, H, W, C)`` attributions before comparing.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.Flatten(), keras.layers.Dense(2, name="d")])
        >>> r = model_randomisation(m, "saliency", np.random.default_rng(0).random((2, 4, 4, 1)), 0)
        >>> r.steps, r.spearman.shape
        (['d', 'c'], (2, 2))
    """
    if mode not in MODES:
        raise ValueError(f"Unknown randomisation mode. Received: mode={mode!r}. Expected one of {MODES}.")
    name, explain = _explainer(method, batch_size, method_kwargs)
    copy = copy_model(model, inputs)
    available = weighted_layers(copy)
    if layers is None:
        chosen = available
    else:
        chosen = []
        for path in layers:
            find_layer(copy, path)
            if path not in available:
                raise ValueError(f"Layer has no weights to randomise. Received: layer={path!r}. "
                                 f"Available layers with weights: {available}.")
            chosen.append(path)
    order = list(reversed([p for p in available if p in chosen]))
    if not order:
        raise ValueError(f"Model {model.name!r} has no layers with weights to randomise. Received: layers={layers!r}.")
    classes = Scorer(copy, "logits", batch_size).targets(inputs, targets)
    original = to_maps(explain(copy, inputs, classes), None, reduce)
    size = original.shape[1:]
    trained = copy.get_weights()
    rhos, ssims, kept = [], [], [original] if keep_maps else []
    for step, path in enumerate(order):
        if mode == "independent":
            copy.set_weights(trained)
        randomise_layer(find_layer(copy, path), seed * 7919 + step)
        maps = to_maps(explain(copy, inputs, classes), size, reduce)
        rhos.append(spearman(original, maps))
        ssims.append(ssim(original, maps))
        if keep_maps:
            kept.append(maps)
    return SanityResult(
        name, mode, order, np.stack(rhos), np.stack(ssims), classes,
        np.stack(kept) if keep_maps else None, {"seed": seed, "reduce": reduce},
    )


def data_randomisation(
    model: keras.Layer,
    randomised_model: keras.Layer,
    method: Any,
    inputs: Any,
    targets: Any = None,
    *,
    reduce: str = "abs_sum",
    batch_size: int = 32,
    method_kwargs: dict[str, Any] | None = None,
) -> SanityResult:
    """Data-label randomisation test: compare explanations of ``model`` and of a model retrained on shuffled labels.

    The user trains ``randomised_model`` (same architecture, labels permuted)
    and passes it; targets default to ``model``'s predicted classes and are
    used for both. Neither model is modified. **Lower similarity is better.**

    Example:
        >>> import keras, numpy as np
        >>> def net(seed):
        ...     keras.utils.set_random_seed(seed)
        ...     return keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(2)])
        >>> r = data_randomisation(net(0), net(1), "saliency", np.ones((2, 4, 4, 1)), 0)
        >>> r.steps, r.spearman.shape
        (['labels'], (1, 2))
    """
    name, explain = _explainer(method, batch_size, method_kwargs)
    classes = Scorer(model, "logits", batch_size).targets(inputs, targets)
    original = to_maps(explain(model, inputs, classes), None, reduce)
    other = to_maps(explain(randomised_model, inputs, classes), original.shape[1:], reduce)
    return SanityResult(
        name, "data", ["labels"], spearman(original, other)[None], ssim(original, other)[None], classes,
        np.stack([original, other]), {"reduce": reduce},
    )
