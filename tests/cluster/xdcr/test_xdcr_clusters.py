"""XDCR between two real local clusters (managers and data nodes as processes): one way, then
both ways with writes to the same keys on each side; at the end both sides hold the same
documents with the same CAS and rev seqnos, the winner of each conflict is the one the rule
picks, and the replications go quiet when the writes stop (no echo loop)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.status import Status
from dcpkv.protocol import kv
from support.managerproc import Cluster, ManagerProcess, start_cluster, wait_for
from support.serverproc import ServerProcess

KEYS = [f"doc-{i}".encode() for i in range(120)]
Meta = tuple[int, int, bool, bytes | None]  # cas, rev seqno, deleted, value


def seeds(cluster: Cluster) -> str:
    return "couchbase://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)


def settings(cluster: Cluster) -> ClientSettings:
    return ClientSettings(ConnectionSettings.parse(seeds(cluster)))


async def _write(cluster: Cluster, keys: list[bytes], value: bytes, delete: bool) -> dict:
    async with await ClusterKV.open(settings(cluster)) as c:
        written = {}
        for key in keys:
            vb = c.vbucket_of(key)
            msg = kv.Delete(key=key, vbucket=vb) if delete else kv.Set(
                key=key, value=value, vbucket=vb
            )  # fmt: skip
            answer = await c.call(vb, msg)
            assert getattr(answer, "status", 0) == Status.Success, answer
            written[key] = answer.cas
        return written


async def _metas(cluster: Cluster, keys: list[bytes]) -> dict[bytes, Meta | None]:
    async with await ClusterKV.open(settings(cluster)) as c:
        out: dict[bytes, Meta | None] = {}
        for key in keys:
            vb = c.vbucket_of(key)
            meta = await c.call(vb, kv.GetMeta(key=key, vbucket=vb))
            if not isinstance(meta, kv.GetMetaResponse):
                out[key] = None
                continue
            got = await c.call(vb, kv.Get(key=key, vbucket=vb))
            value = bytes(got.value) if isinstance(got, kv.GetResponse) else None
            out[key] = (meta.cas, meta.rev_seqno, meta.deleted, value)
        return out


def write(cluster: Cluster, keys: list[bytes], value: bytes = b"", *, delete: bool = False) -> dict:
    return asyncio.run(_write(cluster, keys, value, delete))


def metas(cluster: Cluster, keys: list[bytes] = KEYS) -> dict[bytes, Meta | None]:
    return asyncio.run(_metas(cluster, keys))


def tasks(cluster: Cluster) -> list[dict[str, Any]]:
    answer: Any = cluster.manager.api("GET", "/pools/default/tasks")
    return list(answer)


def replicate(source: Cluster, target: Cluster, name: str) -> str:
    source.manager.cli(
        "xdcr", "remote", "add", name, "--hostname", seeds(target),
        "--username", "Administrator", "--remote-password", "password",
    )  # fmt: skip
    out = source.manager.cli("xdcr", "create", "--to-cluster", name, "--checkpoint-interval", "1")
    return out.split()[1]  # "replication ID created"


def two_clusters(
    servers: type[ServerProcess], managers: type[ManagerProcess], tmp: Path,
    a: tuple[int, int], b: tuple[int, int],
) -> tuple[Cluster, Cluster]:  # fmt: skip
    """Clusters A and B of (nodes, replicas) each, in tmp/a and tmp/b."""
    started = []
    for name, (nodes, replicas) in (("a", a), ("b", b)):
        (tmp / name).mkdir()
        started.append(start_cluster(servers, managers, tmp / name, nodes=nodes,
                                     replicas=replicas))  # fmt: skip
    return started[0], started[1]


def converged(a: Cluster, b: Cluster, keys: list[bytes] = KEYS) -> bool:
    return metas(a, keys) == metas(b, keys)


def test_one_way_then_both_ways_converge_without_echo(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    a, b = two_clusters(server_factory, manager_factory, tmp_path, (2, 1), (1, 0))
    write(a, KEYS, b'{"side":"a","n":0}')
    a_to_b = replicate(a, b, "b")
    wait_for(lambda: converged(a, b), "A's documents on B", timeout_s=60)
    assert all(m is not None and m[1] == 1 for m in metas(b).values())

    # both ways: the same keys changed on each side while the replications are paused, so
    # each side's change has the same rev seqno and the larger CAS must win everywhere
    b_to_a = replicate(b, a, "a")
    a.manager.cli("xdcr", "pause", a_to_b)
    b.manager.cli("xdcr", "pause", b_to_a)
    on_a = write(a, KEYS[:80], b'{"side":"a","n":1}')
    on_b = write(b, KEYS[40:], b'{"side":"b","n":1}')
    deleted_on_b = write(b, KEYS[100:110], delete=True)
    a.manager.cli("xdcr", "resume", a_to_b)
    b.manager.cli("xdcr", "resume", b_to_a)
    wait_for(lambda: converged(a, b), "both sides equal", timeout_s=90)

    final = metas(a)
    for key in KEYS:
        cas, rev, deleted, value = final[key]  # type: ignore[misc]
        if key in deleted_on_b:  # rev 3 (B's write, then its delete) beats A's rev 2
            assert deleted and cas == deleted_on_b[key] and rev == 3, key
        elif key in on_a and key in on_b:
            winner = max(on_a[key], on_b[key])
            assert (cas, rev) == (winner, 2), key
            side = b"a" if winner == on_a[key] else b"b"
            assert value == b'{"side":"%s","n":1}' % side
        else:
            assert rev == 2 and cas == (on_a.get(key) or on_b.get(key)), key

    # no echo loop: once nothing is left to send, the counts stop moving
    def quiet() -> tuple[int, ...] | None:
        stats = [t["stats"] for t in tasks(a) + tasks(b)]
        if any(s.get("changes_left", 1) for s in stats):
            return None
        return tuple(s["docs_written"] + s["docs_failed_cr_target"] for s in stats)

    wait_for(lambda: quiet() is not None, "replications caught up", timeout_s=30)
    first = quiet()
    time.sleep(2.5)  # a few checkpoint intervals: an echo would have shown by now
    assert quiet() == first
    written = {t["id"]: t["stats"] for t in tasks(a) + tasks(b)}
    # B->A sent back what it got from A (at least the 40 keys only A changed, whose newest
    # version on B is A's): A refused each as identical
    assert written[b_to_a]["docs_failed_cr_target"] >= 40


def caught_up(cluster: Cluster) -> bool:
    """Every replica vbucket of the cluster holds what its active holds."""
    nodes = cluster.status()["nodes"]
    return all(n.get("replicationLag") == 0 for n in nodes if n["clusterMembership"] == "active")


def fail_over(cluster: Cluster, victim: ServerProcess) -> None:
    victim.kill9()
    cluster.manager.api("POST", "/controller/failOver", otpNode=cluster.name(victim))


def test_a_replication_rides_through_a_failover_on_each_side(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    a, b = two_clusters(server_factory, manager_factory, tmp_path, (2, 1), (2, 1))
    replicate(a, b, "b")
    batches = [[f"fo-{n}-{i}".encode() for i in range(40)] for n in range(3)]
    everything: list[bytes] = []
    for n, (batch, failing) in enumerate(zip(batches, (None, b, a), strict=True)):
        if failing is not None:
            wait_for(lambda c=failing: caught_up(c), "replicas caught up", timeout_s=30)
            fail_over(failing, failing.nodes[1])  # the target's writes, then the source's
            # streams, move to the promoted replicas
        write(a, batch, b'{"batch":%d}' % n)
        everything += batch
        wait_for(lambda k=list(everything): converged(a, b, k), f"batch {n} on B", timeout_s=90)
    final = metas(b, everything)
    assert all(m is not None and not m[2] for m in final.values())


def test_a_restarted_manager_resumes_its_replication_from_the_checkpoints(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    a, b = two_clusters(server_factory, manager_factory, tmp_path, (1, 0), (1, 0))
    rid = replicate(a, b, "b")
    first = [f"cp-{i}".encode() for i in range(200)]
    write(a, first, b'{"v":1}')
    wait_for(lambda: converged(a, b, first), "the first docs on B", timeout_s=60)
    a.manager.cli("xdcr", "pause", rid)  # a paused replication keeps a final checkpoint
    assert list((tmp_path / "a" / "manager" / "xdcr-checkpoints").glob("*.json"))
    a.manager.kill9()
    a.manager.start(same_port=True)
    assert tasks(a)[0]["status"] == "paused"  # the records survived the restart
    a.manager.cli("xdcr", "resume", rid)
    more = [f"cp-more-{i}".encode() for i in range(10)]
    write(a, more, b'{"v":2}')
    wait_for(lambda: converged(a, b, first + more), "the new docs on B", timeout_s=60)
    stats = tasks(a)[0]["stats"]
    # resumed where it stood: the new docs, not the 200 before them again
    assert stats["docs_written"] == len(more) and stats["docs_processed"] < len(first)


def test_a_replication_survives_its_target_node_killed_and_restarted_mid_stream(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> None:
    """B keeps its writes in memory only (a flusher that never runs), so its kill -9 loses
    every write it had acknowledged: the replicator notices the target's new history at its
    next checkpoint and resumes from a checkpoint B still holds (here: from 0)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = start_cluster(server_factory, manager_factory, tmp_path / "a", nodes=1, replicas=0)
    b = start_cluster(server_factory, manager_factory, tmp_path / "b", nodes=1, replicas=0,
                      node_args=("--flush-interval", "100000"))  # fmt: skip
    a.manager.api("POST", "/pools/default/remoteClusters", name="b", hostname=seeds(b),
                  username="Administrator", password="password")  # fmt: skip
    a.manager.api("POST", "/controller/createReplication", fromBucket="default", toCluster="b",
                  toBucket="default", replicationType="continuous", checkpointInterval="1",
                  failureRestartInterval="1")  # fmt: skip
    before = [f"kill-{i}".encode() for i in range(300)]
    write(a, before, b'{"before":1}')
    wait_for(lambda: converged(a, b, before), "the first docs on B", timeout_s=60)
    time.sleep(1.5)  # a checkpoint past them: they are acknowledged, and only in B's memory
    victim = b.nodes[0]
    victim.kill9()
    during = [f"kill-during-{i}".encode() for i in range(100)]
    write(a, during, b'{"during":1}')  # the replicator retries them while B is down
    victim.start(same_port=True)
    after = [f"kill-after-{i}".encode() for i in range(100)]
    write(a, after, b'{"after":1}')
    everything = before + during + after
    wait_for(lambda: converged(a, b, everything), "every doc on B again", timeout_s=120)
    assert tasks(a)[0]["restarts"] >= 1  # it noticed B's new history
