"""Spec 002, "UPR in action on a Cluster", figures 1-9, with real processes.

The spec follows one partition; here the partitions are every vbucket the manager placed
active on node A (3 nodes, 2 replicas: each has both B and C as replicas), and each takes the
story's exact seqnos. Driven by the manager where it has the step (placement, the failover of
A, adding D as a member) and by hand where it has not yet (rebalance is the next issue: D is
made a replica with SetVbucket and a map one rev higher, pushed with SetClusterConfig).

1. A is active, B and C replicate; A takes 5 mutations, both persist them (figures 1-2);
2. B stops at 5 (its last persisted snapshot); A takes 3 more, C persists through 8
   (figures 3-4); C stops; A takes 3 more (9-11) and is killed (figure 5);
3. B comes back and the manager fails A over: C is down, so B, the only replica it can ask,
   is promoted, with a new failover entry at 5 (figure 6); B takes new mutations;
4. D joins and becomes a replica, taking B's failover log (figure 7); C comes back, follows
   the map to B, compares failover logs and rolls back to 5: the common ancestor is A's entry
   at 0, the next entries are B's at 5 and C's own persisted snapshot at 8, the smaller wins
   (spec 002, "How UPR Replicas/Clients find out where to rollback to") (figure 8);
5. B takes more; B, C and D end equal (figure 9).

Run twice: as above, and with the cluster's ``repairOnRollback`` on, where C first repairs B
with what it has above 5 that B never changed (figure 8's "Replica C repairs master"): A's
6-8, three keys B never had, are added on B with new seqnos and stream back to C and D.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, client, start_cluster, wait_for
from support.replicacheck import contents, failover_logs, wait_equal
from support.serverproc import ServerProcess


def keys_of(vb: int, count: int, prefix: str) -> list[bytes]:
    found = (f"{prefix}{i}".encode() for i in range(100_000))
    keys = [k for k in found if vbucket_for_key(k, VBUCKETS) == vb]
    return keys[:count]


def write(node: ServerProcess, vbs: list[int], count: int, prefix: str) -> None:
    """``count`` new keys in each vbucket: its high seqno grows by exactly ``count``."""
    with client(node) as kv:
        for vb in vbs:
            for key in keys_of(vb, count, prefix):
                assert kv.set(key, prefix.encode(), vbucket=vb).status == Status.Success


def persisted(node: ServerProcess, vb: int) -> tuple[int, int]:
    """(persisted, high) seqnos of the node's copy, from ObserveSeqno."""
    uuid = failover_logs(node.port, [vb])[vb][0].uuid  # type: ignore[attr-defined]
    with client(node) as kv:
        answer = kv.call(Opcode.ObserveSeqno, vbucket=vb, value=struct.pack(">Q", uuid))
    assert answer.status == Status.Success
    _, _, _, done, high = struct.unpack_from(">BHQQQ", answer.value)
    return done, high


def wait_persisted(nodes: list[ServerProcess], vbs: list[int], seqno: int) -> None:
    for node in nodes:
        for vb in vbs:
            wait_for(lambda n=node, v=vb: persisted(n, v) == (seqno, seqno), f"{vb} at {seqno}")


def log_entries(node: ServerProcess, vb: int) -> list[tuple[int, int]]:
    return [(e.uuid, e.seqno) for e in failover_logs(node.port, [vb])[vb]]  # type: ignore[attr-defined]


def make_replica(
    cluster: Cluster, d: ServerProcess, live: list[ServerProcess], vbs: list[int]
) -> None:
    """By hand (rebalance's job, not there yet): D a replica of ``vbs``, in a map one rev up."""
    with client(live[0]) as kv:
        served = json.loads(kv.call(Opcode.GetClusterConfig).value)
    old = VBucketMap.from_config(served)
    servers = [*old.servers, cluster.name(d)]
    chains = [list(c) for c in old.chains]
    for vb in vbs:
        chains[vb][-1] = len(servers) - 1
    new = old.with_chains(servers, chains)
    with client(d) as kv:
        for vb in vbs:
            extras = struct.pack(">I", VBucketState.REPLICA)
            assert kv.call(Opcode.SetVbucket, extras=extras, vbucket=vb).status == Status.Success
    for node in [*live, d]:
        config = new.to_config(served["name"], served["uuid"], this_node=cluster.name(node))
        with client(node) as kv:
            raw = json.dumps(config).encode()
            answer = kv.call(Opcode.SetClusterConfig, key=b"default", value=raw)
            assert answer.status == Status.Success


@pytest.mark.parametrize("repair", [False, True], ids=["rollback", "repair-then-rollback"])
def test_upr_in_action_on_a_cluster(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    repair: bool,
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=2)
    a, b, c = cluster.nodes
    with client(a) as kv:
        vb_map = VBucketMap.from_config(json.loads(kv.call(Opcode.GetClusterConfig).value))
    vbs = sorted(
        vb for vb, s in vb_map.states_of(cluster.name(a)).items() if s == VBucketState.ACTIVE
    )
    assert vbs
    origin = {vb: log_entries(a, vb) for vb in vbs}
    assert all(len(entries) == 1 and entries[0][1] == 0 for entries in origin.values())
    # figures 1-2: 5 mutations, both replicas persist them
    write(a, vbs, 5, "one-")
    wait_persisted([b, c], vbs, 5)
    # figures 3-4: B stops at its last persisted snapshot, 5; C goes on to 8, then stops
    assert b.terminate() == 0
    write(a, vbs, 3, "two-")
    wait_persisted([c], vbs, 8)
    assert c.terminate() == 0
    write(a, vbs, 3, "three-")  # 9-11: on A only
    # figure 5: A dies
    a.kill9()
    # figure 6: B is back; the manager fails A over; C is down, so B is promoted
    b.start(same_port=True)
    b_name = cluster.name(b)
    wait_for(lambda: node_status(cluster, b_name) == ("healthy", True), "B back in sync", 60)
    cluster.manager.api("POST", "/controller/failOver", otpNode=cluster.name(a))
    for vb in vbs:
        entries = log_entries(b, vb)
        assert entries[1:] == origin[vb] and entries[0][1] == 5  # the new entry at 5
        assert entries[0][0] != origin[vb][0][0]
        assert persisted(b, vb) == (5, 5)
    write(b, vbs, 2, "four-")  # the new master accepts mutations: 6-7 on B's branch
    if repair:
        answer = cluster.manager.api("POST", "/settings/rollbackRepair", repairOnRollback="true")
        assert answer == {"repairOnRollback": True}
    # figure 7: D joins (the manager) and becomes a replica (by hand)
    d = server_factory(tmp_path / "d", tmp_path / "d.log", "--managed")
    d.start()
    cluster.nodes.append(d)
    cluster.manager.api("POST", "/controller/addNode", hostname=cluster.name(d))
    make_replica(cluster, d, [b], vbs)
    # figure 8: C comes back, follows the map to B, rolls back to 5 and catches up
    c.start(same_port=True)
    wait_for(lambda: node_status(cluster, cluster.name(c)) == ("healthy", True), "C back", 60)
    # figure 9: B goes on; B, C and D end equal
    write(b, vbs, 2, "five-")
    for replica in (c, d):
        wait_equal(b.port, replica.port, vbs)
    expected = contents(b.port, "check-b", vbs)
    for vb in vbs:
        # B's history: A's 1-5, then its own 6-9; A's 6-11 are nowhere, or with the repair,
        # A's 6-8 (C had them) are B's 8-10 or later
        values = {b"one-", b"four-", b"five-"} | ({b"two-"} if repair else set())
        total = 5 + 2 + 2 + (3 if repair else 0)
        assert sorted(s for s, _, _ in expected[vb].values()) == list(range(1, total + 1))
        assert {v for _, _, v in expected[vb].values()} == values
        # C rolled back to 5, as the spec's logs say; D, new, had nothing to roll back
        assert f"vbucket {vb} rolled back to 5 (asked 5)" in c.log()
        assert f"vbucket {vb} rolled back" not in d.log()
        assert (f"vbucket {vb}: repaired 3 of 3 document(s)" in c.log()) == repair
    with client(c) as kv:
        stats = kv.stats(b"dcp")
    assert all(int(stats[f"rollbacks:{vb}:Replica:{cluster.name(c)}"]) == 1 for vb in vbs)


def node_status(cluster: Cluster, name: str) -> tuple[str, bool]:
    node = next(n for n in cluster.status()["nodes"] if n["hostname"] == name)
    return node["status"], node["inSync"]
