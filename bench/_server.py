"""A fresh ``dcpkv server`` subprocess for a benchmark: temp data dir, free port, always
stopped (SIGTERM, then SIGKILL) and cleaned up."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 60.0


@contextmanager
def bench_server(
    vbuckets: int, *extra: str, label: str = "bench", data_dir: Path | None = None
) -> Iterator[int]:
    """Yield the port of a server on ``data_dir`` (a fresh temp dir when None)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"dcpkv-bench-{label}-"))
    data = data_dir if data_dir is not None else tmp / "data"
    port_file = tmp / "port"
    cmd = [
        sys.executable, "-m", "dcpkv.cli.main", "server", "--port", "0",
        "--data-dir", str(data), "--port-file", str(port_file),
        "--vbuckets", str(vbuckets), *extra,
    ]  # fmt: skip
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None:
                raise SystemExit(f"server exited {proc.returncode}: {tmp / 'server.log'}")
            if time.monotonic() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.05)
        yield int(port_file.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
