"""Round-robin timing shared by the benchmark scripts (no heavy imports: any backend can load it).

Example::

    times = rotating_times({"ours": ours, "base": floor}, rounds=5)
    times["ours"]  # five durations in seconds
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def rotating_times(
    runners: dict[str, Callable[[], Any]], rounds: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """Seconds of each runner per round; the order rotates every round (A B, B A for two).

    A slow phase of a shared machine then hits every runner alike, and the
    per-round ratios show how noisy it was. ``clock``: wall time by default;
    ``time.process_time`` counts this process's CPU seconds (with one compute
    thread, the work done, whatever the other processes' load).
    """
    order = list(runners)
    times: dict[str, list[float]] = {label: [] for label in order}
    for round_ in range(rounds):
        shift = round_ % max(1, len(order))
        for label in order[shift:] + order[:shift]:
            start = clock()
            runners[label]()
            times[label].append(clock() - start)
    return times
