"""Pictures of a benchmark result: deletion/insertion curves and the sanity-check figures.

Moved out of :mod:`kerascope.evaluation` (which re-exports them) so that computation and
drawing stay apart; matplotlib is imported only inside the functions. ``result`` is a
:class:`kerascope.evaluation.BenchmarkResult` (read by attribute; viz imports no higher package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kerascope.viz.plots import save_figure

__all__ = ["plot_curves", "plot_sanity", "plot_sanity_curves"]


def _saved(fig: Any, curve_axes: Any, path: str | Path, dpi: int) -> Path:
    """Grid and legend on the curve plots' axes, then the figure written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    for ax in curve_axes:
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    saved = save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return saved


def plot_curves(result: Any, path: str | Path) -> Path:
    """Mean deletion and insertion curves of every method, side by side (PNG).

    Example:
        >>> import tempfile, os
        >>> from kerascope.evaluation import BenchmarkResult, MethodScores
        >>> r = BenchmarkResult([MethodScores("a", deletion_curve=np.array([1.0, 0.0]),
        ...                      insertion_curve=np.array([0.0, 1.0]))], np.array([0.0, 1.0]))
        >>> plot_curves(r, os.path.join(tempfile.mkdtemp(), "c.png")).suffix
        '.png'
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in result.rows:
        if r.deletion_curve is None:
            continue
        style = "--" if "reference" in r.method else "-"
        axes[0].plot(result.fractions, r.deletion_curve, style, label=f"{r.method} ({r.deletion_auc:.3f})")
        axes[1].plot(result.fractions, r.insertion_curve, style, label=f"{r.method} ({r.insertion_auc:.3f})")
    for ax, title in zip(axes, ("Deletion (lower AUC is better)", "Insertion (higher AUC is better)"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("fraction of pixels removed" if "Deletion" in title else "fraction of pixels inserted")
        ax.set_ylabel("target probability")
    return _saved(fig, axes, path, 110)


def plot_sanity(result: Any, image: np.ndarray | None, path: str | Path, sample: int = 0) -> Path:
    """The cascade picture: per method, the map of one image as layers are randomised from the top.

    Rows are methods; the first column is the image, then the original map and
    one column per cascade step (labelled with the last randomised layer).

    Example:
        >>> import tempfile, os
        >>> from kerascope.evaluation import BenchmarkResult, MethodScores
        >>> from kerascope.metrics.sanity import SanityResult
        >>> s = SanityResult("a", "cascading", ["d"], np.ones((1, 1)), np.ones((1, 1)), np.zeros(1),
        ...                  maps=np.random.default_rng(0).random((2, 1, 4, 4)))
        >>> r = BenchmarkResult([MethodScores("a", sanity=s)], np.zeros(1))
        >>> plot_sanity(r, np.zeros((4, 4, 3)), os.path.join(tempfile.mkdtemp(), "s.png")).suffix
        '.png'
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = [r for r in result.rows if r.sanity is not None and r.sanity.maps is not None]
    cols = 2 + max((len(r.sanity.steps) for r in rows), default=0)  # type: ignore[union-attr]
    fig, axes = plt.subplots(max(1, len(rows)), cols, figsize=(1.35 * cols, 1.45 * max(1, len(rows))), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for i, r in enumerate(rows):
        s = r.sanity
        assert s is not None and s.maps is not None
        if image is not None:
            axes[i, 0].imshow(np.clip(np.asarray(image), 0, 1))
        axes[i, 0].set_title(r.method, fontsize=6, loc="left")
        for j in range(len(s.maps)):
            axes[i, j + 1].imshow(s.maps[j, sample], cmap="viridis")
            label = "original" if j == 0 else f"{s.steps[j - 1]}\nρ={s.spearman[j - 1, sample]:.2f}"
            axes[i, j + 1].set_title(label, fontsize=5)
    fig.suptitle("Cascading randomisation (top layer first): a faithful map should fall apart", fontsize=8)
    return _saved(fig, [], path, 120)


def plot_sanity_curves(result: Any, path: str | Path) -> Path:
    """Mean Spearman correlation to the original map after each cascade step, per method (PNG).

    Example:
        >>> import tempfile, os
        >>> from kerascope.evaluation import BenchmarkResult, MethodScores
        >>> from kerascope.metrics.sanity import SanityResult
        >>> s = SanityResult("a", "cascading", ["d", "c"], np.ones((2, 1)), np.ones((2, 1)), np.zeros(1))
        >>> r = BenchmarkResult([MethodScores("a", sanity=s)], np.zeros(1))
        >>> plot_sanity_curves(r, os.path.join(tempfile.mkdtemp(), "s.png")).suffix
        '.png'
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps: list[str] = []
    for r in result.rows:
        if r.sanity is None:
            continue
        steps = r.sanity.steps
        style = "--" if "reference" in r.method else "-"
        ax.plot(range(len(steps) + 1), [1.0, *r.sanity.spearman_mean.tolist()], style, marker="o", ms=3, label=r.method)
    ax.set_xticks(range(len(steps) + 1), ["original", *steps], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("Spearman ρ to the original map")
    ax.set_title("Cascading randomisation (lower = depends more on the weights)")
    return _saved(fig, [ax], path, 110)
