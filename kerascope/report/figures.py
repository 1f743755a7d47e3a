"""A run's publication figures: one per image and method in ``OUT/figures/`` (``kerascope explain --figures``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.io.paths import safe_name
from kerascope.viz.figure import check_figure_formats, explanation_figure, save_explanation_figure


def write_figures(folder: str | Path, explanation: Any, images: Sequence[np.ndarray], stems: Sequence[str],
                  formats: Sequence[str], *, size: tuple[float, float] = (6.4, 3.2), dpi: int = 200,
                  **options: Any) -> list[Path]:
    """One figure per image (``folder/<stem>_<method>.<format>`` in each format); returns the paths.

    ``options`` go to :func:`explanation_figure` (``model_name``, ``class_names``, ``limit``, ...).

    Example:
        >>> import tempfile
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.random.rand(1, 8, 8), "gradcam", {}, np.array([0]), np.ones(1))
        >>> [p.name for p in write_figures(tempfile.mkdtemp(), e, [np.zeros((8, 8, 3))], ["a"], ["png", "svg"], dpi=40)]
        ['a_gradcam.png', 'a_gradcam.svg']
    """
    folder = Path(folder)
    written = []
    method = safe_name(explanation.method, fallback="method", max_length=40)
    for i, (image, stem) in enumerate(zip(images, stems)):
        figure = explanation_figure(explanation, image, i, size=size, **options)
        for fmt in check_figure_formats(formats):
            written.append(save_explanation_figure(figure, folder / f"{stem}_{method}.{fmt}", dpi=dpi))
    return written
