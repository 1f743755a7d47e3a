"""Loading a KerasHub preset saved on disk (``task.save_to_preset(folder)``), offline."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any


def is_preset_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by KerasHub's ``save_to_preset`` (it holds ``config.json``
    and ``metadata.json``).

    Example:
        >>> import tempfile
        >>> is_preset_dir(tempfile.mkdtemp())
        False
    """
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and (path / "metadata.json").is_file()


def load_preset(path: str | Path) -> Any:
    """The KerasHub task saved in the preset folder ``path`` (with its preprocessor and tokenizer).

    The task class is read from the folder's ``task.json`` and loaded with its own
    ``from_preset(path)``, which reads nothing from the network for a local folder. A folder
    holding only a backbone (no ``task.json``) is refused: kerascope explains a task's outputs.

    Example:
        >>> load_preset("missing")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Not a KerasHub preset folder ...
    """
    path = Path(path)
    if not is_preset_dir(path):
        raise ValueError(
            f"Not a KerasHub preset folder (config.json and metadata.json, as `task.save_to_preset(folder)` "
            f"writes them). Received: path={str(path)!r}."
        )
    task_file = path / "task.json"
    if not task_file.is_file():
        raise ValueError(
            f"The preset folder holds a backbone without a task (no task.json). Received: path={str(path)!r}. "
            "Save the task model (e.g. `keras_hub.models.BertTextClassifier(...).save_to_preset(folder)`)."
        )
    try:
        import keras_hub  # noqa: F401 - registers the task classes
    except ModuleNotFoundError as error:
        raise ValueError(
            f"Loading a KerasHub preset needs keras-hub: `pip install keras-hub`. Received: path={str(path)!r}."
        ) from error
    spec = json.loads(task_file.read_text(encoding="utf-8"))
    module, name = spec.get("module", ""), spec.get("class_name", "")
    if not module.startswith("keras_hub."):
        raise ValueError(f"The preset's task is not a KerasHub class. Received: module={module!r}, class={name!r}.")
    cls = getattr(importlib.import_module(module), name, None)
    if cls is None or not hasattr(cls, "from_preset"):
        raise ValueError(f"The preset's task class is not in the installed keras-hub. Received: {module}.{name}.")
    return cls.from_preset(str(path))
