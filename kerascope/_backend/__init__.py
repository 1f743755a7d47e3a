"""Backend dispatch: the only package that imports tensorflow / jax / torch.

``get()`` returns the module implementing kerascope's differentiation
primitives for the active Keras backend (``keras.backend.backend()``).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import keras

_SUPPORTED = ("tensorflow", "jax", "torch")


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
    loaded = sys.modules.get(f"kerascope._backend.{name}")
    if loaded is not None:  # no import machinery inside a trace (AutoGraph would try to convert it)
        return loaded
    try:
        return importlib.import_module(f"kerascope._backend.{name}")
    except ModuleNotFoundError as error:
        raise RuntimeError(
            f"kerascope has no implementation for the Keras backend {name!r} yet. "
            f"Received: KERAS_BACKEND={name!r}. Use KERAS_BACKEND=tensorflow."
        ) from error
