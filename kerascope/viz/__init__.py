"""numpy -> pictures: normalisation for display, colour maps, overlays, figures. Never used in computation."""

from kerascope.viz.overlay import heatmap, overlay, save_overlay, to_display
from kerascope.viz.plots import (
    display_map,
    is_signed,
    plot_explanation,
    plot_grid,
    plot_sequence,
    plot_tabular,
    plot_tokens,
    save_figure,
)
from kerascope.viz.text import tokens_html

__all__ = [
    "display_map",
    "heatmap",
    "is_signed",
    "overlay",
    "plot_explanation",
    "plot_grid",
    "plot_sequence",
    "plot_tabular",
    "plot_tokens",
    "save_figure",
    "save_overlay",
    "to_display",
    "tokens_html",
]
