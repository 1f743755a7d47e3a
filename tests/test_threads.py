"""BLAS threading is limited during explanations and restored afterwards (also after errors)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from threadpoolctl import threadpool_info

import kerascope as ks
from kerascope.core.threads import single_threaded_blas


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_single_threaded_blas_limits_and_restores():
    before = _blas_threads()
    assert before, "numpy's BLAS should be visible to threadpoolctl"
    with single_threaded_blas():
        assert _blas_threads() == [1] * len(before)
    assert _blas_threads() == before
    with pytest.raises(RuntimeError), single_threaded_blas():
        raise RuntimeError("boom")
    assert _blas_threads() == before


def test_explain_runs_with_one_blas_thread(monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    seen: list[list[int]] = []
    original = ks.Saliency._explain

    def recording(self, inputs, targets):
        seen.append(_blas_threads())
        return original(self, inputs, targets)

    monkeypatch.setattr(ks.Saliency, "_explain", recording)
    before = _blas_threads()
    ks.Saliency(model).explain(np.ones((2, 3), "float32"), targets=0)
    assert seen == [[1] * len(before)]
    assert _blas_threads() == before


def test_blas_threads_can_be_left_alone(monkeypatch):
    monkeypatch.setenv("KERASCOPE_BLAS_THREADS", "keep")
    before = _blas_threads()
    with single_threaded_blas():
        assert _blas_threads() == before
