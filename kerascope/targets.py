"""Targets for outputs with positions: ``ks.targets.position`` and ``ks.targets.region``.

A target says which scalar per sample is explained. An int (or ``None``, the
predicted class) suits an output of shape ``(N, classes)``; on an output with
positions (a language model's ``(N, T, V)`` logits, a segmentation map's
``(N, H, W, C)``) kerascope refuses it and asks for one of these.

Example:
    >>> import kerascope as ks
    >>> ks.targets.position(-1, 7)
    ks.targets.position(-1, 7)
"""

from kerascope.core.positions import PositionTarget, RegionTarget, position, region

__all__ = ["PositionTarget", "RegionTarget", "position", "region"]
