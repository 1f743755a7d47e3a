"""Method registry: name -> class, used by ``ks.explain`` and the CLI."""

from __future__ import annotations

from typing import Any

_REGISTRY: dict[str, type] = {}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


def register(cls: type) -> type:
    """Class decorator: register a method under its ``name`` attribute.

    Example:
        >>> @register
        ... class Demo:
        ...     name = "demo_method"
        ...     description = "for the docs"
        >>> get("demo-method") is Demo
        True
        >>> _ = _REGISTRY.pop("demomethod")
    """
    _REGISTRY[_key(cls.name)] = cls
    for alias in getattr(cls, "aliases", ()):
        _REGISTRY[_key(alias)] = cls
    return cls


def get(name: str | type) -> Any:
    """Return the method class registered as ``name`` (case, ``-`` and ``_`` ignored).

    Example:
        >>> import kerascope as ks
        >>> ks.methods.get("gradcam").__name__
        'GradCAM'
    """
    if isinstance(name, type):
        return name
    if not isinstance(name, str) or _key(name) not in _REGISTRY:
        import difflib

        names = available()
        close = difflib.get_close_matches(str(name).lower(), names, n=3, cutoff=0.4)
        raise ValueError(
            f"Unknown method. Received: method={name!r}. "
            + (f"Did you mean {close}? " if close else "")
            + f"Available methods: {names}."
        )
    return _REGISTRY[_key(name)]


def accepted_parameters(cls: type) -> set[str]:
    """Keyword arguments a method class's constructor accepts, following ``**kwargs`` up the MRO.

    Example:
        >>> import kerascope as ks
        >>> {"layer", "upsample", "batch_size"} <= accepted_parameters(ks.GradCAM)
        True
    """
    import inspect

    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - {"self", "model"}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return names


def available() -> list[str]:
    """Names of the registered methods (without aliases), sorted.

    Example:
        >>> import kerascope as ks
        >>> "saliency" in ks.methods.available()
        True
    """
    return sorted({cls.name for cls in _REGISTRY.values()})


def describe() -> list[tuple[str, str]]:
    """``(name, one-line description)`` for every registered method.

    Example:
        >>> import kerascope as ks
        >>> dict(ks.methods.describe())["saliency"][:8]
        'Gradient'
    """
    classes = {cls.name: cls for cls in _REGISTRY.values()}
    return [(name, classes[name].description) for name in sorted(classes)]
