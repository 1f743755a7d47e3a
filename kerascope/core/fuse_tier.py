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
calls set by the model (measured: ~90 on the demo model, ~80 on MobileNetV2
at 8 images; 2-3 on VGG16 at 160 px).

The estimates, from the calls' own wall times:

* what fusing would save per call: :data:`SAVED_FRACTION` of the separate
  pass's steady time (the fastest call after the first at that shape);
* its price: :data:`COMPILE_S` per distinct kernel, plus the trace of the
  fused pass, taken to cost what the separate pass's first call cost over its
  steady time (0 once the fused pass is traced, e.g. by an earlier call of
  at least ``FUSE_MIN_ROWS`` inputs).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Hashable

#: Share of a separate-ops DeepLIFT pass that the fused rules save (measured 0.11 on ResNet50, 0.25 on VGG16,
#: 0.27 on the demo model, 0.36 on MobileNetV2: docs/performance.md, "Repeated calls fuse").
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

    ``graph``: what one traced pass depends on (method, layout, input
    signature); ``shape``: what one compilation depends on besides (the
    number of inputs and the chunk size). :meth:`record` each call's wall
    time; :meth:`fuses` says whether the next call at ``(graph, shape)``
    should fuse. ``kernels``: the model's distinct fused kernels.

    Example:
        >>> tier = FuseTier(kernels=5)  # price: 5 x 0.1 s of compilation + the trace (first - steady = 0.6 s)
        >>> tier.record("g", 8, 0.65, fused=False); tier.record("g", 8, 0.05, fused=False)
        >>> tier.fuses("g", 8)  # 2 calls x 0.25 x 0.05 s saved would not pay 1.1 s
        False
        >>> for _ in range(86):
        ...     tier.record("g", 8, 0.05, fused=False)
        >>> tier.fuses("g", 8)  # 88 calls x 0.0125 s = 1.1 s
        True
    """

    def __init__(self, kernels: int) -> None:
        self.kernels = int(kernels)
        self._shapes: dict[tuple[Hashable, Hashable], _Shape] = {}
        self._first_shape: dict[Hashable, Hashable] = {}  # the shape of each graph's first separate call
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

    def price(self, graph: Hashable) -> float:
        """Estimated seconds of switching ``graph``'s calls to the fused rules (``inf``: not known yet).

        Example:
            >>> tier = FuseTier(kernels=3)
            >>> tier.record("g", 8, 1.0, fused=False); tier.record("g", 8, 0.2, fused=False)
            >>> round(tier.price("g"), 3)  # 3 kernels x 0.1 s + the trace: 1.0 - 0.2 s
            1.1
        """
        compile_s = self.kernels * COMPILE_S
        with self._lock:
            if graph in self._fused_graphs:
                return compile_s
            first_shape = self._first_shape.get(graph)
            seen = self._shapes.get((graph, first_shape))
            if seen is None or seen.first is None or math.isinf(seen.steady):
                return math.inf
            return compile_s + max(seen.first - seen.steady, 0.0)

    def fuses(self, graph: Hashable, shape: Hashable) -> bool:
        """Whether a call at ``(graph, shape)`` should fuse: it did before, or the rent paid reaches the price."""
        with self._lock:
            if (graph, shape) in self._fused:
                return True
            seen = self._shapes.get((graph, shape))
        if seen is None or math.isinf(seen.steady):
            return False
        return seen.calls * SAVED_FRACTION * seen.steady >= self.price(graph)
