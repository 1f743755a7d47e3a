"""Progress moves after every chunk of every method, without the methods knowing about it.

A real run: the one chunker reports to the active progress scope, so a callback (the API's
``progress=``) and the CLI's bar on standard error advance many times within one method,
and ``--quiet`` prints no bar at all.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

import kerascope as ks
from kerascope.cli import main
from kerascope.core.progress import progress_scope
from kerascope.numeric.chunking import active_listener, chunk_ranges


def tiny(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)], name="tiny")


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(0).random((4, 16, 16, 3)).astype(np.float32)


def test_scope_maps_the_outer_loop_onto_samples_and_ignores_nested_loops():
    seen = []
    with progress_scope(2, "t", seen.append):
        for _ in chunk_ranges(8, 4):  # 2 samples x 4 variants, 4 rows a chunk
            assert active_listener() is not None
            for _ in chunk_ranges(4, 1):  # the engine's loop inside one chunk: not counted
                pass
    assert [e.done for e in seen] == [1.0, 2.0] and all(e.total == 2 for e in seen)
    assert active_listener() is None  # the scope is gone afterwards
    with progress_scope(2, "off", False):
        assert active_listener() is None  # disabled: nothing listens, nothing is printed


@pytest.mark.parametrize("method, params", [
    ("smoothgrad", {"samples": 8}), ("integratedgradients", {"steps": 8}), ("rise", {"masks": 16}),
    ("occlusion", {"window": (8, 8), "stride": (4, 4)}), ("scorecam", {}), ("kernelshap", {"samples": 16}),
])
def test_api_progress_callback_advances_per_chunk(x, method, params):
    model = tiny()
    events = []
    explained = ks.explain(model, x, method=method, batch_size=4, progress=events.append, **params)
    quiet = ks.explain(model, x, method=method, batch_size=4, **params)
    np.testing.assert_allclose(explained.attributions, quiet.attributions, rtol=1e-5, atol=1e-6)  # same result
    main_pass = [e.done for e in events][1:]  # the first event is the one-chunk clean pass
    assert len(main_pass) >= 3, events  # several chunks, each one a step
    assert main_pass == sorted(main_pass) and main_pass[-1] == pytest.approx(4.0)
    assert all(e.total == 4 and e.description == explained.method for e in events)
    assert all(e.rate >= 0 for e in events)


def _pictures(folder: Path, count: int = 3) -> list[str]:
    rng = np.random.default_rng(1)
    paths = []
    for i in range(count):
        path = folder / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def test_cli_bars_move_within_a_method_and_quiet_prints_none(tmp_path, capsys, monkeypatch):
    model_file = tmp_path / "m.keras"
    tiny().save(model_file)
    images = _pictures(tmp_path)
    argv = ["explain", str(model_file), *images, "--method", "smoothgrad,gradcam", "--param", "samples=8",
            "--batch-size", "4", "--out", str(tmp_path / "out")]
    batch = ["batch", str(model_file), str(tmp_path), "--method", "smoothgrad", "--param", "samples=8",
             "--batch-size", "2", "--out", str(tmp_path / "run")]
    # tqdm redraws at most every 0.1 s; here on every update, so each chunk's step can be seen
    import tqdm.std

    monkeypatch.setattr(tqdm.std.tqdm, "__init__", functools.partialmethod(tqdm.std.tqdm.__init__, mininterval=0))
    assert main(argv) == 0
    explain_err = capsys.readouterr().err
    assert main(batch) == 0
    batch_err = capsys.readouterr().err
    frames = re.split(r"[\r\n]", explain_err)
    smooth = {int(m.group(1)) for f in frames if (m := re.match(r"smoothgrad \(1/2\):\s+(\d+)%", f))}
    assert len(smooth) >= 4, explain_err  # 3 images x 8 noise draws in chunks of 4 rows: many steps
    assert any(re.search(r"\d+(\.\d+)?img/s", f) for f in frames if f.startswith("smoothgrad"))
    assert any(f.startswith("gradcam (2/2):") for f in frames)
    assert explain_err.index("preprocessing: unit") < explain_err.index("smoothgrad (1/2):")
    # batch: 3 images in batches of 2 (2 + 1), each batch 8 chunks of noise draws: the bar moves inside
    steps = {int(m.group(1)) for f in re.split(r"[\r\n]", batch_err)
             if (m := re.match(r"kerascope batch:\s+(\d+)%", f))}
    assert len(steps - {0, 67, 100}) >= 2, batch_err

    assert main([*argv[:-1], str(tmp_path / "quiet"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_evaluate_bar_moves_per_chunk_in_each_phase(tmp_path):
    model = tiny()
    events = []
    images = np.random.default_rng(2).random((4, 16, 16, 3)).astype(np.float32)
    masks = np.zeros((4, 16, 16), bool)
    masks[:, 4:12, 4:12] = True
    from kerascope.evaluation import benchmark

    benchmark(model, images, masks, None, ["smoothgrad"], steps=4, sanity_images=0, batch_size=4,
              baselines=False, progress=events.append)
    phases = {e.description for e in events}
    assert phases == {"smoothgrad: explain", "smoothgrad: deletion", "smoothgrad: insertion"}
    assert sum(e.description == "smoothgrad: explain" for e in events) >= 3
