"""Rebalance with real processes: managed data nodes and ``dcpkv manager`` on free ports, a
steady map-following write load and a reader running (``rebalancecheck.Load``).

Each story ends with the same checks (``check_cluster``): the map even and whole, every
acknowledged write on its active, replicas equal to their actives (contents, CAS, seqnos,
failover logs), reads never back in time; and a consumer that followed each vbucket before the
moves resumes on its new active without a rollback (the failover log moved with it).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.managerproc import VBUCKETS, ManagerProcess, client, start_cluster, wait_for
from support.rebalancecheck import (
    Load,
    assert_consistent,
    check_cluster,
    port_of,
    positions,
    preload,
    rebalance,
    resumes_without_rollback,
    served_map,
    wait_progress,
)
from support.replicacheck import contents, wait_equal
from support.serverproc import ServerProcess


def add_node(
    servers: type[ServerProcess], tmp: Path, manager: ManagerProcess, name: str
) -> ServerProcess:
    node = servers(tmp / name, tmp / f"{name}.log", "--managed", "--vbuckets", "16")
    node.start()
    manager.api("POST", "/controller/addNode", hostname=f"127.0.0.1:{node.port}")
    return node


def held_states(node: ServerProcess) -> dict[int, str]:
    with client(node) as kv:
        rows = kv.stats(b"vbucket")
    return {int(k[3:]): v for k, v in rows.items() if k.startswith("vb_")}


def moved_actives(before: VBucketMap, after: VBucketMap) -> int:
    return sum(
        1
        for a, b in zip(before.chains, after.chains, strict=True)
        if before.servers[a[0]] != after.servers[b[0]]
    )


def test_rebalance_in_then_out_under_load(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    nodes = list(cluster.nodes)
    with Load(nodes) as load:
        wait_for(lambda: load.writes > 200, "the load to start")
        before = served_map(nodes)
        where = positions(before)
        c = add_node(server_factory, tmp_path, cluster.manager, "n2")
        nodes.append(c)
        load.nodes.append(c)
        done = rebalance(cluster.manager)
        assert done["state"] == "idle", done
        progress = done["progress"]
        assert progress["vbucketsMoved"] == progress["vbucketsTotal"] > 0
        assert progress["itemsTransferred"] > 0
        middle = served_map(nodes)
        assert moved_actives(before, middle) >= 5  # the newcomer took its share of actives
        resumes_without_rollback(middle, where)
        writes_in = load.writes
        wait_for(lambda: load.writes > writes_in + 100, "writes after the rebalance in")
        where = positions(middle)
        # and out again: the first node leaves gracefully
        leaving = nodes[0]
        out = cluster.manager.cli("cluster", "remove-node", cluster.name(leaving))
        assert "rebalance: idle" in out and "vbuckets moved" in out, out
        nodes.remove(leaving)
        wait_for(lambda: load.writes > writes_in + 200, "writes after the rebalance out")
    after = check_cluster(cluster, nodes, load)
    resumes_without_rollback(after, where)
    members = [n["hostname"] for n in cluster.status()["nodes"]]
    assert cluster.name(leaving) not in members
    assert held_states(leaving) == {}  # its copies were deleted once the new ones persisted
    assert load.writes > 0 and load.reads > 0


def test_swap_rebalance(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """One node in and one out in the same run: the newcomer takes the leaver's place."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    a, b = cluster.nodes
    with Load([a, b]) as load:
        wait_for(lambda: load.writes > 100, "the load to start")
        where = positions(served_map([a, b]))
        c = add_node(server_factory, tmp_path, cluster.manager, "n2")
        load.nodes.append(c)
        out = cluster.manager.cli("cluster", "rebalance", "--eject", cluster.name(a))
        assert "rebalance: idle" in out, out
        writes = load.writes
        wait_for(lambda: load.writes > writes + 100, "writes after the swap")
    after = check_cluster(cluster, [b, c], load)
    assert set(after.servers) == {cluster.name(b), cluster.name(c)}
    resumes_without_rollback(after, where)
    assert held_states(a) == {}


def test_a_stopped_and_an_interrupted_rebalance_finish_when_run_again(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """Stopped by an operator, then the manager killed -9 mid-run: each time the map is
    consistent (the node it names active for a vbucket is the one holding it active), the
    nodes keep serving, and a re-run finishes the job."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    manager = cluster.manager
    manager.api("POST", "/settings/rebalance", movesAtOnce="1")
    nodes = list(cluster.nodes)
    with Load(nodes) as load:
        wait_for(lambda: load.writes > 100, "the load to start")
        nodes.append(add_node(server_factory, tmp_path, manager, "n2"))
        manager.api("POST", "/controller/rebalance")
        wait_progress(manager, 2)
        stopped = manager.api("POST", "/controller/stopRebalance")
        assert stopped["state"] == "stopped"
        assert 2 <= stopped["progress"]["vbucketsMoved"] < stopped["progress"]["vbucketsTotal"]
        assert_consistent(nodes)
        manager.api("POST", "/controller/rebalance")
        wait_progress(manager, 1)
        manager.kill9()
        writes = load.writes
        wait_for(lambda: load.writes > writes + 100, "writes with the manager down")
        manager.start()
        assert manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "interrupted"
        assert_consistent(nodes)
        assert "rebalance: interrupted" in manager.cli("cluster", "status")
        done = rebalance(manager)
        assert done["state"] == "idle", done
        writes = load.writes
        wait_for(lambda: load.writes > writes + 100, "writes after the rebalance")
    check_cluster(cluster, nodes, load)


def test_a_node_killed_mid_rebalance_is_failed_over_and_a_new_rebalance_finishes(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """The newcomer dies -9 while vbuckets move to it: its moves are abandoned (the old
    actives put back), the rebalance fails saying why, the node is failed over, and a new
    rebalance evens the map over the two left. The load pauses around the kill so every
    acknowledged write is on a replica first (a write acknowledged from one node's memory
    alone may be lost with it: that is failover's guarantee, not rebalance's)."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    manager = cluster.manager
    manager.api("POST", "/settings/rebalance", movesAtOnce="1")
    a, b = cluster.nodes
    with Load([a, b]) as before:
        wait_for(lambda: before.writes > 100, "the load to start")
        c = add_node(server_factory, tmp_path, manager, "n2")
        before.nodes.append(c)
        manager.api("POST", "/controller/rebalance")
        wait_progress(manager, 3)
    wait_for(
        lambda: all(n["replicationLag"] == 0 for n in cluster.status()["nodes"]),
        "every replica caught up",
    )
    c.kill9()
    wait_for(
        lambda: manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "failed",
        "the rebalance to fail",
        timeout_s=60,
    )
    failed = manager.api("GET", "/pools/default/rebalanceProgress")
    assert "stopped answering" in failed["error"]
    manager.api("POST", "/controller/failOver", otpNode=cluster.name(c))
    with Load([a, b], first=10**6) as after:
        done = rebalance(manager)
        assert done["state"] == "idle", done
        writes = after.writes
        wait_for(lambda: after.writes > writes + 100, "writes after the rebalance")
    after.acked = {**before.acked, **after.acked}
    vb_map = check_cluster(cluster, [a, b], after)
    assert cluster.name(c) not in [n["hostname"] for n in cluster.status()["nodes"]]
    assert len(vb_map.servers) == 2


@pytest.mark.parametrize("how", ["delta", "full", "delta-after-kill9"])
def test_recovery_of_a_failed_over_node(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    how: str,
) -> None:
    """A node stopped and failed over comes back with its data. Delta recovery keeps it: its
    copies become replicas again, roll back where their failover logs say and copy only what
    was written since, far less than the node holds. Full recovery wipes it and copies its
    whole share again. Either way everything ends equal. After a kill -9 the node's warm-up
    cut a branch on each vbucket it held active, which no other node knows: its copies must
    still resume from the history that wrote them, not from 0."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    manager = cluster.manager
    nodes = list(cluster.nodes)
    preload(nodes, 3000)
    c = nodes[2]
    with Load(nodes) as load:
        wait_for(lambda: load.writes > 100, "the load to start")
        wait_for(
            lambda: all(n["replicationLag"] == 0 for n in cluster.status()["nodes"]),
            "every replica caught up",
        )
        if how == "delta-after-kill9":
            c.kill9()
        else:
            c.terminate()
        manager.api("POST", "/controller/failOver", otpNode=cluster.name(c))
        writes = load.writes
        wait_for(lambda: load.writes > writes + 150, "writes while the node is out")
        c.start(same_port=True)
        flag = "--full" if how == "full" else "--delta"
        out = manager.cli("cluster", "recover", cluster.name(c), flag)
        assert "rebalance: idle" in out, out
        writes = load.writes
        wait_for(lambda: load.writes > writes + 100, "writes after the recovery")
    vb_map = check_cluster(cluster, nodes, load)
    assert cluster.name(c) in vb_map.servers  # back in the map
    # what the new copies received, as the manager counted it (their high seqnos' growth)
    copied = manager.api("GET", "/pools/default/rebalanceProgress")["progress"]
    # the node's share is a third of the 6,000 copies of the preloaded items
    if how.startswith("delta"):
        assert 0 < copied["itemsTransferred"] < 1000, copied
        # (a copy rolled back to 0 and copied again shows no growth: the log tells)
        assert "rolled back to 0" not in c.log()
    else:
        assert copied["itemsTransferred"] > 1500, copied


def test_the_issue_story_3_to_4_to_3_then_failover_and_delta_recovery(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """Issue 13's "done when": 3 nodes under a write load and a reader go to 4 and back to
    3; then a node is stopped, failed over and delta-recovered. Nothing acknowledged is lost,
    reads never go back, replicas end equal, and a consumer that followed every vbucket
    before it all resumes on the final actives without a rollback."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    manager = cluster.manager
    nodes = list(cluster.nodes)
    with Load(nodes) as load:
        wait_for(lambda: load.writes > 100, "the load to start")
        where = positions(served_map(nodes))
        d = add_node(server_factory, tmp_path, manager, "n3")
        nodes.append(d)
        assert rebalance(manager)["state"] == "idle"
        assert len(served_map(nodes).servers) == 4
        assert rebalance(manager, ejectedNodes=cluster.name(nodes[0]))["state"] == "idle"
        gone = nodes.pop(0)
        assert len(served_map(nodes).servers) == 3
        wait_for(
            lambda: all(n["replicationLag"] == 0 for n in cluster.status()["nodes"]),
            "every replica caught up",
        )
        resumes_without_rollback(served_map(nodes), where)
        c = nodes[1]
        placed = served_map(nodes)
        # followers of the vbuckets c does not hold active: the failover does not branch those
        where = {
            vb: at
            for vb, at in positions(placed).items()
            if placed.servers[placed.chains[vb][0]] != cluster.name(c)
        }
        c.terminate()
        manager.api("POST", "/controller/failOver", otpNode=cluster.name(c))
        writes = load.writes
        wait_for(lambda: load.writes > writes + 100, "writes while the node is out")
        c.start(same_port=True)
        manager.api(
            "POST", "/controller/setRecoveryType", otpNode=cluster.name(c), recoveryType="delta"
        )
        assert rebalance(manager)["state"] == "idle"
        writes = load.writes
        wait_for(lambda: load.writes > writes + 100, "writes after the recovery")
    check_cluster(cluster, nodes, load)
    assert held_states(gone) == {}
    # (the failed node's own vbuckets branched at the promoted copy's last persisted
    # snapshot: a follower there may roll back to it, as failover's rules say)
    resumes_without_rollback(served_map(nodes), where)


def keys_in(vb: int, prefix: str, count: int) -> list[bytes]:
    found = (f"{prefix}{i}".encode() for i in range(100_000))
    return [k for k in found if vbucket_for_key(k, VBUCKETS) == vb][:count]


def set_states(node: ServerProcess, vbs: list[int], state: VBucketState) -> None:
    """By hand, unconditionally (CAS 0), behind the manager's back."""
    with client(node) as kv:
        for vb in vbs:
            extras = struct.pack(">I", state)
            assert kv.call(Opcode.SetVbucket, vbucket=vb, extras=extras).status == Status.Success


def test_delta_recovery_rolls_back_what_the_failover_dropped(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """C takes writes its replicas never get (their copies set dead by hand for that while,
    so their streams stop), is stopped and failed over: the promoted replicas branch below
    those writes. Delta-recovered, C's copies roll back to the branch as the failover logs
    decide, drop the writes no one else has (lost by the failover, as it warns), then catch
    up; every copy ends equal to its active."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    manager = cluster.manager
    c = cluster.nodes[2]
    placed = served_map(cluster.nodes)
    mine = [vb for vb, ch in enumerate(placed.chains) if placed.servers[ch[0]] == cluster.name(c)]
    replicas: dict[str, list[int]] = {}
    for vb in mine:
        replicas.setdefault(placed.servers[placed.chains[vb][1]], []).append(vb)
    with client(c) as kv:
        for vb in mine:
            for key in keys_in(vb, "kept-", 5):
                assert kv.set(key, b"kept", vbucket=vb).status == Status.Success
    wait_for(
        lambda: all(n["replicationLag"] == 0 for n in cluster.status()["nodes"]),
        "every replica caught up",
    )
    for name, vbs in replicas.items():
        set_states(cluster.node(name), vbs, VBucketState.DEAD)
    with client(c) as kv:
        for vb in mine:
            for key in keys_in(vb, "lost-", 5):
                assert kv.set(key, b"lost", vbucket=vb).status == Status.Success
    c.terminate()  # a clean stop: C persisted what its replicas never got
    for name, vbs in replicas.items():
        set_states(cluster.node(name), vbs, VBucketState.REPLICA)
    manager.api("POST", "/controller/failOver", otpNode=cluster.name(c))
    c.start(same_port=True)
    manager.api(
        "POST", "/controller/setRecoveryType", otpNode=cluster.name(c), recoveryType="delta"
    )
    assert rebalance(manager)["state"] == "idle"
    assert_only_kept(served_map(cluster.nodes), mine)
    assert "rolled back" in c.log()  # C's copies unwound the writes nobody else had


def assert_only_kept(final: VBucketMap, mine: list[int]) -> None:
    """Every copy equal to its active, which holds the kept keys and none of the lost."""
    for vb, chain in enumerate(final.chains):
        active = port_of(final.servers[chain[0]])
        for replica in chain[1:]:
            wait_equal(active, port_of(final.servers[replica]), [vb])
        held = contents(active, "check-lost", [vb])[vb]
        assert not any(k.startswith(b"lost-") for k in held)  # dropped with the failover
        if vb in mine:
            assert {k for k in held if k.startswith(b"kept-")} == set(keys_in(vb, "kept-", 5))


def test_an_old_active_that_dies_mid_move_is_failed_over_by_the_manager(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """Spec 002, rebalance step 5: when a move fails and its old active cannot be told to go
    back to active (it stopped answering), the manager fails that node over to a replica
    itself; every vbucket has an active again without an operator."""
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    manager = cluster.manager
    manager.api("POST", "/settings/rebalance", movesAtOnce="1")
    preload(cluster.nodes, 400)
    c = add_node(server_factory, tmp_path, manager, "n2")
    manager.api("POST", "/controller/rebalance")
    moving: dict[str, str] = {}

    def a_move_running() -> bool:
        moving.update(manager.api("GET", "/pools/default/rebalanceProgress")["progress"]["moving"])
        return bool(moving)

    wait_for(a_move_running, "a move to start")
    vb = int(next(iter(moving)))
    before = served_map([*cluster.nodes, c])
    old_active = cluster.node(before.servers[before.chains[vb][0]])
    old_active.kill9()
    name = cluster.name(old_active)

    def failed_over() -> bool:
        nodes = {n["hostname"]: n for n in cluster.status()["nodes"]}
        return name not in nodes or nodes[name]["clusterMembership"] == "failed"

    wait_for(failed_over, "the manager to fail the dead old active over", timeout_s=60)
    assert manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "failed"
    live = [n for n in [*cluster.nodes, c] if n is not old_active]

    def actives_moved_off() -> bool:
        # the manager records the failover, then pushes the new map: the nodes serve it a
        # moment after the status shows the node failed
        after = served_map(live)
        return name not in [after.servers[chain[0]] for chain in after.chains if chain[0] >= 0]

    wait_for(actives_moved_off, "the live nodes to serve a map without the dead node")
    after = served_map(live)
    assert all(chain[0] >= 0 for chain in after.chains)  # every vbucket has an active
    assert_consistent(live)
