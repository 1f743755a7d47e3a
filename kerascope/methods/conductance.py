"""Neuron and layer conductance, internal influence (Captum's layer / neuron path methods).

All three walk the Integrated Gradients path ``b + alpha (x - b)`` in *input* space with
the quadrature rules of :func:`~kerascope.methods.integrated.quadrature`, and read the
gradient at an inner layer along it:

* :class:`InternalInfluence` (Leino et al. 2018): the path integral of the gradient w.r.t.
  the layer's output, ``sum_k w_k dF/dy (x_k)``.
* :class:`LayerConductance` (Dhamdhere et al. 2018): ``integral dF/dy dy/dalpha dalpha`` per
  neuron ``y`` of the layer, as Captum computes it: ``sum_k dF/dy (x_k) (y(x_{k+1}) - y(x_k))``
  over ``steps + 1`` path points (the discrete chain rule; summed over the layer it telescopes
  to ``F(x) - F(b)`` up to the chain rule's first-order error).
* :class:`NeuronConductance` (Dhamdhere et al. 2018): IG of the inputs with the gradient
  flowing through one neuron only, ``(x_i - b_i) sum_k w_k dF/dy (x_k) dy/dx_i (x_k)``.

Path points are folded into the batch axis and run ``batch_size`` rows at a time through the
engine's compiled gradient pass (one pass per row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.inputs import Inputs
from kerascope.core.probe import patched_attribute
from kerascope.core.rows import REFERENCE, rows_of
from kerascope.methods import _layer
from kerascope.methods._folding import clean_scores, reduce_rows, row_targets
from kerascope.methods._input_choice import gradient_inputs
from kerascope.methods.base import Method, check_positive_int
from kerascope.methods.integrated import (
    _chosen_baselines,
    _describe_baseline,
    _substitute,
    quadrature,
    resolve_baselines,
)
from kerascope.methods.registry import register
from kerascope.numeric.chunking import chunk_ranges


class _InputPath(Method):
    """Shared part: a layer, the quadrature, and the input-space path folded into the batch axis."""

    def __init__(
        self,
        model: keras.Layer,
        *,
        layer: Any,
        steps: int = 50,
        method: str = "gausslegendre",
        baseline: Any = None,
        input_index: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        if layer is None:
            raise ValueError(
                f"{type(self).__name__} needs the layer to read. Received: layer=None. Pass a layer name or "
                "path, e.g. layer='conv2' (see `kerascope.layers(model)`)."
            )
        self._layer, self.layer = _layer.resolve(self.engine, layer)
        check_positive_int(steps, "steps")
        quadrature(steps + self._extra_point, method)  # validate early
        self.steps = steps
        self.method = method
        self.baseline = baseline
        self.input_index = input_index

    #: path points beyond ``steps`` (conductance differences consecutive points: ``steps + 1``)
    _extra_point = 0

    def _path(
        self, inputs: Inputs, targets: Any, resolved: np.ndarray, alphas: np.ndarray, *, through_inputs: bool = False,
        **options: Any,
    ) -> tuple[list[int], list[np.ndarray], Iterator[tuple[np.ndarray, np.ndarray, Any]]]:
        """The moving inputs' positions, their ``x - b``, and an iterator of ``(owners, step indices,
        GradientResult)`` per chunk (rows sample-major); ``through_inputs``: differentiate w.r.t. them."""
        wrt = gradient_inputs(self.model, inputs, self.input_index)
        chosen = Inputs([inputs.arrays[i] for i in wrt])
        baselines = resolve_baselines(_chosen_baselines(self.baseline, inputs, wrt), chosen)
        deltas = [x - b for x, b in zip(chosen.arrays, baselines, strict=True)]
        options["wrt_inputs"] = wrt if through_inputs else False
        return wrt, deltas, self._chunks(inputs, targets, resolved, alphas, wrt, chosen, baselines, options)

    def _chunks(
        self, inputs: Inputs, targets: Any, resolved: np.ndarray, alphas: np.ndarray, wrt: list[int],
        chosen: Inputs, baselines: list[np.ndarray], options: dict[str, Any],
    ) -> Iterator[tuple[np.ndarray, np.ndarray, Any]]:
        per = len(alphas)
        for rows in chunk_ranges(inputs.num_samples * per, self.batch_size):
            owners, steps = rows // per, rows % per
            points = []
            for x, b in zip(chosen.arrays, baselines, strict=True):
                alpha = alphas[steps].reshape((-1,) + (1,) * (x.ndim - 1)).astype(np.float32)
                points.append(b[owners] + alpha * (x[owners] - b[owners]))
            whose = np.where(alphas[steps] == 0.0, REFERENCE, owners)
            with rows_of(whose):
                result = self.engine.gradients(
                    Inputs(inputs.model_arg(_substitute(inputs, owners, wrt, points))),
                    row_targets(targets, resolved, owners), batch_size=self.batch_size, **options,
                )
            yield owners, steps, result

    def params(self) -> dict[str, Any]:
        """Hyper-parameters (an array baseline reported by its shape).

        Example:
            >>> import keras, kerascope as ks
            >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="h"), keras.layers.Dense(1)])
            >>> ks.InternalInfluence(m, layer="h", steps=8).params()["steps"]
            8
        """
        params = super().params()
        params["baseline"] = _describe_baseline(self.baseline)
        return params


@register
class InternalInfluence(_InputPath):
    """Internal influence (Leino et al. 2018): the path-integrated gradient at a layer.

    ``integral_0^1 dF/dy (b + alpha (x - b)) d alpha`` for every unit ``y`` of ``layer``'s
    output, the integral computed with ``steps`` points of the quadrature ``method`` (as
    :class:`IntegratedGradients`; Captum's ``InternalInfluence``). Not multiplied by any
    difference: it is the layer's average gradient along the input path.

    Args:
        layer: the layer (name or path) whose output is read.
        steps: path points per sample.
        method: the quadrature (see :func:`~kerascope.methods.integrated.quadrature`).
        baseline: the path's start in input space (as :class:`IntegratedGradients`; default zeros).
        input_index: which model input(s) move along the path (multi-input models).

    Cost: ``steps`` forward+backward passes per sample (plus one forward pass for the scores).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="h"),
        ...                       keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        >>> ks.InternalInfluence(m, layer="h", steps=4).explain(np.ones((1, 2)), 0).attributions.tolist()
        [[1.0, 1.0]]
    """

    name = "internal_influence"
    description = "Gradient at a layer integrated along the input path (Leino et al. 2018)."
    aliases = ("internalinfluence",)

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        alphas, weights = quadrature(self.steps, self.method)
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)
        total: np.ndarray | None = None
        for owners, steps, result in self._path(inputs, targets, resolved, alphas, layers=[self._layer])[2]:
            grads = np.asarray(result.layer_grads[0])
            if total is None:
                total = np.zeros((inputs.num_samples, *grads.shape[1:]), np.float64)
            reduce_rows(total, owners, weights[steps], grads)
        return _layer_explanation(self, total, scores, resolved)


@register
class LayerConductance(_InputPath):
    """Layer conductance (Dhamdhere et al. 2018): each unit's share of the IG path.

    For every unit ``y`` of ``layer``'s output, ``integral dF/dy (dy / d alpha) d alpha``
    along ``x(alpha) = b + alpha (x - b)``, computed as Captum's ``LayerConductance``: the
    ``steps + 1`` nodes ``alpha_k`` of the quadrature ``method`` (the weights are not used)
    and ``sum_k dF/dy (x(alpha_k)) (y(x(alpha_{k+1})) - y(x(alpha_k)))``. Summed over the
    layer it is ``F(x) - F(b)`` (IG's total) up to the discrete chain rule's error; with
    ``method="riemann_trapezoid"`` the path runs exactly from ``b`` to ``x``.

    Args:
        layer: the layer (name or path) whose units are attributed.
        steps: intervals of the path (``steps + 1`` points per sample).
        method: the quadrature whose nodes are the path points (default ``"gausslegendre"``, as
            Captum; ``"riemann_trapezoid"``: equally spaced points including both ends).
        baseline: the path's start in input space (as :class:`IntegratedGradients`; default zeros).
        input_index: which model input(s) move along the path (multi-input models).

    Cost: ``steps + 1`` forward+backward passes per sample (plus one forward pass for the scores).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, use_bias=False, name="h"),
        ...                       keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        >>> m.get_layer("h").set_weights([np.array([[1.0, 0.0], [0.0, 3.0]])])
        >>> e = ks.LayerConductance(m, layer="h", steps=4, method="riemann_trapezoid")
        >>> e.explain(np.ones((1, 2)), 0).attributions.tolist()
        [[1.0, 3.0]]
    """

    name = "layer_conductance"
    description = "Each layer unit's share of the input path's gradient flow (Dhamdhere et al. 2018)."
    aliases = ("layerconductance", "conductance")
    _extra_point = 1

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        alphas, _ = quadrature(self.steps + 1, self.method)
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)
        total: np.ndarray | None = None
        carry: tuple[int, np.ndarray, np.ndarray] | None = None  # the last row of a chunk: (owner, grad, act)
        for owners, steps, result in self._path(inputs, targets, resolved, alphas, layers=[self._layer])[2]:
            acts = np.asarray(result.activations[0], np.float32)
            grads = np.asarray(result.layer_grads[0], np.float32)
            if total is None:
                total = np.zeros((inputs.num_samples, *acts.shape[1:]), np.float64)
            if carry is not None and steps[0] > 0:  # the previous chunk's last row precedes this first row
                owner, grad, act = carry
                total[owner] += grad * (acts[0].astype(np.float64) - act)
            inner = steps[:-1] < self.steps  # row i and row i + 1 are consecutive points of one sample
            if inner.any():
                reduce_rows(total, owners[:-1][inner], np.ones(int(inner.sum())),
                            grads[:-1][inner] * (acts[1:][inner] - acts[:-1][inner]))
            carry = (int(owners[-1]), grads[-1].astype(np.float64), acts[-1]) if steps[-1] < self.steps else None
        return _layer_explanation(self, total, scores, resolved)


def _layer_explanation(method: _InputPath, total: Any, scores: Any, resolved: np.ndarray) -> Explanation:
    attributions = np.asarray(total, np.float32)
    method._check_finite_result([attributions], scores)
    return Explanation(
        attributions=attributions, method=method.name, params=method.params(), targets=np.asarray(resolved),
        scores=None if scores is None else np.asarray(scores), layer=method.layer,
        extras={"attributed_at": "layer"},
    )


class NeuronGate:
    """A backward rule for :meth:`Engine.gradients` (``rule=``): gradients pass ``layer`` through one unit.

    The layer's output keeps its value; its gradient is zero except at ``neuron`` (an index into
    one sample's output), so the input gradient is ``dF/dy dy/dx`` for that unit ``y``. Equal
    gates (same layer, same unit) are equal, so the engine keeps one compiled function per unit.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> h = keras.layers.Dense(2, use_bias=False, kernel_initializer="ones", name="h")
        >>> m = keras.Sequential([keras.Input((1,)), h, keras.layers.Dense(1, kernel_initializer="ones")])
        >>> engine_for(m).gradients(np.ones((1, 1)), 0, rule=NeuronGate(h, (1,))).input_grads[0].tolist()
        [[1.0]]
    """

    folds_batchnorm = False

    def __init__(self, layer: keras.Layer, neuron: tuple[int, ...]) -> None:
        self.layer = layer
        self.neuron = tuple(int(i) for i in neuron)

    def install(self, model: keras.Layer, backend: Any) -> contextlib.AbstractContextManager[None]:
        """Enter to gate the layer's output gradient (``model`` and ``backend`` unused: plain ``keras.ops``)."""
        original = self.layer.call
        neuron = self.neuron

        def gated(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            mask = np.zeros(tuple(out.shape[1:]), np.float32)
            mask[neuron] = 1.0
            frozen = keras.ops.stop_gradient(out)
            return frozen + keras.ops.cast(mask, out.dtype) * (out - frozen)

        return patched_attribute(self.layer, "call", gated)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NeuronGate) and other.layer is self.layer and other.neuron == self.neuron

    def __hash__(self) -> int:
        return hash((id(self.layer), self.neuron))

    def __repr__(self) -> str:
        return f"NeuronGate({self.layer.name!r}, {self.neuron})"


@register
class NeuronConductance(_InputPath):
    """Neuron conductance (Dhamdhere et al. 2018): IG of the inputs through one unit of a layer.

    ``(x_i - b_i) integral_0^1 dF/dy dy/dx_i (b + alpha (x - b)) d alpha`` for the unit ``y``
    of ``layer`` at index ``neuron`` (in the layer's own output layout, batch axis excluded: e.g.
    ``(row, col, channel)`` for a channels-last conv layer), with ``steps`` points of the
    quadrature ``method`` (Captum's ``NeuronConductance``). Summed over the inputs it is the
    unit's :class:`LayerConductance` (in the limit of many steps); summed over every unit of the
    layer, IG.

    Args:
        layer: the layer (name or path) holding the unit.
        neuron: the unit's index, an int for a flat layer output or a tuple.
        steps: path points per sample.
        method: the quadrature (see :func:`~kerascope.methods.integrated.quadrature`).
        baseline: the path's start in input space (as :class:`IntegratedGradients`; default zeros).
        input_index: which model input(s) move along the path (multi-input models).

    Cost: ``steps`` forward+backward passes per sample (plus one forward pass for the scores and
    one eager pass on one sample to check ``neuron`` against the layer's output shape).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, use_bias=False, name="h"),
        ...                       keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        >>> m.get_layer("h").set_weights([np.array([[1.0, 0.0], [2.0, 3.0]])])
        >>> ks.NeuronConductance(m, layer="h", neuron=0, steps=4).explain(np.ones((1, 2)), 0).attributions.tolist()
        [[1.0, 2.0]]
    """

    name = "neuron_conductance"
    description = "Integrated Gradients of the inputs flowing through one unit of a layer (Dhamdhere et al. 2018)."
    aliases = ("neuronconductance",)

    def __init__(self, model: keras.Layer, *, layer: Any, neuron: Any, **kwargs: Any) -> None:
        super().__init__(model, layer=layer, **kwargs)
        index = (neuron,) if isinstance(neuron, (int, np.integer)) else neuron
        if not isinstance(index, (tuple, list)) or not index or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in index
        ):
            raise TypeError(
                "`neuron` must be an int or a tuple of ints indexing one sample of the layer's output. "
                f"Received: neuron={neuron!r}."
            )
        self.neuron = tuple(int(i) for i in index)

    def _check_neuron(self, inputs: Inputs) -> None:
        first = Inputs(inputs.model_arg([a[:1] for a in inputs.arrays]))
        shape = _layer.activations(self.engine, first, self._layer, 1).shape[1:]
        if len(self.neuron) != len(shape) or any(not 0 <= i < s for i, s in zip(self.neuron, shape, strict=True)):
            raise ValueError(
                f"`neuron` is out of range for layer {self.layer!r}, whose output per sample has shape {shape}. "
                f"Received: neuron={self.neuron}. Pass {len(shape)} index(es), each 0 <= i < the axis length."
            )

    def _explain(self, inputs: Inputs, targets: Any) -> Explanation:
        self._check_neuron(inputs)
        alphas, weights = quadrature(self.steps, self.method)
        scores, resolved = clean_scores(self.engine, inputs, targets, self.batch_size, self.scores)
        totals: list[np.ndarray] | None = None
        gate = NeuronGate(self._layer, self.neuron)
        wrt, deltas, chunks = self._path(inputs, targets, resolved, alphas, through_inputs=True, rule=gate)
        for owners, steps, result in chunks:
            if totals is None:
                totals = [np.zeros((inputs.num_samples, *g.shape[1:]), np.float64) for g in result.input_grads]
            for total, grad in zip(totals, result.input_grads, strict=True):
                reduce_rows(total, owners, weights[steps], grad)
        assert totals is not None
        attributions = [(t * d).astype(np.float32) for t, d in zip(totals, deltas, strict=True)]
        return self._input_result(inputs, wrt, attributions, scores, resolved)
