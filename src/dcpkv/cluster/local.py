"""``dcpkv cluster up``: a whole cluster on this machine for development and tests.

Theory of operation
-------------------
Like Couchbase's ``cluster_run``: N ``dcpkv server --managed`` processes and one
``dcpkv manager`` over them, each a child process of this one, every file under one folder::

    D/node0/  D/node0.log  D/node0.port     (the data node's folder, log, bound port)
    ...
    D/manager/cluster.json  D/manager.log  D/manager.port

Ports are free ones picked by the kernel (``--port 0`` and a port file); a second ``up`` on
the same folder reuses the ports the files name, so the saved configuration still addresses
its nodes. The nodes start first; the manager gets them as seeds (it ignores them when its
folder already holds a configuration). ``up`` then prints where everything is and waits.
SIGINT or SIGTERM stops the manager, then the nodes, each by its PID: SIGTERM, and SIGKILL
after a grace period; if the manager exits by itself, the nodes are stopped too. The children
run in their own process group (a terminal's Ctrl-C reaches only the parent, which stops them
in that order) and get SIGTERM if the parent dies (:func:`~dcpkv.core.children.die_with_parent`).

A job that injects faults (``dcpkv demo --chaos``) kills one child with :meth:`Child.kill9`
and brings it back on the same port with :meth:`Child.restart`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dcpkv.core.children import die_with_parent
from dcpkv.core.errors import DcpkvError

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0


class LocalClusterError(DcpkvError, RuntimeError):
    """A process of the local cluster did not start."""


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    port_file: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, process_group=0,
                preexec_fn=die_with_parent,
            )  # fmt: skip

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL (a crash: no final flush), by PID; waits for the exit."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def restart(self, deadline: float) -> int:
        """Start again on the port it had (the cluster configuration names it); the port."""
        if self.port and "--port" in self.argv:
            self.argv[self.argv.index("--port") + 1] = str(self.port)
        self.start()
        return self.wait_port(deadline)

    def wait_port(self, deadline: float) -> int:
        assert self.proc is not None
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise LocalClusterError(
                    f"{self.name} exited with {self.proc.returncode}; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                raise LocalClusterError(f"{self.name} did not start; see {self.log_path}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        return self.port

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace period; by PID, this child only."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class LocalCluster:
    data_dir: Path
    nodes: int
    replicas: int
    vbuckets: int = 1024
    manager_port: int = 0
    host: str = "127.0.0.1"
    children: list[Child] = field(default_factory=list)

    def _previous_port(self, name: str) -> int:
        try:
            return int((self.data_dir / f"{name}.port").read_text())
        except (OSError, ValueError):
            return 0

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dcpkv.cli.main", *args]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        node_children = []
        for i in range(self.nodes):
            name = f"node{i}"
            argv = self._cli(
                "server",
                "--managed",
                "--host",
                self.host,
                "--port",
                str(self._previous_port(name)),
                "--port-file",
                str(self.data_dir / f"{name}.port"),
                "--data-dir",
                str(self.data_dir / name),
                "--vbuckets",
                str(self.vbuckets),
            )
            node_children.append(self._child(name, argv))
        for child in node_children:
            child.wait_port(deadline)
        seeds = [arg for c in node_children for arg in ("--node", f"{self.host}:{c.port}")]
        port = self.manager_port or self._previous_port("manager")
        argv = self._cli(
            "manager",
            "--host",
            self.host,
            "--port",
            str(port),
            "--port-file",
            str(self.data_dir / "manager.port"),
            "--data-dir",
            str(self.data_dir / "manager"),
            "--replicas",
            str(self.replicas),
            "--vbuckets",
            str(self.vbuckets),
            *seeds,
        )
        self._child("manager", argv).wait_port(deadline)

    def _child(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.data_dir / f"{name}.log", self.data_dir / f"{name}.port")
        self.children.append(child)
        child.start()
        return child

    @property
    def manager(self) -> Child:
        return next(c for c in self.children if c.name == "manager")

    @property
    def data_nodes(self) -> list[Child]:
        return [c for c in self.children if c.name != "manager"]

    @property
    def manager_url(self) -> str:
        return f"http://{self.host}:{self.manager.port}"

    def address(self, child: Child) -> str:
        """How the cluster names a data node: host:port."""
        return f"{self.host}:{child.port}"

    def describe(self, out: IO[str]) -> None:
        out.write(
            f"manager  http://{self.host}:{self.manager.port}/  (log {self.manager.log_path})\n"
        )
        for child in self.children:
            if child.name != "manager":
                out.write(f"{child.name:<8} {self.host}:{child.port}  (log {child.log_path})\n")
        out.write(f"pid {os.getpid()}: Ctrl-C or SIGTERM stops every process\n")
        out.flush()

    def wait(self) -> int:
        """Until a signal or the manager's exit: 0 on a signal, 1 if the manager died."""
        stopping = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stopping:
                if self.manager.proc is not None and self.manager.proc.poll() is not None:
                    return 1
                time.sleep(0.2)
            return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self) -> None:
        """The manager first (it must not see the nodes go and react), then the nodes."""
        for child in sorted(self.children, key=lambda c: c.name != "manager"):
            child.stop()
