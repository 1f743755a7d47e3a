"""``kerascope explain`` for models that do not read images: tabular and time-series data files, and text.

The report draws each sample with the tabular, sequence or text views of
:func:`kerascope.report.kinds.write_data_report`; ``<method>.npz`` holds the attributions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

#: What each model kind reads on the command line, and the Python call that explains it.
ACCEPTED = {
    "image": ("image files or folders (`kerascope batch` also reads a .npy array of images)",
              "ks.explain(model, images, method='gradcam')"),
    "tabular": ("a .npy, .csv or .parquet file of features, one sample per row (--features names them)",
                "ks.explain(model, x, method='integrated_gradients')"),
    "sequence": ("a .npy file (N, T, F), or a .csv / .parquet file with one time step per row and one "
                 "column per channel", "ks.explain(model, x, method='integrated_gradients')"),
    "text": ("--text \"...\" or --text-file lines.txt with a KerasHub preset folder (its preprocessor tokenizes), "
             "or a .npy file of token ids (N, T) for a model without a tokenizer",
             "ks.explain_tokens(model, token_ids)"),
}


def model_kind(model: Any) -> str:
    """What the model's first input is: ``"image"``, ``"tabular"``, ``"sequence"`` or ``"text"`` (token ids).

    Example:
        >>> import keras
        >>> model_kind(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
        'tabular'
        >>> model_kind(keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(9, 2)]))
        'text'
    """
    inputs = getattr(model, "inputs", None) or []
    if isinstance(getattr(model, "input", None), dict) or getattr(model, "preprocessor", None) is not None:
        return "text"
    if not inputs:
        return "image"  # a subclassed model without known inputs: the image path says what it needs
    first = inputs[0]
    rank = len(tuple(first.shape))
    if rank == 4:
        return "image"
    if rank == 2 and "int" in str(getattr(first, "dtype", "")):
        return "text"
    return {2: "tabular", 3: "sequence"}.get(rank, "image")


def refusal(kind: str, received: str) -> str:
    """The message for inputs the model cannot take: what it accepts, and the Python call.

    Example:
        >>> print(refusal("tabular", "photo.png"))  # doctest: +ELLIPSIS
        This model reads tabular inputs; give a .npy, .csv or .parquet file ... Received: photo.png. In Python: ks.explain(model, x, method='integrated_gradients').
    """
    accepted, call = ACCEPTED[kind]
    return f"This model reads {kind} inputs; give {accepted}. Received: {received}. In Python: {call}."


def _write_npz(path: Path, explanation: Any, extra: dict[str, Any]) -> None:
    arrays = {"attributions": np.asarray(explanation.attributions), "targets": np.asarray(explanation.targets),
              "scores": np.asarray(explanation.scores), "method": np.array(explanation.method)}
    arrays.update({k: np.asarray(v) for k, v in extra.items() if v is not None})
    with open(path, "wb") as handle:
        np.savez_compressed(handle, **arrays)


def _run(args: argparse.Namespace, model: Any, inputs: Any, kind: str, explain: Any, names: dict[str, Any],
         extra: dict[str, Any]) -> int:
    """Explain with every method into a staged ``--out`` and write the report; print the summary.

    ``explain(name)`` returns the method's explanation of every sample; for text, its token ids
    (and strings) are the report's inputs.
    """
    from kerascope.cli.common import emit
    from kerascope.core.progress import progress_scope
    from kerascope.io.paths import prepare_output_dir
    from kerascope.io.staging import check_reusable, staged
    from kerascope.pipeline import RunSummary
    from kerascope.report.kinds import write_data_report

    start = time.perf_counter()
    methods = args.method or ["integrated_gradients"]
    out = prepare_output_dir(args.out)
    check_reusable(out, args.overwrite)
    chatty = not (args.quiet or args.json)
    count = len(names["sample_names"])
    summary = RunSummary(out_dir=str(out), methods=list(methods))
    with staged(out) as stage:
        done: dict[str, Any] = {}
        for k, name in enumerate(methods, 1):
            label = name if len(methods) == 1 else f"{name} ({k}/{len(methods)})"
            with progress_scope(count, label, chatty, unit={"text": "text", "tabular": "row"}.get(kind, "sample")):
                done[name] = explain(name)
            if kind == "text":  # the token ids (and strings) the tokenizer made
                inputs, names["tokens"] = done[name].token_ids, done[name].tokens
                extra = {**extra, "token_ids": inputs}
            _write_npz(stage / f"{name}.npz", done[name], extra)
        report = write_data_report(
            stage, inputs, done, kind=kind, class_names=names.get("class_names"),
            feature_names=names.get("feature_names") if kind == "tabular" else None,
            channel_names=names.get("feature_names") if kind == "sequence" else None,
            tokens=names.get("tokens"), sample_names=names["sample_names"],
            title=f"kerascope report: {getattr(model, 'name', 'model')}", tables=_token_tables(kind, done),
        )
        summary.processed = count
        summary.report = str(out / report.name)
        summary.seconds = round(time.perf_counter() - start, 3)
        (stage / "summary.json").write_text(json.dumps({**summary.as_dict(), "kind": kind}, indent=1))
    what = {"tabular": "row(s)", "sequence": "series", "text": "text(s)"}[kind]
    emit(args, {**summary.as_dict(), "kind": kind},
         f"explained {count} {what} with {', '.join(methods)} in {summary.seconds:.1f}s -> {summary.report}")
    return 0


def _token_tables(kind: str, done: dict[str, Any]) -> dict[str, str] | None:
    """Text: every method's token heatmaps as page text (searchable, copyable), above the pictures."""
    if kind != "text":
        return None
    from kerascope.report.tokens import token_tables

    return {heading: html for name, e in done.items() for heading, html in token_tables(e, name).items()}


def _method_params(model: Any, name: str, layer: str | None, params: dict[str, Any], batch_size: int) -> Any:
    from kerascope.methods.registry import accepted_parameters, build, get

    own = {"layer": layer} if layer is not None and "layer" in accepted_parameters(get(name)) else {}
    return build(name, model, own, {"batch_size": batch_size, **params})


def run_data(args: argparse.Namespace, model: Any, path: str, params: dict[str, Any],
             class_names: list[str] | None) -> int:
    """Explain a ``.npy`` / ``.csv`` / ``.parquet`` file of tabular, time-series or token-id inputs.

    Example:
        >>> from kerascope.cli import main
        >>> main(["explain", "model.keras", "data.csv", "--method", "saliency"])  # doctest: +SKIP
        0
    """
    from kerascope.io.tables import read_data
    from kerascope.methods.registry import check_common

    kind = model_kind(model)
    if kind == "image":
        raise ValueError(refusal("image", path))
    shape = tuple(model.inputs[0].shape)[1:] if getattr(model, "inputs", None) else (None,)
    data = read_data(path, shape, names=args.features)
    if kind == "text" or data.kind == "text":
        if not np.issubdtype(data.values.dtype, np.integer):
            raise ValueError(refusal("text", f"{path} holding {data.values.dtype} values (token ids are integers)"))
        return _run_tokens(args, model, data.values, data.sample_names, params, class_names)
    methods = args.method or ["integrated_gradients"]
    check_common(methods, {**({} if args.layer is None else {"layer": args.layer}), **params})

    def explain(name: str) -> Any:
        method = _method_params(model, name, args.layer, params, args.batch_size)
        return method.explain(data.values, args.target)

    names = {"feature_names": data.feature_names, "sample_names": data.sample_names, "class_names": class_names}
    extra = {"feature_names": data.feature_names, "sample_names": data.sample_names, "inputs": data.values}
    return _run(args, model, data.values, data.kind, explain, names, extra)


def read_texts(texts: list[str] | None, text_file: str | None) -> list[str]:
    """The ``--text`` values, then the non-empty lines of ``--text-file``.

    Example:
        >>> read_texts(["a cat"], None)
        ['a cat']
    """
    found = list(texts or [])
    if text_file:
        lines = Path(text_file).read_text(encoding="utf-8").splitlines()
        found += [line for line in lines if line.strip()]
    if not found:
        raise ValueError(f"No text to explain. Received: --text-file {text_file} with no non-empty line.")
    return found


def run_text(args: argparse.Namespace, model: Any, params: dict[str, Any], class_names: list[str] | None) -> int:
    """Explain ``--text`` / ``--text-file`` strings with a model whose preprocessor tokenizes them.

    Example:
        >>> from kerascope.cli import main
        >>> main(["explain", "preset_dir/", "--text", "a fine film"])  # doctest: +SKIP
        0
    """
    texts = read_texts(args.text, args.text_file)
    if getattr(model, "preprocessor", None) is None:
        raise ValueError(
            f"--text needs a model that tokenizes strings: a KerasHub preset folder (saved with "
            f"`task.save_to_preset(folder)`, its preprocessor holds the tokenizer). Received: {args.model}, a model "
            "without a preprocessor. Give its token ids instead: `kerascope explain model.keras ids.npy` with an "
            "integer array (N, T), or in Python: ks.explain_tokens(model, token_ids)."
        )
    return _run_tokens(args, model, texts, [t if len(t) <= 60 else t[:57] + "..." for t in texts], params,
                       class_names)


def _run_tokens(args: argparse.Namespace, model: Any, inputs: Any, sample_names: list[str], params: dict[str, Any],
                class_names: list[str] | None) -> int:
    import kerascope as ks

    def explain(name: str) -> Any:
        return ks.explain_tokens(model, inputs, targets=args.target, method=name, layer=args.layer,
                                 **{"batch_size": args.batch_size, **params})

    names = {"sample_names": sample_names, "class_names": class_names}
    texts = None if isinstance(inputs, np.ndarray) else np.array(inputs)
    return _run(args, model, None, "text", explain, names, {"texts": texts})
