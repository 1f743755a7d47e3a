"""Rewrite bookkeeping of one traced pass: precision, backward rules, batch-norm folding, cheaper conv backward."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras

from kerascope import _backend
from kerascope.core.precision import reduced_precision
from kerascope.core.probe import other_activations, override_relu_gradients, probe, relu_sites


def _propagation() -> tuple[Any, Any, Any]:
    """``(bn_fold, conv_backward, deeplift_rules)`` of :mod:`kerascope.propagation`, imported when a pass is traced.

    The rule-based propagation package sits above ``core`` (it imports the probes and layer
    lookups); the engine only runs its scoped rewrites, so ``core`` never imports it at load time.
    """
    from kerascope.propagation import bn_fold, conv_backward, deeplift_rules

    return bn_fold, conv_backward, deeplift_rules


class PassRewrites:
    """The one traced model call every compiled function makes, with the scoped rewrites of that pass."""

    def _check_relus(self, rule: str) -> None:
        """Warn when a ReLU backward rule would silently give the plain gradient (no ReLU reached)."""
        relus, others = self.memo("activations", lambda: (len(relu_sites(self.model)), other_activations(self.model)))
        listed = ", ".join(f"{name} ({count} layer{'s' if count > 1 else ''})" for name, count in others.items())
        if relus == 0:
            warnings.warn(
                f"Model {self.model.name!r} has no ReLU that the {rule!r} backward rule can reach"
                + (f" (its activations: {listed})" if listed else "")
                + f". The {rule!r} rule changes only ReLU backward passes, so this result EQUALS the plain "
                "gradient (Saliency, or Grad-CAM x gradient for GuidedGradCAM). Use Saliency, "
                "IntegratedGradients or SmoothGrad for models with GELU / swish activations.",
                UserWarning,
                stacklevel=4,
            )
        elif others:
            warnings.warn(
                f"The {rule!r} backward rule applies to the {relus} ReLU(s) of model {self.model.name!r}; "
                f"its other activations keep their plain gradient: {listed}.",
                UserWarning,
                stacklevel=4,
            )

    def _call_model(
        self,
        model_arg: Callable[[list[Any]], Any],
        arrays: list[Any],
        bypass: Sequence[keras.Layer],
        layers: Sequence[keras.Layer] = (),
        transform: Callable[[int, keras.Layer, Any], Any] | None = None,
        rule: str | None = None,
        positions: Sequence[int | None] | None = None,
        fold: bool = True,
        input_gradients: bool = False,
    ) -> tuple[Any, Any]:
        """What every compiled function (gradients, forward, scorer) traces: ``(explained, recorder)``.

        ``layers`` are probed (outputs recorded, replaced by ``transform(i, layer, output)``
        when given, at the call ``positions`` chooses) and ReLU gradients overridden by ``rule``,
        then :meth:`call_model` (the
        softmax layers in ``bypass`` made linear, ``output_layer`` read); all undone on return.
        With ``fold`` (and the engine's ``fold_batchnorm``, no ``rule`` or one whose ``folds_batchnorm``
        is true, float32) every Conv / Dense +
        BatchNormalization pair that neither is probed nor is ``output_layer`` runs as one layer
        (``propagation/bn_fold.py``: exact up to float32 rounding). A folded layer called apart from its
        BatchNormalization (code outside the graph, e.g. a ``Lambda`` closure) makes the pass rerun
        unfolded, and this engine folds no more. With ``input_gradients`` (the pass differentiates w.r.t.
        the model's inputs; float32, not for weight gradients) the convolutions of :meth:`conv_ops` run
        with their cheaper exact input gradient (``propagation/conv_backward.py``); passes without an input
        gradient would only pay for tracing it.
        """
        try:
            return self._call_model_once(model_arg, arrays, bypass, layers, transform, rule, positions, fold,
                                         input_gradients)
        except _propagation()[0].FoldMismatch:
            self._fold_refused = True
            return self._call_model_once(model_arg, arrays, bypass, layers, transform, rule, positions, False,
                                         input_gradients)

    def _call_model_once(
        self,
        model_arg: Callable[[list[Any]], Any],
        arrays: list[Any],
        bypass: Sequence[keras.Layer],
        layers: Sequence[keras.Layer],
        transform: Callable[[int, keras.Layer, Any], Any] | None,
        rule: str | None,
        positions: Sequence[int | None] | None,
        fold: bool,
        input_gradients: bool = False,
    ) -> tuple[Any, Any]:
        """One pass of :meth:`_call_model` (folding as ``fold`` says)."""
        bn_fold, conv_backward, deeplift_rules = _propagation()
        with contextlib.ExitStack() as stack:
            stack.enter_context(reduced_precision(self.model, self.precision))  # restored on exit
            if rule == "deeplift":
                stack.enter_context(deeplift_rules.deeplift_rules(self.model, _backend.get()))
            elif rule is not None and not isinstance(rule, str):  # a rules object (e.g. LRP)
                stack.enter_context(rule.install(self.model, _backend.get()))
            elif rule is not None:
                backend = _backend.get()
                stack.enter_context(override_relu_gradients(self.model, lambda f: backend.modified_relu(f, rule)))
            folds = rule is None or getattr(rule, "folds_batchnorm", False)  # a rule on non-linearities only
            if fold and folds and self.precision is None:  # (folded_pairs: none with fold_batchnorm=False)
                stack.enter_context(bn_fold.fold_batchnorm(self.folded_pairs(layers)))  # restored on exit
            if input_gradients and self.precision is None:  # every rule differentiates convolutions as they are
                stack.enter_context(conv_backward.cheaper_backward(self.conv_ops(layers)))  # restored on exit
            recorder = stack.enter_context(probe(layers, transform, positions))
            outputs = self.call_model(model_arg(arrays), stack, bypass)
        return outputs, recorder

    def folded_pairs(self, probed: Sequence[keras.Layer] = ()) -> list[tuple[keras.Layer, keras.Layer]]:
        """The ``(Conv / Dense, BatchNormalization)`` pairs run as one layer in a float32 pass that probes ``probed``.

        Empty with ``fold_batchnorm=False`` and on JAX (``propagation.bn_fold.FOLD_BACKENDS``: XLA fuses the
        normalisation already). A pair with a probed layer (or ``output_layer``) is not
        folded, so what the method reads there is the layer's own output (see ``propagation/bn_fold.py``).

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> x = keras.Input((4,))
            >>> bn = keras.layers.BatchNormalization(name="bn")
            >>> m = keras.Model(x, bn(keras.layers.Dense(2, name="d")(x)))
            >>> [(a.name, b.name) for a, b in Engine(m).folded_pairs()], Engine(m).folded_pairs([bn])
            ([('d', 'bn')], [])
        """
        bn_fold = _propagation()[0]
        if not self.fold_batchnorm or self._fold_refused or keras.backend.backend() not in bn_fold.FOLD_BACKENDS:
            return []
        skip = self._kept_as_they_are(probed)
        model = self.model
        pairs = self.memo(("batchnorm_pairs", self._structure()), lambda: bn_fold.foldable_pairs(model))
        return [pair for pair in pairs if id(pair[0]) not in skip and id(pair[1]) not in skip]

    def _kept_as_they_are(self, probed: Sequence[keras.Layer]) -> set[int]:
        """Ids of the layers a pass must run as the model does: the probed ones and ``output_layer``."""
        explained = self.explained_layer()
        return {id(layer) for layer in probed} | ({id(explained)} if explained is not None else set())

    def conv_ops(self, probed: Sequence[keras.Layer] = ()) -> list[tuple[keras.Layer, Callable[[Any, Any], Any]]]:
        """The convolutions run with a cheaper exact backward in a float32 pass that probes ``probed``.

        ``propagation/conv_backward.py``: on TensorFlow without a GPU, stem and 1x1 ``Conv2D`` layers
        (``_backend/tf_conv.py``); none elsewhere. A probed layer (or ``output_layer``) keeps its own op.

        Example:
            >>> from kerascope.core.engine import Engine
            >>> import keras
            >>> m = keras.Sequential([keras.Input((9, 9, 3)), keras.layers.Conv2D(2, 3, strides=2, name="stem")])
            >>> [layer.name for layer, _ in Engine(m).conv_ops()] in ([], ["stem"])
            True
        """
        conv_backward = _propagation()[1]
        skip = self._kept_as_they_are(probed)
        model = self.model
        ops = self.memo(("conv_ops", self._structure()), lambda: conv_backward.conv_ops(model, _backend.get()))
        return [(layer, op) for layer, op in ops if id(layer) not in skip]
