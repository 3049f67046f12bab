"""Rebalance with real processes: managed data nodes and ``dcpkv manager`` on free ports, a
steady map-following write load and a reader running (``rebalancecheck.Load``).

Each story ends with the same checks (``check_cluster``): the map even and whole, every
acknowledged write on its active, replicas equal to their actives (contents, CAS, seqnos,
failover logs), reads never back in time; and a consumer that followed each vbucket before the
moves resumes on its new active without a rollback (the failover log moved with it).
"""

from __future__ import annotations

from pathlib import Path

from managerproc import ManagerProcess, client, start_cluster, wait_for
from rebalancecheck import (
    Load,
    check_cluster,
    positions,
    rebalance,
    resumes_without_rollback,
    served_map,
)
from serverproc import ServerProcess

from dcpkv.cluster.vbucket_map import VBucketMap


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
        done = rebalance(cluster.manager, ejectedNodes=cluster.name(leaving))
        assert done["state"] == "idle", done
        nodes.remove(leaving)
        wait_for(lambda: load.writes > writes_in + 200, "writes after the rebalance out")
    after = check_cluster(cluster, nodes, load)
    resumes_without_rollback(after, where)
    members = [n["hostname"] for n in cluster.status()["nodes"]]
    assert cluster.name(leaving) not in members
    assert held_states(leaving) == {}  # its copies were deleted once the new ones persisted
    assert load.writes > 0 and load.reads > 0
