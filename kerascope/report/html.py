"""A self-contained HTML report: original images, top-k predictions, one overlay per method.

The report is a folder: ``index.html`` plus the PNG files it references by
relative path, so it opens offline (no CDN, no scripts, no external fonts).
``embed_images=True`` inlines every picture as a ``data:`` URI instead, for a
single file that can be mailed around. All user-supplied text (file names,
class names, method names, table cells) is HTML-escaped.

Next to ``index.html``, :func:`write_report` saves ``report.json`` with the
same content as data, which ``kerascope report RESULTS_DIR`` uses to rebuild
the page (see :mod:`kerascope.report.rebuild`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerascope.io.paths import atomic_write_text
from kerascope.report.safe_html import _e, _src, picture_problem, sanitize_html
from kerascope.report.tokens import css_for_tables

__all__ = ["ReportEntry", "TableData", "html_table", "picture_problem", "read_report_data", "render",
           "sanitize_html", "scale_statement", "write_report"]

_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;padding:16px clamp(10px,2.5vw,32px);
color:#222;background:#f6f6f4;line-height:1.35}
h1{font-size:22px;margin:0 0 4px;overflow-wrap:anywhere} .meta{color:#666;font-size:13px;margin-bottom:14px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px;margin:0 0 16px;min-width:0}
.card h2{font-size:15px;margin:0 0 6px;overflow-wrap:anywhere}
.facts{font-size:13px;color:#333;margin:0 0 10px;overflow-wrap:anywhere}
.facts span+span:before{content:" \\00b7  ";color:#999}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,175px),1fr));gap:14px;align-items:start}
figure{margin:0;min-width:0} figure img{display:block;width:100%;height:auto;max-width:512px;border:1px solid #ccc;
border-radius:3px;background:#eee}
figure.wide{grid-column:1/-1} figure.wide img{max-width:min(100%,900px)}
figcaption{font-size:12px;color:#444;margin-top:4px;max-width:512px} figcaption b{font-size:13px;color:#222}
.bar{height:10px;border:1px solid #bbb;border-radius:2px;margin-top:4px}
.ticks{display:flex;justify-content:space-between;font-size:11px;color:#555;font-variant-numeric:tabular-nums}
.legend{font-size:11.5px;color:#444;margin-top:2px}
.panel{font-size:12px;color:#333;margin:2px 0} .panel span+span:before{content:" \\00b7  ";color:#999}
.quantity{font-size:11.5px;color:#222;margin-top:2px} .scale-note{font-size:13px;color:#333;margin:0 0 14px}
.scale-note code{white-space:nowrap} table.preds th:first-child{white-space:normal}
.scroll{overflow-x:auto;max-width:100%} table.preds{margin-top:4px;width:100%} table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #eee;overflow-wrap:anywhere;vertical-align:top}
th{white-space:nowrap}
.err{color:#b00020} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.about dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0;font-size:13px}
.about dt{color:#666} .about dd{margin:0;overflow-wrap:anywhere} .about code{font-size:12px}
@media (max-width:520px){.about dl{grid-template-columns:1fr} .about dd{margin-bottom:6px}}
"""
#: What ``tables=`` accepts per heading: rows as a list of dicts (keys are columns), a dict of rows
#: (row name -> {column: value}), or a ``str`` of already-rendered HTML that you trust.
TableData = str | Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]


@dataclass
class ReportEntry:
    """One input image in the report.

    ``predictions`` are ``(class name, probability)`` pairs, best first;
    ``overlays`` maps a method name to a picture path relative to the page, in the order
    the methods were given (the page keeps it); ``scales`` maps a method name to its colour
    scale (:meth:`kerascope.viz.colours.ColourScale.as_dict`), drawn as a colour bar with a
    legend under the overlay; ``target`` is the explained class and ``target_probability`` its probability;
    ``details`` are extra facts shown under the heading (e.g. ``{"CAM layer": "conv3"}``);
    ``wide`` pictures (figures of sequences, tables, text) take a whole row of the grid each;
    ``layers`` maps a method to the layer its map comes from (a CAM's feature layer, a gradient
    method's attribution layer), named on its panel; ``classes`` is how many classes the model
    has (the table says "top k of N"); ``quantities`` maps a method to its map's
    ``quantity [unit]`` for panels without a colour scale here (figures that draw their own bar).

    Example:
        >>> ReportEntry("cat.png", "images/cat.png", [("cat", 0.9)]).name
        'cat.png'
    """

    name: str
    image: str
    predictions: list[tuple[str, float]]
    overlays: dict[str, str] = field(default_factory=dict)
    target: str | None = None
    target_probability: float | None = None
    scales: dict[str, dict[str, Any]] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    wide: bool = False
    layers: dict[str, str] = field(default_factory=dict)
    classes: int | None = None
    quantities: dict[str, str] = field(default_factory=dict)


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{_e('' if value is None else value)}</td>"
    if isinstance(value, (int, float)) or type(value).__module__ == "numpy":
        try:
            number = float(value)
        except (TypeError, ValueError):
            return f"<td>{_e(value)}</td>"
        text = "–" if math.isnan(number) else (f"{int(number)}" if number.is_integer() and abs(number) < 1e15
                                              else f"{number:.4g}")
        return f"<td class='num'>{_e(text)}</td>"
    return f"<td>{_e(value)}</td>"


def html_table(data: TableData) -> str:
    """Render table data as an escaped HTML ``<table>`` (numbers to 4 significant digits).

    ``data`` is a list of row dicts (columns in first-seen order), or a dict
    ``row name -> {column: value}`` (the row name becomes the first column).
    A ``str`` is returned unchanged: it must be HTML you trust.

    Example:
        >>> html_table([{"method": "gradcam", "pointing game": 0.75}])
        "<table><tr><th>method</th><th>pointing game</th></tr><tr><td>gradcam</td><td class='num'>0.75</td></tr></table>"
        >>> "&lt;x&gt;" in html_table({"<x>": {"auc": 0.5}})
        True
    """
    if isinstance(data, str):
        return data
    if isinstance(data, Mapping):
        rows = [{"": name, **dict(values)} for name, values in data.items()]
    elif isinstance(data, Sequence):
        rows = [dict(row) for row in data]
    else:
        raise TypeError(
            "A report table must be a list of row dicts, a dict of row dicts or an HTML string. "
            f"Received: type={type(data).__name__}."
        )
    columns: list[str] = []
    for row in rows:
        columns.extend(str(k) for k in row if str(k) not in columns)
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(_cell({str(k): v for k, v in row.items()}.get(c)) for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _score(value: float) -> str:
    return "–" if value is None or math.isnan(float(value)) else f"{float(value):.3f}"


_HEX = re.compile(r"^#[0-9a-fA-F]{6}$")


def _checked_scale(scale: Any) -> dict[str, Any] | None:
    """A colour scale fit for the page (stops are plain ``#rrggbb``, limits finite), else ``None``.

    Scales may come from a ``report.json`` someone sent: nothing but validated colours reaches a
    ``style`` attribute.
    """
    if not isinstance(scale, Mapping):
        return None
    stops = scale.get("stops")
    try:
        low, high = float(scale.get("low")), float(scale.get("high"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if (not isinstance(stops, (list, tuple)) or not 2 <= len(stops) <= 64
            or not all(isinstance(c, str) and _HEX.match(c) for c in stops)
            or not (math.isfinite(low) and math.isfinite(high) and high > low)):
        return None
    return {"stops": list(stops), "low": low, "high": high, "signed": bool(scale.get("signed")),
            "cmap": str(scale.get("cmap", "")), "custom": scale.get("cmap") not in ("RdBu_r", "magma"),
            "quantity": str(scale.get("quantity") or ""), "unit": str(scale.get("unit") or ""),
            "shared": bool(scale.get("shared"))}


def _tick(value: float) -> str:
    if value == 0:
        return "0"
    text = f"{abs(value):.3g}"
    return ("−" if value < 0 else "+") + text


def _colour_bar(scale: Mapping[str, Any] | None, target: str | None, method: str = "") -> str:
    """A colour bar (a CSS gradient of the scale's colours), its limits, its quantity and unit, the scale it
    is on (this image, or shared by the method's panels) and a one-line legend."""
    from kerascope.viz.colours import legend_text
    from kerascope.viz.quantities import map_quantity

    checked = _checked_scale(scale)
    if checked is None:
        return ""
    low, high = checked["low"], checked["high"]
    middle = 0.0 if checked["signed"] else (low + high) / 2
    ticks = [_tick(low) if checked["signed"] else "0", _tick(middle), _tick(high)]
    if not checked["signed"]:
        ticks = [t.lstrip("+") for t in ticks]
    gradient = ",".join(checked["stops"])
    legend = legend_text(checked["signed"], target, checked["custom"])
    if not checked["quantity"]:  # a report.json written before quantities were saved: the method's family
        known = map_quantity(method)
        checked["quantity"], checked["unit"] = known.quantity, known.unit
    where = f"shared by every {method} panel" if checked["shared"] else "this image only"
    return (
        f"<div class='bar' role='img' aria-label='colour scale {_e(checked['cmap'])} from {_e(ticks[0])} to "
        f"{_e(ticks[2])}' style='background:linear-gradient(to right,{gradient})'></div>"
        f"<div class='ticks'>{''.join(f'<span>{_e(t)}</span>' for t in ticks)}</div>"
        f"<div class='quantity'>{_e(checked['quantity'])} <span class='unit'>[{_e(checked['unit'])}]</span>"
        f" · <span class='scope'>scale: {_e(where)}</span></div>"
        f"<div class='legend'>{_e(legend)}</div>"
    )


def scale_statement(entries: Sequence[ReportEntry]) -> str:
    """The page's sentence on colour scales: per image (the default) or shared by each method's panels.

    Example:
        >>> scale_statement([])[:40]
        'Colour scales: per image. Each panel has'
    """
    shared = sorted({m for e in entries for m, sc in e.scales.items() if isinstance(sc, Mapping) and sc.get("shared")})
    every = sorted({m for e in entries for m in e.scales})
    if shared and shared == every:
        return ("Colour scales: shared per method. Every panel of a method uses the same limits (the 99.5th "
                "percentile of all its maps), so its colours compare across images, not across methods.")
    text = ("Colour scales: per image. Each panel has its own limits (the 99.5th percentile of that map): compare "
            "colours within a panel, not between panels (read the numbers on each bar). `--shared-scale` "
            "(shared_scale=True) puts every panel of a method on one scale.")
    if shared:
        text += f" Shared by all panels: {', '.join(shared)}."
    return text


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return str(value)


def _about(about: Mapping[str, Any]) -> str:
    """The "about this page" box: one row per fact, method parameters one line per method."""
    rows = []
    for key, value in about.items():
        if key == "methods" and isinstance(value, Mapping):
            lines = []
            for method, params in value.items():
                if isinstance(params, Mapping) and params:
                    text = ", ".join(f"{k}={_value_text(v)}" for k, v in params.items())
                else:
                    text = "defaults"
                lines.append(f"<div><b>{_e(method)}</b>: <code>{_e(text)}</code></div>")
            rows.append(f"<dt>method parameters</dt><dd>{''.join(lines)}</dd>")
        elif value is not None and value != "":
            rows.append(f"<dt>{_e(key)}</dt><dd>{_e(_value_text(value))}</dd>")
    return f"<section class='card about'><h2>About this page</h2><dl>{''.join(rows)}</dl></section>"


def reason_without_name(name: str, message: str) -> str:
    """An error message without the file name the row already shows.

    Example:
        >>> reason_without_name("a.png", "a.png: not a readable image (cannot identify image file 'a.png').")
        'not a readable image (cannot identify image file).'
    """
    for prefix in (f"{name}: ", f"{name}:", name):
        if prefix and message.startswith(prefix) and len(message) > len(prefix):
            message = message[len(prefix):].lstrip()
            break
    if name:  # e.g. Pillow's "cannot identify image file '/path/a.png'"
        for quoted in (f" {name!r}", f' "{name}"', f" '{name}'"):
            message = message.replace(quoted, "")
        message = message.replace(name, "this file")
    return message


def _problem_rows(problems: Mapping[str, str]) -> str:
    return "".join(f"<tr><td>{_e(k)}</td><td class='err'>{_e(reason_without_name(str(k), str(v)))}</td></tr>"
                   for k, v in problems.items())


def render(
    entries: list[ReportEntry],
    *,
    title: str = "kerascope report",
    subtitle: str = "",
    errors: Mapping[str, str] | None = None,
    tables: Mapping[str, TableData] | None = None,
    embed_from: str | Path | None = None,
    unreadable: Mapping[str, str] | None = None,
    about: Mapping[str, Any] | None = None,
) -> str:
    """Render the report page as a string (paths in entries are relative to the page).

    ``tables`` maps a heading to table data (see :func:`html_table`), shown
    above the images, e.g. a metric table ``{"gradcam": {"pointing game": 0.9}}``.
    ``embed_from``: folder the entry paths are relative to; when given, the
    pictures are inlined as ``data:`` URIs (a single self-contained file); only
    PNG/JPEG files inside that folder are read.
    ``unreadable``: ``{file name: reason}`` for saved files that could not be used
    (listed on the page in their own section).
    ``about``: facts for the "About this page" box, in order (e.g. model, model file,
    sha256, preprocessing, kerascope version); the key ``"methods"`` maps each method to
    its parameters.

    The page is a responsive grid (input, then one overlay per method in the order of
    ``entry.overlays``), each overlay with its colour bar and legend; no scripts.

    Example:
        >>> page = render([ReportEntry("<b>.png", "a.png", [("x", 1.0)], {"gradcam": "g.png"})])
        >>> "&lt;b&gt;.png" in page and "<b>.png" not in page
        True
    """
    base = Path(embed_from) if embed_from is not None else None
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<link rel='icon' href='data:,'>",
        f"<title>{_e(title)}</title><style>{_CSS}{css_for_tables(tables)}</style></head><body>",
        f"<h1>{_e(title)}</h1><div class='meta'>{_e(subtitle)}</div>",
    ]
    if any(e.scales for e in entries):
        note = _e(scale_statement(entries)).replace("`--shared-scale`", "<code>--shared-scale</code>")
        parts.append(f"<p class='scale-note'>{note.replace('(shared_scale=True)', '(<code>shared_scale=True</code>)')}</p>")
    if about:
        parts.append(_about(about))
    for heading, table in (tables or {}).items():
        parts.append(f"<div class='card'><h2>{_e(heading)}</h2><div class='scroll'>{html_table(table)}</div></div>")
    for entry in entries:
        preds = "".join(f"<tr><td>{_e(label)}</td><td class='num'>{_score(score)}</td></tr>"
                        for label, score in entry.predictions)
        facts = []
        if entry.target is not None:
            probability = entry.target_probability
            shown = "" if probability is None or math.isnan(float(probability)) else f" (p = {float(probability):.3f})"
            facts.append(f"<span>explained class: <b>{_e(entry.target)}</b>{shown}</span>")
        facts += [f"<span>{_e(k)}: <b>{_e(v)}</b></span>" for k, v in entry.details.items()]
        heading = f"top {len(entry.predictions)} of {entry.classes} classes" if entry.classes else "top classes"
        table = (f"<table class='preds'><tr><th>{_e(heading)}</th><th class='num'>probability</th></tr>{preds}"
                 "</table>" if entry.predictions else "")
        cells = []
        if entry.image:
            cells.append(
                f"<figure class='input'><img src='{_e(_src(entry.image, base))}' alt='{_e(entry.name)}'>"
                f"<figcaption><b>input</b>{table}</figcaption></figure>"
            )
        elif table:
            cells.append(f"<div>{table}</div>")
        for method, path in entry.overlays.items():
            panel = [f"<span class='target'>target: <b>{_e(entry.target)}</b></span>"] if entry.target is not None else []
            if entry.layers.get(method):
                panel.append(f"<span class='layer'>layer: <b>{_e(entry.layers[method])}</b></span>")
            cells.append(
                f"<figure class='method{' wide' if entry.wide else ''}' data-method='{_e(method)}'><img src='{_e(_src(path, base))}' "
                f"alt='{_e(method)} for {_e(entry.name)}'><figcaption><b>{_e(method)}</b>"
                + (f"<div class='panel'>{''.join(panel)}</div>" if panel else "")
                + (_colour_bar(entry.scales.get(method), entry.target, method) if method in entry.scales else
                   f"<div class='quantity'>{_e(entry.quantities[method])}</div>" if entry.quantities.get(method) else "")
                + "</figcaption></figure>"
            )
        parts.append(
            f"<section class='card entry'><h2>{_e(entry.name)}</h2>"
            + (f"<div class='facts'>{''.join(facts)}</div>" if facts else "")
            + f"<div class='grid'>{''.join(cells)}</div></section>"
        )
    if errors:
        parts.append("<div class='card'><h2>Inputs that could not be explained</h2>"
                     f"<div class='scroll'><table>{_problem_rows(errors)}</table></div></div>")
    if unreadable:
        parts.append("<div class='card'><h2>Saved files that could not be used</h2>"
                     f"<div class='scroll'><table>{_problem_rows(unreadable)}</table></div></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _json_tables(tables: Mapping[str, TableData] | None) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            return value.item()
        if isinstance(value, float) and math.isnan(value):
            return None
        return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)

    return {str(k): plain(v) for k, v in (tables or {}).items()}


def write_report(
    path: str | Path,
    entries: list[ReportEntry],
    *,
    title: str = "kerascope report",
    subtitle: str = "",
    errors: Mapping[str, str] | None = None,
    tables: Mapping[str, TableData] | None = None,
    embed_images: bool = False,
    save_data: bool = True,
    unreadable: Mapping[str, str] | None = None,
    about: Mapping[str, Any] | None = None,
) -> Path:
    """Write :func:`render` to ``path`` (usually ``OUT/index.html``); returns the path.

    Args:
        path: the HTML file to write; picture paths in ``entries`` are relative to its folder.
        entries: one :class:`ReportEntry` per image.
        title, subtitle: page heading (escaped).
        errors: ``{input name: reason}`` for inputs that could not be explained.
        tables: ``{heading: table}`` shown above the images, e.g. metrics
            (``kerascope evaluate``): rows as a list of dicts, a dict of row dicts
            (``{"gradcam": {"pointing game": 0.92, "deletion AUC": 0.11}}``), or
            trusted HTML as a ``str``. Cells are escaped; numbers get 4 significant digits.
        embed_images: inline every picture as a ``data:`` URI (one self-contained file).
        save_data: also write ``report.json`` next to the page (entries, tables, errors)
            so that ``kerascope report`` can rebuild it later.
        unreadable: ``{file: reason}`` for saved files a rebuild could not use (shown, and kept in
            ``report.json`` under ``"unreadable"``).
        about: facts for the "About this page" box (see :func:`render`), kept in ``report.json``.

    Both files are written atomically; a symbolic link in their place is replaced, never followed.

    Example:
        >>> import tempfile, os
        >>> p = write_report(os.path.join(tempfile.mkdtemp(), "index.html"), [],
        ...                  tables={"metrics": [{"method": "gradcam", "auc": 0.5}]})
        >>> p.name, (p.parent / "report.json").exists()
        ('index.html', True)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    page = render(
        entries, title=title, subtitle=subtitle, errors=errors, tables=tables,
        embed_from=path.parent if embed_images else None, unreadable=unreadable, about=about,
    )
    atomic_write_text(path, page)
    if save_data:
        data = {
            "format": 1,
            "title": title,
            "subtitle": subtitle,
            "errors": dict(errors or {}),
            "tables": _json_tables({k: v for k, v in (tables or {}).items() if not isinstance(v, str)}),
            "html_tables": {str(k): v for k, v in (tables or {}).items() if isinstance(v, str)},
            "unreadable": dict(unreadable or {}),
            "about": _json_tables(about),
            "entries": [
                {**asdict(e), "predictions": [[str(label), None if math.isnan(float(s)) else float(s)]
                                              for label, s in e.predictions]}
                for e in entries
            ],
        }
        atomic_write_text(path.parent / "report.json", json.dumps(data, indent=1))
    return path


def read_report_data(folder: str | Path) -> dict[str, Any] | None:
    """The ``report.json`` saved by :func:`write_report` in ``folder``, or ``None`` if there is none.

    Raises ``ValueError`` naming the file when it is not valid JSON of the expected shape
    (strings where text is expected, lists of entries, tables as dicts). Text is returned as
    it was saved: render it only through :func:`render`, which escapes it.

    Example:
        >>> import tempfile
        >>> read_report_data(tempfile.mkdtemp()) is None
        True
    """
    file = Path(folder) / "report.json"
    if not file.exists():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, found {type(data).__name__}")
        for key in ("title", "subtitle"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise TypeError(f"{key!r} must be a string")
        for key in ("errors", "tables", "html_tables", "unreadable", "about"):
            if not isinstance(data.get(key) or {}, dict):
                raise TypeError(f"{key!r} must be an object")
        data["errors"] = {str(k): str(v) for k, v in (data.get("errors") or {}).items()}
        data["unreadable"] = {str(k): str(v) for k, v in (data.get("unreadable") or {}).items()}
        if not all(isinstance(v, str) for v in (data.get("html_tables") or {}).values()):
            raise TypeError("'html_tables' values must be strings")
        entries = data.get("entries") or []
        if not isinstance(entries, list):
            raise TypeError("'entries' must be a list")
        parsed = []
        for e in entries:
            overlays = e.get("overlays") or {}
            if not isinstance(overlays, dict) or not all(isinstance(v, str) for v in overlays.values()):
                raise TypeError("an entry's 'overlays' must map method names to picture paths")
            if not isinstance(e["image"], str):
                raise TypeError("an entry's 'image' must be a path string")
            scales, details = e.get("scales") or {}, e.get("details") or {}
            if not isinstance(scales, dict) or not isinstance(details, dict):
                raise TypeError("an entry's 'scales' and 'details' must be objects")
            probability = e.get("target_probability")
            layers, classes, quantities = e.get("layers") or {}, e.get("classes"), e.get("quantities") or {}
            if not isinstance(layers, dict) or not isinstance(quantities, dict):
                raise TypeError("an entry's 'layers' and 'quantities' must be objects")
            parsed.append(ReportEntry(
                name=str(e["name"]), image=e["image"],
                predictions=[(str(label), float("nan") if s is None else float(s)) for label, s in e["predictions"]],
                overlays={str(k): v for k, v in overlays.items()},
                target=None if e.get("target") is None else str(e["target"]),
                scales={str(k): v for k, v in scales.items() if isinstance(v, dict)},  # checked when rendered
                target_probability=None if probability is None else float(probability),
                details={str(k): str(v) for k, v in details.items()},
                wide=bool(e.get("wide", False)),
                layers={str(k): str(v) for k, v in layers.items()},
                quantities={str(k): str(v) for k, v in quantities.items()},
                classes=classes if isinstance(classes, int) and not isinstance(classes, bool) and classes > 0 else None,
            ))
        data["entries"] = parsed
        data["about"] = dict(data.get("about") or {})
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as error:
        raise ValueError(
            f"Could not read {str(file)!r}: not a valid kerascope report.json ({type(error).__name__}: {error})."
        ) from error
    return data
