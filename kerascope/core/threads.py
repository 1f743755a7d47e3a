"""Keep numpy's BLAS single-threaded while kerascope runs the backend's compiled passes.

kerascope's numpy work between compiled passes is small (reductions over a
chunk, bilinear resizing, an SVD per sample). With a multi-threaded
OpenBLAS, each such call leaves its worker threads spinning for a while
afterwards, and they compete for the cores with the next TensorFlow / JAX /
PyTorch pass: measured on 2 cores, Occlusion's forward passes took 60-88 ms
instead of 45 ms, and an SVD on a loaded machine 250x longer. Inside
:func:`single_threaded_blas` BLAS libraries already loaded by the process run
on one thread; the previous settings are restored on exit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

_controller: Any = None


def _get_controller() -> Any:
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # optional at run time: without it, nothing is limited
            _controller = False
        else:
            _controller = ThreadpoolController()
    return _controller


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit BLAS libraries (numpy's OpenBLAS, ...) to one thread inside the block.

    Set ``KERASCOPE_BLAS_THREADS=keep`` to leave BLAS threading alone.
    The controller is created once per process (inspecting the loaded
    libraries takes milliseconds; entering the block then takes microseconds).

    Example:
        >>> import numpy as np
        >>> with single_threaded_blas():
        ...     float((np.ones((2, 2)) @ np.ones((2, 2)))[0, 0])
        2.0
    """
    controller = None if os.environ.get("KERASCOPE_BLAS_THREADS") == "keep" else _get_controller()
    if not controller:
        yield
        return
    with controller.limit(limits=1, user_api="blas"):
        yield
