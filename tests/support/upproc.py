"""``dcpkv cluster up`` as an operator runs it, for the tests: the real command in a folder,
its children found by the PID and port files it writes, its status over the admin API."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dcpkv.cluster.admin_client import admin_answer
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from support.kvclient import KVClient

VBUCKETS = 16


@contextmanager
def cluster_up(
    tmp_path: Path, *args: str, ready: str = "manager"
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``cluster up ARGS`` in ``tmp_path/cluster``, until ``ready``'s port file exists;
    its stderr goes to ``up.err``; SIGTERM (by PID) at the end."""
    data = tmp_path / "cluster"
    argv = [
        sys.executable, "-m", "dcpkv.cli.main", "cluster", "up", "--vbuckets", str(VBUCKETS),
        "--data-dir", str(data), *args,
    ]  # fmt: skip
    with open(tmp_path / "up.err", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_until(lambda: (data / f"{ready}.port").exists(), proc, f"{ready}'s port")
        yield proc, data
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def wait_until(
    condition: Callable[[], bool],
    proc: subprocess.Popen[str],
    what: str,
    timeout_s: float = 60.0,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"cluster up exited ({proc.returncode}) waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pid_of(data: Path, name: str) -> int:
    return int((data / f"{name}.pid").read_text())


def port_of(data: Path, name: str) -> int:
    return int((data / f"{name}.port").read_text())


def api(data: Path, manager: str, path: str, method: str = "GET", **params: str) -> Any:
    """``manager``'s answer; None while it does not answer."""
    try:
        url = f"http://127.0.0.1:{port_of(data, manager)}"
    except (OSError, ValueError):
        return None
    return admin_answer(url, method, path, params=params or None)


def status(data: Path, manager: str = "manager") -> dict[str, Any] | None:
    doc: dict[str, Any] | None = api(data, manager, "/pools/default")
    return doc


def write_and_read(ports: list[int], key: bytes, value: bytes) -> None:
    """Write ``key`` on the node holding its vbucket active (the others refuse), read it."""
    vb = vbucket_for_key(key, VBUCKETS)
    written = []
    for port in ports:
        with KVClient(port) as kv:
            assert kv.login().status == Status.Success
            if kv.set(key, value, vbucket=vb).status == Status.Success:
                assert bytes(kv.get(key, vbucket=vb).value) == value
                written.append(port)
    assert len(written) == 1, f"{key!r} (vb {vb}) written on {written}"


def read(ports: list[int], key: bytes) -> bytes:
    """``key``'s value from the node holding its vbucket active."""
    vb = vbucket_for_key(key, VBUCKETS)
    for port in ports:
        with KVClient(port) as kv:
            assert kv.login().status == Status.Success
            frame = kv.get(key, vbucket=vb)
            if frame.status == Status.Success:
                return bytes(frame.value)
    raise AssertionError(f"no node serves {key!r} (vb {vb})")
