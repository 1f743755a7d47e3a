"""When repeated DeepLIFT calls switch to the fused rules: a ski-rental rule.

Fusing DeepLIFT's element-wise rules (``fuse_rules``) makes every pass cheaper
(a quarter to a third on the benchmark models) but costs XLA's compilation
once per kernel and number of rows, and a trace of the fused pass: 1.3 s on
the demo model, ~3 s on MobileNetV2 at 160 px, against 15-90 ms saved per
call of 8 images. Whether it pays depends on how many calls follow, which is
unknown when the first one runs. The classic answer to such a choice (ski
rental) is to keep the cheap-to-start option ("rent") until what it has cost
over the other reaches the price of switching ("buy"), then switch: in total
this never costs more than about twice the better fixed choice in hindsight,
as far as the estimates hold. A single call, or a few, keep the separate ops
and their cheap first call; a loop over a data set fuses after a number of
calls set by the model (measured: 114-135 on the demo model, 70-80 on MobileNetV2
at 8 images; 5 on VGG16 at 160 px).

The estimates, from the calls' own wall times:

* what fusing would save per call: :data:`SAVED_FRACTION` of the separate
  pass's steady time (the fastest call after the first at that shape);
* its price: :data:`COMPILE_S` per distinct kernel, plus the trace of the
  fused pass, taken to cost what the separate pass's first call cost over its
  steady time (0 once the fused pass is traced, e.g. by an earlier call of
  at least ``FUSE_MIN_ROWS`` inputs).

A steady time needs two calls at one shape, so nothing fuses before the third
call. Kept per model (its engine); threads share it under a lock.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Hashable

#: Share of a separate-ops DeepLIFT pass that the fused rules save (0.11 on ResNet50, 0.25 on VGG16, 0.33 on
#: MobileNetV2 and the demo model: docs/performance.md, "DeepLIFT's rules fused" and "Max pooling fused").
SAVED_FRACTION = 0.25

#: XLA's compilation of one fused kernel for one shape on CPU, seconds (measured 0.05-0.16).
COMPILE_S = 0.1


@dataclasses.dataclass
class _Shape:
    """The separate-ops calls seen at one call shape."""

    calls: int = 0
    first: float | None = None
    steady: float = math.inf


class FuseTier:
    """Ski-rental bookkeeping of one model's DeepLIFT calls: when the default ``fuse_rules`` fuses.

    ``graph``: what one traced pass depends on (method, rule layout, input
    signature, kind of targets); ``shape``: what one compilation depends on
    besides (the numbers of inputs and references, the chunk size).
    :meth:`record` each call's wall time; :meth:`fuses` says whether the next
    call at ``(graph, shape)`` should fuse. ``kernels``: the model's distinct
    fused kernels (none: fusing saves nothing, never fuse).

    Example:
        >>> tier = FuseTier(kernels=5)  # price: 5 x 0.1 s of compilation + the trace (first - steady = 0.61 s)
        >>> tier.record("g", 8, 0.66, fused=False); tier.record("g", 8, 0.05, fused=False)
        >>> tier.fuses("g", 8)  # 2 calls x 0.25 x 0.05 s saved would not pay 1.11 s
        False
        >>> for _ in range(87):
        ...     tier.record("g", 8, 0.05, fused=False)
        >>> tier.fuses("g", 8)  # 89 calls x 0.0125 s = 1.1125 s
        True
    """

    def __init__(self, kernels: int) -> None:
        self.kernels = int(kernels)
        self._shapes: dict[tuple[Hashable, Hashable], _Shape] = {}
        #: the shape of each graph's first separate call (whose ``first`` time holds the trace)
        self._first_shape: dict[Hashable, Hashable] = {}
        self._fused: set[tuple[Hashable, Hashable]] = set()
        self._fused_graphs: set[Hashable] = set()
        self._lock = threading.Lock()

    def record(self, graph: Hashable, shape: Hashable, seconds: float, fused: bool) -> None:
        """Note one call's wall time (``fused``: it ran the fused rules)."""
        with self._lock:
            if fused:
                self._fused.add((graph, shape))
                self._fused_graphs.add(graph)
                return
            self._first_shape.setdefault(graph, shape)
            seen = self._shapes.setdefault((graph, shape), _Shape())
            seen.calls += 1
            if seen.first is None:
                seen.first = float(seconds)
            else:
                seen.steady = min(seen.steady, float(seconds))

    def price(self, graph: Hashable, shape: Hashable) -> float:
        """Estimated seconds of switching the calls at ``(graph, shape)`` to the fused rules (``inf``: no call yet).

        Example:
            >>> tier = FuseTier(kernels=3)
            >>> tier.record("g", 8, 1.0, fused=False); tier.record("g", 8, 0.2, fused=False)
            >>> round(tier.price("g", 8), 3)  # 3 kernels x 0.1 s + the trace: 1.0 - 0.2 s
            1.1
        """
        with self._lock:
            return self._price(graph, shape)

    def _price(self, graph: Hashable, shape: Hashable) -> float:
        compile_s = self.kernels * COMPILE_S
        if graph in self._fused_graphs:  # the fused pass is traced: only this shape's compilation is left
            return compile_s
        if graph not in self._first_shape:
            return math.inf
        opening = self._shapes[(graph, self._first_shape[graph])]
        first = opening.first or 0.0  # (set by that call)
        # the trace: the graph's first call over its steady time at that shape, else over this shape's
        # (another number of inputs: roughly), else the whole first call (an over-estimate)
        for seen in (opening, self._shapes.get((graph, shape))):
            if seen is not None and not math.isinf(seen.steady):
                return compile_s + max(first - seen.steady, 0.0)
        return compile_s + first

    def fuses(self, graph: Hashable, shape: Hashable) -> bool:
        """Whether a call at ``(graph, shape)`` should fuse: it did before, or the rent paid reaches the price."""
        with self._lock:
            if (graph, shape) in self._fused:
                return True
            seen = self._shapes.get((graph, shape))
            if self.kernels == 0 or seen is None or math.isinf(seen.steady):
                return False
            return seen.calls * SAVED_FRACTION * seen.steady >= self._price(graph, shape)
