"""A real ``dcpkv manager`` subprocess on a free port (``--port 0`` and a port file), and a
whole cluster of them: managed data nodes seeded into one manager (``start_cluster``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from dcpkv.cluster.admin_client import admin_request
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from dcpkv.core.status import Status
from support.kvclient import KVClient
from support.serverproc import ServerProcess, tracked_servers

VBUCKETS = 16


class ManagerProcess(ServerProcess):
    """Started like a server (and stopped the same way, by PID), with the manager's flags."""

    def command(self, port: str, port_file: Path) -> list[str]:
        return [
            sys.executable, "-m", "dcpkv.cli.main", "manager", "--port", port,
            "--data-dir", str(self.data_dir), "--port-file", str(port_file), *self.extra,
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        """Run ``dcpkv <args> --url <this manager>``; its output (it must succeed)."""
        argv = [sys.executable, "-m", "dcpkv.cli.main", *args, "--url", self.url]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def api(self, method: str, path: str, **params: str) -> dict[str, Any]:
        return admin_request(
            self.url,
            method,
            path,
            user=DEFAULT_USER,
            password=DEFAULT_PASSWORD,
            params=params or None,
        )


def tracked_managers() -> AbstractContextManager[type[ManagerProcess]]:
    """Managers reaped by PID on exit, as ``tracked_servers`` reaps servers."""
    return tracked_servers(ManagerProcess)


class Cluster:
    def __init__(self, nodes: list[ServerProcess], manager: ManagerProcess) -> None:
        self.nodes = nodes
        self.manager = manager

    def name(self, node: ServerProcess) -> str:
        return f"127.0.0.1:{node.port}"

    def node(self, name: str) -> ServerProcess:
        return next(n for n in self.nodes if self.name(n) == name)

    def status(self) -> dict[str, Any]:
        return self.manager.api("GET", "/pools/default")


def start_cluster(
    servers: type[ServerProcess],
    managers: type[ManagerProcess],
    tmp: Path,
    *,
    nodes: int,
    replicas: int,
    num_vbuckets: int = VBUCKETS,
    node_args: tuple[str, ...] = (),
    manager_args: tuple[str, ...] = (),
) -> Cluster:
    """``node_args``, ``manager_args``: more flags for every node, for the manager."""
    started = []
    for i in range(nodes):
        node = servers(
            tmp / f"n{i}",
            tmp / f"n{i}.log",
            "--managed",
            "--vbuckets",
            str(num_vbuckets),
            *node_args,
        )
        node.start()
        started.append(node)
    seeds = [arg for n in started for arg in ("--node", f"127.0.0.1:{n.port}")]
    manager = managers(
        tmp / "manager",
        tmp / "manager.log",
        "--replicas",
        str(replicas),
        "--vbuckets",
        str(num_vbuckets),
        *seeds,
        *manager_args,
    )
    manager.start()
    return Cluster(started, manager)


def client(node: ServerProcess) -> KVClient:
    kv = KVClient(node.port)
    assert kv.login().status == Status.Success
    return kv


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.05)
