"""Publication figures of one explained image: input, overlay, colour bar with unit, caption and metadata.

A figure a reader can paste into a paper or a slide without redrawing it: the input, the map
over it (the report's colours, :mod:`kerascope.viz.colours`), a colour bar with ticks labelled
with the map's quantity and unit (:mod:`kerascope.viz.quantities`), and a caption naming the
model, method, layer, target and score. Saved as PNG, SVG or PDF through matplotlib at a chosen
size and dpi; a PNG carries the same facts as text chunks (``kerascope:method``, ...), SVG/PDF in
their title and description / subject fields.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kerascope.viz._figure import legible_ticks, new_figure
from kerascope.viz.colours import DIMMED, colour_scale, signed_opacity
from kerascope.viz.overlay import scaled_overlay, to_display

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("png", "svg", "pdf")


def check_figure_formats(formats: str | Sequence[str] | None) -> tuple[str, ...]:
    """Figure formats as a tuple of ``"png"``, ``"svg"``, ``"pdf"`` (a comma-separated string is split).

    Example:
        >>> check_figure_formats("png,SVG"), check_figure_formats(())
        (('png', 'svg'), ())
        >>> check_figure_formats(["tiff"])
        Traceback (most recent call last):
        ValueError: Unknown figure format. Received: figures=['tiff']. Expected some of png, svg, pdf, e.g. 'png,svg'.
    """
    if not formats:
        return ()
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    chosen = tuple(dict.fromkeys(str(f).strip().lower().lstrip(".") for f in items if str(f).strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise ValueError(f"Unknown figure format. Received: figures={unknown or items!r}. "
                         f"Expected some of {', '.join(FORMATS)}, e.g. 'png,svg'.")
    return chosen


def _class_name(target: int, class_names: Sequence[str] | None) -> str:
    return str(class_names[target]) if class_names is not None and 0 <= target < len(class_names) else str(target)


def figure_facts(explanation: Any, index: int = 0, *, model_name: str | None = None,
                 class_names: Sequence[str] | None = None, kind: str = "image",
                 limit: float | None = None) -> dict[str, str]:
    """What a figure of sample ``index`` says: model, method, layer, target, score, quantity, unit, scale.

    Example:
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.ones((1, 4, 4)), "gradcam", {}, np.array([1]), np.array([2.5]), layer="conv")
        >>> figure_facts(e, model_name="cnn", class_names=["cat", "dog"])["target"]
        'dog'
    """
    from kerascope.viz.quantities import map_quantity

    targets = np.ravel(np.asarray(explanation.targets))
    if not 0 <= index < len(targets):
        raise IndexError(f"No sample {index}. Received: index={index}; the explanation has {len(targets)} samples.")
    layer = explanation.layer or explanation.extras.get("layer") or explanation.params.get("layer")
    quantity = map_quantity(explanation.method, explanation.params, kind)
    facts = {
        "model": model_name or explanation.extras.get("model") or "",
        "method": explanation.method,
        "layer": "" if layer is None else str(layer),
        "target": _class_name(int(targets[index]), class_names),
        "score": "" if explanation.scores is None else f"{float(np.ravel(explanation.scores)[index]):.4g}",
        "quantity": quantity.quantity,
        "unit": quantity.unit,
        "scale": "shared by the method's maps" if limit is not None else "this image only",
    }
    return {k: str(v) for k, v in facts.items()}


def caption(facts: Mapping[str, str]) -> str:
    """The one-line caption of a figure from :func:`figure_facts`.

    Example:
        >>> caption({"model": "cnn", "method": "gradcam", "layer": "conv", "target": "dog", "score": "2.5"})
        'model cnn · gradcam · layer conv · target dog (score 2.5)'
    """
    parts = [f"model {facts['model']}" if facts.get("model") else "", facts.get("method", ""),
             f"layer {facts['layer']}" if facts.get("layer") else "",
             f"target {facts.get('target', '')}" + (f" (score {facts['score']})" if facts.get("score") else "")]
    return " · ".join(p for p in parts if p)


def _bar_colormap(scale: Any, alpha: float) -> Any:
    """The colours the overlay shows along the scale (a signed map over the middle grey of the dimmed image)."""
    import matplotlib
    from matplotlib.colors import ListedColormap

    positions = np.linspace(0.0, 1.0, 256)
    colours = matplotlib.colormaps[scale.cmap](positions)[:, :3]
    if scale.signed:
        opacity = signed_opacity(positions, alpha)[:, None]
        colours = (1 - opacity) * (sum(DIMMED) / 2) + opacity * colours
    return ListedColormap(colours, name=f"{scale.cmap}-shown")


def _sample(values: Any, index: int) -> np.ndarray:
    array = values[0] if isinstance(values, (list, tuple)) else values
    return np.asarray(array[index])


def input_image(explanation: Any, inputs: Any = None, index: int = 0) -> np.ndarray | None:
    """The picture of sample ``index``: from ``inputs`` (the explained batch), else from the file in
    ``extras["paths"]`` (a run of ``kerascope explain``), else ``None``.

    Example:
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.ones((2, 4, 4)), "gradcam", {}, np.array([0, 1]), None)
        >>> input_image(e, np.zeros((2, 4, 4, 3)), 1).shape, input_image(e) is None
        ((4, 4, 3), True)
    """
    if inputs is not None:
        batch = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        return np.asarray(batch[index])
    paths = np.ravel(np.asarray(explanation.extras.get("paths", []), dtype=object))
    if index < len(paths) and Path(str(paths[index])).is_file():
        from PIL import Image

        try:
            with Image.open(str(paths[index])) as picture:
                return np.asarray(picture.convert("RGB"))
        except OSError:
            return None
    return None


def explanation_figure(
    explanation: Any,
    image: np.ndarray | None = None,
    index: int = 0,
    *,
    model_name: str | None = None,
    class_names: Sequence[str] | None = None,
    cmap: str | None = None,
    alpha: float = 0.6,
    limit: float | None = None,
    kind: str = "image",
    size: tuple[float, float] = (6.4, 3.2),
) -> Figure:
    """A publication figure of sample ``index``: input, overlay, colour bar with ticks and unit, caption.

    Args:
        explanation: an :class:`~kerascope.Explanation` of images.
        image: the input picture ``(H, W[, C])`` (any range; larger than the map is fine); ``None``
            draws the map alone.
        index: which sample of the explanation.
        model_name: named in the caption (default: the explanation's ``extras["model"]``).
        class_names: names for the target classes.
        cmap, alpha: the overlay's colours and opacity (as in the report).
        limit: a fixed colour limit (:func:`kerascope.viz.colours.shared_limit`), else this map's own.
        kind: ``"image"`` or ``"layer"`` (maps of an inner layer), for the quantity's wording.
        size: ``(width, height)`` in inches.

    The facts (:func:`figure_facts`) are kept on the figure as ``figure.kerascope_facts``.

    Example:
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.random.rand(1, 8, 8), "gradcam", {}, np.array([0]), np.ones(1), layer="conv")
        >>> fig = explanation_figure(e, np.random.rand(16, 16, 3), model_name="cnn")
        >>> fig.kerascope_facts["unit"], fig.texts[0].get_text()
        ('score units', 'model cnn · gradcam · layer conv · target 0 (score 1)')
    """
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    facts = figure_facts(explanation, index, model_name=model_name, class_names=class_names, kind=kind, limit=limit)
    attribution = _sample(explanation.attributions, index)
    if attribution.ndim == 3 and attribution.shape[-1] == 1:
        attribution = attribution[..., 0]
    if attribution.ndim not in (2, 3):
        raise ValueError(f"explanation_figure draws image maps (H, W[, C]). Received: a map of shape "
                         f"{attribution.shape}. Use Explanation.plot(inputs, kind=...) for other data.")
    scale = colour_scale(attribution, explanation.method, explanation.params, cmap=cmap, limit=limit, alpha=alpha,
                         kind=kind)
    base = np.zeros(attribution.shape[:2] + (3,)) + 0.5 if image is None else to_display(np.asarray(image))
    shown = scaled_overlay(base, attribution, scale, alpha=alpha if image is not None else 1.0)
    figure = new_figure(*size)
    panels = 2 if image is not None else 1
    axes = figure.subplots(1, panels, squeeze=False)[0]
    if image is not None:
        axes[0].imshow(base, interpolation="nearest")
        axes[0].set_title("input", fontsize=9)
    axes[-1].imshow(shown, interpolation="nearest")
    axes[-1].set_title(f"{facts['method']}" + (f" · {facts['layer']}" if facts["layer"] else ""), fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    mappable = ScalarMappable(Normalize(scale.low, scale.high), _bar_colormap(scale, alpha if image is not None else 1.0))
    bar = figure.colorbar(mappable, ax=axes[-1], orientation="horizontal", fraction=0.06, pad=0.03, aspect=25)
    width = size[0] / panels  # inches under the overlay: wrap the label to fit there
    bar.set_label(textwrap.fill(f"{facts['quantity']} [{facts['unit']}]", max(24, int(width * 72 / 4.2))), fontsize=7)
    bar.ax.tick_params(labelsize=7)
    figure.text(0.5, 0.005, caption(facts), ha="center", va="bottom", fontsize=8, wrap=True)
    figure.get_layout_engine().set(h_pad=0.25)
    legible_ticks(figure, bar, symmetric=scale.signed, gap=6.0)  # measured in the final layout
    figure.kerascope_facts = facts  # type: ignore[attr-defined]
    return figure


def save_explanation_figure(figure: Figure, path: str | Path, *, dpi: int = 200) -> Path:
    """Save a figure of :func:`explanation_figure` (PNG, SVG or PDF from the suffix) with its facts as metadata.

    PNG: one text chunk per fact (``kerascope:method``, ``kerascope:unit``, ...) plus ``Title`` and
    ``Description``; SVG: title and description; PDF: title, subject and keywords.

    Example:
        >>> import tempfile, os
        >>> from PIL import Image
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.random.rand(1, 8, 8), "gradcam", {}, np.array([0]), np.ones(1))
        >>> p = save_explanation_figure(explanation_figure(e), os.path.join(tempfile.mkdtemp(), "f.png"), dpi=50)
        >>> Image.open(p).text["kerascope:method"]
        'gradcam'
    """
    path = Path(path)
    fmt = check_figure_formats([path.suffix or "png"])[0]
    facts: Mapping[str, str] = getattr(figure, "kerascope_facts", {})
    text = caption(facts) if facts else ""
    description = "; ".join(f"{k}: {v}" for k, v in facts.items() if v)
    if fmt == "png":
        metadata = {"Title": text, "Description": description, **{f"kerascope:{k}": v for k, v in facts.items()}}
    elif fmt == "svg":
        metadata = {"Title": text, "Description": description}
    else:
        metadata = {"Title": text, "Subject": description, "Keywords": f"kerascope {facts.get('method', '')}"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        figure.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
