"""Method registry: name -> class, and :func:`build`, the one factory that makes a method.

Every caller that turns "a method name plus parameters" into a method
(``ks.explain``, the CLI pipeline, the Keras callback, the batch worker, the
benchmark, the sanity checks, the noise wrappers' ``base=``) goes through
:func:`build`, so specs and parameter errors behave the same everywhere.
"""

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


class UnknownParameterError(TypeError, ValueError):
    """A method was given a parameter it does not accept (a ``TypeError`` and a ``ValueError``).

    Example:
        >>> issubclass(UnknownParameterError, TypeError) and issubclass(UnknownParameterError, ValueError)
        True
    """


def resolve(spec: Any) -> Any:
    """What a method spec names: a Method class (for a name or a class), an instance, or a callable.

    Raises the registry's "Unknown method" error for unknown names and a
    ``TypeError`` for anything that is no method at all.

    Example:
        >>> import kerascope as ks
        >>> resolve("grad-cam") is ks.GradCAM, resolve(ks.Saliency) is ks.Saliency
        (True, True)
    """
    from kerascope.methods.base import Method

    if isinstance(spec, str):
        return get(spec)
    if isinstance(spec, type):
        if not issubclass(spec, Method):
            raise TypeError(
                f"A method class must derive from kerascope.methods.Method. Received: method={spec!r}."
            )
        return spec
    if isinstance(spec, Method) or callable(spec):
        return spec
    raise TypeError(
        "A method must be a registered name, a Method class, a Method instance or a callable "
        f"(model, inputs, targets) -> attributions. Received: method={spec!r}."
    )


def method_name(spec: Any) -> str:
    """The display name of a method spec (registered name, or the callable's ``__name__``).

    Example:
        >>> import kerascope as ks
        >>> method_name("Grad_CAM"), method_name(ks.Saliency), method_name(lambda m, x, t: x)
        ('gradcam', 'saliency', '<lambda>')
    """
    resolved = resolve(spec)
    name = getattr(resolved, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(resolved, "__name__", "custom")


def _accepted(resolved: Any) -> set[str]:
    from kerascope.methods.base import Method

    if isinstance(resolved, type):
        return accepted_parameters(resolved)
    if isinstance(resolved, Method):
        return set()  # an instance is already built: it takes no further parameters
    return {"batch_size"}  # a callable receives nothing; batch_size is offered to every method


def check_common(specs: Any, common: dict[str, Any] | None) -> None:
    """Raise when a parameter meant for several methods is accepted by none of them.

    Example:
        >>> check_common(["gradcam", "saliency"], {"layer": "conv"})
        >>> check_common(["saliency"], {"samples": 8})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kerascope.methods.registry.UnknownParameterError: No chosen method accepts the parameter(s) ['samples']. Received methods: ['saliency']. ...
    """
    specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
    resolved = [resolve(s) for s in specs]
    accepted = set().union(*(_accepted(r) for r in resolved))
    unused = sorted(set(common or {}) - accepted)
    if unused:
        raise UnknownParameterError(
            f"No chosen method accepts the parameter(s) {unused}. Received methods: "
            f"{[method_name(r) for r in resolved]}. Accepted: {sorted(accepted)}. "
            "See docs/methods.md for each method's parameters."
        )


def build(
    spec: Any,
    model: Any,
    params: dict[str, Any] | None = None,
    common: dict[str, Any] | None = None,
) -> Any:
    """Build a method for ``model``: the one factory every caller uses.

    Args:
        spec: a registered name (case, ``-`` and ``_`` ignored), a Method class, a
            Method instance (returned as is; it must explain ``model``), or a callable
            ``(model, inputs, targets) -> attributions`` (wrapped so it has ``explain``).
        model: the Keras model to explain.
        params: parameters for this method; one it does not accept raises
            :class:`UnknownParameterError` (names what it accepts).
        common: parameters offered to every method (``batch_size``, ``progress``, ...);
            those it does not accept are left out. ``params`` win over ``common``.

    Returns:
        A :class:`~kerascope.methods.base.Method` (``.explain(inputs, targets)``).

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> method = build("saliency", m, {"absolute": True}, common={"batch_size": 4, "samples": 9})
        >>> method.batch_size, method.absolute
        (4, True)
        >>> build("saliency", m, {"samples": 9})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        kerascope.methods.registry.UnknownParameterError: Method 'saliency' does not accept the parameter(s) ['samples']. Received: samples=9. Accepted: ...
    """
    from kerascope.methods.base import FunctionMethod, Method

    resolved = resolve(spec)
    params = dict(params or {})
    if isinstance(resolved, Method):
        if resolved.model is not model:
            raise ValueError(
                f"The method instance explains a different model. Received: method={resolved!r} for model "
                f"{resolved.model.name!r}; expected a method built on {getattr(model, 'name', model)!r}."
            )
        if params:
            raise UnknownParameterError(
                f"A method instance is already built and takes no parameters. Received: {sorted(params)} "
                f"for method={resolved!r}. Pass a name or class to set parameters."
            )
        return resolved
    accepted = _accepted(resolved)
    unknown = sorted(set(params) - accepted)
    if unknown:
        received = ", ".join(f"{k}={params[k]!r}" for k in unknown)
        raise UnknownParameterError(
            f"Method {method_name(resolved)!r} does not accept the parameter(s) {unknown}. "
            f"Received: {received}. Accepted: {sorted(accepted)}."
        )
    kwargs = {k: v for k, v in (common or {}).items() if k in accepted}
    kwargs.update(params)
    if isinstance(resolved, type):
        return resolved(model, **kwargs)
    return FunctionMethod(model, resolved, **kwargs)


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
