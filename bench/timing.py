"""Timing and memory helpers shared by every scenario (no heavy imports: any backend can load it).

Example::

    times = rotating_times({"ours": ours, "base": floor}, rounds=5)
    times["ours"]  # five durations in seconds
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

K = TypeVar("K")
T = TypeVar("T")


def rotating_calls(runners: dict[K, Callable[[], T]], rounds: int) -> dict[K, list[T]]:
    """Each runner's return value per round; the order rotates every round (A B, B A for two).

    A slow phase of a shared machine then hits every runner alike. The runners time
    themselves (:func:`rotating_times` wraps them with one clock; the chunk-size scenarios
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


def summary(times: dict[str, list[float]], base: str) -> dict[str, dict[str, float]]:
    """Per runner: its median seconds, the median of its per-round ratios to ``base`` and their min / max.

    Ratios are taken round by round (both sides saw the same load), so their spread shows how
    noisy the machine was.

    >>> summary({"ours": [2.0, 3.0], "floor": [1.0, 2.0]}, "floor")["ours"]["ratio"]
    1.75
    """
    out = {}
    for label, seconds in times.items():
        ratios = [a / b for a, b in zip(seconds, times[base], strict=True)]
        out[label] = {"median_s": statistics.median(seconds), "ratio": statistics.median(ratios),
                      "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return out


def cpu_clock(enabled: bool) -> Callable[[], float]:
    """``time.process_time`` (CPU seconds of this process) when ``enabled``, else wall time."""
    return time.process_time if enabled else time.perf_counter


def one_tf_thread() -> None:
    """One TensorFlow compute thread, so CPU seconds measure the work done (call before any op runs)."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already ran an op in this process: its pools are fixed
        pass


# ----------------------------------------------------------------- memory
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> int:
    """Reset the RSS high-water mark (Linux >= 4.0); return the current RSS in KiB.

    ``tracemalloc`` cannot see TensorFlow's allocations; ``VmHWM`` from ``/proc/self/status``
    can, after writing ``5`` to ``/proc/self/clear_refs``.
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    return _rss_kib("VmRSS")


def peak_kib() -> int:
    """The RSS high-water mark since the last :func:`reset_peak`, in KiB."""
    return _rss_kib("VmHWM")
