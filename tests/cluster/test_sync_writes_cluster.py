"""SyncWrites on a cluster, with real processes: the manager sets every active vbucket's
replication topology (cluster/topology_sync.py) and keeps it set over a node's restart, durable
writes through the official SDK at DurabilityLevel.MAJORITY, and a failover after a kill -9
that loses none of them (PROTOCOL.md, "SyncWrites"). Three nodes, one replica, the default
1,024 vbuckets. Waits are bounded polling loops; nothing asserts on time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from couchbase.collection import Collection
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import CouchbaseException
from couchbase.options import UpsertOptions
from managerproc import Cluster, ManagerProcess, client, start_cluster, wait_for
from sdkhelp import connect
from serverproc import ServerProcess

from dcpkv.cluster.topology_sync import held_chains, wanted
from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode

VBUCKETS = 1024
MAJORITY = UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY))


def served_map(node: ServerProcess) -> VBucketMap:
    with client(node) as kv:
        return VBucketMap.from_config(json.loads(kv.call(Opcode.GetClusterConfig).value))


def topologies(node: ServerProcess) -> dict[int, Any]:
    """Active vbucket -> the chains it holds (None: no topology)."""
    with client(node) as kv:
        rows = kv.stats(b"vbucket-topology")
    return {int(name[3:]): held_chains(value) for name, value in rows.items()}


def topologies_match(cluster: Cluster, nodes: list[ServerProcess]) -> bool:
    """Every node's active vbuckets hold exactly the chains the newest map gives them."""
    vb_map = max((served_map(n) for n in nodes), key=lambda m: m.version)
    return all(topologies(n) == wanted(vb_map, cluster.name(n)) for n in nodes)


def three_nodes(servers: type[ServerProcess], managers: type[ManagerProcess], tmp: Path) -> Cluster:
    cluster = start_cluster(servers, managers, tmp, nodes=3, replicas=1, vbuckets=VBUCKETS)
    wait_for(lambda: topologies_match(cluster, cluster.nodes), "every active's topology", 60)
    return cluster


def test_every_active_gets_its_topology_and_a_restarted_node_gets_it_back(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = three_nodes(server_factory, manager_factory, tmp_path)
    vb_map = served_map(cluster.nodes[0])
    for node in cluster.nodes:
        held = topologies(node)
        assert len(held) in (VBUCKETS // 3, VBUCKETS // 3 + 1)
        for chains in held.values():  # one chain: the active, then its replica
            assert chains is not None and len(chains) == 1 and len(chains[0]) == 2
            assert chains[0][0] == cluster.name(node) and chains[0][1] in vb_map.servers
    sent = cluster.manager.api("GET", "/pools/default")["counters"]["topologiesSent"]
    assert sent == VBUCKETS
    # a node killed and restarted at once (before any failover) comes back without the
    # topologies: the manager notices the new session and sets them again
    victim = cluster.nodes[1]
    actives = len(topologies(victim))
    victim.kill9()
    victim.start(same_port=True)
    wait_for(lambda: topologies_match(cluster, cluster.nodes), "topologies back", 60)
    counters = cluster.manager.api("GET", "/pools/default")["counters"]
    assert counters["topologiesSent"] == VBUCKETS + actives  # the restarted node's only


def durable_writes(coll: Collection, prefix: str, count: int) -> tuple[dict[str, int], int]:
    """Upsert ``count`` keys at Majority: the keys acknowledged Success, and the failures."""
    acked: dict[str, int] = {}
    failures = 0
    for i in range(count):
        key = f"{prefix}{i}"
        try:
            coll.upsert(key, {"i": i}, MAJORITY)
        except CouchbaseException:
            failures += 1
        else:
            acked[key] = i
    return acked, failures


def test_majority_writes_succeed_and_survive_a_kill9_and_failover_of_their_active(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[Any],
) -> None:
    cluster = three_nodes(server_factory, manager_factory, tmp_path)
    coll = connect(cluster.nodes[0], sdk, kv_timeout_s=10)
    acked, failures = durable_writes(coll, "sw", 300)
    assert failures == 0 and len(acked) == 300
    victim = cluster.nodes[2]
    vb_map = served_map(victim)
    name = cluster.name(victim)
    on_victim = [
        k
        for k in acked
        if vb_map.servers[vb_map.chains[vbucket_for_key(k.encode(), VBUCKETS)][0]] == name
    ]
    assert on_victim
    victim.kill9()
    cluster.manager.api("POST", "/controller/failOver", otpNode=name)
    survivors = [n for n in cluster.nodes if n is not victim]
    wait_for(lambda: topologies_match(cluster, survivors), "the promoted actives' topologies", 60)
    # every write acknowledged Success at Majority is on its new active (a prepare the old
    # active committed but whose commit never left it is re-committed first: reads retry)
    for key in acked:
        assert coll.get(key).content_as[dict] == {"i": acked[key]}, key
