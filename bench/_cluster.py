"""The same data on one node and on a local 3-node cluster, for the benches' 3-node runs.

Theory of operation
-------------------
:func:`same_data` starts a fresh ``dcpkv server`` (``_server.bench_server``) and a local
cluster (:class:`~dcpkv.cluster.local.LocalCluster`: three managed nodes and the manager, one
replica), waits until the cluster's map names an active for every vbucket, and writes the
same ``count`` items (16-byte keys, 100-byte values) into both through the cluster-aware
:class:`~dcpkv.client.writer.KVWriter` (on the cluster: each to its vbucket's active, which
replicates it). It yields the connection settings of both, the node first; the benches then
time the same reader on each, so the ratio is the cost (or the gain) of reading across three
nodes. Everything is stopped and removed afterwards.

Loading goes through the protocol, not the engine (as the single-node runs do), because a
cluster's vbuckets and replicas are placed by the manager: keep ``count`` moderate.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import _placement
from _server import bench_server
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.writer import KVWriter, WriteOp
from dcpkv.cluster.local import LocalCluster

NODES = 3
REPLICAS = 1
CHUNK = 8192


def _load(conn: ConnectionSettings, count: int, vbuckets: int) -> float:
    """Write the items; seconds taken."""
    value = b"v" * 100
    start = time.perf_counter()
    with KVWriter(conn, vbuckets) as writer:
        for base in range(0, count, CHUNK):
            writer.write(
                WriteOp(b"key-%012d" % i, value=value)
                for i in range(base, min(count, base + CHUNK))
            )
    return time.perf_counter() - start


async def _ready(conn: ConnectionSettings, timeout_s: float = 60.0) -> None:
    kv = await ClusterKV.open(ClientSettings(conn))
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = kv.router.map
            if m is not None and all(m.active(vb) for vb in range(m.num_vbuckets)):
                return
            await asyncio.sleep(0.1)
            await kv.refresh()
    finally:
        await kv.close()
    raise SystemExit("the cluster map never named an active for every vbucket")


@contextmanager
def same_data(
    count: int, vbuckets: int, label: str, width: int = 30
) -> Iterator[tuple[ConnectionSettings, ConnectionSettings]]:
    """(one node, the 3-node cluster), both holding the same ``count`` items."""
    with (
        bench_server(vbuckets, label=f"{label}-single") as port,
        tempfile.TemporaryDirectory(prefix=f"dcpkv-bench-{label}-cluster-") as tmp,
    ):
        cluster = LocalCluster(Path(tmp), nodes=NODES, replicas=REPLICAS, num_vbuckets=vbuckets)
        try:
            with _placement.servers():
                cluster.start()
            nodes = ",".join(cluster.address(c) for c in cluster.data_nodes)
            single = ConnectionSettings.at(port=port)
            three = ConnectionSettings.parse(f"couchbase://{nodes}")
            asyncio.run(_ready(three))
            for what, conn in (("1 node", single), (f"{NODES} nodes", three)):
                took = _load(conn, count, vbuckets)
                print(f"  {f'load {count:,} items, {what}':<{width}} {took:7.2f} s")
            yield single, three
        finally:
            cluster.stop()
