"""Several managers over etcd, as ``dcpkv cluster up --nodes 3`` runs them (real etcd
members, managers and nodes on free ports): one leads; kill -9 of the leader and, 2 s later,
of a data node: a manager takes the lead in a newer term and fails the node over; nothing written is
lost. The times are printed (``-s``), never asserted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.etcdproc import require_etcd
from support.upproc import (
    api,
    cluster_up,
    pid_of,
    port_of,
    read,
    status,
    wait_until,
    write_and_read,
)

MANAGERS = ["manager0", "manager1", "manager2"]


# a lease of 5 s, not the default 10: each test waits for a dead or stopped leader's lease to
# end; the keep-alive every 1.7 s leaves a loaded machine room
LEASE = ("--lease-ttl", "5")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    require_etcd()
    args = ("--nodes", "3", "--replicas", "1", *LEASE)
    with cluster_up(tmp_path, *args, ready="manager2") as started:
        yield started


def view(data: Path, managers: list[str]) -> dict[str, Any] | None:
    """The managers' view from the first of ``managers`` that answers."""
    for name in managers:
        doc = api(data, name, "/pools/default/managers")
        if doc is not None:
            return dict(doc)
    return None


def led(data: Path, managers: list[str], after: int = 0) -> bool:
    """Some manager leads, in a term after ``after``."""
    doc = view(data, managers)
    return doc is not None and doc["leader"] is not None and doc["term"] > after


def listed(data: Path, managers: list[str]) -> int:
    doc = view(data, managers)
    return 0 if doc is None else len(doc["managers"])


def failed_over(data: Path, managers: list[str], node: str) -> bool:
    for name in managers:
        doc = status(data, name)
        if doc is not None:
            return any(
                n["hostname"] == node and n["clusterMembership"] == "failed" for n in doc["nodes"]
            )
    return False


def test_a_new_leader_fails_over_a_node_killed_after_the_old_leader(
    up: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, data = up
    wait_until(lambda: led(data, MANAGERS) and listed(data, MANAGERS) == 3, proc, "a leader")
    first = view(data, MANAGERS)
    assert first is not None and first["etcd"]["healthy"]
    assert sorted(m[0] for m in first["managers"]) == MANAGERS
    leader, term = first["leader"], first["term"]
    follower = next(m for m in MANAGERS if m != leader)
    # a write to a follower is forwarded to the leader; every manager reads it back
    answer = api(data, follower, "/settings/autoFailover", "POST", enabled="true", timeout="5")
    assert answer == {"enabled": True, "timeout": 5, "count": 0, "maxCount": 1}
    for name in MANAGERS:
        assert api(data, name, "/settings/autoFailover")["enabled"] is True
    user = {"password": "secret1", "roles": "data_reader[default]"}
    assert api(data, follower, "/settings/rbac/users/local/ann", "PUT", **user) is not None
    ports = [port_of(data, f"node{i}") for i in range(3)]
    keys = [f"k{i}".encode() for i in range(32)]
    for key in keys:
        write_and_read(ports, key, key)
    wait_until(lambda: lag_is_zero(data, follower), proc, "the replicas to catch up")

    killed_node = "node2"
    node_name = f"127.0.0.1:{port_of(data, killed_node)}"
    start = time.monotonic()
    os.kill(pid_of(data, leader), signal.SIGKILL)
    time.sleep(2)
    os.kill(pid_of(data, killed_node), signal.SIGKILL)
    node_killed = time.monotonic()
    others = [m for m in MANAGERS if m != leader]
    # (the new leader is a survivor, or the killed one that cluster up started again)
    wait_until(lambda: led(data, others, after=term), proc, "a new leader", 120)
    new_lead = time.monotonic()
    wait_until(lambda: failed_over(data, others, node_name), proc, "the failover", 120)
    done = time.monotonic()
    print(
        f"\nleader {leader} killed; new leader after {new_lead - start:.1f} s; {node_name} "
        f"failed over {done - start:.1f} s after the leader's kill, "
        f"{done - node_killed:.1f} s after its own"
    )
    second = view(data, others)
    assert second is not None and second["term"] > term
    # the new leader failed the node over: its log says so (once the store holds it)
    said = f"failed over {node_name} automatically"
    wait_until(lambda: said in (data / f"{second['leader']}.log").read_text(), proc, "its log")
    survivors = ports[:2]
    for key in keys:  # nothing acknowledged is lost: the replicas were promoted
        assert read(survivors, key) == key
    doc = status(data, second["leader"])
    assert doc is not None and doc["buckets"][0]["placed"]
    users = api(data, second["leader"], "/settings/rbac/users")  # kept in etcd too
    assert [u["id"] for u in users] == ["ann"]
    # cluster up started the killed manager again: one leader among three
    wait_until(lambda: listed(data, others) == 3, proc, "the manager back")
    roles = [api(data, name, "/pools/default/managers")["role"] for name in MANAGERS]
    assert sorted(roles) == ["follower", "follower", "leader"]


def lag_is_zero(data: Path, manager: str) -> bool:
    doc = status(data, manager)
    return doc is not None and all(n["replicationLag"] == 0 for n in doc["nodes"])


def test_without_an_etcd_quorum_no_manager_leads_and_no_failover_runs(
    up: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, data = up
    wait_until(lambda: led(data, MANAGERS) and listed(data, MANAGERS) == 3, proc, "a leader")
    answer = api(data, "manager0", "/settings/autoFailover", "POST", enabled="true", timeout="5")
    assert answer is not None and answer["enabled"] is True
    ttl = view(data, MANAGERS)["leaseTtl"]  # type: ignore[index]
    for member in ("etcd1", "etcd2"):  # two of three: no quorum
        os.kill(pid_of(data, member), signal.SIGKILL)
    os.kill(pid_of(data, "node2"), signal.SIGKILL)
    followers = ["follower"] * 3
    wait_until(lambda: [role(data, m) for m in MANAGERS] == followers, proc, "no leader", 120)
    # one lease TTL and the failover timeout later, still no manager led, none failed over
    time.sleep(ttl + 5 + 2)
    assert [role(data, m) for m in MANAGERS] == followers
    for name in MANAGERS:
        assert "failed over" not in (data / f"{name}.log").read_text()
    said = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "cluster", "status", "--url",
         f"http://127.0.0.1:{port_of(data, 'manager0')}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert said.returncode == 1  # the status needs a leader or etcd
    assert "leader none (no lease held" in said.stdout
    assert "etcd: UNHEALTHY" in said.stdout
    assert "no manager leads and etcd did not answer" in said.stderr


def role(data: Path, manager: str) -> str | None:
    doc = api(data, manager, "/pools/default/managers")
    return None if doc is None else str(doc["role"])


def test_a_leader_stopped_past_its_lease_wakes_up_deposed(
    up: tuple[subprocess.Popen[str], Path],
) -> None:
    """SIGSTOP of the leader: another leads once its lease expires; SIGCONT: the old one
    finds its lease gone and stops acting at once: one leader, in the newer term."""
    proc, data = up
    wait_until(lambda: led(data, MANAGERS) and listed(data, MANAGERS) == 3, proc, "a leader")
    first = view(data, MANAGERS)
    assert first is not None
    leader, term = first["leader"], first["term"]
    others = [m for m in MANAGERS if m != leader]
    os.kill(pid_of(data, leader), signal.SIGSTOP)
    try:
        wait_until(lambda: led(data, others, after=term), proc, "a new leader", 120)
    finally:
        os.kill(pid_of(data, leader), signal.SIGCONT)
    one_leader = ["follower", "follower", "leader"]
    wait_until(lambda: sorted(map(str, roles(data))) == one_leader, proc, "one leader", 60)
    second = view(data, others)
    assert second is not None and second["term"] > term and second["leader"] in others
    assert f"manager {leader} stops leading (term {term})" in (data / f"{leader}.log").read_text()


def roles(data: Path) -> list[str | None]:
    return [role(data, m) for m in MANAGERS]


def test_a_new_leader_finishes_a_rebalance_its_predecessor_left_running(
    tmp_path: Path,
) -> None:
    """Fail node2 over, take it back in by a rebalance of one move at a time, kill -9 the
    leader meanwhile: the next leader runs the rebalance again from etcd's record, to its
    end (node2 active, the record idle)."""
    require_etcd()
    args = ("--nodes", "3", "--replicas", "1", "--vbuckets", "64", *LEASE)
    with cluster_up(tmp_path, *args, ready="manager2") as (proc, data):
        wait_until(lambda: led(data, MANAGERS) and listed(data, MANAGERS) == 3, proc, "leader")
        first = view(data, MANAGERS)
        assert first is not None
        leader, term = first["leader"], first["term"]
        others = [m for m in MANAGERS if m != leader]
        node2 = f"127.0.0.1:{port_of(data, 'node2')}"
        assert api(data, others[0], "/controller/failOver", "POST", otpNode=node2) is not None
        assert api(data, others[0], "/settings/rebalance", "POST", movesAtOnce="1") is not None
        recovery = {"otpNode": node2, "recoveryType": "delta"}
        assert api(data, others[0], "/controller/setRecoveryType", "POST", **recovery)
        assert api(data, others[0], "/controller/rebalance", "POST") is not None
        os.kill(pid_of(data, leader), signal.SIGKILL)
        progress = "/pools/default/rebalanceProgress"
        # with no leader answering, a follower reads the record from etcd
        record = api(data, others[0], progress)
        assert record is not None
        wait_until(lambda: led(data, others, after=term), proc, "a new leader", 120)
        wait_until(
            lambda: (api(data, others[0], progress) or {}).get("state") == "idle"
            and not failed_over(data, others, node2),
            proc, "the rebalance's end", 180,
        )  # fmt: skip
        second = view(data, others)
        assert second is not None
        if record["state"] == "running":  # (it may have ended before the kill)
            log = (data / f"{second['leader']}.log").read_text()
            assert "the interrupted rebalance runs again" in log
