"""``dcpkv cluster up`` as an operator runs it: a real command, its real children, signals
sent by PID. Its processes are siblings: one's death takes no other with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvclient import KVClient

from dcpkv.cluster.admin_client import AdminError, admin_request
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key

VBUCKETS = 16


@pytest.fixture
def cluster_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``cluster up --nodes 2`` in ``tmp_path/cluster``; its stderr goes to ``up.err``."""
    data = tmp_path / "cluster"
    argv = [
        sys.executable, "-m", "dcpkv.cli.main", "cluster", "up", "--nodes", "2",
        "--replicas", "1", "--vbuckets", str(VBUCKETS), "--data-dir", str(data),
    ]  # fmt: skip
    with open(tmp_path / "up.err", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_until(lambda: (data / "manager.port").exists(), proc, "the manager's port")
        yield proc, data
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def wait_until(
    condition: object, proc: subprocess.Popen[str], what: str, timeout_s: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert proc.poll() is None, f"cluster up exited ({proc.returncode}) waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pid_of(data: Path, name: str) -> int:
    return int((data / f"{name}.pid").read_text())


def status(data: Path) -> dict[str, object] | None:
    """The manager's status; None while it does not answer."""
    try:
        url = f"http://127.0.0.1:{(data / 'manager.port').read_text()}"
        return admin_request(
            url, "GET", "/pools/default", user=DEFAULT_USER, password=DEFAULT_PASSWORD
        )
    except (OSError, ValueError, AdminError):
        return None


def write_and_read(ports: list[int], key: bytes, value: bytes) -> None:
    """Write ``key`` on the node holding its vbucket active (the other refuses), read it back."""
    vb = vbucket_for_key(key, VBUCKETS)
    written = []
    for port in ports:
        with KVClient(port) as kv:
            assert kv.login().status == Status.Success
            if kv.set(key, value, vbucket=vb).status == Status.Success:
                assert bytes(kv.get(key, vbucket=vb).value) == value
                written.append(port)
    assert len(written) == 1, f"{key!r} (vb {vb}) written on {written}"


def test_a_killed_manager_takes_no_node_down_and_comes_back(
    cluster_up: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, data = cluster_up
    ports = [int((data / f"node{i}.port").read_text()) for i in range(2)]
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
    assert isinstance(nodes, list) and len(nodes) == 2
    assert {n["clusterMembership"] for n in nodes} == {"active"}
    assert doc["buckets"][0]["rev"] == 1  # type: ignore[index]
    write_and_read(ports, b"after", b"3")
    assert proc.poll() is None
    assert "manager exited (-9); starting it again" in (tmp_path / "up.err").read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    for port in ports:  # and Ctrl-C still stops every node
        with pytest.raises(OSError):
            KVClient(port, timeout=2)


def test_a_dead_node_is_reported_and_the_rest_keeps_running(
    cluster_up: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    proc, data = cluster_up
    wait_until(lambda: status(data) is not None, proc, "the manager's status")
    os.kill(pid_of(data, "node1"), signal.SIGKILL)
    err = tmp_path / "up.err"
    wait_until(lambda: "node1 exited (-9)" in err.read_text(), proc, "the report")
    assert status(data) is not None  # the manager stays
    with KVClient(int((data / "node0.port").read_text())) as kv:
        assert kv.login().status == Status.Success
