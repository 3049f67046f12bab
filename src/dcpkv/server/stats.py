"""The Stat opcode: one StatResponse per statistic, ended by one with an empty name.

Theory of operation
-------------------
The request's key names a group and, after a space, an argument (``vbucket-seqno 5``). Each
group is a generator of (name, value) pairs over the selected bucket: the default group
(process, memory, persistence), ``vbucket-seqno``, ``failovers``, ``vbucket`` (states),
``vbucket-details`` (per vbucket: seqnos, SyncWrites, replication topology),
``vbucket-topology`` (each active vbucket's topology alone), ``dcp`` (every
producer of the bucket, spec 002 naming: ``stat:name`` per connection and
``stat:vbucket:name`` per stream, plus bucket totals) and ``handover`` (when vbuckets changed
hands and the map served named their new actives). An unknown group answers KeyEnoent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from dcpkv import __version__
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.producer import DcpProducer
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import kv
from dcpkv.server.connection import Connection, Reply, not_my_vbucket

STARTED = time.time()

Stats = Iterator[tuple[str, object]]


def stat(conn: Connection, req: kv.Stat) -> bytes:
    """The group's stats, then the empty one that ends the answer, encoded in one go."""
    group, _, arg = req.group.partition(" ")
    stats = _GROUPS.get(group)
    if stats is None:
        raise Reply(Status.KeyEnoent, f"no stat group {group!r}".encode())
    # (a list first: a group that raises Reply midway answers the error, not half a group)
    return kv.encode_stats(req.opaque, list(stats(conn, arg.strip())))


def _selected(conn: Connection, arg: str) -> list[VBucket]:
    vbuckets = conn.bucket.vbuckets
    if not arg:
        return [vbuckets[vb] for vb in sorted(vbuckets)]
    if not arg.isdigit():
        raise Reply(Status.Einval, b"the stat argument must be a vbucket number")
    vbucket = vbuckets.get(int(arg))
    if vbucket is None:
        raise not_my_vbucket(conn)
    return [vbucket]


_EVICTION_POLICY_STAT = {
    EvictionPolicy.VALUE_ONLY: "value_only",
    EvictionPolicy.FULL: "full_eviction",
}


def _general(conn: Connection, arg: str) -> Stats:
    bucket = conn.bucket
    vbuckets = list(bucket.vbuckets.values())
    now = time.time()
    yield "pid", os.getpid()
    yield "uptime", int(now - STARTED)
    yield "time", int(now)
    yield "version", __version__
    yield "curr_connections", conn.server.connections
    yield "auth_errors", conn.server.auth_errors
    yield "auth_throttled", conn.server.login_throttle.throttled
    yield "rbac_eaccess", conn.server.eaccess
    yield "max_connections", conn.server.config.max_connections
    yield "rejected_conns", conn.server.rejected_conns
    yield "unauth_timeouts", conn.server.unauth_timeouts
    yield "write_holds", conn.server.write_holds
    yield "bg_fetch_waits", conn.server.bg_fetch_waits
    yield "metrics_port", conn.server.metrics_port or 0  # ours: Prometheus (0: not served)
    yield "curr_items", sum(len(vb) for vb in vbuckets if vb.state == VBucketState.ACTIVE)
    yield "mem_used", bucket.memory_used
    yield "ep_total_persisted", bucket.items_persisted
    yield "ep_persistence_lag_ms", round(bucket.persistence_lag() * 1000)
    yield "ep_item_commit_failed", bucket.flush_failures  # kv_engine's name: failed flushes
    # ours: flusher ticks that left a sparse backlog to gather (engine/flush_cadence.py)
    yield "ep_flushes_deferred", bucket.flushes_deferred
    yield "ep_disk_error", bucket.disk_error or ""
    yield "ep_max_size", bucket.memory_quota
    # kv_engine's name and values: what leaves memory over the quota (hash_table.EvictionPolicy)
    yield "ep_item_eviction_policy", _EVICTION_POLICY_STAT[bucket.eviction_policy]
    # kv_engine's name: keys read by background fetches; ours: the multi-gets that read them
    fetcher = bucket.bg_fetcher
    yield "ep_bg_fetched", 0 if fetcher is None else fetcher.keys_read
    yield "ep_bg_fetch_batches", 0 if fetcher is None else fetcher.batches
    # kv_engine's name: how with-meta (XDCR) writes are judged, "seqno" or "lww"
    yield "ep_conflict_resolution_type", bucket.conflict_mode.value
    for state in VBucketState:
        yield f"vb_{state.label}_num", sum(1 for vb in vbuckets if vb.state == state)


def _seqnos(conn: Connection, arg: str) -> Stats:
    for vb in _selected(conn, arg):
        yield f"vb_{vb.id}:high_seqno", vb.high_seqno
        yield f"vb_{vb.id}:abs_high_seqno", vb.high_seqno
        yield f"vb_{vb.id}:purge_seqno", vb.purge_seqno
        yield f"vb_{vb.id}:uuid", vb.uuid


def _failovers(conn: Connection, arg: str) -> Stats:
    for vb in _selected(conn, arg):
        entries = vb.failover.entries
        yield f"vb_{vb.id}:num_entries", len(entries)
        for i, entry in enumerate(entries):
            yield f"vb_{vb.id}:{i}:id", entry.uuid
            yield f"vb_{vb.id}:{i}:seq", entry.seqno


def _vbuckets(conn: Connection, arg: str) -> Stats:
    for vb in _selected(conn, arg):
        yield f"vb_{vb.id}", vb.state.label


def _vbucket_details(conn: Connection, arg: str) -> Stats:
    """Per vbucket, the reference's names: the state, the seqnos a failover compares (high
    prepared seqno, high seqno), the SyncWrites pending, the replication topology (JSON, as
    SetVbucket gave it; empty: none) and, on an active, what each node of it acknowledged."""
    for vb in _selected(conn, arg):
        p = f"vb_{vb.id}:"
        monitor = vb.durability or vb.passive_durability
        topology = vb.topology
        yield p + "state", vb.state.label
        yield p + "high_seqno", vb.high_seqno
        yield p + "high_prepared_seqno", vb.high_prepared_seqno
        yield p + "high_completed_seqno", 0 if monitor is None else monitor.high_completed_seqno
        yield p + "persistence_seqno", vb.persisted_seqno
        yield p + "num_items", len(vb)  # live documents, resident or not (a replica's too)
        yield p + "sync_write_pending", 0 if monitor is None else monitor.num_pending
        yield p + "topology", "" if topology is None else topology.to_json().decode()
        if vb.durability is not None and topology is not None:
            nodes = sorted({n for chain in topology.chains for n in chain.nodes})
            acks = (f"{n}={vb.durability.ack_of(n)}" for n in nodes)
            yield p + "acks", ",".join(acks)


def dcp_stats(conn: Connection, arg: str = "") -> Stats:
    """Totals for the selected bucket, then each producer's own stats, by connection name."""
    producers = sorted(
        (c.dcp for (bucket, _), c in conn.server.dcp_producers.items()
         if bucket == conn.bucket_name and isinstance(c.dcp, DcpProducer)),
        key=lambda p: p.name,
    )  # fmt: skip
    yield "ep_dcp_count", len(producers)
    yield "ep_dcp_producer_count", len(producers)
    yield "ep_dcp_items_sent", sum(p.items_sent for p in producers)
    yield "ep_dcp_total_bytes", sum(p.bytes_sent for p in producers)
    for producer in producers:
        yield f"type:{producer.name}", "producer"
        yield from producer.stats().items()
    replicator = conn.server.replicators.get(conn.bucket_name or "")
    if replicator is not None:
        yield from replicator.stats().items()


def _handover(conn: Connection, arg: str) -> Stats:
    """When vbuckets changed hands here and when the map served named their new actives
    (:mod:`dcpkv.server.handover`; monotonic seconds, one clock for a host's processes)."""
    yield from conn.server.handover(conn.bucket_name or "").stats()


def _vbucket_topology(conn: Connection, arg: str) -> Stats:
    """Each active vbucket's replication topology (its SetVbucket JSON value; empty: none),
    one line each: what the manager compares with the map (cluster/topology_sync.py)."""
    for vb in _selected(conn, arg):
        if vb.state == VBucketState.ACTIVE:
            topology = vb.topology
            yield f"vb_{vb.id}", "" if topology is None else topology.to_json().decode()


_GROUPS: dict[str, Callable[[Connection, str], Stats]] = {
    "": _general,
    "vbucket-seqno": _seqnos,
    "failovers": _failovers,
    "vbucket": _vbuckets,
    "vbucket-details": _vbucket_details,
    "vbucket-topology": _vbucket_topology,
    "dcp": dcp_stats,
    "handover": _handover,
}
