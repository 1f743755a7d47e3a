"""Backend dispatch: the only package that imports tensorflow / jax / torch.

``get()`` returns the module implementing kerascope's differentiation
primitives for the active Keras backend (``keras.backend.backend()``).
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

import keras

_SUPPORTED = ("tensorflow", "jax", "torch")
_IMPORTED: dict[str, ModuleType] = {}  # fully imported backend modules
_IMPORT_LOCK = threading.Lock()  # a module another thread is importing is in sys.modules half-made


def get() -> ModuleType:
    """Return the backend module for the active Keras backend.

    Example:
        >>> from kerascope import _backend
        >>> _backend.get().NAME in ("tensorflow", "jax", "torch")
        True
    """
    name = keras.backend.backend()
    if name not in _SUPPORTED:
        raise RuntimeError(
            f"kerascope supports the Keras backends {list(_SUPPORTED)}. "
            f"Received: KERAS_BACKEND={name!r}. Set KERAS_BACKEND=tensorflow (or jax / torch)."
        )
    loaded = _IMPORTED.get(name)
    if loaded is not None:  # no import machinery inside a trace (AutoGraph would try to convert it)
        return loaded
    try:
        with _IMPORT_LOCK:
            loaded = _IMPORTED[name] = importlib.import_module(f"kerascope._backend.{name}")
        return loaded
    except ModuleNotFoundError as error:
        raise RuntimeError(
            f"kerascope has no implementation for the Keras backend {name!r} yet. "
            f"Received: KERAS_BACKEND={name!r}. Use KERAS_BACKEND=tensorflow."
        ) from error
