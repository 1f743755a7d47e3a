"""Errors the backends raise about the user's model (re-exported by :mod:`kerascope.core.engine`)."""

from __future__ import annotations

__all__ = ["StatefulModelError"]


class StatefulModelError(ValueError):
    """The model carries state from one call to the next, or changes its variables at inference.

    ``stateful=True`` recurrent layers, BatchNormalization called with ``training=True`` inside a
    ``call``, a metric updated in ``call``: each pass of a method would start from another state
    and the explanation would change the user's model, so kerascope refuses.

    Example:
        >>> issubclass(StatefulModelError, ValueError)
        True
    """
