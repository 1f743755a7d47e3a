"""The peers' virtual environment: tf-keras-vis, Xplique and tf-explain on kerascope's own TensorFlow.

It is created with ``--system-site-packages`` (so every library runs on the very same
TensorFlow / Keras / numpy as kerascope) and a constraints file pinning those three to the
installed versions, so that installing a peer cannot swap them. Each peer is installed
separately from PyPI; what installed (with its version) and what did not (with pip's last
error lines) is recorded in ``bench/peers-env.json``. ``python -m bench --setup-peers``
creates it; scenarios registered with ``venv="peers"`` run with its interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("KERASCOPE_PEERS_VENV", Path.home() / ".cache" / "kerascope" / "peers-venv"))
RECORD = HERE / "peers-env.json"
PEERS = {"tf-keras-vis": "tf_keras_vis", "xplique": "xplique", "tf-explain": "tf_explain"}


def python() -> Path:
    """The peers' interpreter."""
    return VENV / "bin" / "python"


def inside() -> bool:
    """Whether this process runs in the peers' environment."""
    return Path(sys.prefix).resolve() == VENV.resolve()


def setup() -> None:
    """Create the venv (if missing), install each peer under the pins, write ``bench/peers-env.json``."""
    import importlib.metadata as md

    if not python().exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
    pins = {name: md.version(name) for name in ("tensorflow", "keras", "numpy")}
    constraints = VENV / "constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in pins.items()))
    record: dict[str, Any] = {"pinned": pins, "python": sys.version.split()[0], "peers": {}}
    for package in PEERS:
        proc = subprocess.run(
            [str(python()), "-m", "pip", "install", "-q", "-c", str(constraints), package],
            capture_output=True, text=True,
        )
        if proc.returncode == 0:
            version = subprocess.run(
                [str(python()), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                capture_output=True, text=True,
            ).stdout.strip()
            record["peers"][package] = {"installed": True, "version": version}
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
            record["peers"][package] = {"installed": False, "pip_error": tail}
        print(package, record["peers"][package])
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RECORD}")
