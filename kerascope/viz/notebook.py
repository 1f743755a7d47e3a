"""Notebook display of an Explanation (``_repr_html_``)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np


def png_data_uri(rgb: np.ndarray) -> str:
    """Encode an RGB uint8 array as a ``data:image/png;base64,...`` URI.

    Example:
        >>> import numpy as np
        >>> png_data_uri(np.zeros((2, 2, 3), np.uint8)).startswith("data:image/png;base64,")
        True
    """
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def explanation_html(explanation: Any, limit: int = 8) -> str:
    """Small HTML summary with one heatmap per sample (first ``limit`` samples).

    Image maps use the method's colour convention (``RdBu_r`` centred at zero when signed,
    ``magma`` otherwise, :mod:`kerascope.viz.colours`); short 1-D maps are coloured cells.

    Example:
        >>> import numpy as np
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.ones((1, 4, 4)), "gradcam", {}, np.array([0]), np.array([2.0]))
        >>> "<img" in explanation_html(e)
        True
    """
    import matplotlib

    from kerascope.viz.colours import colour_scale, reduce_for_display
    from kerascope.viz.text import tokens_html

    attrs = explanation.attributions
    attrs = attrs[0] if isinstance(attrs, (list, tuple)) else attrs
    cells = []
    for i in range(min(len(explanation), limit)):
        a = np.asarray(attrs[i])
        if a.ndim in (2, 3) and (a.ndim == 2 or a.shape[-1] <= 4):  # an image map, on the method's colour scale
            scale = colour_scale(a, explanation.method, explanation.params)
            values = scale.normalise(reduce_for_display(a, scale.signed))
            rgb = (matplotlib.colormaps[scale.cmap](values)[..., :3] * 255).astype(np.uint8)
            picture = f'<img src="{png_data_uri(rgb)}" style="width:96px;image-rendering:pixelated">'
        elif a.ndim == 1 and a.size <= 64:  # features or tokens: one coloured cell each
            picture = tokens_html(a)
        else:
            picture = f"<code>shape {a.shape}</code>"
        score = "" if explanation.scores is None else f", score {float(explanation.scores[i]):.3g}"
        cells.append(f"<td>{picture}<br>target {int(explanation.targets[i])}{score}</td>")
    title = html.escape(f"{explanation.method} ({len(explanation)} samples)")
    return f"<div><b>{title}</b><table><tr>{''.join(cells)}</tr></table></div>"
