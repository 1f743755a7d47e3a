"""A self-contained HTML report: original images, top-k predictions, one overlay per method.

The report is a folder: ``index.html`` plus the PNG files it references by
relative path, so it opens offline (no CDN, no scripts). All user-supplied
text (file names, class names, method names) is HTML-escaped.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 4px} .meta{color:#666;font-size:13px;margin-bottom:18px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px;margin:0 0 16px}
.card h2{font-size:15px;margin:0 0 8px;word-break:break-all}
.row{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
figure{margin:0;text-align:center} figure img{width:160px;height:160px;image-rendering:pixelated;border:1px solid #ccc}
figcaption{font-size:12px;color:#444;margin-top:4px} table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #eee} .err{color:#b00020}
"""


@dataclass
class ReportEntry:
    """One input image in the report.

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


def render(
    entries: list[ReportEntry],
    *,
    title: str = "kerascope report",
    subtitle: str = "",
    errors: dict[str, str] | None = None,
    tables: dict[str, str] | None = None,
) -> str:
    """Render the report page as a string (paths in entries are relative to the page).

    ``tables`` maps a heading to already-rendered, trusted HTML (e.g. a metric table).

    Example:
        >>> page = render([ReportEntry("<b>.png", "a.png", [("x", 1.0)], {"gradcam": "g.png"})])
        >>> "&lt;b&gt;.png" in page and "<b>.png" not in page
        True
    """
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1><div class='meta'>{_e(subtitle)}</div>",
    ]
    for heading, table in (tables or {}).items():
        parts.append(f"<div class='card'><h2>{_e(heading)}</h2>{table}</div>")
    for entry in entries:
        preds = "".join(f"<tr><td>{_e(label)}</td><td>{score:.3f}</td></tr>" for label, score in entry.predictions)
        target = f" &middot; explained class: <b>{_e(entry.target)}</b>" if entry.target is not None else ""
        figures = [f"<figure><img src='{_e(entry.image)}' alt='{_e(entry.name)}'><figcaption>input</figcaption></figure>"]
        for method, path in entry.overlays.items():
            figures.append(
                f"<figure><img src='{_e(path)}' alt='{_e(method)} for {_e(entry.name)}'>"
                f"<figcaption>{_e(method)}</figcaption></figure>"
            )
        parts.append(
            f"<div class='card'><h2>{_e(entry.name)}{target}</h2><div class='row'>{''.join(figures)}"
            f"<table><tr><th>top classes</th><th>probability</th></tr>{preds}</table></div></div>"
        )
    if errors:
        rows = "".join(f"<tr><td>{_e(k)}</td><td class='err'>{_e(v)}</td></tr>" for k, v in errors.items())
        parts.append(f"<div class='card'><h2>Inputs that could not be explained</h2><table>{rows}</table></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(path: str | Path, entries: list[ReportEntry], **kwargs: object) -> Path:
    """Write :func:`render` to ``path`` (usually ``OUT/index.html``); returns the path.

    Example:
        >>> import tempfile, os
        >>> p = write_report(os.path.join(tempfile.mkdtemp(), "index.html"), [])
        >>> p.name
        'index.html'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(entries, **kwargs), encoding="utf-8")  # type: ignore[arg-type]
    return path
