"""Rebalance under the official Couchbase SDK: it routes by the map, meets NotMyVbucket while a
vbucket is handed over, reads the new map and carries on: no operation fails, every write it
saw acknowledged is there afterwards, and its reads never go back in time."""

from __future__ import annotations

from pathlib import Path

from couchbase.cluster import Cluster as SdkCluster
from couchbase.collection import Collection
from couchbase.exceptions import CouchbaseException
from managerproc import ManagerProcess, start_cluster
from rebalancecheck import served_map
from sdkhelp import connect
from serverproc import ServerProcess

KEYS = 64


class SdkLoad:
    """Upserts ever higher counters over a few keys and reads others back, one step at a time
    (driven from the test's thread: from a second Python thread its calls did not progress
    here)."""

    def __init__(self, coll: Collection) -> None:
        self.coll = coll
        self.acked: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.went_back: list[tuple[str, int, int]] = []
        self.failures = 0
        self.i = 0

    def step(self) -> None:
        i, self.i = self.i, self.i + 1
        key, read = f"sdk-{i % KEYS}", f"sdk-{(i * 7) % KEYS}"
        try:
            self.coll.upsert(key, {"i": i})
            self.acked[key] = i
            value = self.coll.get(read).content_as[dict]["i"] if read in self.acked else None
        except CouchbaseException:
            self.failures += 1
            return
        if value is not None:
            if value < self.seen.get(read, -1):
                self.went_back.append((read, self.seen[read], value))
            self.seen[read] = value


def test_rebalance_in_under_the_official_sdk(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[SdkCluster],
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=1)
    load = SdkLoad(connect(cluster.nodes[0], sdk, kv_timeout_s=5.0))
    while load.i < 4 * KEYS:
        load.step()
    node = server_factory(tmp_path / "n2", tmp_path / "n2.log", "--managed", "--vbuckets", "16")
    node.start()
    manager = cluster.manager
    manager.api("POST", "/settings/rebalance", movesAtOnce="1")  # a longer overlap with the load
    manager.api("POST", "/controller/addNode", hostname=cluster.name(node))
    manager.api("POST", "/controller/rebalance")
    during = 0
    while manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "running":
        for _ in range(20):
            load.step()
            during += 1
    assert manager.api("GET", "/pools/default/rebalanceProgress")["state"] == "idle"
    for _ in range(4 * KEYS):
        load.step()
    # the load ran while vbuckets moved (at least one round of steps; how many depends on the
    # machine's speed, so it is not counted further)
    assert during >= 20 and not load.went_back, (during, load.went_back[:5])
    for key, value in load.acked.items():
        assert load.coll.get(key).content_as[dict]["i"] == value
    assert load.failures == 0  # NotMyVbucket while a vbucket moved was retried by the SDK
    assert len(served_map([*cluster.nodes, node]).servers) == 3
