"""Where the peer benchmarks are and which Python runs them.

The peer scripts live in ``shared/peerbench/`` beside the repository (``$PEERBENCH`` overrides).
They need ``redis`` and ``hiredis``, which the project's venv does not install, so they run
under the first Python that imports both: ``.venv-peers/`` (``bench/install_peers.sh``, which
``make bench`` runs, installs the pinned ``bench/peers-requirements.txt`` there), then this
Python, then the system's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

PEERBENCH = Path(
    os.environ.get("PEERBENCH", Path(__file__).resolve().parents[2] / "shared" / "peerbench")
)
PEERS_VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "python"


@cache
def peer_python() -> str | None:
    """A Python that imports redis and hiredis, or None."""
    for exe in (
        str(PEERS_VENV_PYTHON),
        sys.executable,
        shutil.which("python3"),
        "/usr/bin/python3",
    ):
        if exe is None or not Path(exe).exists():
            continue
        probe = subprocess.run([exe, "-c", "import redis, hiredis"], capture_output=True)
        if probe.returncode == 0:
            return exe
    return None
