"""Rebalance under the official Couchbase SDK (issue 29): a cluster of three grows to four and
shrinks back to three while the SDK writes and reads. It routes by the map, meets NotMyVbucket
while a vbucket is handed over, reads the map it carries (or the one pushed to it) and carries
on: no operation fails, every write it saw acknowledged is there afterwards, and its reads
never go back in time. Meanwhile no node that gave a vbucket away answers NotMyVbucket with a
map naming itself, and every node pushes each newer map to the clients that asked for it."""

from __future__ import annotations

from pathlib import Path

from couchbase.cluster import Cluster as SdkCluster
from couchbase.collection import Collection
from couchbase.exceptions import CouchbaseException

from support.managerproc import ManagerProcess, start_cluster
from support.rebalancecheck import MapWatch, served_map
from support.sdkhelp import connect
from support.serverproc import ServerProcess

KEYS = 64
VBUCKETS = 16


class SdkLoad:
    """Upserts ever higher counters over a few keys and reads others back, one step at a time
    (driven from the test's thread: from a second Python thread its calls did not progress
    here)."""

    def __init__(self, coll: Collection) -> None:
        self.coll = coll
        self.acked: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.went_back: list[tuple[str, int, int]] = []
        self.failures: list[str] = []
        self.i = 0

    def step(self) -> None:
        i, self.i = self.i, self.i + 1
        key, read = f"sdk-{i % KEYS}", f"sdk-{(i * 7) % KEYS}"
        try:
            self.coll.upsert(key, {"i": i})
            self.acked[key] = i
            value = self.coll.get(read).content_as[dict]["i"] if read in self.acked else None
        except CouchbaseException as exc:
            self.failures.append(type(exc).__name__)
            return
        if value is not None:
            if value < self.seen.get(read, -1):
                self.went_back.append((read, self.seen[read], value))
            self.seen[read] = value


def rebalance_under(load: SdkLoad, manager: ManagerProcess, **params: str) -> int:
    """Run a rebalance with the load stepping; how many steps ran meanwhile."""
    manager.api("POST", "/controller/rebalance", **params)
    during = 0
    while manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "running":
        for _ in range(20):
            load.step()
            during += 1
    assert manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "idle"
    return during


def test_3_to_4_to_3_under_the_official_sdk(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[SdkCluster],
) -> None:
    cluster = start_cluster(
        server_factory, manager_factory, tmp_path, nodes=3, replicas=1, num_vbuckets=VBUCKETS
    )
    # the SDK's own KV timeout (2.5 s): a stale map for longer would fail writes
    load = SdkLoad(connect(cluster.nodes[0], sdk, kv_timeout_s=2.5))
    while load.i < 4 * KEYS:
        load.step()
    node = server_factory(
        tmp_path / "n3", tmp_path / "n3.log", "--managed", "--vbuckets", str(VBUCKETS)
    )
    node.start()
    nodes = [*cluster.nodes, node]
    manager = cluster.manager
    with MapWatch(nodes, VBUCKETS) as watch:
        manager.api("POST", "/controller/addNode", hostname=cluster.name(node))
        during_in = rebalance_under(load, manager)
        assert len(served_map(nodes).servers) == 4
        watch.phase()
        leaving = cluster.nodes[0]  # the node the SDK bootstrapped from
        during_out = rebalance_under(load, manager, ejectedNodes=cluster.name(leaving))
        for _ in range(4 * KEYS):
            load.step()
    # the load ran while vbuckets moved (at least one round of steps each way; how many
    # depends on the machine's speed, so it is not counted further)
    assert during_in >= 20 and during_out >= 20
    assert load.failures == [], load.failures  # NotMyVbucket was retried by the SDK
    assert not load.went_back, load.went_back[:5]
    for key, value in load.acked.items():
        assert load.coll.get(key).content_as[dict]["i"] == value
    final = served_map(nodes)
    assert cluster.name(leaving) not in final.servers and len(final.servers) == 3
    assert not watch.errors, watch.errors
    assert watch.probes > 0 and watch.stale == [], watch.stale[:5]
    for n in nodes:  # every newer map was pushed, in order, up to the one served
        revs = watch.pushed[n.port]
        assert revs == sorted(set(revs)), (n.port, revs)
        assert revs[-1] == served_map([n]).version, (n.port, revs[-1])
