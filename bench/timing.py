"""Round-robin timing shared by the benchmark scripts (no heavy imports: any backend can load it).

Example::

    times = rotating_times({"ours": ours, "base": floor}, rounds=5)
    times["ours"]  # five durations in seconds
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

K = TypeVar("K")
T = TypeVar("T")


def rotating_calls(runners: dict[K, Callable[[], T]], rounds: int) -> dict[K, list[T]]:
    """Each runner's return value per round; the order rotates every round (A B, B A for two).

    A slow phase of a shared machine then hits every runner alike. The runners time
    themselves (:func:`rotating_times` wraps them with one clock; ``bench/chunk_size.py``
    with two).
    """
    order = list(runners)
    results: dict[K, list[T]] = {label: [] for label in order}
    for round_ in range(rounds):
        shift = round_ % max(1, len(order))
        for label in order[shift:] + order[:shift]:
            results[label].append(runners[label]())
    return results


def rotating_times(
    runners: dict[str, Callable[[], Any]], rounds: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """Seconds of each runner per round, in :func:`rotating_calls`' rotating order.

    The per-round ratios show how noisy the machine was. ``clock``: wall time by
    default; ``time.process_time`` counts this process's CPU seconds (with one compute
    thread, the work done, whatever the other processes' load).
    """

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            start = clock()
            fn()
            return clock() - start

        return run

    return rotating_calls({label: timed(fn) for label, fn in runners.items()}, rounds)
