"""The facts of the report's "About this page" box: model, model file hash, preprocessing, methods, version."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kerascope.io.paths import file_sha256

#: Parameters that change how a method runs, not what it computes: left out of the box.
_EXECUTION = {"batch_size", "progress", "jit_compile"}


def page_facts(
    *,
    model_name: str | None = None,
    model_path: str | Path | None = None,
    preprocess: str | None = None,
    preprocess_reason: str | None = None,
    methods: Mapping[str, Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    hash_length: int = 16,
) -> dict[str, Any]:
    """The "About this page" facts, in display order (``None`` values are left out).

    ``model file`` is the file's name and ``model sha256`` the first ``hash_length`` hex
    digits of its SHA-256 (enough to tell two model files apart); ``methods`` maps each
    method, in the order given, to its parameters (``None`` values and execution settings such
    as ``batch_size`` left out); ``extra`` facts (e.g. from the CLI) come before the version.

    Example:
        >>> facts = page_facts(model_name="cnn", preprocess="unit", methods={"gradcam": {"layer": "conv"}})
        >>> list(facts)
        ['model', 'preprocessing', 'methods', 'kerascope version']
        >>> facts["preprocessing"]
        'unit: pixels / 255 -> [0, 1]'
    """
    from kerascope import __version__
    from kerascope.io.images import PREPROCESS

    facts: dict[str, Any] = {"model": model_name}
    if model_path is not None and Path(model_path).is_file():
        facts["model file"] = Path(model_path).name
        facts["model sha256"] = file_sha256(model_path)[:hash_length]
    if preprocess is not None:
        text = f"{preprocess}: {PREPROCESS[preprocess]}" if preprocess in PREPROCESS else preprocess
        facts["preprocessing"] = text + (f" ({preprocess_reason})" if preprocess_reason else "")
    if methods is not None:
        facts["methods"] = {str(k): {p: v for p, v in dict(params).items() if v is not None and p not in _EXECUTION}
                            for k, params in methods.items()}
    facts.update(dict(extra or {}))
    facts["kerascope version"] = __version__
    return {k: v for k, v in facts.items() if v is not None}
