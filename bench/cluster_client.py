"""The cluster-aware client on a local 3-node cluster: routed writes, client durability, and
the DCP consumer streaming every vbucket from its active.

Theory of operation
-------------------
``dcpkv.cluster.local.LocalCluster`` starts three managed nodes and a manager (1 replica,
1024 vbuckets) under a temporary directory. Through a connection string naming all three:

1. **Writes**: ``--count`` upserts (16-byte keys, 100-byte values) through
   ``ClusterKV.upsert``, 256 in flight: ops/s, each routed to its vbucket's active.
2. **Durable writes**: ``--durable`` upserts one at a time with ``persist_to=2,
   replicate_to=1`` (on the active's disk and on the replica's): p50/p99 latency in ms, which
   is mostly the flusher and the replica's snapshot persistence.
3. **Stream**: a ``Consumer`` from the beginning to the high seqnos of every vbucket (one DCP
   connection per node): items/s.

``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

import _placement
from _report import bench_main, write_json
from dcpkv.client import events
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.consumer import Consumer
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.cluster.local import LocalCluster
from latency import _quantile_ms

VBUCKETS = 1024
IN_FLIGHT = 256


async def _ready(kv: ClusterKV) -> None:
    for _ in range(600):
        m = kv.router.map
        if m is not None and all(m.active(vb) for vb in range(m.num_vbuckets)):
            return
        await asyncio.sleep(0.1)
        await kv.refresh()
    raise RuntimeError("the cluster map never named an active for every vbucket")


async def _writes(kv: ClusterKV, count: int) -> float:
    value = b"v" * 100
    start = time.perf_counter()
    for base in range(0, count, IN_FLIGHT):
        keys = [b"key-%012d" % i for i in range(base, min(count, base + IN_FLIGHT))]
        await asyncio.gather(*(kv.upsert(k, value) for k in keys))
    return count / (time.perf_counter() - start)


async def _durable(kv: ClusterKV, count: int) -> list[float]:
    took = []
    for i in range(count):
        start = time.perf_counter()
        await kv.upsert(b"durable-%08d" % i, b"d" * 100, persist_to=2, replicate_to=1)
        took.append(time.perf_counter() - start)
    return sorted(took)


async def _stream(config: ClientSettings) -> tuple[int, float]:
    items = 0
    start = time.perf_counter()
    async with Consumer(config) as consumer:
        async for ev in consumer.stream(start="beginning", end="now"):
            items += isinstance(ev, events.Mutation)
    return items, items / (time.perf_counter() - start)


async def _run(config: ClientSettings, count: int, durable: int) -> dict[str, float]:
    kv = await ClusterKV.open(config)
    try:
        await _ready(kv)
        write_rate = await _writes(kv, count)
        took = await _durable(kv, durable)
    finally:
        await kv.close()
    items, stream_rate = await _stream(config)
    return {
        "routed_upserts_per_s": round(write_rate),
        "durable_p50_ms": round(_quantile_ms(took, 0.5), 2),
        "durable_p99_ms": round(_quantile_ms(took, 0.99), 2),
        "stream_items": items,
        "stream_items_per_s": round(stream_rate),
    }


def main(
    count: Annotated[int, typer.Option(help="Routed upserts.")] = 50_000,
    durable: Annotated[
        int, typer.Option(help="Durable upserts (persist_to=2, replicate_to=1).")
    ] = 200,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="dcpkv-bench-cluster-") as tmp:
        cluster = LocalCluster(Path(tmp), nodes=3, replicas=1, num_vbuckets=VBUCKETS)
        try:
            with _placement.servers():
                cluster.start()
            seeds = ",".join(f"127.0.0.1:{c.port}" for c in cluster.children if c.name != "manager")
            config = ClientSettings(ConnectionSettings.parse(f"couchbase://{seeds}"), name="bench")
            figures = asyncio.run(_run(config, count, durable))
        finally:
            cluster.stop()
    print(figures)
    write_json(json_out, "cluster_client", figures, nodes=3, replicas=1, num_vbuckets=VBUCKETS)


if __name__ == "__main__":
    bench_main(main)
