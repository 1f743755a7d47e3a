"""numpy -> pictures: normalisation for display, colour maps, overlays. Never used in computation."""

from kerascope.viz.overlay import heatmap, overlay, save_overlay, to_display

__all__ = ["heatmap", "overlay", "save_overlay", "to_display"]
