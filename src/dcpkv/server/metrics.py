"""A data node's Prometheus metrics (``dcpkv server --metrics-port``), in the reference's names.

Theory of operation
-------------------
The server already keeps every figure a monitoring system wants (the counters ``stat``
answers from, :mod:`dcpkv.server.stats`); nothing is counted for Prometheus alone except the
requests per opcode (one list slot per request) and, while metrics are served, the time to
answer each read (:mod:`dcpkv.server.latency`). A scrape reads those figures on the event
loop, where they change, and nowhere else: :class:`NodeCollector`, called in the HTTP
server's own thread, asks the loop for :func:`families` with ``call_soon_threadsafe`` and
waits for them; the text is written in that thread. The loop pays one pass over the buckets'
vbuckets and DCP connections per scrape, and nothing per request.

Names follow Couchbase's (``kv_`` + family + unit suffix; labels ``bucket``, ``op``,
``state``, ``connection_type``):

===================================  =========  ============================================
name                                 labels     what
===================================  =========  ============================================
kv_ops                               op         requests received, by opcode (``get``...)
kv_curr_items                        bucket     documents in the active vbuckets
kv_vb_curr_items                     bucket,    documents per vbucket state
                                     state
kv_num_vbuckets                      bucket,    vbuckets per state
                                     state
kv_mem_used_bytes                    bucket     memory the bucket's documents take
kv_ep_max_size_bytes                 bucket     its memory quota
kv_ep_diskqueue_items                bucket     writes waiting for the flusher
kv_ep_total_persisted                bucket     items the flusher wrote
kv_ep_item_commit_failed             bucket     flushes that failed (a disk fault)
kv_ep_flushes_deferred               bucket     flusher ticks that let a backlog gather
kv_ep_persistence_lag_seconds        bucket     age of the oldest unpersisted write
kv_ep_disk_failing                   bucket     1 while flushes fail
kv_ep_rollback_count                 bucket     replica vbucket rollbacks (history reset)
kv_dcp_connections              bucket,    DCP producer connections
                                     conn. type
kv_dcp_items_remaining               bucket,    items their open streams have still to send
                                     conn. type
kv_dcp_items_sent                    bucket,    items sent
                                     conn. type
kv_dcp_total_data_size_bytes         bucket,    bytes sent
                                     conn. type
kv_dcp_rollback_count                bucket,    stream requests answered Rollback
                                     conn. type
kv_vb_sync_write_accepted_count      bucket     SyncWrites accepted as prepares
kv_vb_sync_write_committed_count     bucket     ... committed
kv_vb_sync_write_aborted_count       bucket     ... aborted or ambiguous (timeout, failover)
kv_sync_write_commit_duration_       level      histogram: prepare to commit, by durability
seconds                                         level (``majority``...)
kv_curr_connections                             open client connections
kv_auth_errors                                  failed logins
kv_rejected_conns                               connections refused (max_connections)
kv_uptime_seconds                               seconds since the process started
kv_cmd_batch_duration_seconds                   histogram: time to answer one read's requests
===================================  =========  ============================================

``connection_type`` is ``replication`` (a replica's stream from its active), ``spark`` (the
Spark source, :mod:`dcpkv.spark`) or ``other`` (:func:`connection_type`). Counters keep the
reference's names, which carry no ``_total`` suffix; they are exposed untyped (Prometheus and
``rate()`` treat them alike, and ``promtool check metrics`` accepts them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.producer import DcpProducer
from dcpkv.protocol.constants import Opcode
from dcpkv.server.latency import LatencyHistogram
from dcpkv.server.state import ServerState
from dcpkv.server.stats import STARTED

SCRAPE_TIMEOUT_S = 10.0  # a loop that does not answer in this long gets an empty scrape
CONNECTION_TYPES = {"Replica:": "replication", "replication:": "replication",
                    "dcpkv-spark:": "spark"}  # fmt: skip


def connection_type(name: str) -> str:
    """A DCP connection's type, from the name its consumer gave it (DcpOpen)."""
    for prefix, kind in CONNECTION_TYPES.items():
        if name.startswith(prefix):
            return kind
    return "other"


def op_name(opcode: int) -> str:
    """``kv_ops``' ``op`` label: the opcode's name in lower case (``get``, ``setq``...)."""
    try:
        return Opcode(opcode).name.lower()
    except ValueError:
        return f"0x{opcode:02x}"


def _add(metric: Metric, labels: dict[str, str], value: float) -> None:
    metric.add_sample(metric.name, labels, value)


def families(state: ServerState) -> list[Metric]:
    """Every metric of this node, read now (call it on the event loop)."""
    out = [_ops(state.ops), *_server(state)]
    for name, bucket in state.buckets.items():
        out.extend(_bucket(name, bucket))
        out.extend(_dcp(name, state))
        out.extend(_sync_writes(name, state.sync_counts(name)))
    return _merged(out)


def _merged(metrics: list[Metric]) -> list[Metric]:
    """One family per name (each bucket built its own): Prometheus wants each name once."""
    by_name: dict[str, Metric] = {}
    for metric in metrics:
        held = by_name.get(metric.name)
        if held is None:
            by_name[metric.name] = metric
        else:
            held.samples.extend(metric.samples)
    return list(by_name.values())


def _ops(ops: list[int]) -> Metric:
    metric = Metric("kv_ops", "Requests received, by opcode", "unknown")
    for opcode, count in enumerate(ops):
        if count:
            _add(metric, {"op": op_name(opcode)}, count)
    return metric


def _server(state: ServerState) -> Iterator[Metric]:
    gauges = {
        "kv_curr_connections": ("Open client connections", state.connections),
        "kv_uptime_seconds": ("Seconds since the server started", time.time() - STARTED),
    }
    for name, (doc, value) in gauges.items():
        yield GaugeMetricFamily(name, doc, value=value)
    counters = {
        "kv_auth_errors": ("Failed logins", state.auth_errors),
        "kv_rejected_conns": ("Connections refused at max_connections", state.rejected_conns),
    }
    for name, (doc, value) in counters.items():
        metric = Metric(name, doc, "unknown")
        _add(metric, {}, value)
        yield metric
    if state.latency is not None:
        yield _histogram(state.latency)
    yield _sync_write_durations(state.sync_write_durations)


def _histogram(latency: LatencyHistogram) -> Metric:
    buckets, total = latency.cumulative()
    return HistogramMetricFamily(
        "kv_cmd_batch_duration_seconds",
        "Time to answer the requests of one read from a connection (one request unless the "
        "client pipelines)",
        buckets=buckets,
        sum_value=total,
    )


def _sync_write_durations(by_level: dict[str, LatencyHistogram]) -> Metric:
    family = HistogramMetricFamily(
        "kv_sync_write_commit_duration_seconds",
        "Time from a SyncWrite's prepare to its commit, by durability level",
        labels=["level"],
    )
    for level, histogram in sorted(by_level.items()):
        buckets, total = histogram.cumulative()
        family.add_metric([level], buckets, total)
    return family


def _bucket(name: str, bucket: Any) -> Iterator[Metric]:
    b = {"bucket": name}
    items = dict.fromkeys(VBucketState, 0)
    vbuckets = dict.fromkeys(VBucketState, 0)
    rollbacks = 0
    for vb in bucket.vbuckets.values():
        items[vb.state] += len(vb)
        vbuckets[vb.state] += 1
        rollbacks += vb.rollbacks
    yield from _per_state("kv_vb_curr_items", "Documents, by vbucket state", name, items)
    yield from _per_state("kv_num_vbuckets", "vbuckets, by state", name, vbuckets)
    yield from _gauges(b, {
        "kv_mem_used_bytes": ("Memory the bucket's documents take", bucket.memory_used),
        "kv_ep_max_size_bytes": ("The bucket's memory quota", bucket.memory_quota),
        "kv_ep_diskqueue_items": ("Writes waiting for the flusher", bucket.backlog().items),
        "kv_ep_persistence_lag_seconds": (
            "Age of the oldest acknowledged write not yet on disk", bucket.persistence_lag()
        ),
        "kv_ep_disk_failing": ("1 while flushes to disk fail", int(bucket.disk_error is not None)),
    })  # fmt: skip
    yield from _counters(b, {
        "kv_ep_total_persisted": ("Items written to disk", bucket.items_persisted),
        "kv_ep_item_commit_failed": ("Flushes that failed", bucket.flush_failures),
        "kv_ep_flushes_deferred": ("Flusher ticks that let a backlog gather",
                                   bucket.flushes_deferred),
        "kv_ep_rollback_count": ("Rollbacks of this bucket's vbuckets", rollbacks),
    })  # fmt: skip


def _per_state(
    metric: str, doc: str, bucket: str, counts: dict[VBucketState, int]
) -> Iterator[Metric]:
    family = GaugeMetricFamily(metric, doc, labels=["bucket", "state"])
    for state, count in counts.items():
        family.add_metric([bucket, state.label], count)
    yield family
    if metric == "kv_vb_curr_items":
        yield _curr_items(bucket, counts[VBucketState.ACTIVE])


def _curr_items(bucket: str, active: int) -> Metric:
    family = GaugeMetricFamily("kv_curr_items", "Documents in the active vbuckets",
                               labels=["bucket"])  # fmt: skip
    family.add_metric([bucket], active)
    return family


def _gauges(labels: dict[str, str], values: dict[str, tuple[str, float]]) -> Iterator[Metric]:
    for name, (doc, value) in values.items():
        family = GaugeMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), value)
        yield family


def _counters(labels: dict[str, str], values: dict[str, tuple[str, int]]) -> Iterator[Metric]:
    for name, (doc, value) in values.items():
        metric = Metric(name, doc, "unknown")
        _add(metric, labels, value)
        yield metric


_DCP_FIGURES = {
    "kv_dcp_connections": ("gauge", "DCP producer connections"),
    "kv_dcp_items_remaining": ("gauge", "Items the open DCP streams have still to send"),
    "kv_dcp_items_sent": ("unknown", "Items sent by DCP producers"),
    "kv_dcp_total_data_size_bytes": ("unknown", "Bytes sent by DCP producers"),
    "kv_dcp_rollback_count": ("unknown", "DCP stream requests answered Rollback"),
}


def _dcp(bucket: str, state: ServerState) -> Iterator[Metric]:
    """Per connection type, summed over the bucket's producers (every type listed, zeros
    included, so a dashboard's series exist before the first connection)."""
    sums = {kind: [0] * len(_DCP_FIGURES) for kind in ("replication", "spark", "other")}
    for (name, _), conn in state.dcp_producers.items():
        producer = conn.dcp
        if name != bucket or not isinstance(producer, DcpProducer):
            continue
        row = sums[connection_type(producer.name)]
        figures = (1, producer.items_remaining(), producer.items_sent, producer.bytes_sent,
                   producer.rollbacks_answered)  # fmt: skip
        for i, value in enumerate(figures):
            row[i] += value
    for i, (metric_name, (kind, doc)) in enumerate(_DCP_FIGURES.items()):
        metric = Metric(metric_name, doc, kind)
        for conn_type, row in sums.items():
            _add(metric, {"bucket": bucket, "connection_type": conn_type}, row[i])
        yield metric


def _sync_writes(bucket: str, counts: list[int]) -> Iterator[Metric]:
    names = ("accepted", "committed", "aborted")
    docs = ("accepted as prepares", "committed", "aborted or answered ambiguous")
    for what, doc, count in zip(names, docs, counts, strict=True):
        metric = Metric(f"kv_vb_sync_write_{what}_count", f"SyncWrites {doc}", "unknown")
        _add(metric, {"bucket": bucket}, count)
        yield metric


class NodeCollector(Collector):
    """A scrape's metrics, read on the server's event loop (module docstring)."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.state, self.loop = state, loop

    def collect(self) -> Iterable[Metric]:
        if self.loop.is_closed():
            return []
        done: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def read() -> None:
            try:
                done.set_result(families(self.state))
            except Exception as exc:  # (the scrape answers 500 with it; the loop goes on)
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(read)
        return done.result(timeout=SCRAPE_TIMEOUT_S)


class MetricsServer:
    """The HTTP port Prometheus scrapes (``GET /metrics``; any path answers the same)."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(state, loop))
        self._httpd: Any = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port) in a thread of its own; the bound port."""
        self._httpd, self._thread = start_http_server(port, host, self.registry)
        return int(self._httpd.server_port)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
