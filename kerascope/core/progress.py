"""Progress bars for long work (tqdm), off unless asked for."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

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
