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

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 4px} .meta{color:#666;font-size:13px;margin-bottom:18px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px;margin:0 0 16px}
.card h2{font-size:15px;margin:0 0 8px;word-break:break-all}
.row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
figure{margin:0;text-align:center} figure img{width:160px;height:160px;image-rendering:pixelated;border:1px solid #ccc}
figcaption{font-size:12px;color:#444;margin-top:4px} table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #eee} .err{color:#b00020}
td.num{text-align:right;font-variant-numeric:tabular-nums}
"""

#: What ``tables=`` accepts per heading: rows as a list of dicts (keys are columns), a dict of rows
#: (row name -> {column: value}), or a ``str`` of already-rendered HTML that you trust.
TableData = str | Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]


@dataclass
class ReportEntry:
    """One input image in the report.

    ``predictions`` are ``(class name, probability)`` pairs, best first;
    ``overlays`` maps a method name to a picture path relative to the page.

    Example:
        >>> ReportEntry("cat.png", "images/cat.png", [("cat", 0.9)]).name
        'cat.png'
    """

    name: str
    image: str
    predictions: list[tuple[str, float]]
    overlays: dict[str, str] = field(default_factory=dict)
    target: str | None = None


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


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


def _src(path: str, base: Path | None) -> str:
    """The ``src`` of a picture: the relative path, or a data URI when ``base`` is given (embedding)."""
    if base is None or path.startswith("data:"):
        return path
    file = base / path
    kind = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".gif": "gif", ".webp": "webp"}.get(
        file.suffix.lower(), "png"
    )
    return f"data:image/{kind};base64," + base64.b64encode(file.read_bytes()).decode()


def _score(value: float) -> str:
    return "–" if value is None or math.isnan(float(value)) else f"{float(value):.3f}"


def render(
    entries: list[ReportEntry],
    *,
    title: str = "kerascope report",
    subtitle: str = "",
    errors: Mapping[str, str] | None = None,
    tables: Mapping[str, TableData] | None = None,
    embed_from: str | Path | None = None,
) -> str:
    """Render the report page as a string (paths in entries are relative to the page).

    ``tables`` maps a heading to table data (see :func:`html_table`), shown
    above the images, e.g. a metric table ``{"gradcam": {"pointing game": 0.9}}``.
    ``embed_from``: folder the entry paths are relative to; when given, the
    pictures are inlined as ``data:`` URIs (a single self-contained file).

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
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1><div class='meta'>{_e(subtitle)}</div>",
    ]
    for heading, table in (tables or {}).items():
        parts.append(f"<div class='card'><h2>{_e(heading)}</h2>{html_table(table)}</div>")
    for entry in entries:
        preds = "".join(f"<tr><td>{_e(label)}</td><td class='num'>{_score(score)}</td></tr>"
                        for label, score in entry.predictions)
        target = f" &middot; explained class: <b>{_e(entry.target)}</b>" if entry.target is not None else ""
        figures = [
            f"<figure><img src='{_e(_src(entry.image, base))}' alt='{_e(entry.name)}'>"
            "<figcaption>input</figcaption></figure>"
        ]
        for method, path in entry.overlays.items():
            figures.append(
                f"<figure><img src='{_e(_src(path, base))}' alt='{_e(method)} for {_e(entry.name)}'>"
                f"<figcaption>{_e(method)}</figcaption></figure>"
            )
        parts.append(
            f"<div class='card'><h2>{_e(entry.name)}{target}</h2><div class='row'>"
            f"<table><tr><th>top classes</th><th>probability</th></tr>{preds}</table>{''.join(figures)}</div></div>"
        )
    if errors:
        rows = "".join(f"<tr><td>{_e(k)}</td><td class='err'>{_e(v)}</td></tr>" for k, v in errors.items())
        parts.append(f"<div class='card'><h2>Inputs that could not be explained</h2><table>{rows}</table></div>")
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
        embed_from=path.parent if embed_images else None,
    )
    path.write_text(page, encoding="utf-8")
    if save_data:
        data = {
            "format": 1,
            "title": title,
            "subtitle": subtitle,
            "errors": dict(errors or {}),
            "tables": _json_tables({k: v for k, v in (tables or {}).items() if not isinstance(v, str)}),
            "html_tables": {str(k): v for k, v in (tables or {}).items() if isinstance(v, str)},
            "entries": [
                {**asdict(e), "predictions": [[str(label), None if math.isnan(float(s)) else float(s)]
                                              for label, s in e.predictions]}
                for e in entries
            ],
        }
        (path.parent / "report.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def read_report_data(folder: str | Path) -> dict[str, Any] | None:
    """The ``report.json`` saved by :func:`write_report` in ``folder``, or ``None`` if there is none.

    Example:
        >>> import tempfile
        >>> read_report_data(tempfile.mkdtemp()) is None
        True
    """
    file = Path(folder) / "report.json"
    if not file.exists():
        return None
    data = json.loads(file.read_text(encoding="utf-8"))
    data["entries"] = [
        ReportEntry(
            name=e["name"], image=e["image"],
            predictions=[(str(label), float("nan") if s is None else float(s)) for label, s in e["predictions"]],
            overlays=dict(e.get("overlays") or {}), target=e.get("target"),
        )
        for e in data.get("entries", [])
    ]
    return data
