"""XDCR between two local clusters: replication throughput, and the lag at a paced write rate.

Theory of operation
-------------------
Two ``LocalCluster`` s on this machine (``--nodes`` data nodes each, no replica, ``--vbuckets``),
the replication created through the source manager's REST API, as ``dcpkv xdcr create``
does:

1. **Throughput (one way)**: the source is loaded with ``--count`` documents (16-byte keys,
   100-byte values) through the cluster-aware writer; the clock starts when the replication
   is created and stops when the replication (``/pools/default/tasks``) is done with
   ``--count`` changes (written, or refused by conflict resolution): docs/s of a replication
   starting from zero (DCP backfill, batches, with-meta writes, the target's actives).
2. **Throughput (both ways)**: each side then gets ``--count`` new documents of its own and a
   replication back is created: the clock stops when each replication is done with the
   whole history of its side (the echoes of the other side's documents included).
3. **Lag**: a writer paces plain Sets into the source (``--rate`` writes/s for
   ``--duration`` seconds), and a DCP consumer of the *target* (started at its current high
   seqnos) notes when each key arrives there: write acknowledged by the source -> change
   received from the target (replicated, written, and streamed by the target's producer: an
   upper bound of write-to-visible). p50/p99 in ms.

Everything runs on this machine's two cores, the writer and the consumer in this process:
the figures are this machine's, at this moment (bench/README.md).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

import _placement
from _cluster import _load, _ready
from _report import bench_main, window, write_json
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.consumer import Consumer
from dcpkv.client.events import Mutation
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.cluster.admin_client import admin_request
from dcpkv.cluster.local import LocalCluster
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from latency import _quantile_ms


def _api(cluster: LocalCluster, method: str, path: str, **params: str) -> Any:
    return admin_request(cluster.manager_url, method, path, user=DEFAULT_USER,
                         password=DEFAULT_PASSWORD, params=params or None)  # fmt: skip


def _conn(cluster: LocalCluster) -> ConnectionSettings:
    nodes = ",".join(cluster.address(c) for c in cluster.data_nodes)
    return ConnectionSettings.parse(f"couchbase://{nodes}")


def _replicate(source: LocalCluster, target: LocalCluster, name: str) -> str:
    _api(source, "POST", "/pools/default/remoteClusters", name=name,
         hostname=target.address(target.data_nodes[0]), username=DEFAULT_USER,
         password=DEFAULT_PASSWORD)  # fmt: skip
    doc = _api(source, "POST", "/controller/createReplication", fromBucket="default",
               toCluster=name, toBucket="default", replicationType="continuous",
               checkpointInterval="5")  # fmt: skip
    return str(doc["id"])


_DONE = ("docs_written", "docs_failed_cr_target", "docs_failed_cr_source", "docs_failed")


def _done(cluster: LocalCluster, rid: str) -> int:
    """Changes the replication has finished with: written, or refused as it should be (an
    echo, a loser), so the count does not depend on which side won."""
    tasks = _api(cluster, "GET", "/pools/default/tasks")
    stats = next(t for t in tasks if t["id"] == rid)["stats"]
    return sum(int(stats.get(name, 0)) for name in _DONE)


def _wait_done(pairs: list[tuple[LocalCluster, str, int]], timeout_s: float) -> float:
    start = time.perf_counter()
    while any(_done(c, rid) < want for c, rid, want in pairs):
        if time.perf_counter() - start > timeout_s:
            raise SystemExit(f"replication did not finish in {timeout_s:g} s")
        time.sleep(0.05)
    return time.perf_counter() - start


def _restarts(*clusters: LocalCluster) -> None:
    """A replication that restarted (and resent from its checkpoints) took longer for it."""
    for cluster in clusters:
        for task in _api(cluster, "GET", "/pools/default/tasks"):
            if task.get("restarts"):
                print(f"  {task['id']}: {task['restarts']} restarts ({task['lastError']})")


async def _lag(source: ConnectionSettings, target: ConnectionSettings, rate: int,
               duration: float) -> list[float]:  # fmt: skip
    acked: dict[bytes, float] = {}
    seen: dict[bytes, float] = {}
    total = int(rate * duration)
    consumer = Consumer(ClientSettings(target, name="bench-xdcr-lag"))

    async def follow() -> None:
        async for event in consumer.stream(start="now"):
            if isinstance(event, Mutation) and event.key.startswith(b"lag-"):
                seen[event.key] = time.perf_counter()
                if len(seen) >= total:
                    return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(1.0)  # the streams are open
    async with await ClusterKV.open(ClientSettings(source)) as kv:
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            key = b"lag-%010d" % i
            await kv.upsert(key, b"v" * 100)
            acked[key] = time.perf_counter()
    try:
        await asyncio.wait_for(follower, timeout=60)  # noqa: TID251 (a bench, not the library)
    except TimeoutError:
        print(f"  lag: {total - len(seen)} of {total} writes never arrived")
    await consumer.close()
    return sorted(seen[k] - acked[k] for k in seen if k in acked)


def main(
    count: Annotated[int, typer.Option(help="Documents replicated in each throughput run.")] = (
        100_000
    ),
    rate: Annotated[int, typer.Option(help="Writes/s during the lag run.")] = 1000,
    duration: Annotated[float, typer.Option(help="Seconds of the lag run.")] = 20.0,
    nodes: Annotated[int, typer.Option(help="Data nodes of each cluster.")] = 1,
    vbuckets: Annotated[int, typer.Option(help="vbuckets of each cluster.")] = 1024,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpkv-bench-xdcr-") as tmp:
        a = LocalCluster(Path(tmp) / "a", nodes=nodes, replicas=0, num_vbuckets=vbuckets)
        b = LocalCluster(Path(tmp) / "b", nodes=nodes, replicas=0, num_vbuckets=vbuckets)
        try:
            for c in (a, b):
                with _placement.servers():
                    c.start()
                asyncio.run(_ready(_conn(c)))
            took = _load(_conn(a), count, vbuckets)
            print(f"  load {count:,} docs into A: {took:.2f} s")
            with window("one_way_docs_per_s"):
                a_to_b = _replicate(a, b, "b")
                one_way = _wait_done([(a, a_to_b, count)], 600)
            print(f"  A -> B, {count:,} docs: {one_way:.2f} s ({count / one_way:,.0f} docs/s)")
            _load_prefixed(_conn(a), count, vbuckets, b"a2-")
            _load_prefixed(_conn(b), count, vbuckets, b"b2-")
            with window("both_ways_docs_per_s"):
                b_to_a = _replicate(b, a, "a")
                # each way: the other side's new docs come back as echoes (refused), so each
                # replication is done with its own history: 3 x count changes
                both = _wait_done([(a, a_to_b, 3 * count), (b, b_to_a, 3 * count)], 900)
            print(f"  both ways, {count:,} new docs each side: {both:.2f} s")
            _restarts(a, b)
            lags = asyncio.run(_lag(_conn(a), _conn(b), rate, duration))
        finally:
            a.stop()
            b.stop()
    figures = {
        "one_way_docs_per_s": count / one_way,
        "both_ways_docs_per_s": 2 * count / both,
        f"lag_p50_ms_{rate}": _quantile_ms(lags, 0.50),
        f"lag_p99_ms_{rate}": _quantile_ms(lags, 0.99),
    }
    write_json(json_path, "xdcr", figures, count=count, rate=rate, nodes=nodes,
               vbuckets=vbuckets, lag_samples=len(lags))  # fmt: skip


def _load_prefixed(conn: ConnectionSettings, count: int, vbuckets: int, prefix: bytes) -> None:
    from dcpkv.client.writer import KVWriter, WriteOp

    with KVWriter(conn, vbuckets) as writer:
        writer.write(WriteOp(prefix + b"%012d" % i, value=b"v" * 100) for i in range(count))


if __name__ == "__main__":
    bench_main(main)
