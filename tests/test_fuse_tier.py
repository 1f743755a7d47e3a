"""The ski-rental rule that switches repeated DeepLIFT calls to the fused rules (``kerascope.propagation.fuse_tier``).

Simulated calls with known costs: the rule's total never exceeds about twice the best fixed
choice in hindsight (its guarantee when its estimates are exact), it waits for a steady time,
and a shape that fused, or a graph traced fused, is priced accordingly.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kerascope.propagation import fuse_tier
from kerascope.propagation.fuse_tier import FuseTier


def simulate(calls: int, steady: float, trace: float, kernels: int) -> tuple[float, int | None]:
    """Total seconds of ``calls`` default calls (true costs = the rule's estimates) and the call that fused."""
    tier, total, switched = FuseTier(kernels), 0.0, None
    for i in range(calls):
        if tier.fuses("g", 8):
            cost = (1 - fuse_tier.SAVED_FRACTION) * steady
            if switched is None:
                switched, cost = i, cost + kernels * fuse_tier.COMPILE_S + trace
            tier.record("g", 8, cost, fused=True)
        else:
            cost = steady + (trace if i == 0 else 0.0)
            tier.record("g", 8, cost, fused=False)
        total += cost
    return total, switched


def best_in_hindsight(calls: int, steady: float, trace: float, kernels: int) -> float:
    """The cheapest fixed plan: separate ops for the first k calls, fused after (k = 0: fused from the start)."""
    fused, price = (1 - fuse_tier.SAVED_FRACTION) * steady, kernels * fuse_tier.COMPILE_S + trace
    plans = [price + calls * fused]  # fused from the first call: one trace (the fused pass) and the compilation
    plans += [trace + k * steady + (price + (calls - k) * fused if k < calls else 0.0) for k in range(1, calls + 1)]
    return min(plans)


@settings(max_examples=60, deadline=None)
@given(calls=st.integers(1, 400), steady=st.floats(0.001, 5.0), trace=st.floats(0.0, 5.0), kernels=st.integers(1, 40))
def test_never_more_than_about_twice_the_best_fixed_choice(calls, steady, trace, kernels):
    total, _ = simulate(calls, steady, trace, kernels)
    assert total <= 2 * best_in_hindsight(calls, steady, trace, kernels) + 1e-9  # the ski-rental bound


def test_switches_when_the_saved_time_reaches_the_price():
    # demo-like: 5 kernels (0.5 s), trace 0.66 s, 0.05 s per separate call -> 0.0125 s saved per call:
    # 1.16 s / 0.0125 s = 92.8 calls, so the 93rd call's rent pays and the 94th (index 93) fuses
    total, switched = simulate(300, 0.05, 0.66, 5)
    assert switched == 93
    # VGG16-like (4.7 s per call, 11 kernels, trace 1.8 s): compute dominates, fused from the fourth call
    assert simulate(10, 4.7, 1.8, 11)[1] == 3
    # one call, or a few: never fused
    assert simulate(20, 0.05, 0.65, 5)[1] is None


def test_needs_a_steady_time_and_remembers_what_fused():
    tier = FuseTier(kernels=2)
    assert math.isinf(tier.price("g", 8))
    tier.record("g", 8, 100.0, fused=False)
    assert not tier.fuses("g", 8)  # one call: its steady time is unknown
    assert tier.price("g", 8) == 2 * fuse_tier.COMPILE_S + 100.0  # the trace at most the whole first call
    tier.record("g", 8, 10.0, fused=False)
    assert tier.price("g", 8) == 2 * fuse_tier.COMPILE_S + 90.0 and not tier.fuses("g", 8)
    tier.record("g", 16, 20.0, fused=True)  # e.g. a call of many inputs fused: the fused pass is traced
    assert tier.fuses("g", 16) and tier.price("g", 8) == 2 * fuse_tier.COMPILE_S
    assert tier.fuses("g", 8)  # 2 calls x 0.25 x 10 s >= 0.2 s of compilation
    assert not tier.fuses("other", 8)


def test_a_loop_at_another_shape_than_the_first_call_still_fuses():
    # one call of 1 input (trace + work: 1 s), then a loop of 8 inputs (0.1 s each): the trace is estimated
    # from the loop's steady time (1 - 0.1 s) and the loop fuses once it has paid 0.9 + 0.5 s
    tier = FuseTier(kernels=5)
    tier.record("g", 1, 1.0, fused=False)
    calls = 0
    while not tier.fuses("g", 8):
        tier.record("g", 8, 0.1, fused=False)
        calls += 1
    assert calls == math.ceil((0.9 + 5 * fuse_tier.COMPILE_S) / (fuse_tier.SAVED_FRACTION * 0.1) - 1e-9)


def test_nothing_to_fuse_never_fuses():
    tier = FuseTier(kernels=0)
    for _ in range(100):
        tier.record("g", 8, 1.0, fused=False)
    assert not tier.fuses("g", 8)
