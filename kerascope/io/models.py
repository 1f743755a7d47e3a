"""Loading models from files, safely, with errors that say what to do."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

import keras

SUPPORTED = (".keras", ".h5", ".hdf5")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_container(path: Path) -> None:
    """Raise ``ValueError`` when the file is not the container its suffix promises (before Keras reads it)."""
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"The model file is empty. Received: path={str(path)!r}.")
    if path.suffix.lower() == ".keras":
        problem = None
        if not zipfile.is_zipfile(path):
            problem = "not a zip archive"
        else:
            try:
                with zipfile.ZipFile(path) as archive:
                    names = set(archive.namelist())
                if "config.json" not in names:
                    problem = "a zip archive without config.json"
            except (zipfile.BadZipFile, OSError, EOFError) as error:
                problem = f"a damaged zip archive ({error})"
        if problem is not None:
            raise ValueError(
                f"Not a valid .keras model file: {problem} ({size} bytes; truncated, or not a model). "
                f"Received: path={str(path)!r}. Save the model again with `model.save('model.keras')`."
            )
    else:
        with open(path, "rb") as handle:
            head = handle.read(8)
        if head != _HDF5_SIGNATURE:
            raise ValueError(
                f"Not a valid {path.suffix} model file: no HDF5 signature ({size} bytes; truncated, or not a "
                f"model). Received: path={str(path)!r}."
            )


def load_model(path: str | Path, *, safe_mode: bool = True, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """Load a ``.keras`` or ``.h5`` model for explanation (not compiled).

    ``safe_mode=True`` (default) refuses files that would run arbitrary code
    when loaded (``Lambda`` layers with Python bytecode). Only pass
    ``safe_mode=False`` for files you trust.

    Example:
        >>> import kerascope as ks
        >>> from kerascope.data import demo_model_path
        >>> ks.load_model(demo_model_path()).name
        'shapes_cnn'
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No model file. Received: path={str(path)!r}. Check the path.")
    if path.is_dir():
        from kerascope.io.presets import is_preset_dir, load_preset

        if is_preset_dir(path):  # a KerasHub task saved with `save_to_preset(folder)`
            return load_preset(path)
        raise ValueError(
            f"Received a directory: path={str(path)!r}. TensorFlow SavedModel directories cannot be "
            "explained as Keras 3 models (a KerasHub preset folder, as `save_to_preset` writes it, can); load "
            "the original model and save it with `model.save('model.keras')`."
        )
    if path.suffix.lower() not in SUPPORTED:
        raise ValueError(
            f"Unsupported model file type. Received: path={str(path)!r}. Expected one of {SUPPORTED}."
        )
    _check_container(path)
    try:
        return keras.saving.load_model(path, compile=False, safe_mode=safe_mode, custom_objects=custom_objects)
    except ValueError as error:
        text = str(error)
        if "safe_mode" in text or "unsafe" in text.lower() or "lambda" in text.lower():
            raise ValueError(
                f"Refusing to load {str(path)!r}: it contains code that would run on loading "
                "(e.g. a Lambda layer). If you trust this file, load it with safe_mode=False "
                "(CLI: --unsafe)."
            ) from error
        raise ValueError(f"Could not load model {str(path)!r}: {text}") from error
    except (OSError, KeyError, TypeError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(
            f"Could not read model file {str(path)!r} ({type(error).__name__}: {error}). Is it a "
            "Keras .keras/.h5 file saved with Keras 3 (or tf.keras 2 for .h5)? Custom layers need "
            "`custom_objects=`."
        ) from error
