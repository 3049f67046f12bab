"""A real ``dcpkv server`` subprocess on a free port (``--port 0`` and a port file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

START_TIMEOUT_S = 30.0


class ServerProcess:
    def __init__(self, data_dir: Path, log_path: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.tls_port = 0

    def start(self, *, same_port: bool = False) -> int:
        """Start (again) on a free port, or on the previous one (clients with a fixed address,
        such as a running Spark query, reconnect to the restarted server)."""
        port = str(self.port) if same_port and self.port else "0"
        port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        port_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(port, port_file), stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {self.log()}")
            time.sleep(0.02)
        ports = port_file.read_text().split()
        self.port = int(ports[0])
        self.tls_port = int(ports[1]) if len(ports) > 1 else 0
        return self.port

    def command(self, port: str, port_file: Path) -> list[str]:
        return [
            sys.executable, "-m", "dcpkv.cli.main", "server", "--port", port,
            "--data-dir", str(self.data_dir), "--port-file", str(port_file),
            "--vbuckets", "16", *self.extra,
        ]  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> int:
        """SIGTERM and wait: the exit code. A server that does not stop is a defect: it is
        killed, and the error carries the end of its log."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"no exit 30 s after SIGTERM; log:\n{self.log()[-4000:]}"
            ) from None

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def reap(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


P = TypeVar("P", bound=ServerProcess)


@contextmanager
def tracked_servers(base: type[P] = ServerProcess) -> Iterator[type[P]]:  # type: ignore[assignment]
    """A ServerProcess class (``base`` or a subclass, e.g. the manager's) whose every started
    instance is reaped (by PID) on exit: the one teardown rule of every test folder's
    ``server_factory`` fixture."""
    started: list[ServerProcess] = []

    class Tracked(base):  # type: ignore[valid-type,misc]
        def start(self, *, same_port: bool = False) -> int:
            if self not in started:
                started.append(self)
            return super().start(same_port=same_port)

    try:
        yield Tracked  # type: ignore[misc]
    finally:
        for proc in started:
            proc.reap()


@pytest.fixture
def server_factory() -> Iterator[type[ServerProcess]]:
    """:class:`ServerProcess`, every instance started through it reaped at teardown; a test
    folder's conftest imports it to have the fixture."""
    with tracked_servers() as factory:
        yield factory


@pytest.fixture
def server(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    """One server started in the test's temporary folder."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log")
    srv.start()
    return srv
