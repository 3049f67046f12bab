"""The cluster manager with real processes: managed data nodes and ``dcpkv manager`` on free
ports, driven over the HTTP admin API and the ``dcpkv cluster`` commands, checked over the
memcached protocol on every node.

Replication is the data node's work (``server/replication.py``): these tests check the states
each node holds, the map each serves and what the manager sends, and, at failover, that what a
replica received is what the promoted active serves.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dcpkv.cluster.admin_client import AdminError, admin_request
from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, client, start_cluster, wait_for
from support.serverproc import ServerProcess


def held_states(node: ServerProcess) -> dict[int, VBucketState]:
    with client(node) as kv:
        rows = kv.stats(b"vbucket")
    return {int(k[3:]): VBucketState(v) for k, v in rows.items() if k.startswith("vb_")}


def served_map(node: ServerProcess) -> dict[str, Any]:
    with client(node) as kv:
        return json.loads(kv.call(Opcode.GetClusterConfig).value)


def state_cas(node: ServerProcess) -> int:
    with client(node) as kv:
        vb = min(held_states(node))
        return kv.call(Opcode.GetVbucket, vbucket=vb).cas


def assert_nodes_match(cluster: Cluster, nodes: list[ServerProcess]) -> VBucketMap:
    """Every node holds exactly the states of the map and serves that same map."""
    maps = [served_map(n) for n in nodes]
    vb_map = VBucketMap.from_config(maps[0])
    assert {(m["revEpoch"], m["rev"]) for m in maps} == {vb_map.version}
    for node, served in zip(nodes, maps, strict=True):
        name = cluster.name(node)
        assert [e.get("thisNode", False) for e in served["nodesExt"]] == [
            s == name for s in vb_map.servers
        ]
        held = {vb: s for vb, s in held_states(node).items() if s != VBucketState.DEAD}
        assert held == vb_map.states_of(name), name
    return vb_map


def high_seqno(node: ServerProcess, vb: int) -> int:
    with client(node) as kv:
        return int(kv.stats(f"vbucket-seqno {vb}".encode()).get(f"vb_{vb}:high_seqno", 0))


def key_in(vbucket: int) -> bytes:
    return next(
        k for i in range(10_000) if vbucket_for_key(k := f"k{i}".encode(), VBUCKETS) == vbucket
    )


def test_a_cluster_comes_up_serves_by_the_map_and_a_manager_restart_changes_nothing(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    vb_map = assert_nodes_match(cluster, cluster.nodes)
    assert vb_map.num_replicas == 1 and vb_map.num_vbuckets == VBUCKETS
    status = cluster.status()
    assert [n["actives"] for n in status["nodes"]] in ([6, 5, 5], [5, 6, 5], [5, 5, 6])
    assert sum(n["replicas"] for n in status["nodes"]) == VBUCKETS
    # writes go through the map's active node; every other node answers NotMyVbucket
    for vb in (0, 7, 15):
        key = key_in(vb)
        chain = vb_map.chains[vb]
        for index, server in enumerate(vb_map.servers):
            with client(cluster.node(server)) as kv:
                answer = kv.set(key, b"v", vbucket=vb)
            expected = Status.Success if index == chain[0] else Status.NotMyVbucket
            assert answer.status == expected, (vb, server)
    # kill -9 and restart: the same map, no SetVbucket, the state CAS untouched
    cas_before = [state_cas(n) for n in cluster.nodes]
    cluster.manager.kill9()
    with client(cluster.node(vb_map.servers[vb_map.chains[0][0]])) as kv:
        # the nodes serve on without the manager
        assert kv.set(key_in(0), b"w", vbucket=0).status == Status.Success
    cluster.manager.start(same_port=True)
    assert assert_nodes_match(cluster, cluster.nodes) == vb_map
    assert [state_cas(n) for n in cluster.nodes] == cas_before
    counters = cluster.status()["counters"]
    assert counters["setVbucketSent"] == 0 and counters["casConflicts"] == 0


def test_a_node_restarted_while_the_manager_is_away_keeps_its_map_and_its_replicas(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """A managed node writes each map it keeps beside its data: restarted while the manager
    is down, it serves that map at once (clients can route) and its replicas stream again
    from their actives, with no manager to push anything. A map file that does not parse is
    left out with a warning (the next push replaces it)."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    a, b = cluster.nodes
    vb_map = assert_nodes_match(cluster, cluster.nodes)
    cluster.manager.kill9()
    b.terminate()
    b.start(same_port=True)
    assert VBucketMap.from_config(served_map(b)) == vb_map
    vb = next(
        v for v, chain in enumerate(vb_map.chains) if vb_map.servers[chain[0]] == cluster.name(a)
    )
    with client(a) as kv:
        assert kv.set(key_in(vb), b"after the restart", vbucket=vb).status == Status.Success
    wait_for(lambda: high_seqno(b, vb) == high_seqno(a, vb), "b's replica to catch up")
    b.terminate()
    (kept,) = b.data_dir.glob("*.cluster-config.json")
    kept.write_bytes(b"{torn")
    b.start(same_port=True)
    assert served_map(b)["vBucketServerMap"]["serverList"] == [cluster.name(b)]  # its own map
    assert "the last cluster map kept is unreadable" in b.log()


def test_manual_failover_promotes_replicas_and_handles_a_stale_state_cas(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    before = assert_nodes_match(cluster, cluster.nodes)
    victim, survivors = cluster.nodes[0], cluster.nodes[1:]
    victim_name = cluster.name(victim)
    # a write to each vbucket the victim holds active, replicated (over DCP, by the nodes)
    moving = [vb for vb, s in before.states_of(victim_name).items() if s == VBucketState.ACTIVE]
    with client(victim) as kv:
        for vb in moving:
            assert kv.set(key_in(vb), b"before failover", vbucket=vb).status == Status.Success
    for vb in moving:
        replica = cluster.node(before.servers[before.chains[vb][1]])
        wait_for(lambda r=replica, v=vb: high_seqno(r, v) >= 1, f"vb {vb} replicated")
    # behind the manager's back: a state changed on a survivor, so its state CAS moved
    tampered = survivors[0]
    vb = next(iter(before.states_of(cluster.name(tampered))))
    with client(tampered) as kv:
        pending = struct.pack(">I", VBucketState.PENDING)
        assert kv.call(Opcode.SetVbucket, extras=pending, vbucket=vb).status == Status.Success
    victim.kill9()
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcpkv.cli.main",
            "cluster",
            "failover",
            victim_name,
            "--url",
            cluster.manager.url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert f"failed over {victim_name}" in cli.stdout
    after = assert_nodes_match(cluster, survivors)  # the tampered vbucket was put back too
    assert after.rev == before.rev + 1 and victim_name not in after.servers
    for vbucket, chain in enumerate(before.chains):
        if before.servers[chain[0]] == victim_name:  # its replica is the new active
            replica = before.servers[chain[1]]
            assert after.servers[after.chains[vbucket][0]] == replica
    for vb in moving:  # what the replica had is what the new active serves
        with client(cluster.node(after.servers[after.chains[vb][0]])) as kv:
            assert bytes(kv.get(key_in(vb), vbucket=vb).value) == b"before failover"
    status = cluster.status()
    assert status["counters"]["casConflicts"] >= 1
    by_name = {n["hostname"]: n for n in status["nodes"]}
    assert by_name[victim_name]["clusterMembership"] == "failed"
    assert sum(by_name[cluster.name(n)]["actives"] for n in survivors) == VBUCKETS
    # with one replica, the survivors' actives that had it on the victim have none now
    with pytest.raises(AdminError, match="has no replica"):
        cluster.manager.api("POST", "/controller/failOver", otpNode=cluster.name(survivors[0]))
    assert assert_nodes_match(cluster, survivors) == after


def test_bad_input_is_refused_clearly_and_changes_nothing(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=1, replicas=0)
    only = cluster.name(cluster.nodes[0])
    saved = (tmp_path / "manager" / "cluster.json").read_bytes()
    states = held_states(cluster.nodes[0])
    sent = cluster.status()["counters"]["setVbucketSent"]
    # a node that holds another cluster's data: states and a map from some other manager
    foreign = server_factory(tmp_path / "f", tmp_path / "f.log", "--managed")
    foreign.start()
    with client(foreign) as kv:
        kv.call(Opcode.SetVbucket, extras=struct.pack(">I", VBucketState.ACTIVE), vbucket=3)
        config = {"rev": 9, "uuid": "elsewhere", "vBucketServerMap": {"vBucketMap": [[0]] * 16}}
        kv.call(Opcode.SetClusterConfig, key=b"default", value=json.dumps(config).encode())
    plain = server_factory(tmp_path / "p", tmp_path / "p.log")  # not --managed: all active
    plain.start()
    wrong_size = server_factory(tmp_path / "w", tmp_path / "w.log", "--managed", "--vbuckets", "8")
    wrong_size.start()
    cases = [
        ("/controller/addNode", {"hostname": "127.0.0.1:1"}, "cannot reach 127.0.0.1:1"),
        ("/controller/addNode", {"hostname": "nonsense"}, "is not a node address"),
        ("/controller/addNode", {"hostname": f"127.0.0.1:{foreign.port}"}, "another cluster"),
        ("/controller/addNode", {"hostname": f"127.0.0.1:{plain.port}"}, "already holds 16"),
        ("/controller/addNode", {"hostname": f"127.0.0.1:{wrong_size.port}"}, "--vbuckets 16"),
        ("/controller/addNode", {"hostname": only}, "already a member"),
        ("/controller/failOver", {"otpNode": only}, "last node"),
        ("/controller/failOver", {"otpNode": "127.0.0.1:1"}, "not an active node"),
        ("/settings/autoFailover", {"timeout": "0"}, "1..3600"),
    ]
    for path, params, message in cases:
        with pytest.raises(AdminError, match=message):
            cluster.manager.api("POST", path, **params)
    assert (tmp_path / "manager" / "cluster.json").read_bytes() == saved
    assert held_states(cluster.nodes[0]) == states
    assert held_states(foreign) == {3: VBucketState.ACTIVE}
    assert cluster.status()["counters"]["setVbucketSent"] == sent
    with pytest.raises(AdminError, match="authentication required"):
        admin_request(cluster.manager.url, "GET", "/pools/default", user="x", password="y")


def test_the_default_1024_vbuckets_are_placed_and_pushed(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(
        server_factory, manager_factory, tmp_path, nodes=3, replicas=2, num_vbuckets=1024
    )
    vb_map = assert_nodes_match(cluster, cluster.nodes)
    counts = vb_map.counts()
    assert sorted(a for a, _ in counts.values()) == [341, 341, 342]
    assert sorted(r for _, r in counts.values()) == [682, 683, 683]
    assert cluster.status()["counters"]["setVbucketSent"] == 3 * 1024


def test_cluster_up_starts_everything_and_sigterm_stops_everything(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dcpkv.cli.main",
            "cluster",
            "up",
            "--nodes",
            "2",
            "--replicas",
            "1",
            "--vbuckets",
            "16",
            "--data-dir",
            str(data),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (data / "manager.port").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url = f"http://127.0.0.1:{(data / 'manager.port').read_text()}"
        status = subprocess.run(
            [sys.executable, "-m", "dcpkv.cli.main", "cluster", "status", "--url", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert "map rev 1" in status.stdout and status.stdout.count("healthy") == 2
        ports = [int((data / f"node{i}.port").read_text()) for i in range(2)]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        for port in ports:  # every node is gone
            with pytest.raises(OSError):
                KVClient(port, timeout=2)
        assert (data / "node0.log").exists() and (data / "manager" / "cluster.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cluster_up_refuses_a_lease_ttl_without_managers_on_etcd(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "cluster", "up", "--nodes", "1", "--no-etcd",
         "--lease-ttl", "5", "--data-dir", str(tmp_path / "cluster")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--lease-ttl needs managers on etcd (--etcd)" in done.stderr
    assert not (tmp_path / "cluster").exists()  # refused before anything started
