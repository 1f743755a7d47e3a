"""The metric columns of the benchmark: any :mod:`kerascope.metrics` family, scored per image, with
confidence intervals over the images.

:func:`score_metric` runs one metric by name on one method's maps (the benchmark's settings: ``steps``
sets the number of perturbation steps or draws of every faithfulness / robustness metric, so a column costs
about ``steps`` forwards or explanations per image); :func:`confidence_interval` gives the mean and its
interval over the images (Student's t, or a seeded percentile bootstrap); :func:`plot_metrics` draws one
panel per metric, methods as dots with their intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerascope import metrics as M

#: The benchmark's own columns, by the name ``metrics=`` / ``--metrics`` selects them with.
BUILTIN = {
    "pointing_game": ("pointing_game",),
    "energy_pointing_game": ("energy_pointing_game",),
    "deletion": ("deletion_auc",),
    "insertion": ("insertion_auc",),
    "sanity": ("sanity_spearman", "sanity_ssim"),
}
DEFAULT_METRICS = tuple(BUILTIN)
INTERVALS = ("t", "bootstrap")


@dataclass
class Context:
    """What a metric column may use: the model, the data, one method's maps and its spec."""

    model: keras.Layer
    images: np.ndarray
    maps: np.ndarray
    masks: np.ndarray
    targets: np.ndarray | None
    method: Any
    steps: int
    batch_size: int
    seed: int

    @property
    def pixels(self) -> int:
        return int(self.images.shape[1] * self.images.shape[2])

    @property
    def per_step(self) -> int:
        """Features per step so that a full curve has about ``steps`` points."""
        return max(1, math.ceil(self.pixels / self.steps))

    @property
    def side(self) -> int:
        return int(min(self.images.shape[1:3]))


def _curve(fn: Callable, **make: Callable[[Context], Any]) -> Callable[[Context, dict], Any]:
    def run(c: Context, params: dict) -> Any:
        kwargs = {k: v(c) for k, v in make.items()} | params
        return fn(c.model, c.images, c.maps, c.targets, batch_size=c.batch_size, **kwargs)
    return run


def _seeded(fn: Callable, **make: Callable[[Context], Any]) -> Callable[[Context, dict], Any]:
    return _curve(fn, seed=lambda c: c.seed, **make)


def _masks(fn: Callable, **make: Callable[[Context], Any]) -> Callable[[Context, dict], Any]:
    return lambda c, params: fn(c.maps, c.masks, **({k: v(c) for k, v in make.items()} | params))


def _maps_only(fn: Callable) -> Callable[[Context, dict], Any]:
    return lambda c, params: fn(c.maps, **params)


def _explain(fn: Callable, batch: bool = True, **make: Callable[[Context], Any]) -> Callable[[Context, dict], Any]:
    def run(c: Context, params: dict) -> Any:
        kwargs = {k: v(c) for k, v in make.items()} | params
        if batch:
            kwargs.setdefault("batch_size", c.batch_size)
        return fn(c.model, c.images, c.method, c.targets, **kwargs)
    return run


def _percentages(c: Context) -> list[float]:
    return [100.0 * (k + 0.5) / c.steps for k in range(c.steps)]


def _sizes(c: Context) -> tuple[int, ...]:
    return tuple(n for n in (1, 4, 16, 64, 256) if n < c.pixels)


_step = {"features_in_step": lambda c: c.per_step}
_draws = {"samples": lambda c: c.steps, "seed": lambda c: c.seed}

#: Every metric the benchmark can add as a column: name -> runner ``(context, params) -> result``.
RUNNERS: dict[str, Callable[[Context, dict], Any]] = {
    # faithfulness (about ``steps`` forwards per image each)
    "pixel_flipping": _curve(M.pixel_flipping, **_step),
    "region_perturbation": _seeded(M.region_perturbation, patch_size=lambda c: max(1, c.side // 8),
                                   regions=lambda c: c.steps),
    "selectivity": _curve(M.selectivity, patch_size=lambda c: max(1, c.side // 4)),
    "monotonicity": _curve(M.monotonicity, **_step),
    "faithfulness_estimate": _curve(M.faithfulness_estimate, **_step),
    "faithfulness_correlation": _seeded(M.faithfulness_correlation, nr_runs=lambda c: 2 * c.steps,
                                        subset_size=lambda c: c.per_step),
    "sensitivity_n": _seeded(M.sensitivity_n, n=_sizes, samples=lambda c: c.steps),
    "irof": _curve(M.irof),
    "infidelity": _seeded(M.infidelity, samples=lambda c: c.steps),
    "road": _seeded(M.road, percentages=_percentages),
    "mu_fidelity": _seeded(M.mu_fidelity, samples=lambda c: 2 * c.steps),
    "average_drop": _curve(M.average_drop),
    "average_increase": _curve(M.average_increase),
    # axiomatic
    "completeness": _curve(M.completeness),
    "non_sensitivity": _curve(M.non_sensitivity, **_step),
    "input_invariance": _explain(M.input_invariance),
    # complexity (no forward)
    "sparseness": _maps_only(M.sparseness),
    "complexity": _maps_only(M.complexity),
    "effective_complexity": _maps_only(M.effective_complexity),
    # localisation (no forward)
    "relevance_mass_accuracy": _masks(M.relevance_mass_accuracy),
    "relevance_rank_accuracy": _masks(M.relevance_rank_accuracy),
    "attribution_localisation": _masks(M.attribution_localisation),
    "top_k_intersection": _masks(M.top_k_intersection, k=lambda c: max(1, min(1000, c.pixels // 4))),
    "auc": _masks(M.auc),
    # robustness (``steps`` explanations per image each)
    "max_sensitivity": _explain(M.max_sensitivity, **_draws),
    "avg_sensitivity": _explain(M.avg_sensitivity, **_draws),
    "local_lipschitz_estimate": _explain(M.local_lipschitz_estimate, **_draws),
    "relative_input_stability": _explain(M.relative_input_stability, **_draws),
    "relative_output_stability": _explain(M.relative_output_stability, **_draws),
    "consistency": _explain(M.consistency),
    # randomisation (one explanation per weighted layer and image, or two)
    "random_logit": _explain(M.random_logit, seed=lambda c: c.seed),
    "mprt": _explain(M.mprt, seed=lambda c: c.seed),
    "smooth_mprt": _explain(M.smooth_mprt, seed=lambda c: c.seed, nr_samples=lambda c: max(2, c.steps // 4)),
    "efficient_mprt": _explain(M.efficient_mprt, seed=lambda c: c.seed),
}


def available_metrics() -> list[str]:
    """Every name ``metrics=`` / ``kerascope evaluate --metrics`` accepts: the benchmark's own columns, then
    the metric families.

    Example:
        >>> names = available_metrics()
        >>> names[:2], "road" in names, "sparseness" in names
        (['pointing_game', 'energy_pointing_game'], True, True)
    """
    return [*BUILTIN, *RUNNERS]


def check_metrics(names: Sequence[str] | None) -> list[str]:
    """The chosen metric names (default: the benchmark's own columns), validated, in order, without repeats.

    Example:
        >>> check_metrics(["road", "pointing_game", "road"])
        ['road', 'pointing_game']
    """
    if names is None:
        return list(DEFAULT_METRICS)
    chosen = list(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))
    unknown = [n for n in chosen if n not in BUILTIN and n not in RUNNERS]
    if unknown:
        raise ValueError(f"Unknown metric(s). Received: metrics={unknown}. Available metrics: "
                         f"{', '.join(available_metrics())}.")
    if not chosen:
        raise ValueError(f"Choose at least one metric. Received: metrics={list(names)}.")
    return chosen


def columns_of(names: Sequence[str]) -> list[str]:
    """The table columns the chosen metrics fill (``sanity`` fills two).

    Example:
        >>> columns_of(["deletion", "sanity", "road"])
        ['deletion_auc', 'sanity_spearman', 'sanity_ssim', 'road']
    """
    return [c for n in names for c in BUILTIN.get(n, (n,))]


@dataclass
class MetricCell:
    """One method's scores on one metric: per-image ``scores``, their mean and confidence interval.

    Example:
        >>> import numpy as np
        >>> c = MetricCell.of("m", np.array([1.0, 2.0, 3.0]), True)
        >>> round(c.mean, 3), c.n, round(c.high - c.mean, 3)
        (2.0, 3, 2.484)
    """

    name: str
    scores: np.ndarray
    higher_is_better: bool
    mean: float = math.nan
    low: float = math.nan
    high: float = math.nan
    n: int = 0
    error: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, scores: Any, higher_is_better: bool, level: float = 0.95, interval: str = "t",
           seed: int = 0) -> MetricCell:
        """The cell of per-image ``scores``, with its ``level`` interval (``"t"`` or ``"bootstrap"``)."""
        s = np.asarray(scores, np.float64).reshape(-1)
        mean, low, high, n = confidence_interval(s, level, interval, seed=seed)
        return cls(name, s, bool(higher_is_better), mean, low, high, n)

    def text(self) -> str:
        """``mean ± half-width`` (symmetric interval), ``mean [low, high]`` (bootstrap) or ``mean``."""
        if not np.isfinite(self.mean):
            return "–"
        if not (np.isfinite(self.low) and np.isfinite(self.high)):
            return f"{self.mean:.3f}"
        half = (self.high - self.low) / 2
        if abs((self.mean - self.low) - half) <= 1e-9 * max(1.0, abs(half)):
            return f"{self.mean:.3f} ± {half:.3f}"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def confidence_interval(scores: Any, level: float = 0.95, interval: str = "t", *, resamples: int = 2000,
                        seed: int = 0) -> tuple[float, float, float, int]:
    """Mean of the finite ``scores`` and its ``level`` confidence interval: ``(mean, low, high, n)``.

    ``"t"``: ``mean ± t_{(1 + level) / 2, n - 1} · s / sqrt(n)`` with ``s`` the sample standard deviation
    (``ddof=1``; needs SciPy). ``"bootstrap"``: the percentile interval of the means of ``resamples`` seeded
    resamples with replacement. NaN scores (undefined for that image) are left out; fewer than two finite
    scores give a NaN interval, and identical scores a zero-width one.

    Example:
        >>> import numpy as np
        >>> mean, low, high, n = confidence_interval(np.array([1.0, 2.0, 3.0, np.nan]))
        >>> round(mean, 3), round(low, 3), round(high, 3), n
        (2.0, -0.484, 4.484, 3)
    """
    if interval not in INTERVALS:
        raise ValueError(f"Unknown interval. Received: interval={interval!r}. Expected one of {INTERVALS}.")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"`level` must be in (0, 1). Received: level={level!r}.")
    s = np.asarray(scores, np.float64).reshape(-1)
    s = s[np.isfinite(s)]
    n = int(s.size)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(s.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    if interval == "t":
        try:
            from scipy.stats import t as student_t
        except ImportError as error:  # pragma: no cover - SciPy ships with the test extra
            raise ImportError("interval='t' needs SciPy (`pip install scipy`); interval='bootstrap' does not.") \
                from error
        half = float(student_t.ppf((1.0 + level) / 2.0, n - 1)) * float(s.std(ddof=1)) / math.sqrt(n)
        return mean, mean - half, mean + half, n
    draws = np.random.default_rng(seed).integers(0, n, (int(resamples), n))
    means = s[draws].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return mean, float(low), float(high), n


def score_metric(name: str, context: Context, params: dict | None = None) -> Any:
    """Run metric ``name`` on ``context`` (one method's maps) with the benchmark's settings and ``params``
    (passed on, overriding them); returns the metric's result (per-image ``scores``).

    Example:
        >>> import numpy as np
        >>> x = np.zeros((2, 4, 4, 3), np.float32)
        >>> maps = np.zeros((2, 4, 4), np.float32); maps[:, 0, 0] = 1.0
        >>> c = Context(None, x, maps, np.ones((2, 4, 4), bool), None, None, 4, 8, 0)
        >>> score_metric("sparseness", c).scores.round(4).tolist()  # one pixel of 16 holds it all: (16 - 1) / 16
        [0.9375, 0.9375]
    """
    if name not in RUNNERS:
        raise ValueError(f"Unknown metric. Received: name={name!r}. Available: {', '.join(RUNNERS)}.")
    return RUNNERS[name](context, dict(params or {}))


def plot_metrics(result: Any, path: str | Path) -> Path:
    """One panel per metric column: each method's mean as a dot with its confidence interval (PNG).

    ``result`` is a :class:`kerascope.evaluation.BenchmarkResult`; columns without per-image scores
    (sanity, seconds) are left out. Titles give the better direction.

    Example:
        >>> import tempfile, os
        >>> from kerascope.evaluation import BenchmarkResult, MethodScores
        >>> row = MethodScores("a", cells={"road": MetricCell.of("road", np.array([0.2, 0.4]), False)})
        >>> plot_metrics(BenchmarkResult([row], np.zeros(1), columns=["road"]),
        ...              os.path.join(tempfile.mkdtemp(), "m.png")).suffix
        '.png'
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from kerascope.viz.plots import save_figure

    shown = [c for c in result.columns if any(c in r.cells for r in result.rows)]
    cols = max(1, min(3, len(shown)))
    rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, (1.3 + 0.3 * len(result.rows)) * rows),
                             squeeze=False)
    names = [r.method for r in result.rows]
    for ax, column in zip(axes.ravel(), shown, strict=False):
        better = "higher"
        for y, r in enumerate(result.rows):
            cell = r.cells.get(column)
            if cell is None or not np.isfinite(cell.mean):
                continue
            better = "higher" if cell.higher_is_better else "lower"
            err = None
            if np.isfinite(cell.low) and np.isfinite(cell.high):
                err = [[cell.mean - cell.low], [cell.high - cell.mean]]
            ax.errorbar(cell.mean, y, xerr=err, fmt="o", ms=4, capsize=3,
                        color="0.5" if "reference" in r.method else "C0")
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{column.replace('_', ' ')} ({'↑' if better == 'higher' else '↓'} {better} is better)",
                     fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes.ravel()[len(shown):]:
        ax.axis("off")
    fig.tight_layout()
    saved = save_figure(fig, path, dpi=110)
    plt.close(fig)
    return saved
