"""A report for non-image explanations: sequences, tabular features and text, one figure per sample and method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.io.paths import inside, prepare_output_dir, safe_name
from kerascope.report.html import ReportEntry, write_report


def write_data_report(
    out_dir: str | Path,
    inputs: Any,
    explanations: Mapping[str, Any] | Sequence[Any],
    *,
    kind: str = "auto",
    feature_names: Sequence[str] | None = None,
    channel_names: Sequence[str] | None = None,
    vocabulary: Sequence[str] | None = None,
    tokens: Sequence[Sequence[str]] | None = None,
    class_names: Sequence[str] | None = None,
    sample_names: Sequence[str] | None = None,
    max_samples: int = 16,
    title: str = "kerascope report",
    embed_images: bool = False,
    dpi: int = 90,
    tables: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``OUT/index.html`` (and ``OUT/plots/*.png``) for explanations of sequences, tables or text.

    Each sample gets a card with one figure per method, in the order given: the series with a
    heat strip of the attribution (sequences), a bar chart of the features (tabular) or the
    highlighted tokens (text), each with its colour bar (:func:`kerascope.viz.plots.plot_explanation`);
    each panel names its target, layer (when the map is a layer's) and the map's quantity and unit.
    Images use :func:`kerascope.pipeline.explain_images` instead.

    Args:
        out_dir: the output folder (created; other files in it are left alone).
        inputs: the explained inputs (``(N, T, F)`` series, ``(N, F)`` features, ``(N, T)`` token ids).
        explanations: ``{name: Explanation}`` or a list (named by their method), all for ``inputs``.
        kind: ``"auto"``, ``"sequence"``, ``"tabular"`` or ``"text"`` (see :func:`kerascope.viz.plots.data_kind`).
        feature_names, channel_names: names of tabular features / sequence channels.
        vocabulary: token strings by id (text); ``tokens``: the token strings per sample instead.
        class_names: names of the explained classes.
        sample_names: a name per sample (default ``sample 0, 1, ...``).
        max_samples: at most this many samples are drawn.
        embed_images: inline the figures (a single self-contained file).
        tables: ``{heading: table}`` shown above the figures (see :func:`kerascope.report.write_report`),
            e.g. :func:`kerascope.report.tokens.token_tables` (token heatmaps as page text).

    Example:
        >>> import tempfile, numpy as np
        >>> from kerascope.core.explanation import Explanation
        >>> e = Explanation(np.array([[0.5, -0.2, 0.1]]), "saliency", {}, np.array([1]), np.ones(1))
        >>> write_data_report(tempfile.mkdtemp(), np.ones((1, 3)), [e], feature_names=["a", "b", "c"]).name
        'index.html'
    """
    from kerascope.viz.plots import _attributions, data_kind, plot_explanation, save_figure
    from kerascope.viz.quantities import map_quantity

    named = dict(explanations) if isinstance(explanations, Mapping) else {e.method: e for e in explanations}
    if not named:
        raise ValueError("Expected at least one explanation. Received: explanations=[].")
    out = prepare_output_dir(out_dir)
    first = next(iter(named.values()))
    count = len(_attributions(first))
    if kind == "auto":
        kind = data_kind(_attributions(first), inputs, tokens if tokens is not None else vocabulary)
    if kind not in ("sequence", "tabular", "text"):
        raise ValueError(
            f"write_data_report draws sequences, tables and text. Received: kind={kind!r}. "
            "For images use kerascope.pipeline.explain_images (CLI: kerascope explain)."
        )
    options: dict[str, Any] = {
        "sequence": {"channel_names": channel_names},
        "tabular": {"feature_names": feature_names},
        "text": {"vocabulary": vocabulary},
    }[kind]
    files = {name: safe_name(name, fallback="method", max_length=40) for name in named}
    # token explanations carry no layer attribute: their map is per token, at the embedding
    at = {name: getattr(e, "layer", None) for name, e in named.items()}
    quantities = {name: map_quantity(e.method, e.params, "layer" if at[name] else kind).label()
                  for name, e in named.items()}
    layers = {name: str(layer) for name, layer in at.items() if layer}
    entries = []
    for i in range(min(count, max_samples)):
        overlays: dict[str, str] = {}
        for name, explanation in named.items():
            extra = dict(options)
            if kind == "text":
                extra["quantity"] = quantities[name]
                if tokens is not None:
                    extra["tokens"] = list(tokens[i])
            figure = plot_explanation(explanation, inputs, kind=kind, index=i, title=name, **extra)
            rel = f"plots/{i:04d}_{files[name]}.png"
            save_figure(figure, inside(out, rel), dpi=dpi)
            overlays[name] = rel
        target = int(np.ravel(first.targets)[i])
        label = str(class_names[target]) if class_names and 0 <= target < len(class_names) else str(target)
        name = str(sample_names[i]) if sample_names is not None and i < len(sample_names) else f"sample {i}"
        entries.append(ReportEntry(name, "", [], overlays, label, wide=True, layers=layers, quantities=quantities))
    return write_report(out / "index.html", entries, title=title,
                        subtitle=f"{kind} · methods {', '.join(named)} · {len(entries)} of {count} samples",
                        embed_images=embed_images, tables=tables)
