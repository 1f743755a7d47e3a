"""docs/layers-learned.md: every example runs as pasted (TensorFlow; the modules' own tests cover the backends)."""

from __future__ import annotations

import re
from pathlib import Path

import keras
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "layers-learned.md"


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="documentation examples: run once, on TensorFlow")
def test_every_example_of_the_page_runs(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 4
    namespaces = []
    for block in blocks:
        namespace: dict = {}
        exec(block, namespace)  # noqa: S102 - the documented example, as a reader would paste it
        namespaces.append(namespace)
    assert namespaces[0]["r"].images.shape == (8, 32, 32, 3) and namespaces[0]["m"].images.shape == (2, 32, 32, 3)
    assert "What each channel of conv detects" in (tmp_path / "results" / "index.html").read_text()
    assert sorted(p.name for p in (tmp_path / "features").glob("*.png"))[0] == "channel_000.png"
    tcav = namespaces[2]["r"]  # (a random model: no claim about the concept's significance)
    assert tcav.runs.shape == (1, 10) and 0.0 <= tcav.scores[0] <= 1.0 and 0.0 <= tcav.p_values[0] <= 1.0
    assert namespaces[3]["c"].concept_maps(namespaces[3]["x"]).shape == (10, 16, 16, 3)
