"""A ``dcpkv server`` subprocess owned by a job: start, wait until it listens, stop cleanly.

Theory of operation
-------------------
The main job brings up one node the way a user would (``dcpkv server``), as a child process:
the server keeps its own event loop and signal handling, and a crash of the job's Spark side
cannot take the data down with it. The server is started with ``--port-file`` and the job
waits for that file (the server writes it once listening, after warm-up), watching for an
early exit, whose log tail then explains why (port taken, bucket locked by another server).

A port already answering is reported before anything starts, with the two ways out (stop the
other server, or ``--port``). Port 0 lets the server pick a free one.

The child runs in its own process group, so a Ctrl-C at the terminal (SIGINT to the whole
foreground group) reaches only the job, which then stops its writers and queries *before*
the server; the server gets SIGTERM last and does its clean shutdown (final flush, clean
shutdown marker). On Linux the child also asks for SIGTERM if the job dies without stopping
it (``PR_SET_PDEATHSIG``), so a ``kill -9`` of the job leaves no orphaned server behind.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dcpkv.core.children import die_with_parent
from dcpkv.core.defaults import DEFAULT_HOST, DEFAULT_PORT
from dcpkv.core.errors import DcpkvError

START_TIMEOUT_S = 120.0  # a big bucket's warm-up happens before the port is bound
STOP_TIMEOUT_S = 60.0  # the final flush of everything still in memory


class NodeStartError(DcpkvError, RuntimeError):
    """The server could not be started; the message says why and what to do."""


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port`` right now."""
    if port == 0:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


class LocalNode:
    """One ``dcpkv server`` child process on ``host:port`` with its data in ``data_dir``."""

    def __init__(
        self, data_dir: Path, log_path: Path, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
        num_vbuckets: int = 1024,
    ) -> None:  # fmt: skip
        self.data_dir = data_dir
        self.log_path = log_path
        self.host = host
        self.port = port
        self.num_vbuckets = num_vbuckets
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> int:
        """Start the server and wait until it listens; the bound port."""
        if port_in_use(self.host, self.port):
            raise NodeStartError(
                f"port {self.port} on {self.host} is already taken (another dcpkv server?): "
                "stop it, or pick another port with --port"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        port_file = self.log_path.with_name("server.port")
        port_file.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "dcpkv.cli.main", "server", "--host", self.host,
            "--port", str(self.port), "--port-file", str(port_file),
            "--data-dir", str(self.data_dir), "--vbuckets", str(self.num_vbuckets),
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, process_group=0,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        self._wait_for(port_file)
        self.port = int(port_file.read_text())
        return self.port

    def _wait_for(self, port_file: Path) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise NodeStartError(
                    f"the server exited with status {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise NodeStartError(f"the server did not start in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM, wait for the clean shutdown (SIGKILL only past the timeout); the exit
        status, or None when it was not running."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
