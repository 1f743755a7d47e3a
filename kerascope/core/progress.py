"""Progress bars for long work (tqdm), off unless asked for.

:func:`progress_scope` shows one bar for a piece of work over ``total`` samples (a method
explaining N images, a batch of a data set). It listens to the one chunker
(:mod:`kerascope.numeric.chunking`), so the bar moves after every chunk of every method,
with samples per second and an ETA, without the methods knowing about it:

* only the outermost chunk loop counts (a method's loop over noise samples, IG steps or
  variants, not the engine's loop inside one of its chunks);
* a loop's rows map linearly onto the samples (rows of folded variants are sample-major);
* a loop at least as large as the ones before it (the main loop after a short clean pass)
  takes over the bar, which restarts its clock so the rate and ETA are the main loop's;
  smaller loops after it (a final check) leave the bar alone;
* a method that runs several equal passes over the samples (Guided Grad-CAM: the CAM, then
  guided backpropagation) says so with ``passes=`` (a method's ``progress_passes``): pass ``k``
  of ``P`` moves the bar from ``k/P`` to ``(k+1)/P``, so one bar moves once through all of
  them; a loop that holds other loops (the method's own loop over chunks of samples) covers
  every pass;
* the bar moves after each chunk but counts whole samples done (``89% 7/8``, never ``7.11/8``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from kerascope.numeric.chunking import active_listener, listening

T = TypeVar("T")


def progress_bar(items: Iterable[T], enabled: bool = True, **kwargs: Any) -> Iterator[T]:
    """Iterate over ``items`` with a tqdm bar when ``enabled`` and there is more than one.

    Example:
        >>> list(progress_bar([1, 2], enabled=False))
        [1, 2]
    """
    items = list(items) if not hasattr(items, "__len__") else items
    if not enabled or len(items) <= 1:  # type: ignore[arg-type]
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, **kwargs)


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a :func:`progress_scope`: ``done`` of ``total`` samples after ``seconds``.

    Example:
        >>> ProgressEvent("saliency", 2.0, 4, 1.0).rate
        2.0
    """

    description: str
    done: float
    total: int
    seconds: float

    @property
    def rate(self) -> float:
        """Samples per second so far (0 before any time has passed)."""
        return self.done / self.seconds if self.seconds > 0 else 0.0


#: ``progress=`` as the API takes it: ``False``/``None`` (off), ``True`` (a bar on standard error) or a
#: callable that receives each :class:`ProgressEvent`.
Progress = bool | Callable[[ProgressEvent], Any] | None



def bar_format(total: int) -> str:
    """The ``bar_format`` of :func:`new_bar`: the share of the work done, then whole samples done of ``total``.

    The bar moves after every chunk (fractions of a sample); ``{done}`` is the count of whole samples
    finished (``89% 7/8``, never ``7.11/8``).

    Example:
        >>> bar_format(3)
        '{desc}: {percentage:3.0f}%|{bar}| {done}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]'
    """
    return "{desc}: {percentage:3.0f}%|{bar}| {done}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def new_bar(total: int, description: str = "", *, unit: str = "img", **kwargs: Any) -> Any:
    """A tqdm bar (on standard error, or a notebook widget) that shows whole samples done (:func:`bar_format`).

    Example:
        >>> import io
        >>> bar = new_bar(8, "demo", file=io.StringIO())
        >>> bar.update(7.11); bar.format_dict["done"]
        7
        >>> bar.close()
    """
    from tqdm.auto import tqdm

    class WholeBar(tqdm):  # type: ignore[misc, valid-type]
        @property
        def format_dict(self) -> dict[str, Any]:
            values = super().format_dict
            values["done"] = int(math.floor(float(values["n"]) + 1e-9))
            return values

    options = {"smoothing": 0.1, "dynamic_ncols": True, "bar_format": bar_format(total), **kwargs}
    return WholeBar(total=total, desc=description, unit=unit, **options)


def method_passes(method: Any) -> int:
    """How many equal passes over the samples a method runs (its ``progress_passes``, default 1).

    Example:
        >>> method_passes(object())
        1
    """
    passes = getattr(method, "progress_passes", 1)
    return passes if isinstance(passes, int) and passes >= 1 else 1


class _Scope:
    """The chunk listener behind :func:`progress_scope` (see the module docstring)."""

    def __init__(self, total: int, description: str, unit: str, bar: Any, callback: Any, external: bool,
                 passes: int = 1) -> None:
        self.total, self.description, self.unit = total, description, unit
        self.bar, self.callback, self.external = bar, callback, external
        self.passes = max(1, int(passes))
        self.depth = 0
        self.largest = 0
        self.position = 0.0
        self.pass_index = 0
        self.base, self.span = 0.0, float(total) / self.passes  # where the current loop moves the bar
        self.major: int | None = None  # the size of the loop that moves the bar, while it runs
        self.completed = False  # the last loop that moved the bar ran to its end
        self.started = time.perf_counter()

    # --- ChunkListener --------------------------------------------------------------
    def start(self, total: int) -> int | None:
        self.depth += 1
        if self.depth > 1:
            if self.major is not None and self.depth == 2 and self.passes > 1:
                self.span = self.total - self.base  # an outer loop: it covers every pass
            return None
        if total <= 0 or total < self.largest:
            return None
        if self.position > 0:
            if self.passes > 1 and self.completed and total == self.largest and self.pass_index + 1 < self.passes:
                self.pass_index += 1  # the next pass continues the bar
                self.base, self.span = self.position, (self.total - self.position) / (self.passes - self.pass_index)
            else:  # a pass at least as large takes over: restart the clock
                self.pass_index = 0
                self.base, self.span = 0.0, float(self.total) / self.passes
                self._move(0.0, restart=True)
        self.largest = total
        self.major, self.completed = total, False
        return total

    def advance(self, token: int | None, done: int) -> None:
        if token is not None:
            self._move(self.base + self.span * done / token)
            self.completed = done >= token

    def stop(self, token: int | None) -> None:
        self.depth -= 1
        if token is not None:
            self.major = None

    # --- the bar ----------------------------------------------------------------------
    def _move(self, position: float, restart: bool = False) -> None:
        position = min(float(self.total), position)
        if self.bar is not None:
            if restart and not self.external:
                self.bar.reset(total=self.total)
            else:
                self.bar.update(position - self.position)
        if restart:
            self.started = time.perf_counter()
        self.position = position
        if self.callback is not None and not restart:
            self.callback(ProgressEvent(self.description, position, self.total, time.perf_counter() - self.started))

    def finish(self) -> None:
        if self.external:  # a shared bar: the owner counts finished samples itself
            if self.bar is not None and self.position:
                self.bar.n = round(self.bar.n - self.position, 6)
            return
        if self.position < self.total:
            self._move(float(self.total))


@contextlib.contextmanager
def progress_scope(
    total: int,
    description: str = "",
    progress: Progress = True,
    *,
    unit: str = "img",
    bar: Any = None,
    leave: bool = True,
    passes: int = 1,
) -> Iterator[Any]:
    """Show progress over ``total`` samples for the work done inside, chunk by chunk.

    ``progress`` is ``True`` (a tqdm bar on standard error), a callable (called with a
    :class:`ProgressEvent` after every chunk) or false (nothing; also when a scope is
    already active, so an outer scope is never doubled). ``bar`` is an existing tqdm bar to
    move while inside (its owner adds the finished samples itself; what the scope added is
    taken back on exit). ``leave=False`` clears the bar when done. ``passes``: how many equal
    passes over the samples the work makes (see the module docstring; :func:`method_passes`).

    Example:
        >>> from kerascope.numeric.chunking import chunk_ranges
        >>> seen = []
        >>> with progress_scope(2, "demo", seen.append):
        ...     for rows in chunk_ranges(8, 3):  # e.g. 2 samples x 4 noise draws, 3 rows per chunk
        ...         pass
        >>> [round(e.done, 2) for e in seen]
        [0.75, 1.5, 2.0]
    """
    if not progress or total <= 0 or active_listener() is not None:
        yield None
        return
    callback = progress if callable(progress) and progress is not True else None
    external = bar is not None
    if bar is None and callback is None:
        bar = new_bar(total, description, unit=unit, leave=leave, miniters=0)  # redraw per chunk (rate-limited)
    scope = _Scope(total, description, unit, bar, callback, external, passes)
    failed = False
    try:
        with listening(scope):
            yield scope
    except BaseException:
        failed = True
        raise
    finally:
        if not failed or external:
            scope.finish()
        if bar is not None and not external:
            bar.close()
