"""The main job: explain image files with a model and write overlays, arrays and a report."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerascope.core.engine import engine_for
from kerascope.core.progress import Progress, method_passes, progress_scope
from kerascope.io.display import read_display_image
from kerascope.io.images import check_image_size, load_images, model_image_size
from kerascope.io.paths import prepare_output_dir
from kerascope.io.preprocessing import resolve_preprocess
from kerascope.io.staging import check_reusable, staged
from kerascope.methods.registry import build, check_common, method_name
from kerascope.report.about import page_facts
from kerascope.report.figures import write_figures
from kerascope.report.html import ReportEntry, write_report
from kerascope.viz.colours import shared_limit
from kerascope.viz.figure import check_figure_formats
from kerascope.viz.overlay import check_overlay_options, save_scaled_overlay


@dataclass
class RunSummary:
    """What a run produced: counts, timings and the files written.

    Example:
        >>> RunSummary(out_dir="out").as_dict()["processed"]
        0
    """

    out_dir: str
    processed: int = 0
    failed: int = 0
    seconds: float = 0.0
    methods: list[str] = field(default_factory=list)
    report: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    predictions: dict[str, str] = field(default_factory=dict)
    preprocess: str | None = None
    preprocess_reason: str | None = None
    layers: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for ``--json``).

        Example:
            >>> RunSummary(out_dir="o", preprocess="unit").as_dict()["preprocess"]
            'unit'
        """
        return dict(vars(self))


def _method_class(spec: Any) -> Any:
    from kerascope.methods.registry import get

    return spec if isinstance(spec, type) else get(spec) if isinstance(spec, str) else type(spec)


def _is_cam(spec: Any) -> bool:
    """Whether a method spec (name, class or instance) is a CAM, the methods ``layer=`` of a run is for."""
    from kerascope.methods.cam import CAM

    cls = _method_class(spec)
    return isinstance(cls, type) and issubclass(cls, CAM)


def _takes_layer(spec: Any) -> bool:
    """Whether a method takes ``layer=`` (a CAM's feature layer, a gradient method's attribution layer)."""
    from kerascope.methods.registry import accepted_parameters

    cls = _method_class(spec)
    return isinstance(cls, type) and "layer" in accepted_parameters(cls)


def _common_for(spec: Any, own: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    """``common`` without ``call_index`` for a method that reads no inner layer in this run.

    ``call_index`` chooses the call of the run's ``layer`` (or ``output_layer``): Saliency kept on the
    pixels beside Grad-CAM must not get it (it would refuse a ``call_index`` with nothing to apply to).

    Example:
        >>> _common_for("saliency", {}, {"call_index": 1, "batch_size": 8})
        {'batch_size': 8}
        >>> _common_for("gradcam", {}, {"call_index": 1})
        {'call_index': 1}
    """
    reads_layer = _is_cam(spec) or "layer" in own or (own.get("output_layer") or common.get("output_layer")) is not None
    return common if reads_layer else {k: v for k, v in common.items() if k != "call_index"}


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _safe_stem(path: Path, index: int) -> str:
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:80]
    return f"{index:04d}_{stem}"


def explain_images(
    model: keras.Model,
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    methods: Sequence[str] = ("gradcam",),
    layer: str | None = None,
    targets: int | None = None,
    size: tuple[int, int] | None = None,
    preprocess: str = "auto",
    class_names: Sequence[str] | None = None,
    batch_size: int = 32,
    cmap: str | None = None,
    alpha: float = 0.6,
    top_k: int = 3,
    progress: Progress = True,
    title: str = "kerascope report",
    method_params: dict[str, Any] | None = None,
    common_params: dict[str, Any] | None = None,
    model_path: str | Path | None = None,
    overwrite: bool = False,
    shared_scale: bool = False,
    figures: Sequence[str] = (),
    figure_size: tuple[float, float] = (6.4, 3.2),
    figure_dpi: int = 200,
) -> RunSummary:
    """Explain image files: writes ``OUT/overlays/*.png``, ``OUT/<method>.npz`` and ``OUT/index.html``.

    ``method_params`` maps a method name to its constructor parameters;
    ``common_params`` (e.g. ``{"samples": 20}``, ``{"output_index": "cls"}``) go to every
    method that accepts them. ``layer`` is the feature layer of the CAMs; in a run
    without a CAM it is the layer the gradient methods attribute at (Saliency,
    IntegratedGradients, SmoothGrad, ... with ``layer=``: their maps are then the
    layer's attributions, shown summed over channels and resized to the image), so
    ``methods=["gradcam", "saliency"], layer="conv5"`` keeps Saliency on the pixels.
    Unreadable images (including images too large to decode safely) are
    reported by name (in the summary and the report) and the others are still
    processed. Every option is checked before any work (colormap, opacity,
    sizes that cannot fit in memory, an output folder that is a file or cannot
    be written, or that already holds run files: ``index.html``, ``report.json``,
    ``summary.json``, ``*.npz``, ``inputs/``, ``overlays/`` -- refused unless ``overwrite=True``,
    which replaces them). The run is written into a hidden folder inside ``out_dir`` and moved
    into place when complete: after an error (a full disk raises
    :class:`kerascope.io.staging.DiskFullError`) the folder holds what it held before. Other
    files in ``out_dir`` are left alone.

    Overlays and ``inputs/*.png`` are saved at the image's natural size, at most 512 px on
    the longest side and never smaller than the model input (:func:`kerascope.io.display.display_size`);
    ``cmap=None`` colours signed methods on ``RdBu_r`` centred at zero and unsigned ones on
    ``magma`` (:mod:`kerascope.viz.colours`). ``model_path`` (the model file) adds its SHA-256 to
    the report's "About this page" box. Each panel names its method, target, layer and the map's
    quantity and unit; ``shared_scale=True`` puts every panel of a method on one colour scale
    (default: each image its own, and the page says which).

    ``figures`` (e.g. ``("png", "svg")``) also writes a publication figure per image and method in
    ``OUT/figures/`` (:func:`kerascope.viz.figure.explanation_figure`: input, overlay, colour bar with
    unit, caption; PNG files carry the same facts as text chunks), ``figure_size`` inches at ``figure_dpi``.

    Example:
        >>> import kerascope as ks, tempfile
        >>> from kerascope.data import demo_images, demo_model_path
        >>> s = explain_images(ks.load_model(demo_model_path()), demo_images()[:1], tempfile.mkdtemp(),
        ...                    progress=False)
        >>> s.processed
        1
    """
    start = time.perf_counter()
    check_overlay_options(cmap, alpha)
    preprocess, preprocess_reason = resolve_preprocess(model, preprocess)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}.")
    batch_size = int(batch_size)
    if size is None:
        h, w, channels = model_image_size(model)
        if h is None or w is None:
            raise ValueError(
                "The model accepts any image size; pass `size=(H, W)` (CLI: --size H W)."
            )
        size = (h, w)
    else:
        channels = model_image_size(model)[2] if getattr(model, "inputs", None) else 3
    size = check_image_size(size, count=max(1, len(paths)), channels=channels)
    names = [method_name(m) for m in methods]
    formats = check_figure_formats(figures)
    check_common(list(methods), {**({} if layer is None else {"layer": layer}), **(common_params or {})})
    out = prepare_output_dir(out_dir)
    check_reusable(out, overwrite)
    with staged(out) as stage:  # all of the new run, or (on any error) the folder as it was
        batch = load_images(list(paths), size=size, channels=channels, mode=preprocess)
        summary = RunSummary(out_dir=str(out), methods=names, errors=dict(batch.errors), preprocess=preprocess,
                             preprocess_reason=preprocess_reason)
        summary.failed = len(batch.errors)
        entries: list[ReportEntry] = []
        method_facts: dict[str, dict[str, Any]] = {name: {} for name in names}
        if len(batch):
            # the predictions shown are those of the explained output (output_index / output_layer, if given)
            space = {**(common_params or {}), **(method_params or {}).get(names[0], {})}
            engine = engine_for(model, output_index=space.get("output_index"), output_layer=space.get("output_layer"),
                                call_index=space.get("call_index"))
            logits = engine.select(engine.forward(batch.inputs, batch_size=batch_size))
            probs = np.asarray(logits) if engine.forward_gives_probabilities else _softmax(np.asarray(logits, np.float64))
            (stage / "inputs").mkdir(exist_ok=True)
            stems = [_safe_stem(p, i) for i, p in enumerate(batch.paths)]
            from PIL import Image

            shown = []
            for path, pixels in zip(batch.paths, batch.pixels):  # the report shows images at their natural size
                try:
                    shown.append(read_display_image(path, size, channels=pixels.shape[-1]))
                except (ValueError, OSError):
                    shown.append(pixels)
            for stem, pixels in zip(stems, shown):
                Image.fromarray(pixels.squeeze(-1) if pixels.shape[-1] == 1 else pixels).save(stage / "inputs" / f"{stem}.png")
            overlays: dict[str, dict[str, str]] = {stem: {} for stem in stems}
            scales: dict[str, dict[str, dict[str, Any]]] = {stem: {} for stem in stems}
            params = method_params or {}
            explained: np.ndarray | None = None
            common: dict[str, Any] = {"batch_size": batch_size}
            common.update(common_params or {})
            with_cam = any(_is_cam(spec) for spec in methods)
            figure_jobs: list[tuple[Any, str, float | None]] = []
            for k, (spec, name) in enumerate(zip(methods, names), 1):
                own = dict(params.get(name, {}))
                # `layer` names the CAM layer; without a CAM in the run, the layer gradient methods attribute at
                if layer is not None and (_is_cam(spec) or (not with_cam and _takes_layer(spec))):
                    own.setdefault("layer", layer)
                method = build(spec, model, own, _common_for(spec, own, common))
                label = name if len(methods) == 1 else f"{name} ({k}/{len(methods)})"
                with progress_scope(len(batch), label, progress, passes=method_passes(method)):  # moves after every chunk of the method's work
                    explanation = method.explain(batch.inputs, targets)
                chosen = method.resolved_params(batch.inputs[:1]).get("layer")
                if chosen is not None:
                    summary.layers[name] = str(chosen)
                explanation.extras.update(paths=np.array([str(p) for p in batch.paths]), preprocess=preprocess,
                                          preprocess_reason=preprocess_reason, layer=summary.layers.get(name),
                                          model=model.name)
                explanation.save(stage / f"{name}.npz")
                explained = explanation.targets
                method_facts[name] = {**explanation.params, "layer": summary.layers.get(name) or explanation.layer}
                kind = "layer" if summary.layers.get(name) and not _is_cam(spec) else "image"
                limit = shared_limit(explanation.attributions, name, explanation.params) if shared_scale else None
                for i, stem in enumerate(stems):
                    rel = f"overlays/{stem}_{name}.png"
                    scale = save_scaled_overlay(stage / rel, shown[i], explanation.attributions[i], method=name,
                                                params=explanation.params, cmap=cmap, alpha=alpha, limit=limit,
                                                kind=kind)
                    overlays[stem][name] = rel
                    scales[stem][name] = scale.as_dict()
                if formats:
                    figure_jobs.append((explanation, kind, limit))
            names = list(class_names) if class_names else [str(i) for i in range(probs.shape[-1])]
            for i, (stem, path) in enumerate(zip(stems, batch.paths)):
                order = np.argsort(-probs[i])[:top_k]
                top = [(names[j] if j < len(names) else str(j), float(probs[i, j])) for j in order]
                target = None if explained is None else names[int(explained[i])] if int(explained[i]) < len(names) else str(explained[i])
                probability = None
                if explained is not None and 0 <= int(explained[i]) < probs.shape[-1]:
                    probability = float(probs[i, int(explained[i])])
                entries.append(ReportEntry(path.name, f"inputs/{stem}.png", top, overlays[stem], target,
                                           scales=scales[stem], target_probability=probability,
                                           layers={m: summary.layers[m] for m in overlays[stem] if m in summary.layers},
                                           classes=int(probs.shape[-1])))
                summary.predictions[str(path)] = top[0][0]
            for explanation, kind, limit in figure_jobs:
                write_figures(stage / "figures", explanation, shown, stems, formats, model_name=model.name,
                              class_names=names, cmap=cmap, alpha=alpha, limit=limit, kind=kind,
                              size=figure_size, dpi=figure_dpi)
            summary.processed = len(batch)
        layers = "; ".join(f"{name} layer {path}" for name, path in summary.layers.items())
        report = write_report(
            stage / "index.html",
            entries,
            title=title,
            subtitle=f"model {model.name} · methods {', '.join(summary.methods)} · {summary.processed} images · "
                     f"preprocessing {preprocess}" + (f" · {layers}" if layers else ""),
            errors=batch.errors,
            about=page_facts(model_name=model.name, model_path=model_path,
                             preprocess=preprocess,
                             preprocess_reason=preprocess_reason, methods=method_facts),
        )
        summary.report = str(out / report.name)
        summary.seconds = round(time.perf_counter() - start, 3)
        (stage / "summary.json").write_text(json.dumps(summary.as_dict(), indent=1))
    return summary
