"""Every Python and shell example of README.md and docs/*.md, run as written.

Each page's fenced ``python`` and ``bash`` blocks run in order (the Python blocks of a page share one
namespace, as a reader pasting them into one session would) in a scratch folder that holds the
placeholders the docs use (listed in docs/README.md, "Running the examples"):

- ``model.keras``: the bundled demo model (``kerascope/data/shapes_cnn.keras``: 64x64 RGB, 4 classes,
  layers ``conv1a`` ... ``conv3b``);
- ``img1.png``, ``cat.png``, ``photos/``, ``images/``: demo images; ``x.npy``: two of them as an array;
  ``val.parquet`` (a ``path`` column) and ``labels.csv`` (``id,class`` rows) for them; ``classes.txt``;
  ``DIR``: a folder written by ``kerascope explain``; ``tabular.keras`` / ``rows.csv``, ``sensor.keras`` /
  ``series.csv``, ``tokens.keras`` / ``ids.npy``, ``bert_preset/`` (a tiny KerasHub BERT classifier with its
  tokenizer) / ``reviews.txt``: tiny models and data of each kind;
- in Python, ``model``, ``images`` / ``x`` (two demo images, float32 in [0, 1]), ``labels`` and ``masks``
  (their classes and object masks) exist before the first block; ``inception_v3/mixed10`` and ``"fc1"`` (layers of larger models the docs name) read
  ``conv3b`` and ``"predictions"``.

A block is marked in the page with an HTML comment on the line before it (invisible when rendered):
``<!-- docs-test: slow -->`` runs it only with the slow tests (``pytest -m slow``), ``<!-- docs-test:
skip: REASON -->`` never (installs packages, runs the whole test suite, or needs a cluster).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"<!--\s*docs-test:\s*(slow|skip)(?::\s*(.*?))?\s*-->")
SUBSTITUTIONS = {"inception_v3/mixed10": "conv3b", '"fc1"': '"predictions"'}


def examples(page: Path) -> list[tuple[int, str, str, str | None, str | None]]:
    """``(line, language, code, mark, reason)`` of every fenced python / bash block of ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        language, start = match.group(1), i
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if language in ("python", "bash"):
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            mark = _MARK.search(before)
            code = "\n".join(lines[start + 1:end])
            for old, new in SUBSTITUTIONS.items():
                code = code.replace(old, new)
            found.append((start + 1, language, code, mark and mark.group(1), mark and mark.group(2)))
        i = end + 1
    return found


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    from PIL import Image

    from kerascope.data import demo_images, demo_model_path

    folder = tmp_path_factory.mktemp("docs")
    shutil.copy(demo_model_path(), folder / "model.keras")
    files = demo_images()
    for name in ("photos", "images"):
        (folder / name).mkdir()
        for path in files[:2]:
            shutil.copy(path, folder / name / path.name)
    shutil.copy(files[0], folder / "img1.png")
    shutil.copy(files[1], folder / "cat.png")
    pixels = np.stack([np.asarray(Image.open(p).convert("RGB").resize((64, 64)), np.float32) / 255 for p in files[:2]])
    np.save(folder / "x.npy", pixels)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": [f"images/{p.name}" for p in files[:2]]}), folder / "val.parquet")
    (folder / "labels.csv").write_text("".join(f"images/{p.name},{i}\n" for i, p in enumerate(files[:2])))
    from kerascope.data import CLASS_NAMES

    (folder / "classes.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    _data_models(folder)
    from kerascope.cli import main

    assert main(["explain", str(folder / "model.keras"), str(folder / "images"), "--out", str(folder / "DIR"),
                 "--quiet"]) == 0
    return folder, pixels


def _data_models(folder: Path) -> None:
    """The README's non-image placeholders: tiny saved tabular, time-series and token models, their data files,
    and a KerasHub preset folder with a tokenizer."""
    import keras

    keras.utils.set_random_seed(0)
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="tabular").save(folder / "tabular.keras")
    keras.Sequential([keras.Input((4, 2)), keras.layers.Flatten(), keras.layers.Dense(2)],
                     name="sensor").save(folder / "sensor.keras")
    keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                      keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)], name="tokens").save(
        folder / "tokens.keras")
    (folder / "rows.csv").write_text("id,age,income,score\na,30,1.5,0.2\nb,41,2.0,-0.3\n")
    (folder / "series.csv").write_text("t,p\n" + "".join(f"{i / 10},{i / 5}\n" for i in range(8)))
    np.save(folder / "ids.npy", np.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]]))
    (folder / "reviews.txt").write_text("the cat sat\na dog ran\n")
    try:
        import keras_hub  # noqa: F401
    except ModuleNotFoundError:
        return
    from _presets import save_bert_preset

    save_bert_preset(folder / "bert_preset")


def _run_page(page: Path, folder: Path, pixels: np.ndarray, slow: bool, monkeypatch) -> None:
    import keras

    import kerascope as ks

    blocks = [b for b in examples(page) if b[3] != "skip" and (slow or b[3] != "slow")]
    if not blocks:
        pytest.skip(f"{page.name}: no example runs in this mode")
    # each page in its own copy of the placeholders: one page's outputs (results/, ...) never meet another's
    folder = Path(shutil.copytree(folder, folder.parent / f"{folder.name}-{page.stem}", dirs_exist_ok=True))
    monkeypatch.chdir(folder)
    # a page that registers a method (docs/architecture.md) leaves the registry as it found it
    from kerascope.methods import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    from kerascope.data import demo_images, demo_masks

    masks = np.stack([demo_masks()[p.name] for p in demo_images()[:2]])
    # the page's blocks share one real module, as pasted into one session (dataclasses look their module up)
    module = types.ModuleType("__docs__")
    monkeypatch.setitem(sys.modules, "__docs__", module)
    namespace = module.__dict__
    namespace.update({"model": ks.load_model(folder / "model.keras"), "images": pixels,
                      "x": pixels, "labels": np.array([0, 1]), "masks": masks})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line, language, code, _, _ in blocks:
        where = f"{page.relative_to(ROOT)}:{line}"
        if language == "python":
            keras.utils.set_random_seed(0)
            try:
                exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the documentation's own code
            except Exception as error:  # the failing block named, with its code
                raise AssertionError(f"the example at {where} failed: {type(error).__name__}: {error}\n{code}") from error
        else:
            for command in shell_commands(code):
                _run_command(command, where, folder, env)


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped, split as the shell would."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def _run_command(words: list[str], where: str, folder: Path, env: dict[str, str]) -> None:
    """``kerascope ...`` runs in this process (``kerascope.cli.main``, the console script's own entry point:
    no second TensorFlow start-up per line); any other command in ``bash``."""
    shown = " ".join(words)
    if words[0] == "kerascope" and not any(ch in shown for ch in "|&;<>$`"):
        from kerascope.cli import main

        try:
            code = main(words[1:])
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        assert code == 0, f"the example at {where} exited {code}: {shown}"
        return
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", shlex.join(words)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"the example at {where} exited {done.returncode}: {shown}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run_as_written(page, sandbox, monkeypatch):
    _run_page(page, *sandbox, slow=False, monkeypatch=monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if any(b[3] == "slow" for b in examples(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_slow_examples_run_as_written(page, sandbox, monkeypatch):
    _run_page(page, *sandbox, slow=True, monkeypatch=monkeypatch)


def test_every_page_has_its_examples_found():
    found = {str(p.relative_to(ROOT)): examples(p) for p in PAGES}
    assert len(found["README.md"]) >= 4 and len(found["docs/methods.md"]) >= 5
    assert all(code.strip() for blocks in found.values() for _, _, code, _, _ in blocks)
    unexplained = [(page, b[0]) for page, blocks in found.items() for b in blocks if b[3] == "skip" and not b[4]]
    assert not unexplained, f"a skipped example must say why: {unexplained}"


def test_import_kerascope_prints_nothing():
    done = subprocess.run([sys.executable, "-c", "import kerascope"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
