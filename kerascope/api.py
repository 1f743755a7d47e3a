"""One-call entry point: ``ks.explain(model, inputs, method=...)``."""

from __future__ import annotations

from typing import Any

import keras

from kerascope.core.explanation import Explanation
from kerascope.methods.registry import build


def explain(
    model: keras.Layer, inputs: Any, method: str | type = "gradcam", targets: Any = None, **params: Any
) -> Explanation:
    """Explain ``inputs`` with the registered ``method`` (a name or a class).

    ``params`` go to the method's constructor (``layer=``, ``batch_size=``,
    ``samples=``...).

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> ks.explain(m, np.ones((1, 3)), method="saliency", targets=0).method
        'saliency'
    """
    return build(method, model, params).explain(inputs, targets)
