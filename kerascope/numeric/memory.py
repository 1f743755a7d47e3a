"""How much memory is available to new allocations, for refusing work that cannot fit before it starts."""

from __future__ import annotations


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable`` on Linux), or ``None`` if unknown.

    Example:
        >>> m = available_memory(); m is None or m > 0
        True
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def human_bytes(count: float) -> str:
    """``count`` bytes in MB / GB / TB for messages.

    Example:
        >>> human_bytes(3.2e9), human_bytes(5e5)
        ('3.2 GB', '0.5 MB')
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count / 1e6:.1f} MB"
