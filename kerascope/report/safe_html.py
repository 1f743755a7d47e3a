"""Untrusted HTML and pictures in a report: escaping, pictures that must stay in their folder, a whitelist.

A results folder may come from someone else: a picture path is shown only when it is a PNG/JPEG
file inside the folder, and saved HTML is rebuilt from a whitelist of tags.
"""

from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser
from pathlib import Path

from kerascope.io.paths import UnsafePathError, inside, sniff_image


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


_DATA_URI = re.compile(r"^data:image/(png|jpeg);base64,[A-Za-z0-9+/=]*$")


def _src(path: str, base: Path | None) -> str:
    """The ``src`` of a picture: the relative path, or a data URI when ``base`` is given (embedding).

    Only PNG / JPEG files inside ``base`` are embedded (links followed, bytes checked); anything
    else raises :class:`~kerascope.io.paths.UnsafePathError`, so no other file is ever read.
    """
    if path.startswith("data:"):
        if not _DATA_URI.match(path):
            raise UnsafePathError(f"Refusing a picture that is not a PNG/JPEG data URI. Received: {path[:40]!r}.")
        return path
    if base is None:
        return path
    file = inside(base, path)
    kind = sniff_image(file) if file.is_file() else None
    if kind is None:
        raise UnsafePathError(f"Refusing to embed a file that is not a PNG or JPEG image. Received: path={path!r}.")
    return f"data:image/{kind};base64," + base64.b64encode(file.read_bytes()).decode()


def picture_problem(folder: str | Path, path: str) -> str | None:
    """Why ``path`` (relative to ``folder``) may not be shown in a report, or ``None`` when it may.

    A picture must be a PNG or JPEG file inside ``folder``; links that leave it are refused.

    Example:
        >>> import tempfile
        >>> picture_problem(tempfile.mkdtemp(), "../../etc/passwd")[:21]
        'leads outside the res'
    """
    if path.startswith("data:"):
        return None if _DATA_URI.match(path) else "is a data URI that is not a PNG/JPEG image"
    try:
        file = inside(folder, path)
    except UnsafePathError:
        return "leads outside the results folder; not shown"
    if not file.is_file():
        return "is missing; not shown"
    if sniff_image(file) is None:
        return "is not a PNG or JPEG image; not shown"
    return None


_ALLOWED_TAGS = {"table", "thead", "tbody", "tr", "th", "td", "caption", "figure", "figcaption", "img", "b", "i",
                 "em", "strong", "br", "p", "span", "div", "code", "pre", "ul", "ol", "li", "h3", "h4"}
_VOID_TAGS = {"img", "br"}
_DROP_CONTENT = {"script", "style", "iframe", "object", "embed", "template", "noscript", "svg", "math", "title"}
_CLASS = re.compile(r"^[A-Za-z0-9 _-]{0,40}$")


class _Sanitizer(HTMLParser):
    def __init__(self, folder: Path | None, embed: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.folder, self.embed = folder, embed
        self.out: list[str] = []
        self.stack: list[str] = []
        self.skipping = 0
        self.refused: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROP_CONTENT:
            self.skipping += 1
            return
        if self.skipping or tag not in _ALLOWED_TAGS:
            return
        values = {k: v or "" for k, v in attrs}
        kept = ""
        if "class" in values and _CLASS.match(values["class"]):
            kept += f" class='{_e(values['class'])}'"
        if tag == "img":
            src = values.get("src", "")
            problem = "no folder to check it against" if self.folder is None else picture_problem(self.folder, src)
            if problem is not None:
                self.refused.append(f"{src}: {problem}")
                return
            kept += f" src='{_e(_src(src, self.folder if self.embed else None))}' alt='{_e(values.get('alt', ''))}'"
        self.out.append(f"<{tag}{kept}>")
        if tag not in _VOID_TAGS:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROP_CONTENT:
            return
        self.handle_starttag(tag, attrs)
        if tag not in _VOID_TAGS and self.stack and self.stack[-1] == tag:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _DROP_CONTENT:
            self.skipping = max(0, self.skipping - 1)
            return
        if self.skipping or tag not in self.stack:
            return
        while self.stack:
            top = self.stack.pop()
            self.out.append(f"</{top}>")
            if top == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.out.append(_e(data))

    def result(self) -> str:
        self.close()
        return "".join(self.out) + "".join(f"</{t}>" for t in reversed(self.stack))


def sanitize_html(text: str, folder: str | Path | None = None, embed: bool = False) -> tuple[str, list[str]]:
    """Rebuild untrusted HTML from a whitelist: returns ``(safe html, refused pictures)``.

    Only table, figure and text-formatting tags survive, without attributes except a plain
    ``class`` and an ``<img>``'s ``src``/``alt``; ``src`` must be a PNG/JPEG file inside
    ``folder`` (inlined when ``embed``). Scripts, styles, event handlers and links are
    dropped and all text is escaped again.

    Example:
        >>> sanitize_html("<table><tr><td onclick='x()'>1 &lt; 2<script>alert(1)</script></td></tr></table>")[0]
        '<table><tr><td>1 &lt; 2</td></tr></table>'
    """
    parser = _Sanitizer(Path(folder) if folder is not None else None, embed)
    parser.feed(str(text))
    return parser.result(), parser.refused
