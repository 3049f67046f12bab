"""SyncWrites on a cluster, with real processes: the manager sets every active vbucket's
replication topology (cluster/topology_sync.py) and keeps it set over a node's restart, durable
writes through the official SDK at DurabilityLevel.MAJORITY, and a failover after a kill -9
that loses none of them (PROTOCOL.md, "SyncWrites"). Three nodes, one replica, the default
1,024 vbuckets. Waits are bounded polling loops; nothing asserts on time."""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from couchbase.collection import Collection
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import CouchbaseException
from couchbase.options import UpsertOptions

from dcpkv.cluster.topology_sync import held_chains, wanted
from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.managerproc import Cluster, ManagerProcess, client, start_cluster, wait_for
from support.rebalancecheck import rebalance
from support.sdkhelp import connect
from support.serverproc import ServerProcess

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
    cluster = start_cluster(servers, managers, tmp, nodes=3, replicas=1, num_vbuckets=VBUCKETS)
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


class DurableWriter:
    """Threads upserting distinct keys at Majority until stopped: the keys acknowledged
    Success (with their value), and how many writes failed (ambiguous, timed out, refused)."""

    def __init__(self, coll: Collection, prefix: str, threads: int) -> None:
        self.coll, self.prefix = coll, prefix
        self.acked: dict[str, int] = {}
        self.failed = 0
        self.kinds: Counter[str] = Counter()  # the failures by exception
        self._stop = threading.Event()
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> DurableWriter:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            i = next(self._next)
            key = f"{self.prefix}{i}"
            try:
                self.coll.upsert(key, {"i": i}, MAJORITY)
            except CouchbaseException as exc:
                with self._lock:
                    self.failed += 1
                    self.kinds[type(exc).__name__] += 1
            else:
                with self._lock:
                    self.acked[key] = i


def rebalance_state(cluster: Cluster) -> str:
    return str(cluster.manager.api("GET", "/pools/default/rebalanceProgress")["state"])


def active_of(vb_map: VBucketMap, key: str) -> str:
    return vb_map.servers[vb_map.chains[vbucket_for_key(key.encode(), VBUCKETS)][0]]


def test_majority_writes_succeed_and_survive_a_kill9_and_failover_of_their_active(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[Any],
) -> None:
    """Writes in flight while an active is killed -9 and failed over: each one acknowledged
    Success at Majority is readable afterwards, on the promoted replica, once a rebalance gave
    the vbuckets a replica again (a prepare whose commit never left the old active waits for a
    chain with a majority to be re-committed; reads of its key answer 0xa4 meanwhile)."""
    cluster = three_nodes(server_factory, manager_factory, tmp_path)
    coll = connect(cluster.nodes[0], sdk, kv_timeout_s=10)
    victim = cluster.nodes[2]
    name = cluster.name(victim)
    vb_map = served_map(victim)
    with DurableWriter(coll, "before", 1) as quiet:
        wait_for(lambda: len(quiet.acked) >= 200, "durable writes")
    assert quiet.failed == 0  # nothing fails on a healthy cluster
    with DurableWriter(coll, "during", 8) as load:
        wait_for(lambda: sum(active_of(vb_map, k) == name for k in load.acked) >= 50, "writes")
        victim.kill9()
        cluster.manager.api("POST", "/controller/failOver", otpNode=name)
    survivors = [n for n in cluster.nodes if n is not victim]
    wait_for(lambda: topologies_match(cluster, survivors), "the promoted actives' topologies", 60)
    done = rebalance(cluster.manager)
    assert done["state"] == "idle", done
    wait_for(lambda: topologies_match(cluster, survivors), "the rebalanced topologies", 60)
    acked = {**quiet.acked, **load.acked}
    on_victim = [k for k in acked if active_of(vb_map, k) == name]
    assert len(on_victim) >= 50
    for key, i in acked.items():
        assert coll.get(key).content_as[dict] == {"i": i}, key
    # nothing is left to re-commit: every promoted prepare found its majority
    for node in survivors:
        with client(node) as kv:
            rows = kv.stats(b"vbucket-details")
        pending = {k: v for k, v in rows.items() if k.endswith(":sync_write_pending") and v != "0"}
        assert pending == {}


def test_majority_writes_go_on_through_a_rebalance_in_and_every_acknowledged_one_stays(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[Any],
) -> None:
    """Two nodes, a third added and rebalanced in under Majority writes: each move's active
    gets its new chain (both chains during a takeover's last stage), every write acknowledged
    Success is read back after, and every active ends with the chain the final map gives it."""
    cluster = start_cluster(
        server_factory, manager_factory, tmp_path, nodes=2, replicas=1, num_vbuckets=VBUCKETS
    )
    wait_for(lambda: topologies_match(cluster, cluster.nodes), "every active's topology", 60)
    coll = connect(cluster.nodes[0], sdk, kv_timeout_s=10)
    with DurableWriter(coll, "moving", 2) as load:
        wait_for(lambda: len(load.acked) >= 100, "durable writes")
        newcomer = server_factory(
            tmp_path / "n2", tmp_path / "n2.log", "--managed", "--vbuckets", str(VBUCKETS)
        )
        newcomer.start()
        cluster.nodes.append(newcomer)
        cluster.manager.api("POST", "/controller/addNode", hostname=cluster.name(newcomer))
        cluster.manager.api("POST", "/controller/rebalance")
        # 683 moves with the writes on: minutes on a busy two-core machine
        wait_for(lambda: rebalance_state(cluster) != "running", "the rebalance to end", 900)
        assert rebalance_state(cluster) == "idle"
        acked_during = len(load.acked)
    # every new active had its chain from its first moment (it went pending with it): none
    # refused; an ambiguous answer (an old active stepping down) is allowed, never counted
    assert load.kinds["DurabilityImpossibleException"] == 0, load.kinds
    wait_for(lambda: topologies_match(cluster, cluster.nodes), "the final topologies", 60)
    assert topologies(newcomer)  # it took actives over, each with its chain
    assert acked_during > 100
    for key, i in load.acked.items():
        assert coll.get(key).content_as[dict] == {"i": i}, key
