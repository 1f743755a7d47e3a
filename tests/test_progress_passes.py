"""One progress bar per method through all of its passes, counting whole samples, read from a real run's stderr."""

from __future__ import annotations

import functools
import io
import re

import keras
import numpy as np
import pytest
from PIL import Image

from kerascope.cli import main
from kerascope.core.progress import new_bar, progress_scope
from kerascope.numeric.chunking import chunk_ranges


def _frames(err: str, label: str) -> list[tuple[int, str]]:
    """``(percent, "done/total")`` of every redraw of the bar called ``label``, in order."""
    pattern = re.compile(rf"^{re.escape(label)}:\s+(\d+)%\|[^|]*\|\s+(\S+)\s")
    return [(int(m.group(1)), m.group(2)) for f in re.split(r"[\r\n]", err) if (m := pattern.match(f))]


@pytest.fixture
def redraw_every_update(monkeypatch):
    import tqdm.std  # tqdm redraws at most every 0.1 s; here on every update, so each step can be seen

    monkeypatch.setattr(tqdm.std.tqdm, "__init__", functools.partialmethod(tqdm.std.tqdm.__init__, mininterval=0))


def test_guided_gradcam_has_one_bar_through_both_passes(tmp_path, capsys, redraw_every_update):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    model.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    images = []
    for i in range(3):
        images.append(str(tmp_path / f"p{i}.png"))
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(images[-1])
    # 3 images in one chunk: the CAM and guided backpropagation are two loops over the samples
    assert main(["explain", str(tmp_path / "m.keras"), *images, "--method", "guided_gradcam",
                 "--out", str(tmp_path / "out")]) == 0
    frames = _frames(capsys.readouterr().err, "guided_gradcam")
    percents = [p for p, _ in frames]
    assert percents == sorted(percents) and percents[-1] == 100, frames  # never back to 0 under the same label
    assert 50 in percents, frames  # the first pass ends half way
    assert all(re.fullmatch(r"\d+/3", count) for _, count in frames), frames  # whole images only
    assert ("50", "1/3") in {(str(p), c) for p, c in frames}  # 1.5 images' work done: 1 whole image


def test_scope_splits_declared_passes_and_outer_loops_cover_them():
    seen: list[float] = []
    with progress_scope(4, "two passes", lambda e: seen.append(e.done), passes=2):
        for _ in chunk_ranges(4, 2):
            pass
        for _ in chunk_ranges(4, 2):
            pass
    assert seen == [1.0, 2.0, 3.0, 4.0]
    seen.clear()
    with progress_scope(4, "outer loop", lambda e: seen.append(e.done), passes=2):
        for _ in chunk_ranges(4, 2):  # the method's loop over chunks of samples, each running both passes
            for _ in chunk_ranges(2, 2):
                pass
            for _ in chunk_ranges(2, 2):
                pass
    assert seen == [2.0, 4.0]


def test_bar_counts_whole_samples():
    out = io.StringIO()
    bar = new_bar(8, "whole", file=out, mininterval=0)
    bar.update(7.11)
    bar.refresh()
    bar.close()
    assert "89%" in out.getvalue() and " 7/8 " in out.getvalue() and "7.11" not in out.getvalue()
