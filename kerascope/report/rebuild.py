"""Rebuild a results folder's ``index.html`` from what a run saved, without the model.

A results folder written by :func:`kerascope.pipeline.explain_images`
(``kerascope explain`` / ``kerascope demo``) holds ``inputs/*.png``, one
``<method>.npz`` per method (:meth:`Explanation.save`), ``summary.json`` and
``report.json``. :func:`rebuild_report` reads them back, redraws missing (or,
on request, all) overlays from the raw attributions and writes the page again,
optionally with new class names or extra tables (e.g. metrics computed later).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kerascope.core.explanation import Explanation
from kerascope.core.progress import progress_bar
from kerascope.report.html import ReportEntry, TableData, read_report_data, write_report


def load_explanations(results_dir: str | Path, order: Sequence[str] = ()) -> dict[str, Explanation]:
    """Every kerascope ``.npz`` explanation in a folder, keyed by method name.

    Files that are not kerascope explanations are skipped. Methods named in
    ``order`` come first, in that order.

    Example:
        >>> import tempfile
        >>> load_explanations(tempfile.mkdtemp())
        {}
    """
    found: dict[str, Explanation] = {}
    for file in sorted(Path(results_dir).glob("*.npz")):
        try:
            explanation = Explanation.load(file)
        except (ValueError, KeyError, OSError):
            continue
        found[explanation.method if explanation.method not in found else file.stem] = explanation
    ranked = [m for m in order if m in found] + [m for m in found if m not in order]
    return {m: found[m] for m in ranked}


def _relabel(label: str, class_names: Sequence[str] | None) -> str:
    if class_names and label.lstrip("-").isdigit() and 0 <= int(label) < len(class_names):
        return str(class_names[int(label)])
    return label


def _class_name(index: int, class_names: Sequence[str] | None) -> str:
    return str(class_names[index]) if class_names and 0 <= index < len(class_names) else str(index)


def rebuild_report(
    results_dir: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
    tables: Mapping[str, TableData] | None = None,
    redraw: bool = False,
    cmap: str = "jet",
    alpha: float = 0.5,
    embed_images: bool = False,
    progress: bool = False,
) -> Path:
    """Rewrite ``RESULTS_DIR/index.html`` from the saved explanations and ``inputs/``; returns its path.

    Args:
        results_dir: a folder written by ``kerascope explain`` / ``demo`` (or
            :func:`kerascope.pipeline.explain_images`).
        class_names: names for class indices (a labels file's lines); replaces numeric labels.
        title: page title (default: the saved one).
        tables: extra ``{heading: table}`` (see :func:`kerascope.report.html.html_table`);
            they replace saved tables with the same heading.
        redraw: redraw every overlay (with ``cmap`` / ``alpha``), not only missing ones.
        embed_images: inline the pictures (single-file page).
        progress: show a progress bar while drawing overlays.

    Example:
        >>> rebuild_report("no-such-folder")  # doctest: +SKIP
        Traceback (most recent call last):
        FileNotFoundError: No results folder. Received: results_dir='no-such-folder'.
    """
    from PIL import Image

    from kerascope.viz.overlay import save_overlay

    out = Path(results_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"No results folder. Received: results_dir={str(results_dir)!r}.")
    inputs = sorted((out / "inputs").glob("*.png"))
    summary: dict[str, Any] = {}
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    saved = read_report_data(out) or {}
    explanations = load_explanations(out, order=summary.get("methods", ()))
    if not explanations and not saved.get("entries"):
        raise ValueError(
            "Nothing to rebuild: no kerascope .npz explanations and no report.json. "
            f"Received: results_dir={str(results_dir)!r}. Expected the output folder of `kerascope explain`."
        )
    errors: dict[str, str] = dict(saved.get("errors") or summary.get("errors") or {})
    usable: dict[str, Explanation] = {}
    for method, explanation in explanations.items():
        if len(explanation) != len(inputs):
            errors[f"{method}.npz"] = (
                f"has {len(explanation)} explanations but inputs/ has {len(inputs)} images; skipped."
            )
        else:
            usable[method] = explanation
    previous = {e.image: e for e in saved.get("entries", [])}
    first = next(iter(usable.values()), None)
    paths = [str(p) for p in first.extras.get("paths", [])] if first is not None else []
    predictions_top1: dict[str, str] = summary.get("predictions", {})

    entries: list[ReportEntry] = []
    for i in progress_bar(range(len(inputs)), enabled=progress, desc="report", unit="image"):
        image_file = inputs[i]
        rel_image = f"inputs/{image_file.name}"
        before = previous.get(rel_image)
        original = paths[i] if i < len(paths) else None
        name = before.name if before else (Path(original).name if original else image_file.stem.split("_", 1)[-1])
        overlays: dict[str, str] = {}
        pixels = None
        for method, explanation in usable.items():
            rel = f"overlays/{image_file.stem}_{method}.png"
            if redraw or not (out / rel).exists():
                if pixels is None:
                    with Image.open(image_file) as picture:
                        pixels = np.asarray(picture.convert("RGB"))
                attribution = explanation.attributions
                attribution = attribution[0] if isinstance(attribution, (list, tuple)) else attribution
                save_overlay(out / rel, pixels, attribution[i], cmap=cmap, alpha=alpha)
            overlays[method] = rel
        if before is not None:
            predictions = [(_relabel(label, class_names), score) for label, score in before.predictions]
        elif original is not None and original in predictions_top1:
            predictions = [(_relabel(str(predictions_top1[original]), class_names), math.nan)]
        else:
            predictions = []
        if first is not None and (class_names or before is None):
            target: str | None = _class_name(int(first.targets[i]), class_names)
        else:
            target = _relabel(before.target, class_names) if before and before.target is not None else None
        entries.append(ReportEntry(name, rel_image, predictions, overlays or (before.overlays if before else {}),
                                   target))
    if not inputs and saved.get("entries"):
        warnings.warn(f"{out / 'inputs'} holds no images; the rebuilt report has no pictures.", stacklevel=2)

    merged: dict[str, TableData] = {**saved.get("html_tables", {}), **saved.get("tables", {}), **dict(tables or {})}
    methods = list(usable)
    return write_report(
        out / "index.html",
        entries,
        title=title or saved.get("title") or "kerascope report",
        subtitle=saved.get("subtitle") or f"methods {', '.join(methods)} · {len(entries)} images (rebuilt)",
        errors=errors,
        tables=merged,
        embed_images=embed_images,
    )
