"""Colour conventions: which methods are signed, their colour scale, and overlays drawn on that scale.

A *signed* attribution says whether a pixel raises or lowers the explained score (gradients,
gradient x input, integrated gradients, DeepLIFT, LRP, Shapley values, LIME, occlusion): it is
drawn on the diverging ``RdBu_r`` map centred at zero with symmetric limits (red raises the
score, blue lowers it, white does nothing). An *unsigned* map says only how much a region
matters (CAMs, RISE, ``absolute=True`` saliency, SmoothGrad²): it is drawn on the sequential
``magma`` map from zero (black) to the largest value (light yellow). The choice comes from the
method's declared convention (:data:`SIGN_CONVENTIONS`, checked against its parameters), and
from the data only for a method not listed there (signed when both signs occur).

Limits are the 99.5th percentile of the magnitude, so that a few extreme pixels do not wash
the picture out; values beyond are shown in the end colour. By default each map has its own
limits (*per-image* scale); a *shared* scale (``shared_scale=True`` in the report, ``--shared-scale``
on the command line) gives every map of a method the same limits, from all its maps together, so
that colours compare across images.

So that "no effect" cannot be mistaken for a light part of the image, a signed map is drawn with
an opacity that grows with its magnitude over a *dimmed* grey copy of the image (grey values
squeezed into ``[0.2, 0.6]``, :data:`DIMMED`): zero leaves the dim grey image uncoloured, and no
pixel of the image is ever white. The colour bar of a signed scale shows exactly that blend over
the middle grey.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DIVERGING = "RdBu_r"
SEQUENTIAL = "magma"
#: The grey range a signed map's image is squeezed into (no pixel of the image is near white).
DIMMED = (0.2, 0.6)

#: Each registered method's sign convention: ``"signed"`` (both signs are meaningful) or
#: ``"unsigned"`` (non-negative importance). Parameters can change it (see :func:`sign_convention`).
SIGN_CONVENTIONS: dict[str, str] = {
    **dict.fromkeys((
        "saliency", "gradient_x_input", "guided_backprop", "deconvnet", "guided_gradcam",
        "integrated_gradients", "expected_gradients", "deeplift", "deeplift_shap", "smoothgrad",
        "occlusion", "feature_ablation", "shapley_exact", "shapley_sampling", "kernel_shap", "lime",
        "lrp", "layer_conductance", "internal_influence", "neuron_conductance", "blur_ig", "guided_ig", "xrai",
    ), "signed"),
    **dict.fromkeys((
        "gradcam", "gradcam_plusplus", "xgradcam", "layercam", "hirescam", "scorecam", "ablationcam",
        "eigencam", "rise", "smoothgrad_squared", "vargrad",
        "eigengradcam", "kpcacam", "fem", "gradcam_elementwise", "shapleycam", "fullgrad", "sobol", "hsic", "attention_rollout",
        "gradient_rollout",
    ), "unsigned"),
}


def _key(name: str) -> str:
    return str(name).lower().replace("-", "_")


def sign_convention(method: str, params: Mapping[str, Any] | None = None) -> str | None:
    """``"signed"``, ``"unsigned"`` or ``None`` (not declared: decide from the data) for a method.

    ``absolute=True`` (Saliency and its relatives) makes a signed method unsigned; names
    starting with ``lrp`` are signed (relevance conserves the score, with both signs).

    Example:
        >>> sign_convention("integrated_gradients"), sign_convention("gradcam")
        ('signed', 'unsigned')
        >>> sign_convention("saliency", {"absolute": True}), sign_convention("my_method")
        ('unsigned', None)
    """
    key = _key(method)
    declared = SIGN_CONVENTIONS.get(key) or ("signed" if key.startswith("lrp") else None)
    if declared == "signed" and params and bool(params.get("absolute", False)):
        return "unsigned"
    return declared


def _data_is_signed(values: np.ndarray, tolerance: float = 1e-3) -> bool:
    top = float(np.max(np.abs(values))) if values.size else 0.0
    return bool(top > 0 and values.min() < -tolerance * top and values.max() > 0)


def reduce_for_display(attribution: np.ndarray, signed: bool) -> np.ndarray:
    """One 2-D map from an ``(H, W)`` or ``(H, W, C)`` attribution: channel sum if signed, sum of ``|a|`` if not.

    Example:
        >>> a = np.stack([np.ones((2, 2)), -3 * np.ones((2, 2))], -1)
        >>> float(reduce_for_display(a, True)[0, 0]), float(reduce_for_display(a, False)[0, 0])
        (-2.0, 4.0)
    """
    a = np.asarray(attribution, np.float64)
    if a.ndim == 3:
        return a.sum(-1) if signed else np.abs(a).sum(-1)
    if a.ndim != 2:
        raise ValueError(f"Expected an image attribution of shape (H, W) or (H, W, C). Received: shape={a.shape}.")
    return a if signed else np.abs(a)


@dataclass(frozen=True)
class ColourScale:
    """How a map is coloured: colormap, signed or not, limits, and the colours of its bar.

    ``stops`` are ``#rrggbb`` colours sampled evenly from ``low`` to ``high`` (for an HTML colour
    bar drawn without pictures); ``legend`` says in one line what the colours mean.

    Example:
        >>> s = colour_scale(np.array([[-1.0, 2.0]]), "saliency", percentile=100)
        >>> s.cmap, s.signed, s.low, s.high
        ('RdBu_r', True, -2.0, 2.0)
    """

    cmap: str
    signed: bool
    low: float
    high: float
    stops: tuple[str, ...]
    legend: str
    quantity: str = ""
    unit: str = ""
    shared: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (saved in ``report.json``).

        Example:
            >>> sorted(colour_scale(np.ones((2, 2)), "gradcam").as_dict())
            ['cmap', 'high', 'legend', 'low', 'quantity', 'shared', 'signed', 'stops', 'unit']
        """
        data = asdict(self)
        data["stops"] = list(self.stops)
        return data

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """Values mapped to [0, 1] along the bar (clipped); zero is 0.5 on a signed scale.

        Example:
            >>> colour_scale(np.array([[-1.0, 1.0]]), "saliency").normalise(np.array([-1.0, 0.0, 3.0])).tolist()
            [0.0, 0.5, 1.0]
        """
        span = self.high - self.low
        return np.clip((np.asarray(values, np.float64) - self.low) / span, 0.0, 1.0)


def legend_text(signed: bool, target: str | None = None, custom_cmap: bool = False) -> str:
    """One line saying what the colours mean (``target`` names the explained class).

    Example:
        >>> legend_text(True, "cat")
        "red raises the score of 'cat', blue lowers it; uncoloured (the dimmed grey image): no effect"
    """
    what = f"the score of {target!r}" if target is not None else "the score"
    if signed:
        if custom_cmap:
            return f"right end raises {what}, left end lowers it; uncoloured (the dimmed grey image): no effect"
        return f"red raises {what}, blue lowers it; uncoloured (the dimmed grey image): no effect"
    if custom_cmap:
        return f"right end: most important for {what}, left end: not at all"
    return f"brighter: more important for {what}, black: not at all"


def signed_opacity(position: np.ndarray, alpha: float) -> np.ndarray:
    """Opacity of a signed map's colour at ``position`` along the bar (0.5 = zero): ``alpha * sqrt(|2p - 1|)``.

    Zero is fully transparent (the dimmed image shows); the square root keeps weak values visible.

    Example:
        >>> signed_opacity(np.array([0.0, 0.5, 1.0]), 0.6).tolist()
        [0.6, 0.0, 0.6]
    """
    return float(alpha) * np.sqrt(np.abs(2.0 * np.asarray(position, np.float64) - 1.0))


def _limit(attribution: np.ndarray, signed: bool, percentile: float) -> float:
    values = reduce_for_display(np.asarray(attribution, np.float64), signed)
    magnitude = np.abs(values[np.isfinite(values)])
    top = float(np.percentile(magnitude, percentile)) if magnitude.size else 0.0
    if not top > 0:
        top = float(magnitude.max()) if magnitude.size and magnitude.max() > 0 else 1.0
    return top


def _signed(raw: np.ndarray, method: str, params: Mapping[str, Any] | None) -> bool:
    convention = sign_convention(method, params)
    return convention == "signed" if convention is not None else _data_is_signed(raw)


def shared_limit(attributions: Any, method: str = "", params: Mapping[str, Any] | None = None, *,
                 percentile: float = 99.5) -> float:
    """One colour limit for several image maps of a method: the percentile of all their magnitudes together.

    Pass it as ``limit=`` to :func:`colour_scale` so that every map of the method shares one scale.

    Example:
        >>> shared_limit([np.array([[1.0, 0.0]]), np.array([[4.0, 2.0]])], "gradcam", percentile=100)
        4.0
    """
    maps = [np.asarray(a, np.float64) for a in attributions]
    if not maps:
        raise ValueError("Expected at least one attribution. Received: attributions=[].")
    signed = any(_signed(a, method, params) for a in maps)
    values = np.concatenate([reduce_for_display(a, signed).ravel() for a in maps])
    return _limit(values[None], signed, percentile)


def colour_scale(
    attribution: np.ndarray,
    method: str = "",
    params: Mapping[str, Any] | None = None,
    *,
    cmap: str | None = None,
    percentile: float = 99.5,
    stops: int = 11,
    limit: float | None = None,
    alpha: float = 0.6,
    kind: str = "image",
) -> ColourScale:
    """The colour scale of one image attribution (see the module docstring for the conventions).

    Args:
        attribution: ``(H, W)`` or ``(H, W, C)`` raw values.
        method: the method's registry name (its sign convention decides signed or unsigned; its
            family the quantity and unit, :func:`kerascope.viz.quantities.map_quantity`).
        params: the method's parameters (``absolute=True`` makes saliency unsigned).
        cmap: a matplotlib colormap instead of ``RdBu_r`` / ``magma``.
        percentile: the limit is this percentile of the magnitude.
        stops: how many colours of the bar to sample.
        limit: a fixed limit instead (a scale shared by several maps, :func:`shared_limit`).
        alpha: the overlay's opacity; a signed bar's colours are drawn at it over the middle grey.
        kind: what is attributed to (``"image"``, ``"layer"``, ...) for the quantity's wording.

    Example:
        >>> s = colour_scale(np.array([[0.0, 1.0], [2.0, 4.0]]), "gradcam", percentile=100)
        >>> s.cmap, s.low, s.high, s.stops[0], s.legend.split(":")[0], s.unit
        ('magma', 0.0, 4.0, '#000004', 'brighter', 'score units')
        >>> colour_scale(np.array([[-1.0, 1.0]]), "saliency", stops=3).stops[1]  # zero: the middle grey
        '#666666'
    """
    import matplotlib

    from kerascope.viz.quantities import map_quantity

    raw = np.asarray(attribution, np.float64)
    signed = _signed(raw, method, params)
    top = float(limit) if limit is not None and float(limit) > 0 else _limit(raw, signed, percentile)
    name = cmap or (DIVERGING if signed else SEQUENTIAL)
    colormap = matplotlib.colormaps[name]
    positions = np.linspace(0.0, 1.0, stops)
    colours = colormap(positions)[:, :3]
    if signed:  # what the overlay shows over the middle grey of the dimmed image
        grey = sum(DIMMED) / 2
        opacity = signed_opacity(positions, alpha)[:, None]
        colours = (1 - opacity) * grey + opacity * colours
    sampled = tuple(matplotlib.colors.to_hex(c) for c in colours)
    quantity = map_quantity(method, params, kind)
    return ColourScale(name, signed, -top if signed else 0.0, top, sampled, legend_text(signed, None, cmap is not None),
                       quantity.quantity, quantity.unit, limit is not None)
