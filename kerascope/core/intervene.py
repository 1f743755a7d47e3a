"""Forward passes with an intervention on one layer's output, driven per row.

Perturbation methods that act *inside* the network (AblationCAM zeroing one
channel of a feature map, ...) need many forward passes that differ only in
what happens at one layer. :func:`compile_scorer` (the engine's public
:meth:`~kerascope.core.engine.Engine.scorer`) compiles that once: a forward pass
in the engine's output space (a final softmax bypassed in ``"logits"`` mode)
where ``transform(output, extra)`` replaces the layer's output, ``extra`` being
an extra input with one row per sample (e.g. the index of the channel to
ablate). Each row can so carry a different variant, and variants are folded
into the batch axis. The layer is intercepted with a scoped
:func:`~kerascope.core.probe.probe`, so the model is never modified (and is
restored even when the forward pass raises).
"""

from __future__ import annotations

from typing import Any

from kerascope.core.engine import ChunkScorer, Engine, Transform
from kerascope.core.inputs import Inputs

__all__ = ["ChunkScorer", "Transform", "compile_scorer"]


def compile_scorer(engine: Engine, inputs: Inputs, **options: Any) -> ChunkScorer:
    """Compiled ``(arrays, indices, extra) -> (scores, resolved_targets)`` for ``engine``'s model.

    The same as ``engine.scorer(inputs, **options)``: ``target_fn``, ``layer``, ``transform`` and
    ``extra_spec`` as :meth:`~kerascope.core.engine.Engine.scorer` takes them.

    Example:
        >>> import keras, numpy as np
        >>> from kerascope.core.engine import engine_for
        >>> d = keras.layers.Dense(3, use_bias=False, kernel_initializer="ones", name="d")
        >>> m = keras.Sequential([keras.Input((2,)), d, keras.layers.Dense(1, kernel_initializer="ones")])
        >>> def drop_unit(output, unit):  # one unit of `d` set to zero per row
        ...     return output * (1.0 - keras.ops.one_hot(unit, 3))
        >>> x = Inputs(np.ones((3, 2)))
        >>> fn = compile_scorer(engine_for(m), x, layer=d, transform=drop_unit, extra_spec=((None,), "int32"))
        >>> fn(x.arrays, np.zeros(3, "int32"), np.array([0, 1, 2], "int32"))[0].tolist()
        [4.0, 4.0, 4.0]
    """
    return engine.scorer(inputs, **options)
