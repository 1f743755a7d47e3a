"""Sequence attributions: a heat strip of the attribution over the series, one panel per channel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kerascope.viz._figure import is_signed, limits, new_figure
from kerascope.viz.colours import DIVERGING, SEQUENTIAL

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_sequence(
    values: np.ndarray | None,
    attributions: np.ndarray,
    *,
    time: np.ndarray | None = None,
    channel_names: Sequence[str] | None = None,
    cmap: str | None = None,
    percentile: float = 100.0,
    max_channels: int = 8,
    size: tuple[float, float] = (8.0, 1.8),
    title: str | None = None,
    signed: bool | None = None,
) -> Figure:
    """A time series with its attribution drawn as a heat strip behind it (one panel per channel).

    Each panel shows the channel's values as a dark line over a strip whose colour at each time
    step is the attribution there (``RdBu_r`` centred at zero when signed: red raises the score,
    blue lowers it; ``magma`` from zero otherwise), with one shared colour bar.

    Args:
        values: the input sequence ``(T,)`` or ``(T, C)``; ``None`` draws the strip alone
            (e.g. per-token maps).
        attributions: ``(T,)`` -- one value per time step (a sequence CAM, or a map summed
            over features), drawn behind every channel -- or ``(T, C)`` like ``values``, each
            channel over its own strip.
        time: x values (default ``0..T-1``).
        channel_names: a name per channel.
        cmap: colormap (default: ``"RdBu_r"`` when signed, ``"magma"`` otherwise).
        percentile: colour limits at this percentile of the magnitude (shared by all channels).
        max_channels: at most this many panels.
        size: ``(width, height per channel)`` in inches.
        title: figure title.
        signed: diverging colours centred at zero (``True``) or sequential from zero (``False``);
            default: the method's convention when called through :func:`plot_explanation`,
            else signed when both signs occur.

    Example:
        >>> import numpy as np
        >>> t = np.linspace(0, 6, 50)
        >>> fig = plot_sequence(np.sin(t), np.cos(t))
        >>> fig.get_size_inches().tolist(), fig.axes[0].images[0].get_cmap().name
        ([8.0, 1.8], 'RdBu_r')
    """
    from matplotlib.colors import Normalize

    a = np.asarray(attributions, np.float64)
    x = None if values is None else np.asarray(values, np.float64)
    if x is not None and x.ndim == 1:
        x = x[:, None]
    if a.ndim not in (1, 2) or (x is not None and (x.ndim != 2 or x.shape[0] != a.shape[0]
                                                   or (a.ndim == 2 and a.shape != x.shape))):
        raise ValueError(
            "Expected values (T,) or (T, C) and attributions (T,) or of the values' shape. "
            f"Received: values.shape={None if values is None else np.shape(values)}, "
            f"attributions.shape={np.shape(attributions)}."
        )
    steps = a.shape[0]
    channels = x.shape[1] if x is not None else (a.shape[1] if a.ndim == 2 else 1)
    channels = min(channels, max_channels)
    strips = np.repeat(a[:, None], channels, axis=1) if a.ndim == 1 else a[:, :channels]
    t = np.arange(steps, dtype=np.float64) if time is None else np.asarray(time, np.float64)
    signed = is_signed(strips) if signed is None else bool(signed)
    vmin, vmax = limits(strips, signed, percentile)
    colours = cmap or (DIVERGING if signed else SEQUENTIAL)
    height = size[1] if x is not None else min(size[1], 0.9)
    figure = new_figure(size[0], height * channels + (0.3 if title else 0.0))
    axes = np.atleast_1d(figure.subplots(channels, 1, sharex=True, squeeze=False)[:, 0])
    half = (t[1] - t[0]) / 2 if steps > 1 else 0.5
    mapped = None
    for c, ax in enumerate(axes):
        if x is not None:
            span = float(x[:, c].max() - x[:, c].min()) or 1.0
            low, high = x[:, c].min() - 0.1 * span, x[:, c].max() + 0.1 * span
        else:
            low, high = 0.0, 1.0
        mapped = ax.imshow(strips[None, :, c], cmap=colours, norm=Normalize(vmin, vmax), aspect="auto",
                           interpolation="nearest", extent=(t[0] - half, t[-1] + half, low, high), zorder=0)
        if x is not None:
            ax.plot(t, x[:, c], color="#111", linewidth=1.4, zorder=2)
            ax.set_ylim(low, high)
        else:
            ax.set_yticks([])
        name = channel_names[c] if channel_names and c < len(channel_names) else (
            f"channel {c}" if x is not None else "attribution")
        ax.set_ylabel(name, fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel("time step", fontsize=8)
    bar = figure.colorbar(mapped, ax=list(axes), fraction=0.03, pad=0.01)
    bar.set_label("attribution" + (" (red raises the score)" if colours == DIVERGING else ""), fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure
