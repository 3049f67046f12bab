"""Real etcd members (Debian's etcd 3.4) on free loopback ports, stopped by PID at teardown;
a test that needs them skips, saying what to install, when etcd is missing."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dcpkv.cluster.etcd_members import Member, endpoints, free_port, member_argv


def require_etcd() -> None:
    if shutil.which("etcd") is None:
        pytest.skip("etcd is missing: install Debian's etcd-server (make test does as root)")


class EtcdCluster:
    def __init__(self, root: Path, size: int) -> None:
        self.members = [
            Member(f"etcd{i}", free_port(), free_port(), root / f"etcd{i}") for i in range(size)
        ]
        self.logs = {m.name: root / f"{m.name}.log" for m in self.members}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def endpoints(self) -> str:
        return endpoints(self.members)

    def start(self, member: Member) -> None:
        with open(self.logs[member.name], "ab") as log:
            self.procs[member.name] = subprocess.Popen(
                member_argv(member, self.members), stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, process_group=0,
            )  # fmt: skip

    def healthy(self, member: Member) -> bool:
        url = f"http://127.0.0.1:{member.client_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(json.load(answer).get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for member in self.members:
            while not self.healthy(member):
                proc = self.procs[member.name]
                assert proc.poll() is None, self.logs[member.name].read_text()[-2000:]
                assert time.monotonic() < deadline, f"{member.name} is not healthy"
                time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def etcd_cluster(root: Path, size: int) -> Iterator[EtcdCluster]:
    require_etcd()
    cluster = EtcdCluster(root, size)
    try:
        for member in cluster.members:
            cluster.start(member)
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop()
