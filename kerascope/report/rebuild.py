"""Rebuild a results folder's ``index.html`` from what a run saved, without the model.

A results folder written by :func:`kerascope.pipeline.explain_images`
(``kerascope explain`` / ``kerascope demo``) holds ``inputs/*.png``, one
``<method>.npz`` per method (:meth:`Explanation.save`), ``summary.json`` and
``report.json``. :func:`rebuild_report` reads them back, redraws missing (or,
on request, all) overlays from the raw attributions and writes the page again,
optionally with new class names or extra tables (e.g. metrics computed later).

The folder is treated as untrusted input (it may come from someone else):
names read from files are sanitised before they become file names, every
picture path read from ``report.json`` must be a PNG/JPEG inside the folder,
saved HTML is rebuilt from a whitelist, nothing is written outside the folder,
and files that cannot be read are listed on the page (``unreadable``) rather
than silently dropped.
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
from kerascope.io.paths import UnsafePathError, inside, safe_name
from kerascope.report.html import (
    ReportEntry,
    TableData,
    picture_problem,
    read_report_data,
    sanitize_html,
    write_report,
)


def load_explanations(
    results_dir: str | Path, order: Sequence[str] = (), unreadable: dict[str, str] | None = None
) -> dict[str, Explanation]:
    """Every kerascope ``.npz`` explanation in a folder, keyed by method name.

    Files that cannot be read (empty, truncated, corrupt, not written by kerascope)
    are skipped; pass a dict as ``unreadable`` to receive ``{file name: reason}``.
    Methods named in ``order`` come first, in that order.

    Example:
        >>> import tempfile
        >>> load_explanations(tempfile.mkdtemp())
        {}
    """
    found: dict[str, Explanation] = {}
    for file in sorted(Path(results_dir).glob("*.npz")):
        try:
            explanation = Explanation.load(file)
        except (ValueError, OSError) as error:
            if unreadable is not None:
                unreadable[file.name] = str(error)
            continue
        found[explanation.method if explanation.method not in found else file.stem] = explanation
    ranked = [m for m in order if m in found] + [m for m in found if m not in order]
    return {m: found[m] for m in ranked}


def _file_names(methods: Sequence[str]) -> dict[str, str]:
    """A distinct safe file-name part per method name (names from files never reach a path unchanged)."""
    names: dict[str, str] = {}
    for method in methods:
        base = safe_name(method, fallback="method", max_length=40)
        name, n = base, 1
        while name in names.values():
            n += 1
            name = f"{base}-{n}"
        names[method] = name
    return names


def _read_json(file: Path, unreadable: dict[str, str]) -> dict[str, Any]:
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, found {type(data).__name__}")
        return data
    except (UnicodeDecodeError, ValueError, TypeError) as error:
        unreadable[file.name] = f"Could not read {str(file)!r}: {type(error).__name__}: {error}."
        return {}


def _relabel(label: str, class_names: Sequence[str] | None) -> str:
    if class_names and label.lstrip("-").isdigit() and 0 <= int(label) < len(class_names):
        return str(class_names[int(label)])
    return label


def _first_input(attributions: Any) -> Any:
    return attributions[0] if isinstance(attributions, (list, tuple)) else attributions


def _class_name(index: int, class_names: Sequence[str] | None) -> str:
    return str(class_names[index]) if class_names and 0 <= index < len(class_names) else str(index)


def rebuild_report(
    results_dir: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
    tables: Mapping[str, TableData] | None = None,
    redraw: bool = False,
    cmap: str | None = None,
    alpha: float = 0.6,
    embed_images: bool = False,
    progress: bool = False,
    shared_scale: bool = False,
) -> Path:
    """Rewrite ``RESULTS_DIR/index.html`` from the saved explanations and ``inputs/``; returns its path.

    Saved files that cannot be used (unreadable ``.npz``/JSON, pictures outside the folder or
    not images, explanations whose count does not match ``inputs/``) are listed on the page
    and in ``report.json`` under ``"unreadable"``; ``kerascope report`` then exits 1.

    Args:
        results_dir: a folder written by ``kerascope explain`` / ``demo`` (or
            :func:`kerascope.pipeline.explain_images`).
        class_names: names for class indices (a labels file's lines); replaces numeric labels.
        title: page title (default: the saved one).
        tables: extra ``{heading: table}`` (see :func:`kerascope.report.html.html_table`);
            they replace saved tables with the same heading.
        redraw: redraw every overlay (with ``cmap`` / ``alpha``), not only missing ones.
        cmap: colormap of redrawn overlays; ``None``: ``RdBu_r`` centred at zero for signed
            methods, ``magma`` for unsigned ones (:mod:`kerascope.viz.colours`).
        alpha: opacity of the colours over the (grey) image.
        embed_images: inline the pictures (single-file page).
        progress: show a progress bar while drawing overlays.
        shared_scale: redraw every overlay with one colour scale per method (from all its maps
            together), so that colours compare across images; default: each image its own scale.

    Example:
        >>> rebuild_report("no-such-folder")  # doctest: +SKIP
        Traceback (most recent call last):
        FileNotFoundError: No results folder. Received: results_dir='no-such-folder'.
    """
    from PIL import Image

    from kerascope.report.about import page_facts
    from kerascope.viz.colours import colour_scale, shared_limit
    from kerascope.viz.overlay import check_overlay_options, save_scaled_overlay
    from kerascope.viz.quantities import attribution_kind

    check_overlay_options(cmap, alpha)
    out = Path(results_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"No results folder. Received: results_dir={str(results_dir)!r}.")
    root = out.resolve()
    for name in ("overlays", "index.html", "report.json"):
        if (out / name).is_symlink():
            try:
                inside(root, name)
            except UnsafePathError:
                raise UnsafePathError(
                    f"{str(out / name)!r} is a symbolic link that leads outside the results folder; refusing to "
                    "write through it. Remove it and run again."
                ) from None
    unreadable: dict[str, str] = {}
    inputs = sorted((out / "inputs").glob("*.png"))
    summary = _read_json(out / "summary.json", unreadable)
    try:
        saved = read_report_data(out) or {}
    except ValueError as error:
        unreadable["report.json"] = str(error)
        saved = {}
    order = summary.get("methods")
    if not isinstance(order, list):  # the order the methods were given: summary.json, else the saved page
        order = list(dict.fromkeys(m for e in saved.get("entries", []) for m in e.overlays))
    explanations = load_explanations(out, order=[str(m) for m in order], unreadable=unreadable)
    if not explanations and not saved.get("entries"):
        listed = f" Unreadable: {unreadable}." if unreadable else ""
        raise ValueError(
            "Nothing to rebuild: no readable kerascope .npz explanations and no report.json. "
            f"Received: results_dir={str(results_dir)!r}. Expected the output folder of `kerascope explain`.{listed}"
        )
    saved_errors = saved.get("errors") or summary.get("errors") or {}
    errors: dict[str, str] = {str(k): str(v) for k, v in dict(saved_errors).items()} if isinstance(
        saved_errors, dict) else {}
    usable: dict[str, Explanation] = {}
    for method, explanation in explanations.items():
        if len(explanation) != len(inputs):
            unreadable[f"{method}.npz"] = (
                f"has {len(explanation)} explanations but inputs/ has {len(inputs)} images; skipped."
            )
        else:
            usable[method] = explanation
    file_names = _file_names(list(usable))
    redraw = redraw or shared_scale
    layers = {m: str(e.layer or e.extras.get("layer") or "") for m, e in usable.items()}
    kinds = {m: attribution_kind(e.method, layers[m]) for m, e in usable.items()}
    limits = {m: shared_limit(_first_input(e.attributions), e.method, e.params) if shared_scale else None
              for m, e in usable.items()}
    previous = {e.image: e for e in saved.get("entries", [])}
    first = next(iter(usable.values()), None)
    paths = [str(p) for p in np.ravel(first.extras.get("paths", []))] if first is not None else []
    predictions_top1 = summary.get("predictions", {})
    predictions_top1 = predictions_top1 if isinstance(predictions_top1, dict) else {}

    entries: list[ReportEntry] = []
    for i in progress_bar(range(len(inputs)), enabled=progress, desc="report", unit="image"):
        image_file = inputs[i]
        rel_image = f"inputs/{image_file.name}"
        problem = picture_problem(out, rel_image)
        if problem is not None:
            unreadable[rel_image] = problem
            rel_image = ""
        before = previous.get(f"inputs/{image_file.name}")
        original = paths[i] if i < len(paths) else None
        name = before.name if before else (Path(original).name if original else image_file.stem.split("_", 1)[-1])
        overlays: dict[str, str] = {}
        scales: dict[str, dict[str, Any]] = {}
        pixels = None
        for method, explanation in usable.items():
            rel = f"overlays/{safe_name(image_file.stem)}_{file_names[method]}.png"
            try:
                target_file = inside(root, rel)
            except UnsafePathError as error:
                unreadable[rel] = str(error)
                continue
            attribution = _first_input(explanation.attributions)
            if redraw or not target_file.exists():
                if not rel_image:
                    continue
                try:
                    if pixels is None:
                        with Image.open(inside(root, rel_image)) as picture:
                            pixels = np.asarray(picture.convert("RGB"))
                    scales[method] = save_scaled_overlay(
                        target_file, pixels, attribution[i], method=explanation.method, params=explanation.params,
                        cmap=cmap, alpha=alpha, limit=limits[method], kind=kinds[method]).as_dict()
                except (ValueError, TypeError, IndexError, OSError) as error:
                    unreadable[rel] = f"could not draw the {method} overlay: {type(error).__name__}: {error}"
                    continue
            elif picture_problem(out, rel) is not None:
                unreadable[rel] = str(picture_problem(out, rel))
                continue
            elif before is not None and method in before.scales:  # the overlay kept: so is its colour bar
                scales[method] = before.scales[method]
            else:
                try:
                    scales[method] = colour_scale(attribution[i], explanation.method, explanation.params,
                                                  kind=kinds[method]).as_dict()
                except (ValueError, TypeError, IndexError):
                    pass
            overlays[method] = rel
        if not overlays and before is not None:
            for method, path in before.overlays.items():
                problem = picture_problem(out, path)
                if problem is None:
                    overlays[method] = path
                    if method in before.scales:
                        scales[method] = before.scales[method]
                else:
                    unreadable[f"{path} (report.json, {method})"] = problem
        if before is not None:
            predictions = [(_relabel(label, class_names), score) for label, score in before.predictions]
        elif original is not None and original in predictions_top1:
            predictions = [(_relabel(str(predictions_top1[original]), class_names), math.nan)]
        else:
            predictions = []
        if first is not None and (class_names or before is None):
            target: str | None = _class_name(int(np.ravel(first.targets)[i]), class_names)
        else:
            target = _relabel(before.target, class_names) if before and before.target is not None else None
        probability = before.target_probability if before is not None and (
            before.target is None or target == _relabel(before.target, class_names)) else None
        shown_layers = {m: layers[m] for m in overlays if layers.get(m)}
        if before is not None:
            shown_layers = {**{m: v for m, v in before.layers.items() if m in overlays}, **shown_layers}
        entries.append(ReportEntry(name, rel_image, predictions, overlays, target, scales=scales,
                                   target_probability=probability,
                                   details=dict(before.details) if before is not None else {},
                                   layers=shown_layers, classes=before.classes if before is not None else None))
    if not inputs and saved.get("entries"):
        warnings.warn(f"{out / 'inputs'} holds no images; the rebuilt report has no pictures.", stacklevel=2)

    merged: dict[str, TableData] = {}
    for heading, text in (saved.get("html_tables") or {}).items():  # HTML from a file: rebuilt from a whitelist
        merged[heading], refused = sanitize_html(text, out, embed=embed_images)
        if refused:
            unreadable[f"table {heading!r} in report.json"] = "pictures refused: " + "; ".join(refused)
    for heading, table in (saved.get("tables") or {}).items():
        if isinstance(table, str):  # a str table is trusted HTML to html_table: never from a file
            merged[heading] = sanitize_html(table, out, embed=embed_images)[0]
        elif isinstance(table, (list, dict)):
            merged[heading] = table
        else:
            unreadable[f"report.json table {heading!r}"] = f"not a table ({type(table).__name__}); skipped"
    merged.update(dict(tables or {}))
    methods = list(usable)
    about = dict(saved.get("about") or {}) or page_facts(
        methods={m: {**({"layer": e.layer} if e.layer else {}), **e.params} for m, e in usable.items()})
    about.pop("kerascope version", None)
    about["kerascope version"] = page_facts()["kerascope version"]
    return write_report(
        out / "index.html",
        entries,
        title=title or saved.get("title") or "kerascope report",
        subtitle=saved.get("subtitle") or f"methods {', '.join(methods)} · {len(entries)} images (rebuilt)",
        errors=errors,
        tables=merged,
        embed_images=embed_images,
        unreadable=unreadable,
        about=about,
    )
