"""``dcpkv cluster up`` as an operator runs it: a real command, its real children, signals
sent by PID. Its processes are siblings: one's death takes no other with it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from support.kvclient import KVClient
from support.upproc import cluster_up, pid_of, port_of, status, wait_until, write_and_read


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    with cluster_up(tmp_path, "--nodes", "2", "--replicas", "1") as started:
        yield started


def test_a_killed_manager_takes_no_node_down_and_comes_back(
    up: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, data = up
    ports = [port_of(data, f"node{i}") for i in range(2)]
    wait_until(lambda: status(data) is not None, proc, "the manager's status")
    write_and_read(ports, b"before", b"1")
    killed = pid_of(data, "manager")
    os.kill(killed, signal.SIGKILL)
    for i in range(20):  # the nodes serve while no manager runs, and after
        write_and_read(ports, f"during-{i}".encode(), b"2")
    wait_until(lambda: pid_of(data, "manager") != killed, proc, "a new manager")
    wait_until(lambda: status(data) is not None, proc, "the restarted manager's status")
    doc = status(data)
    assert doc is not None
    nodes = doc["nodes"]
    assert len(nodes) == 2
    assert {n["clusterMembership"] for n in nodes} == {"active"}
    assert doc["buckets"][0]["rev"] == 1
    write_and_read(ports, b"after", b"3")
    assert proc.poll() is None
    assert "manager exited (-9); starting it again" in (tmp_path / "up.err").read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    for port in ports:  # and Ctrl-C still stops every node
        with pytest.raises(OSError):
            KVClient(port, timeout=2)


def test_a_dead_node_is_reported_and_the_rest_keeps_running(
    up: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, data = up
    wait_until(lambda: status(data) is not None, proc, "the manager's status")
    os.kill(pid_of(data, "node1"), signal.SIGKILL)
    err = tmp_path / "up.err"
    wait_until(lambda: "node1 exited (-9)" in err.read_text(), proc, "the report")
    assert status(data) is not None  # the manager stays
    with KVClient(port_of(data, "node0")) as kv:
        assert kv.login().status == Status.Success
