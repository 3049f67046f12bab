"""Automatic failover with real processes: managed data nodes and ``dcpkv manager`` on free
ports, auto-failover switched on with a short timeout through the admin API.

The kill -9 story is the issue's "done when": the official SDK writes steadily and, for each
write, the test polls the vbucket's replica with ObserveSeqno (spec 002, "How front end
clients ensure mutations are replicated or persisted on a replica") and notes the writes a
replica persisted. One node is killed; the manager fails it over by itself; the SDK carries on
once it re-reads the map; every noted write is on the new active, and every replica ends
equal to its active. Waits are bounded polling loops; nothing asserts on time.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from couchbase.cluster import Cluster as SdkCluster
from couchbase.collection import Collection
from couchbase.exceptions import CouchbaseException

from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.kvclient import poll_rounds
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, client, start_cluster, wait_for
from support.replicacheck import wait_equal
from support.sdkhelp import connect
from support.serverproc import ServerProcess

TIMEOUT_S = "2"  # the auto-failover timeout: short, so the story stays short


def switch_on(cluster: Cluster) -> None:
    answer = cluster.manager.api(
        "POST", "/settings/autoFailover", enabled="true", timeout=TIMEOUT_S
    )
    assert answer["enabled"] and answer["timeout"] == int(TIMEOUT_S)


def membership(cluster: Cluster) -> dict[str, str]:
    return {n["hostname"]: n["clusterMembership"] for n in cluster.status()["nodes"]}


def auto_failover(cluster: Cluster) -> dict[str, Any]:
    return cluster.status()["autoFailover"]


def current_map(cluster: Cluster, live: list[ServerProcess]) -> VBucketMap:
    """The newest map the live nodes serve."""
    maps = []
    for node in live:
        with client(node) as kv:
            maps.append(VBucketMap.from_config(json.loads(kv.call(Opcode.GetClusterConfig).value)))
    return max(maps, key=lambda m: m.version)


# -- the writer -------------------------------------------------------------------------------


@dataclass
class Writer:
    """The SDK writes; the test confirms persistence on the vbucket's replica itself."""

    coll: Collection
    cluster: Cluster
    live: list[ServerProcess]
    vb_map: VBucketMap
    written: dict[str, int] = field(default_factory=dict)  # key -> value acknowledged
    confirmed: dict[str, int] = field(default_factory=dict)  # ... and persisted on a replica
    failures: int = 0

    def write(self, i: int) -> str | None:
        """Write key ``w<i>``; None when the SDK gave up (a dead node, an old map)."""
        key = f"w{i}"
        try:
            token = self.coll.upsert(key, {"i": i}).mutation_token()
        except CouchbaseException:
            self.failures += 1
            return None
        self.written[key] = i
        assert token is not None
        if self._persisted_on_replica(
            token.partition_id, token.partition_uuid, token.sequence_number
        ):
            self.confirmed[key] = i
        return key

    def _persisted_on_replica(self, vb: int, uuid: int, seqno: int) -> bool:
        for _ in range(2):  # the map may have moved on since it was read: read it once more
            replica = self._replica(vb)
            if replica is not None and _observe_until(replica, vb, uuid, seqno):
                return True
            self.vb_map = current_map(self.cluster, self.live)
        return False

    def _replica(self, vb: int) -> ServerProcess | None:
        index = self.vb_map.chains[vb][1]
        if index == NOBODY:
            return None
        name = self.vb_map.servers[index]
        return next((n for n in self.live if self.cluster.name(n) == name), None)


def _observe_until(replica: ServerProcess, vb: int, uuid: int, seqno: int) -> bool:
    """Poll ObserveSeqno on the replica until it persisted ``seqno`` of branch ``uuid``."""
    try:
        with client(replica) as kv:
            for _ in poll_rounds(5, 0.005):
                answer = kv.call(Opcode.ObserveSeqno, vbucket=vb, value=struct.pack(">Q", uuid))
                if answer.status != Status.Success:
                    return False
                fmt, _, got_uuid, persisted, _ = struct.unpack_from(">BHQQQ", answer.value)
                if fmt != 0 or got_uuid != uuid:  # another branch: the write may be gone
                    return False
                if persisted >= seqno:
                    return True
    except OSError:
        return False
    return False


# -- the tests --------------------------------------------------------------------------------


def test_kill9_of_an_active_under_load_fails_over_by_itself_and_loses_no_replicated_write(
    server_factory: type[ServerProcess],
    manager_factory: type[ManagerProcess],
    tmp_path: Path,
    sdk: list[SdkCluster],
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)
    switch_on(cluster)
    victim, survivors = cluster.nodes[0], cluster.nodes[1:]
    victim_name = cluster.name(victim)
    before = current_map(cluster, cluster.nodes)
    moved = {
        vb for vb, chain in enumerate(before.chains) if before.servers[chain[0]] == victim_name
    }
    writer = Writer(connect(survivors[0], sdk), cluster, survivors, before)
    i = 0
    while len(writer.confirmed) < 150:  # a steady load before the crash
        writer.write(i := i + 1)
    assert any(vbucket_for_key(k.encode(), VBUCKETS) in moved for k in writer.confirmed)
    victim.kill9()
    killed_at = i
    # the load goes on; the manager fails the victim over by itself; the SDK follows the map
    failed_over, resumed = False, 0
    for _ in poll_rounds(120, 0):
        key = writer.write(i := i + 1)
        if not failed_over and i % 10 == 0:
            failed_over = membership(cluster)[victim_name] == "failed"
        if failed_over and key is not None and vbucket_for_key(key.encode(), VBUCKETS) in moved:
            resumed += 1  # acknowledged by the promoted replica: the SDK has the new map
        if resumed >= 20:
            break
    else:
        raise AssertionError(
            f"writes to the moved vbuckets never resumed: {auto_failover(cluster)}"
        )
    auto = auto_failover(cluster)
    assert auto["count"] == 1 and [e["node"] for e in auto["events"]] == [victim_name]
    assert "unresponsive for" in auto["events"][0]["reason"]
    assert writer.failures < i - killed_at  # most writes went through even meanwhile
    # every write a replica persisted is on the new active, with its value
    final = current_map(cluster, survivors)
    assert victim_name not in final.servers
    for key, value in writer.confirmed.items():
        vb = vbucket_for_key(key.encode(), VBUCKETS)
        with client(cluster.node(final.servers[final.chains[vb][0]])) as kv:
            got = kv.get(key.encode(), vbucket=vb)
        assert got.status == Status.Success, key
        assert json.loads(bytes(got.value)) == {"i": value}, key
    assert_replicas_equal(cluster, final)


def assert_replicas_equal(cluster: Cluster, vb_map: VBucketMap) -> None:
    """Every replica holds what its active holds: keys, values, CAS, seqnos, tombstones,
    and the same failover log."""
    pairs: dict[tuple[str, str], list[int]] = {}
    for vb, chain in enumerate(vb_map.chains):
        for index in chain[1:]:
            if index != NOBODY:
                key = (vb_map.servers[chain[0]], vb_map.servers[index])
                pairs.setdefault(key, []).append(vb)
    assert pairs, "no vbucket has a replica left to compare"
    for (active_name, replica_name), vbs in pairs.items():
        wait_equal(cluster.node(active_name).port, cluster.node(replica_name).port, vbs)


def test_a_second_node_waits_for_the_count_reset_and_a_node_without_replicas_stays(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=2)
    switch_on(cluster)
    first, second, last = cluster.nodes
    first.kill9()
    wait_for(lambda: membership(cluster)[cluster.name(first)] == "failed", "first failover", 60)
    second.kill9()
    # the second is held by the quota, and says so; it stays a member
    wait_for(
        lambda: "quota is used" in auto_failover(cluster)["held"].get(cluster.name(second), ""),
        "the second node held by the quota",
        60,
    )
    assert membership(cluster)[cluster.name(second)] == "active"
    assert auto_failover(cluster)["count"] == 1
    reset = cluster.manager.api("POST", "/settings/autoFailover/resetCount")
    assert reset["count"] == 0
    wait_for(lambda: membership(cluster)[cluster.name(second)] == "failed", "second failover", 60)
    auto = auto_failover(cluster)
    assert [e["node"] for e in auto["events"]] == [cluster.name(first), cluster.name(second)]
    assert auto["count"] == 1 and not auto["held"]
    # what automatic failover did is in the configuration file: a restart still shows it
    cluster.manager.kill9()
    cluster.manager.start(same_port=True)
    assert auto_failover(cluster)["events"] == auto["events"]
    with client(last) as kv:  # the last node serves every vbucket
        rows = kv.stats(b"vbucket")
    assert sorted(int(k[3:]) for k, v in rows.items() if v == "active") == list(range(VBUCKETS))


def test_a_node_holding_an_unreplicated_active_is_never_failed_over(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    cluster = start_cluster(server_factory, manager_factory, tmp_path, nodes=2, replicas=0)
    switch_on(cluster)
    victim = cluster.nodes[0]
    victim.kill9()
    wait_for(
        lambda: "has no replica" in auto_failover(cluster)["held"].get(cluster.name(victim), ""),
        "the node held for its unreplicated vbuckets",
        60,
    )
    assert membership(cluster)[cluster.name(victim)] == "active"
    assert auto_failover(cluster)["count"] == 0 and not auto_failover(cluster)["events"]
    # and the CLI shows why
    status = cluster.manager.cli("cluster", "status")
    assert f"{cluster.name(victim)} is unresponsive and not failed over" in status
    assert "has no replica" in status
