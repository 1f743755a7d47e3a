"""Paths from untrusted text: safe file names, containment in a folder, output folders, image sniffing.

A results folder may come from someone else (``kerascope report`` on a folder
that was mailed around), so every name read from a file that becomes part of a
path goes through :func:`safe_name`, every path read from a file is checked
with :func:`inside` before it is opened, and every file kerascope writes is
checked to land inside the output folder (symbolic links included).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"


class UnsafePathError(ValueError):
    """A path named by a file (or a symbolic link) leads outside the folder it must stay in.

    Example:
        >>> isinstance(UnsafePathError("x"), ValueError)
        True
    """


class OutputFolderError(ValueError):
    """The output folder cannot be used: it is a file, lies under a file, or cannot be written.

    Example:
        >>> isinstance(OutputFolderError("x"), ValueError)
        True
    """


def safe_name(text: object, fallback: str = "item", max_length: int = 80) -> str:
    """A file-name component made of ``[A-Za-z0-9_.-]`` only: no separators, no ``..``, never empty.

    Example:
        >>> safe_name("x/../../etc/passwd")
        'x_.._.._etc_passwd'
        >>> safe_name(".."), safe_name(""), safe_name("grad cam++")
        ('item', 'item', 'grad_cam_')
    """
    name = _UNSAFE.sub("_", str(text))[:max_length].lstrip(".")
    return name if name.strip("._-") else fallback


def inside(root: str | Path, relative: str | Path) -> Path:
    """``root / relative`` resolved (links followed), or :class:`UnsafePathError` when it leaves ``root``.

    Absolute paths, ``..`` components and symbolic links that point elsewhere are all refused.

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> inside(root, "a/b.png").name
        'b.png'
        >>> inside(root, "../../etc/passwd")
        Traceback (most recent call last):
        kerascope.io.paths.UnsafePathError: ...
    """
    base = Path(root).resolve()
    text = str(relative)
    if not text or "\0" in text:
        raise UnsafePathError(f"Refusing an empty or NUL-containing path. Received: path={text!r}.")
    candidate = Path(text)
    target = (base / candidate).resolve()
    if candidate.is_absolute() or not target.is_relative_to(base):
        raise UnsafePathError(
            f"Refusing a path outside the folder {str(base)!r}. Received: path={text!r}"
            + (f" (resolves to {str(target)!r})." if target != candidate else ".")
        )
    return target


def sniff_image(path: str | Path) -> str | None:
    """``"png"`` or ``"jpeg"`` when the file's first bytes are a PNG / JPEG signature, else ``None``.

    Example:
        >>> from kerascope.data import demo_images
        >>> sniff_image(demo_images()[0]), sniff_image(__file__)
        ('png', None)
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    if head.startswith(PNG_MAGIC):
        return "png"
    if head.startswith(JPEG_MAGIC):
        return "jpeg"
    return None


def prepare_output_dir(path: str | Path, option: str = "out") -> Path:
    """Create ``path`` (and parents) and check that files can be written in it; clear errors otherwise.

    Raises :class:`OutputFolderError` when ``path`` is an existing file, lies under a
    file, or cannot be created or written (permissions, read-only file system).

    Example:
        >>> import tempfile, os
        >>> prepare_output_dir(os.path.join(tempfile.mkdtemp(), "new", "folder")).is_dir()
        True
        >>> f = os.path.join(tempfile.mkdtemp(), "file"); _ = open(f, "w").close()
        >>> prepare_output_dir(f)
        Traceback (most recent call last):
        kerascope.io.paths.OutputFolderError: ...
    """
    out = Path(path)
    flag = f"--{option.replace('_', '-')}"
    if out.exists() and not out.is_dir():
        raise OutputFolderError(
            f"The output folder is an existing file. Received: {option}={str(out)!r}. "
            f"Pass a folder path ({flag})."
        )
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputFolderError(
                    f"The output folder lies under a file: {str(parent)!r} is not a folder. "
                    f"Received: {option}={str(out)!r}."
                )
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".kerascope-write-check-"):
            pass
    except OSError as error:
        raise OutputFolderError(
            f"Cannot write to the output folder ({error.strerror or type(error).__name__}). "
            f"Received: {option}={str(out)!r}. Choose a folder you can write to ({flag})."
        ) from error
    return out


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write text to a temporary file in the same folder and rename it over ``path``.

    A symbolic link at ``path`` is replaced, never followed, so the write stays in its folder.
    The file gets the mode of any other new file (``0o666`` less the user's umask).

    Example:
        >>> import tempfile, os
        >>> atomic_write_text(os.path.join(tempfile.mkdtemp(), "a.txt"), "hi").read_text()
        'hi'
    """
    path = Path(path)
    tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
    handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file (hex), read in chunks of ``chunk`` bytes so a large model file is never held whole.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "f"); _ = open(p, "wb").write(b"abc")
        >>> file_sha256(p)[:16]
        'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
