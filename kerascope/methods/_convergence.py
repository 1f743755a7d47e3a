"""Stopping rules for ``tolerance=``: nested path grids (IG) and Monte-Carlo error estimates (noise, EG).

Integrated Gradients with ``tolerance=`` evaluates the path on dyadic grids
``alpha = j / 2**k`` that double level by level, so every pass already run is
reused (:func:`level_nodes`). Noise wrappers and Expected Gradients draw their
samples in antithetic pairs (``z`` and ``-z``; ``alpha`` and ``1 - alpha``) and
estimate the map's sampling error from the spread of the pair means
(:class:`PairMoments`). Their ``tolerance`` bounds the estimated ``1 - rho``, with ``rho`` the
Pearson correlation of the map with the exact (infinite-sample) map (:func:`correlation_error`), and
each round is sized from the error measured so far, for noise falling as ``1 / samples``
(:func:`next_pairs`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from kerascope.methods._folding import reduce_rows

NESTED_RULES = ("open_trapezoid", "riemann_trapezoid")
ROUND_MARGIN = 1.1  # a predicted round asks for 10% more pairs than the 1 / samples law says


def check_tolerance(tolerance: object, cap: object, cap_name: str) -> None:
    """Validate ``tolerance`` (``None`` or a number in ``(0, 1)``) and its cap (an int >= 2).

    Example:
        >>> check_tolerance(0.0, 64, "max_steps")
        Traceback (most recent call last):
        ...
        ValueError: `tolerance` must be None or a number in (0, 1). Received: tolerance=0.0.
    """
    if tolerance is not None and (
        isinstance(tolerance, bool) or not np.isscalar(tolerance) or not 0.0 < float(tolerance) < 1.0
    ):
        raise ValueError(f"`tolerance` must be None or a number in (0, 1). Received: tolerance={tolerance!r}.")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 2:
        raise ValueError(f"`{cap_name}` must be an int >= 2. Received: {cap_name}={cap!r}.")


def pair_samples(samples: object, tolerance: float | None, max_samples: object) -> int:
    """Check ``tolerance`` / ``max_samples`` and return the sample count (default 50, or 32 for the first round).

    Shared by the noise wrappers and Expected Gradients: with ``tolerance=``, ``samples`` is the
    first round and must lie in ``2..max_samples``.

    Example:
        >>> pair_samples(None, None, 1024), pair_samples(None, 0.05, 1024)
        (50, 32)
        >>> pair_samples(1, 0.05, 1024)
        Traceback (most recent call last):
        ...
        ValueError: `samples` must be a positive int (with tolerance=, the first round: 2..max_samples). Received: samples=1, max_samples=1024.
    """
    check_tolerance(tolerance, max_samples, "max_samples")
    if samples is None:
        samples = 50 if tolerance is None else 32
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1 or (
        tolerance is not None and not 2 <= samples <= max_samples  # type: ignore[operator]
    ):
        raise ValueError(
            f"`samples` must be a positive int (with tolerance=, the first round: 2..max_samples). "
            f"Received: samples={samples!r}, max_samples={max_samples!r}."
        )
    return samples


def grid_points(level: int, closed: bool) -> int:
    """Path points of the dyadic grid of ``level`` (``2**level + 1`` closed, ``2**level - 1`` open).

    Example:
        >>> [grid_points(k, closed=False) for k in (1, 2, 3)], grid_points(3, closed=True)
        ([1, 3, 7], 9)
    """
    return 2**level + 1 if closed else 2**level - 1


def level_nodes(level: int, closed: bool) -> tuple[np.ndarray, np.ndarray]:
    """``alpha`` of the nodes new at ``level`` and whether each is next to an end of the path.

    Level ``k >= 1`` adds the odd ``j / 2**k``; level 0 (closed grids only) is ``{0, 1}``.
    The open rule weighs the two nodes next to the ends (``1 / 2**k`` and
    ``1 - 1 / 2**k``, always new) by ``3 / 2`` (:func:`estimate`).

    Example:
        >>> a, near = level_nodes(2, closed=False)
        >>> a.tolist(), near.tolist()
        ([0.25, 0.75], [True, True])
    """
    if level == 0:
        return np.array([0.0, 1.0]), np.zeros(2, bool)
    j = np.arange(1, 2**level, 2)
    return j / 2**level, (j == 1) | (j == 2**level - 1)


def estimate(level: int, closed: bool, interior: np.ndarray, near: np.ndarray | None,
             ends: np.ndarray | None) -> np.ndarray:
    """The path integral on the grid of ``level`` from sums of integrand values.

    ``interior``: the sum over every node ``0 < alpha < 1`` of the grid; ``near``: over the two
    nodes next to the ends (open rule); ``ends``: over ``alpha = 0`` and ``1`` (closed rule).
    Closed (trapezoid): ``h (interior + ends / 2)``. Open (``open_trapezoid``, second order,
    exact for linear integrands): ``h (interior + near / 2)``, and the midpoint at level 1.

    Example:
        >>> f = lambda a: 3 * a + 1  # integral 2.5, exact on both rules
        >>> a = np.arange(1, 8) / 8
        >>> float(estimate(3, False, f(a).sum(), f(a[[0, -1]]).sum(), None))
        2.5
        >>> float(estimate(3, True, f(a).sum(), None, f(0.0) + f(1.0)))
        2.5
    """
    h = 1.0 / 2**level
    if closed:
        return h * (interior + 0.5 * ends)
    if level == 1:
        return interior
    return h * (interior + 0.5 * near)


def relative_change(new: list[np.ndarray], old: list[np.ndarray]) -> np.ndarray:
    """Per sample ``||new - old|| / ||new||`` over all arrays (L2; 0 where both are 0).

    Example:
        >>> relative_change([np.array([[3.0, 4.0]])], [np.array([[3.0, 3.0]])]).tolist()
        [0.2]
    """
    diff = sum(np.square(a - b).reshape(len(a), -1).sum(axis=1) for a, b in zip(new, old, strict=True))
    norm = sum(np.square(a).reshape(len(a), -1).sum(axis=1) for a in new)
    return np.sqrt(diff) / np.sqrt(np.where(norm > 0, norm, 1.0))


class PairMoments:
    """Running moments of antithetic-pair means, per sample: the map and its sampling error.

    ``add(owners, s, q)`` adds units (one per antithetic pair): ``s`` the pair's
    mean attribution, ``q`` its mean squared attribution (kept only when the
    statistic needs it). ``statistic`` is ``"mean"`` (SmoothGrad),
    ``"mean_square"`` (SmoothGrad²) or ``"variance"`` (VarGrad, population
    variance ``E[a^2] - E[a]^2``). :meth:`noise_fraction` estimates, per
    sample, the share of the map's variance over its elements that is sampling
    noise, ``sum(SE^2) / sum((m - mean(m))^2)`` (the variance delta method for
    ``"variance"``); the map's Pearson correlation with the exact
    (infinite-sample) map is then about ``sqrt(1 - noise_fraction)``.

    Example:
        >>> acc = PairMoments((1, 2), "mean")
        >>> acc.add(np.array([0, 0]), np.array([[1.0, 2.0], [3.0, 2.0]]))
        >>> acc.value().tolist(), acc.count.tolist()
        ([[2.0, 2.0]], [2])
    """

    def __init__(self, shape: tuple[int, ...], statistic: str) -> None:
        self.statistic = statistic
        self.count = np.zeros(shape[0], np.int64)
        self.s1 = np.zeros(shape, np.float64)
        self.s2 = np.zeros(shape, np.float64)
        squares = statistic != "mean"
        self.q1 = np.zeros(shape, np.float64) if squares else None
        self.q2 = np.zeros(shape, np.float64) if squares else None
        self.qs = np.zeros(shape, np.float64) if statistic == "variance" else None

    def add(self, owners: np.ndarray, s: np.ndarray, q: np.ndarray | None = None) -> None:
        """Add one unit per row of ``s`` (and ``q``) to its owner's sums."""
        np.add.at(self.count, owners, 1)
        ones = np.ones(len(owners))
        s = np.asarray(s, np.float64)
        reduce_rows(self.s1, owners, ones, s)
        reduce_rows(self.s2, owners, ones, s * s)
        if self.q1 is not None:
            q = np.asarray(q, np.float64)
            reduce_rows(self.q1, owners, ones, q)
            reduce_rows(self.q2, owners, ones, q * q)
            if self.qs is not None:
                reduce_rows(self.qs, owners, ones, q * s)

    def _per_sample(self, array: np.ndarray) -> np.ndarray:
        return self.count.reshape((-1,) + (1,) * (array.ndim - 1)).astype(np.float64)

    def value(self) -> np.ndarray:
        """The map: mean, mean of squares or variance over all draws so far."""
        p = np.maximum(self._per_sample(self.s1), 1.0)
        mean = self.s1 / p
        if self.statistic == "mean":
            return mean
        mean_sq = self.q1 / p
        return mean_sq if self.statistic == "mean_square" else np.maximum(mean_sq - mean**2, 0.0)

    def noise_fraction(self) -> np.ndarray:
        """Per sample: estimated sampling variance of the map over its variance across elements."""
        p = self._per_sample(self.s1)
        safe = np.maximum(p, 1.0)
        ms, vs = self.s1 / safe, np.maximum(self.s2 / safe - (self.s1 / safe) ** 2, 0.0)
        if self.statistic == "mean":
            unit_var = vs
        else:
            mq, vq = self.q1 / safe, np.maximum(self.q2 / safe - (self.q1 / safe) ** 2, 0.0)
            if self.statistic == "mean_square":
                unit_var = vq
            else:  # var = E q - (E s)^2; unit u = q - 2 mu s
                cov = self.qs / safe - mq * ms
                unit_var = np.maximum(vq - 4 * ms * cov + 4 * ms**2 * vs, 0.0)
        se2 = unit_var / np.maximum(p - 1.0, 1.0)  # unbiased variance of the unit mean
        n = len(p)
        value = self.value().reshape(n, -1)
        spread = np.square(value - value.mean(axis=1, keepdims=True)).sum(axis=1)
        noise = se2.reshape(n, -1).sum(axis=1)
        fraction = np.zeros(n)
        positive = spread > 0
        fraction[positive] = noise[positive] / spread[positive]
        fraction[~positive & (noise > 0)] = np.inf
        fraction[self.count < 2] = np.inf  # no spread estimate from one unit
        return fraction


def correlation_error(fraction: np.ndarray) -> np.ndarray:
    """``1 - rho`` from a noise fraction ``f`` (noise over total variance across the map): ``rho = sqrt(1 - f)``.

    ``rho`` is the expected Pearson correlation of the noisy map with the exact one; ``f >= 1``
    gives 1 (no correlation left), an unknown fraction (``inf``) stays ``inf``.

    Example:
        >>> correlation_error(np.array([0.0, 0.0975, 1.5, np.inf])).round(3).tolist()
        [0.0, 0.05, 1.0, inf]
    """
    fraction = np.asarray(fraction, np.float64)
    error = 1.0 - np.sqrt(np.clip(1.0 - fraction, 0.0, 1.0))
    return np.where(np.isinf(fraction), np.inf, error)


def next_pairs(done: int, cap: int, fractions: np.ndarray | None = None, tolerance: float | None = None) -> int:
    """Pairs after the next round, at most ``cap``.

    With the noise ``fractions`` of the samples still running and the ``tolerance`` (on
    ``1 - rho``, :func:`correlation_error`), the round is predicted: noise over signal falls as
    ``1 / pairs``, so the sample nearest to its goal reaches it at ``done * r / r_goal`` pairs
    (``r = f / (1 - f)``), asked with a 10% margin and kept within ``done + 4 .. 4 * done``.
    Samples without an estimate (``inf``, or ``f >= 1``: no signal seen yet) do not size the round;
    with none left, or without these arguments: 1.5 times as many (at least 4 more).

    Example:
        >>> next_pairs(8, 512), next_pairs(400, 512)
        (12, 512)
        >>> next_pairs(16, 512, np.array([0.1950, 0.3]), tolerance=0.05)  # r 0.242, goal r 0.108
        40
    """
    grown = max(done + 4, -(-3 * done // 2))
    if fractions is None or tolerance is None:
        return min(cap, grown)
    fractions = np.asarray(fractions, np.float64)
    known = fractions[np.isfinite(fractions) & (fractions < 1.0)]  # f >= 1: all noise, no signal seen yet
    if not len(known):
        return min(cap, grown)
    goal = 1.0 - (1.0 - tolerance) ** 2
    ratio = float(np.min(known / (1.0 - known))) / (goal / (1.0 - goal))
    need = int(np.ceil(done * ratio * ROUND_MARGIN))
    return min(cap, 4 * done, max(done + 4, need))


def pair_rows(rows: np.ndarray, active: np.ndarray, first_pair: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Owner, pair index and sign (+1 / -1) of antithetic rows: row ``2u + s`` is unit ``u``, unit
    ``u`` is pair ``first_pair + u // len(active)`` of sample ``active[u % len(active)]``.

    Example:
        >>> [a.tolist() for a in pair_rows(np.arange(4), np.array([3, 5]), 10)]
        [[3, 3, 5, 5], [10, 10, 10, 10], [1.0, -1.0, 1.0, -1.0]]
    """
    units = rows // 2
    owners = active[units % len(active)]
    return owners, first_pair + units // len(active), np.where(rows % 2 == 0, 1.0, -1.0)


def pair_moments(flat: np.ndarray, statistic: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Pair means of rows ``(2u, 2u + 1)``: of the values, and of their squares unless ``statistic == "mean"``.

    Example:
        >>> s, q = pair_moments(np.array([[1.0], [3.0]]), "variance")
        >>> s.tolist(), q.tolist()
        ([[2.0]], [[5.0]])
    """
    flat = np.asarray(flat, np.float64)
    s = 0.5 * (flat[0::2] + flat[1::2])
    q = None if statistic == "mean" else 0.5 * (flat[0::2] ** 2 + flat[1::2] ** 2)
    return s, q


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised by this function's caller at the first frame
    outside kerascope (the user's call), however deep the method's call chain is.

    Example:
        >>> user_stacklevel() >= 2
        True
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("kerascope."):
        frame, level = frame.f_back, level + 1
    return level


def warn_not_converged(method: str, tolerance: float, cap_name: str, cap: int, errors: np.ndarray,
                       what: str) -> None:
    """Warn, at the user's call, that ``tolerance`` was not reached within the cap (the worst estimated error named).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     warn_not_converged("SmoothGrad", 0.05, "max_samples", 64, np.array([0.2, 0.01]), "1 - rho")
        >>> "did not reach tolerance=0.05" in str(w[0].message)
        True
    """
    worst = int(np.argmax(errors))
    warnings.warn(
        f"{method} did not reach tolerance={tolerance} within {cap_name}={cap} for "
        f"{int(np.sum(errors > tolerance))} of {len(errors)} sample(s) (worst: sample {worst}, "
        f"estimated {what} {float(errors[worst]):.3g}). The result uses {cap_name} passes; raise "
        f"`{cap_name}` or `tolerance` for a converged map.",
        RuntimeWarning,
        stacklevel=user_stacklevel(),
    )


@dataclass
class PairRun:
    """What :func:`run_pairs` returns: per-sample values ``(N, width)``, estimated errors ``(N,)``, samples used ``(N,)``.

    Example:
        >>> PairRun(np.zeros((1, 2)), np.zeros(1), np.full(1, 4)).samples.tolist()
        [4]
    """

    value: np.ndarray
    error: np.ndarray
    samples: np.ndarray


def pair_chunk_rows(batch_size: int) -> int:
    """Rows per chunk of antithetic pairs: ``batch_size`` rounded down to an even count (at least 2).

    Example:
        >>> pair_chunk_rows(7), pair_chunk_rows(1)
        (6, 2)
    """
    return max(2, batch_size - batch_size % 2)


def run_pairs(
    n: int,
    width: int,
    statistic: str,
    chunks: Callable[[np.ndarray, int, int], Iterable[tuple[np.ndarray, np.ndarray]]],
    *,
    samples: int,
    max_samples: int,
    tolerance: float,
    method: str,
) -> PairRun:
    """The antithetic convergence loop of the noise wrappers and Expected Gradients.

    Rounds of pairs: every still-active sample gets pairs ``done .. target - 1`` (first
    ``samples // 2`` pairs, then as many as :func:`next_pairs` predicts), its ``1 - rho`` is
    re-estimated (:class:`PairMoments`, :func:`correlation_error`), and samples at
    ``<= tolerance`` leave; at ``max_samples // 2``
    pairs the loop stops and warns for those left. ``chunks(active, done, rows)`` runs
    ``rows = 2 * len(active) * (target - done)`` rows (row ``r`` as :func:`pair_rows` places
    it) and yields ``(owners, flat)`` per chunk: the rows' samples and their ``(rows, width)``
    values.

    Example:
        >>> def chunks(active, done, rows):  # the value is +-1 around 2: pairs average to exactly 2
        ...     owners, _, signs = pair_rows(np.arange(rows), active, done)
        ...     yield owners, (2.0 + signs)[:, None]
        >>> run = run_pairs(2, 1, "mean", chunks, samples=8, max_samples=64, tolerance=0.1, method="M")
        >>> run.value.tolist(), run.samples.tolist()
        ([[2.0], [2.0]], [8, 8])
    """
    moments = PairMoments((n, width), statistic)
    active, done, cap = np.arange(n), 0, max_samples // 2
    target = max(2, samples // 2)
    error = np.full(n, np.inf)
    while len(active):
        for owners, flat in chunks(active, done, 2 * len(active) * (target - done)):
            moments.add(owners[0::2], *pair_moments(flat, statistic))
        done = target
        fractions = moments.noise_fraction()[active]
        error[active] = correlation_error(fractions)
        keep = error[active] > tolerance
        active, fractions = active[keep], fractions[keep]
        if done >= cap or not len(active):
            break
        target = next_pairs(done, cap, fractions, tolerance)
    if len(active):
        warn_not_converged(method, tolerance, "max_samples", max_samples, error, "1 - Pearson correlation")
    return PairRun(moments.value(), error, 2 * moments.count)
