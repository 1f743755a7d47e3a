"""Writing a run's files into a folder all at once: staged beside the old run, swapped in when complete.

``kerascope explain`` writes ``index.html``, ``report.json``, ``summary.json``, ``<method>.npz``,
``inputs/``, ``overlays/`` and (``--figures``) ``figures/``. A folder that already holds any of them (an earlier run, or the user's own
``index.html``) is refused unless ``overwrite``; the new files are written into a hidden folder inside
the output folder and moved into place only when every one was written, so a failure (a full disk, an
interruption) leaves the folder as it was: all of the old run, never a mix.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kerascope.io.paths import OutputFolderError

#: What an ``explain`` run writes at the top of its folder (besides ``<method>.npz``).
RUN_ENTRIES = ("index.html", "report.json", "summary.json", "inputs", "overlays", "figures")
_STAGE_PREFIX = ".kerascope-new-"
_OLD_PREFIX = ".kerascope-old-"
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFullError(OutputFolderError):
    """The disk (or quota) filled up while a run's files were written; nothing was changed.

    Example:
        >>> isinstance(DiskFullError("full"), ValueError)
        True
    """


def run_files(folder: str | Path) -> list[Path]:
    """The entries of ``folder`` that an ``explain`` run writes (an earlier run's, or the user's own).

    Example:
        >>> import tempfile
        >>> run_files(tempfile.mkdtemp())
        []
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.name in RUN_ENTRIES or (p.suffix == ".npz" and not p.name.startswith(".")))


def check_reusable(folder: str | Path, overwrite: bool, flag: str = "--overwrite") -> None:
    """Refuse a folder holding run files unless ``overwrite``.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "index.html").write_text("mine")
        >>> check_reusable(d, overwrite=False)
        Traceback (most recent call last):
        kerascope.io.paths.OutputFolderError: The output folder ... already holds ['index.html'] ...
    """
    found = run_files(folder)
    if found and not overwrite:
        shown = [p.name for p in found[:6]] + (["..."] if len(found) > 6 else [])
        raise OutputFolderError(
            f"The output folder {str(folder)!r} already holds {shown} (an earlier run, or files of your own); "
            f"a new run there would mix with them. Choose a new or empty folder, or pass {flag} (overwrite=True) "
            "to replace them (other files in the folder are left alone)."
        )


@contextlib.contextmanager
def staged(folder: str | Path) -> Iterator[Path]:
    """A hidden folder inside ``folder`` to write a run into; on success its entries replace the run files of
    ``folder`` (see :func:`run_files`), on any error it is deleted and ``folder`` is unchanged.

    A full disk raises :class:`DiskFullError` with one clear line.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "old.npz").write_bytes(b"x")
        >>> with staged(d) as stage:
        ...     _ = (stage / "index.html").write_text("new")
        >>> sorted(p.name for p in d.iterdir())
        ['index.html']
    """
    folder = Path(folder)
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=_STAGE_PREFIX))
    try:
        yield stage
        _publish(stage, folder)
    except OSError as error:
        if error.errno in _DISK_FULL:
            where = f" while writing {Path(error.filename).name}" if getattr(error, "filename", None) else ""
            raise DiskFullError(
                f"Not enough disk space in {str(folder)!r}{where} ({error.strerror}); nothing was written and the "
                "folder holds what it held before. Free some space or choose another output folder."
            ) from None
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _publish(stage: Path, folder: Path) -> None:
    old = Path(tempfile.mkdtemp(dir=folder, prefix=_OLD_PREFIX))
    try:
        for entry in run_files(folder):  # renames within one file system: no space needed
            entry.rename(old / entry.name)
        for entry in sorted(stage.iterdir()):
            entry.rename(folder / entry.name)
    finally:
        shutil.rmtree(old, ignore_errors=True)
