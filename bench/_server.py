"""A fresh ``dcpkv server`` subprocess for a benchmark: temp data dir, free port, always
stopped (SIGTERM, then SIGKILL) and cleaned up."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import _placement

START_TIMEOUT_S = 60.0


@contextmanager
def bench_server(
    vbuckets: int, *extra: str, label: str = "bench", data_dir: Path | None = None
) -> Iterator[int]:
    """Yield the port of a server on ``data_dir`` (a fresh temp dir when None)."""
    with bench_server_proc(vbuckets, *extra, label=label, data_dir=data_dir) as (port, _pid):
        yield port


@contextmanager
def bench_server_proc(
    vbuckets: int, *extra: str, label: str = "bench", data_dir: Path | None = None
) -> Iterator[tuple[int, int]]:
    """:func:`bench_server`, yielding the server's PID too: (port, pid)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"dcpkv-bench-{label}-"))
    data = data_dir if data_dir is not None else tmp / "data"
    port_file = tmp / "port"
    cmd = [
        sys.executable, "-m", "dcpkv.cli.main", "server", "--port", "0",
        "--data-dir", str(data), "--port-file", str(port_file),
        "--vbuckets", str(vbuckets), *extra,
    ]  # fmt: skip
    with open(tmp / "server.log", "wb") as log, _placement.servers():
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None:
                raise SystemExit(f"server exited {proc.returncode}: {tmp / 'server.log'}")
            if time.monotonic() > deadline:
                raise SystemExit("server did not start")
            time.sleep(0.05)
        yield int(port_file.read_text()), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, all its threads (Linux /proc; 0.0
    elsewhere): on a shared machine a server's CPU per operation swings much less than its
    wall-clock rate."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """A process's resident set (Linux ``/proc/PID/status`` ``VmRSS``; 0.0 elsewhere), MiB."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in lines if line.startswith("VmRSS:")), 0.0)


def folder_bytes(folder: Path) -> int:
    """The size of every file under ``folder`` (a RocksDB bucket is a folder of its own)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def disk_bytes_written(pid: int) -> int:
    """Bytes a process has had written to storage so far (Linux ``/proc/PID/io``
    ``write_bytes``: what reaches the disk, page cache write-back included; 0 elsewhere)."""
    try:
        lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    except OSError:
        return 0
    fields = dict(line.split(": ", 1) for line in lines)
    return int(fields.get("write_bytes", 0))
