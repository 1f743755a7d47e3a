"""Numeric helpers, numpy only: the leaf package every other package may import.

One module each: :mod:`~kerascope.numeric.resize` (bilinear resizing, half-pixel
centres), :mod:`~kerascope.numeric.reduce` (channel reductions),
:mod:`~kerascope.numeric.blur` (Gaussian blur) and :mod:`~kerascope.numeric.chunking`
(splitting rows into chunks of ``batch_size``). Nothing here imports another
kerascope package, so ``core``, ``viz``, ``metrics`` and ``batch`` share them without
import loops.
"""
