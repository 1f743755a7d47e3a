"""Keep the command line's standard error for kerascope's own progress and messages.

TensorFlow, XLA and absl print start-up lines from C++ (``oneDNN custom
operations are on``, ``failed call to cuInit``, CPU-feature notes) straight to
file descriptor 2, before and regardless of ``TF_CPP_MIN_LOG_LEVEL``, and
Keras / TensorFlow emit Python warnings and retracing notices that say nothing
about the user's run. :func:`quiet_backends` routes descriptor 2 through a
filter that drops those known start-up lines and passes every other line on,
and silences the backends' Python loggers and warnings. ``--verbose`` (or the
user's own ``TF_CPP_MIN_LOG_LEVEL`` below 3) turns all of this off.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator

# lines C++ libraries print to descriptor 2 on start-up (absl's "I0000 12:00:00.000000 123 file.cc:12] ..."
# format, TensorFlow's older "2024-01-01 12:00:00.000000: I tensorflow/..." format, their continuations)
_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"
    r"|E\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\].*(cuda|cuInit|cuDNN|cuFFT|cuBLAS|TensorRT|factory for plugin)"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] "
    r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [IW] \d+ \d+\] \S+:\d+: "  # Ray's C++ core (info / warning)
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow"
    r"|WARNING: All log messages before absl::InitializeLog)",
)
# Python-side chatter of the backends: warnings issued from their modules, retracing notices
_WARNING_MODULES = r"(keras|tensorflow|tf_keras|absl|jax|jaxlib|torch|google\.protobuf)(\.|$)"
_LOGGERS = ("tensorflow", "absl", "jax", "jax._src.xla_bridge", "torch", "h5py")


def is_noise(line: str) -> bool:
    """True for a backend start-up line that the command line hides.

    Example:
        >>> is_noise("I0000 00:00:1796238164.456742   10963 port.cc:153] oneDNN custom operations are on.")
        True
        >>> is_noise("[2026-12-07 20:06:15,825 I 1387 1387] logging.cc:303: Set ray log level from environment")
        True
        >>> is_noise("kerascope explain: error: Unknown method.")
        False
    """
    return bool(_NOISE.match(line))


def copy_without_noise(source: Iterable[bytes], write: Callable[[bytes], object]) -> None:
    """Pass every line of ``source`` to ``write`` except the backends' start-up noise.

    :func:`filter_stdin` applies it to standard input (``scripts/test.sh`` pipes the test run's
    standard error through it: TensorFlow prints those lines to descriptor 2 before
    ``TF_CPP_MIN_LOG_LEVEL`` is read, in every process that imports it).

    Example:
        >>> kept = []
        >>> copy_without_noise([b"WARNING: All log messages before absl::InitializeLog() is called\\n", b"ok\\n"],
        ...                    kept.append)
        >>> kept
        [b'ok\\n']
    """
    for raw in source:
        if not is_noise(raw.decode("utf-8", "replace")):
            write(raw)


def wants_backend_logs(verbose: bool) -> bool:
    """True when the user asked for the backends' own logs (``--verbose`` or ``TF_CPP_MIN_LOG_LEVEL`` < 3).

    Example:
        >>> wants_backend_logs(True)
        True
    """
    if verbose:
        return True
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    return level is not None and level.strip() in {"0", "1", "2"}


class _Descriptor2Filter:
    """Routes file descriptor 2 through a pipe; a thread forwards every line that is not start-up noise."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self._saved_stderr = sys.stderr
        self._real = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        self._thread = threading.Thread(target=self._pump, args=(read_end,), daemon=True)
        self._thread.start()
        # Python's own writes (progress bars, messages) go straight to the real stream: no line buffering
        sys.stderr = io.TextIOWrapper(
            os.fdopen(os.dup(self._real), "wb", buffering=0), encoding=self._saved_stderr.encoding or "utf-8",
            errors="backslashreplace", write_through=True,
        )

    def _pump(self, read_end: int) -> None:
        with os.fdopen(read_end, "rb") as pipe:
            copy_without_noise(pipe, lambda raw: os.write(self._real, raw))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        sys.stderr = self._saved_stderr
        os.dup2(self._real, 2)  # closes the pipe's last write end: the thread reads to the end and stops
        self._thread.join(timeout=2)
        os.close(self._real)


@contextlib.contextmanager
def quiet_backends(verbose: bool = False) -> Iterator[None]:
    """Hide the deep-learning backends' start-up logs and warnings for the duration of a command.

    Every line that is not known start-up noise still reaches standard error,
    and kerascope's own warnings and errors are untouched. Inside a process
    whose standard error is captured (pytest, notebooks) only the Python-side
    filters apply.

    Example:
        >>> with quiet_backends():
        ...     pass
    """
    if wants_backend_logs(verbose):
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    fd_filter = None
    if sys.stderr is sys.__stderr__ and sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            sys.stderr.fileno()
            fd_filter = _Descriptor2Filter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=_WARNING_MODULES)
            warnings.filterwarnings("ignore", message=r"The structure of `inputs` doesn't match")
            yield
    finally:
        if fd_filter is not None:
            fd_filter.close()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def filter_stdin() -> None:
    """Copy standard input to standard output without the backends' start-up noise, line by line.

    Example (shell)::

        pytest tests 2> >(python -c "from kerascope.cli.quiet import filter_stdin; filter_stdin()" >&2)
    """
    out = sys.stdout.buffer

    def write(raw: bytes) -> None:
        out.write(raw)
        out.flush()

    copy_without_noise(sys.stdin.buffer, write)
