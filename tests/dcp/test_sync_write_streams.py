"""SyncWrites over DCP without sockets (PROTOCOL.md, "SyncWrites"): what each kind of connection
sees of prepares, commits and aborts, the producer's answers to DcpSeqnoAcknowledged, and a
replica (DcpConsumer with a consumer_name) fed by a producer through the codec's bytes: it keeps
prepares apart from what readers see, applies commits and aborts, and acknowledges its high
prepared seqno at each snapshot's end (PersistToMajority: once persisted)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dcpkv.core.replication_topology import parse_topology
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.producer import DcpProducer
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import Einval, PrepareItem
from dcpkv.engine.vbucket import SyncOutcome, VBucket
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import DurabilityLevel, OpenFlag, SnapshotFlag
from dcpkv.protocol.frame import FrameParser
from dcpkv.protocol.messages import decode_message
from support.dcplink import VBS, Link

ACTIVE, REPLICA = "node-a:11210", "node-b:11210"
TOPOLOGY = parse_topology(f'{{"topology": [["{ACTIVE}", "{REPLICA}"]]}}')
MAJORITY, PERSIST = DurabilityLevel.Majority, DurabilityLevel.PersistToMajority
Buckets = Callable[[str, VBucketState], Bucket]


def decode(chunks: list[bytes]) -> list[Message]:
    parser = FrameParser()
    return [decode_message(f) for c in chunks for f in parser.feed(c)]


def answers(bucket: Bucket) -> list[SyncOutcome]:
    got: list[SyncOutcome] = []
    bucket.sync_outcomes = lambda _vb, outcomes: got.extend(outcomes)
    return got


def active_bucket(buckets: Buckets) -> Bucket:
    bucket = buckets("active", VBucketState.ACTIVE)
    for vb in range(VBS):
        bucket.vbuckets[vb].set_topology(TOPOLOGY)
    return bucket


def durable_set(vb: VBucket, key: bytes, value: bytes, level: DurabilityLevel, **kw: Any) -> None:
    vb.sync_write(lambda: vb.set(key, value), level, cookie=key, **kw)


def history(buckets: Buckets) -> Bucket:
    """vb 0: 1 plain set, 2 prepare of k, 3 its commit (the replica acked), 4 prepare of j,
    5 its abort (timed out)."""
    bucket = active_bucket(buckets)
    vb = bucket.vbuckets[0]
    vb.set(b"plain", b"p")
    durable_set(vb, b"k", b"v", MAJORITY)
    vb.seqno_acknowledged(REPLICA, 2)
    durable_set(vb, b"j", b"w", MAJORITY, timeout_ms=10)
    assert isinstance(bucket.clock, ManualClock)
    bucket.clock.advance(1)
    vb.durability_tick()
    assert vb.high_seqno == 5
    return bucket


def stream(bucket: Bucket, controls: dict[str, str]) -> list[Message]:
    producer = DcpProducer(bucket, "reader", OpenFlag.Producer, clock=bucket.clock)
    for key, value in controls.items():
        producer.control(key, value)
    ok = decode([producer.stream_request(dcp.StreamRequest(opaque=7, vbucket=0))])
    assert isinstance(ok[0], dcp.StreamRequestOk)
    return decode(producer.next_messages())


def summary(messages: list[Message]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for m in messages:
        if isinstance(m, dcp.SnapshotMarkerV2_0):
            out.append(("marker2", m.start_seqno, m.end_seqno, m.max_visible_seqno))
        elif isinstance(m, dcp.SnapshotMarker):
            out.append(("marker", m.start_seqno, m.end_seqno))
        elif isinstance(m, dcp.Mutation):
            out.append(("mutation", m.by_seqno, bytes(m.key)))
        elif isinstance(m, dcp.Prepare):
            out.append(("prepare", m.by_seqno, bytes(m.key), m.durability_level))
        elif isinstance(m, dcp.Commit):
            out.append(("commit", m.prepared_seqno, m.commit_seqno, bytes(m.key)))
        elif isinstance(m, dcp.Abort):
            out.append(("abort", m.prepared_seqno, m.abort_seqno, bytes(m.key)))
        else:
            out.append((type(m).__name__,))
    return out


# Who sees what of history(): a consumer without SyncWrites gets committed items only (the
# commit as a plain mutation with the commit's seqno) and a marker ending at the last of them
# (the max visible seqno); a SyncWrite consumer gets everything, its marker (V2.0 at least)
# ending at the snapshot's end with the max visible seqno beside it.
SYNC_SEES = [
    ("marker2", 0, 5, 3), ("mutation", 1, b"plain"), ("prepare", 2, b"k", 1),
    ("commit", 2, 3, b"k"), ("prepare", 4, b"j", 1), ("abort", 4, 5, b"j"),
]  # fmt: skip
SEES = [
    (
        "plain V1",
        {},
        [("marker", 0, 3), ("mutation", 1, b"plain"), ("mutation", 3, b"k")],
    ),
    (
        "plain V2.0",
        {"max_marker_version": "2.0"},
        [("marker2", 0, 3, 3), ("mutation", 1, b"plain"), ("mutation", 3, b"k")],
    ),
    (
        "sync writes",
        {"enable_sync_writes": "true"},
        SYNC_SEES,
    ),
    (
        "sync writes, named",
        {"enable_sync_writes": "true", "consumer_name": REPLICA},
        SYNC_SEES,
    ),
]


@pytest.mark.parametrize(("controls", "expected"), [s[1:] for s in SEES], ids=[s[0] for s in SEES])
def test_what_each_connection_sees_from_memory(
    buckets: Buckets, controls: dict[str, str], expected: list[tuple[Any, ...]]
) -> None:
    assert summary(stream(history(buckets), controls)) == expected


def test_a_commit_carries_the_commits_cas_and_a_prepare_its_value(buckets: Buckets) -> None:
    bucket = history(buckets)
    vb = bucket.vbuckets[0]
    got = stream(bucket, {"enable_sync_writes": "true"})
    prepare = next(m for m in got if isinstance(m, dcp.Prepare))
    commit = next(m for m in got if isinstance(m, dcp.Commit))
    assert bytes(prepare.value) == b"v"
    assert commit.cas == vb.get(b"k").cas != prepare.cas


def test_a_prepare_only_snapshot_keeps_the_last_max_visible_seqno(buckets: Buckets) -> None:
    bucket = active_bucket(buckets)
    vb = bucket.vbuckets[0]
    vb.set(b"a", b"1")
    producer = DcpProducer(bucket, "reader", OpenFlag.Producer, clock=bucket.clock)
    producer.control("enable_sync_writes", "true")
    producer.stream_request(dcp.StreamRequest(opaque=7, vbucket=0))
    assert summary(decode(producer.next_messages())) == [
        ("marker2", 0, 1, 1),
        ("mutation", 1, b"a"),
    ]
    durable_set(vb, b"b", b"2", MAJORITY)
    assert summary(decode(producer.next_messages())) == [
        ("marker2", 2, 2, 1),
        ("prepare", 2, b"b", 1),
    ]
    vb.set(b"c", b"3")  # plain items after SyncWrites: the ordinary path, visible to its end
    assert summary(decode(producer.next_messages())) == [
        ("marker2", 3, 3, 3),
        ("mutation", 3, b"c"),
    ]


def test_sync_write_controls(buckets: Buckets) -> None:
    bucket = active_bucket(buckets)
    p = DcpProducer(bucket, "ids", OpenFlag.Producer, clock=bucket.clock)
    p.control("enable_stream_id", "true")
    refused = decode_message(
        next(FrameParser().feed(p.handle(dcp.DcpControl(key="enable_sync_writes", value="true"))))
    )
    assert isinstance(refused, GenericResponse) and refused.status == Status.NotSupported
    q = DcpProducer(bucket, "sync", OpenFlag.Producer, clock=bucket.clock)
    for key, value, status in [
        ("enable_sync_writes", "maybe", Status.Einval),
        ("consumer_name", "", Status.Einval),
        ("enable_sync_writes", "true", Status.Success),
        ("consumer_name", REPLICA, Status.Success),
        ("enable_stream_id", "true", Status.NotSupported),
    ]:
        answer = q.handle(dcp.DcpControl(key=key, value=value))
        assert answer is not None
        assert decode([answer])[0].status == status, key  # type: ignore[attr-defined]
    assert q.sync_writes and q.consumer_name == REPLICA


def ack_answer(p: DcpProducer, vb: int, seqno: int) -> int | None:
    answer = p.handle(dcp.SeqnoAcknowledged(opaque=3, vbucket=vb, prepared_seqno=seqno))
    if answer is None:
        return None
    (msg,) = decode([answer])
    assert isinstance(msg, GenericResponse)
    return msg.status


def test_seqno_acknowledged_feeds_the_active_monitor_or_is_refused(buckets: Buckets) -> None:
    bucket = active_bucket(buckets)
    got = answers(bucket)
    vb = bucket.vbuckets[0]
    durable_set(vb, b"k", b"v", MAJORITY)
    bucket.set_vbucket_state(1, VBucketState.REPLICA)

    unnamed = DcpProducer(bucket, "a", OpenFlag.Producer, clock=bucket.clock)
    assert ack_answer(unnamed, 0, 1) == Status.Einval  # no SyncWrites
    unnamed.control("enable_sync_writes", "true")
    assert ack_answer(unnamed, 0, 1) == Status.Einval  # no consumer_name

    named = DcpProducer(bucket, "b", OpenFlag.Producer, clock=bucket.clock)
    named.control("enable_sync_writes", "true")
    named.control("consumer_name", REPLICA)
    assert ack_answer(named, 1, 1) == Status.NotMyVbucket  # not active here
    assert ack_answer(named, VBS + 3, 1) == Status.NotMyVbucket  # no such vbucket
    assert got == [] and b"k" in vb.hash_table.prepared
    assert ack_answer(named, 0, 1) is None  # taken: no answer
    assert [(o.cookie, o.status) for o in got] == [(b"k", Status.Success)]
    assert vb.get(b"k").value == b"v"

    itself = DcpProducer(bucket, "c", OpenFlag.Producer, clock=bucket.clock)
    itself.control("enable_sync_writes", "true")
    itself.control("consumer_name", ACTIVE)  # misconfigured: names the active itself
    assert ack_answer(itself, 0, 2) == Status.Einval


# -- a replica fed by the producer ------------------------------------------------------------


def value(vb: VBucket, key: bytes) -> bytes | None:
    """What a reader of the replica's committed entry sees (None: nothing)."""
    item = vb.peek(key)
    return None if item is None or item.deleted else item.value


def replica_pair(buckets: Buckets) -> tuple[Bucket, Bucket, Link]:
    active = active_bucket(buckets)
    replica = buckets("replica", VBucketState.REPLICA)
    link = Link(active, replica, consumer_name=REPLICA)
    link.connect()
    link.pump()
    return active, replica, link


def test_a_majority_prepare_commits_once_the_replica_acknowledges_it(buckets: Buckets) -> None:
    active, replica, link = replica_pair(buckets)
    got = answers(active)
    avb, rvb = active.vbuckets[0], replica.vbuckets[0]
    avb.set(b"k", b"old")
    durable_set(avb, b"k", b"new", MAJORITY)
    assert got == []  # the replica has not acknowledged
    assert link.producer is not None
    link.to_consumer(link.producer.next_messages())  # everything, nothing back yet
    assert isinstance(rvb.hash_table.prepared[b"k"], PrepareItem)
    assert value(rvb, b"k") == b"old"  # a replica's reader never sees the prepare
    link.pump()  # its ack went back at the snapshot's end: the active committed
    assert [(o.cookie, o.status) for o in got] == [(b"k", Status.Success)]
    link.pump()
    assert value(rvb, b"k") == b"new" and not rvb.hash_table.prepared
    assert [(i.key, i.by_seqno, i.cas) for i in rvb.items()] == [
        (i.key, i.by_seqno, i.cas) for i in avb.items()
    ]


def test_a_persist_to_majority_prepare_waits_for_both_flushes(buckets: Buckets) -> None:
    active, replica, link = replica_pair(buckets)
    got = answers(active)
    avb, rvb = active.vbuckets[0], replica.vbuckets[0]
    durable_set(avb, b"k", b"v", PERSIST)
    link.pump()
    assert got == [] and b"k" in rvb.hash_table.prepared  # the replica holds it, unpersisted
    assert value(rvb, b"k") is None
    active.flush_once()
    assert got == []  # persisted on the active only
    replica.flush_once()  # persisted on the replica: its ack is due now
    assert link.consumer.seqno_acks([1, 2]) == []  # asked for others: this one stays due
    link.to_producer(link.due_acks())
    assert [(o.cookie, o.status) for o in got] == [(b"k", Status.Success)]
    link.pump()
    assert value(rvb, b"k") == b"v"


def test_an_abort_drops_the_replicas_prepare(buckets: Buckets) -> None:
    active, replica, link = replica_pair(buckets)
    got = answers(active)
    avb, rvb = active.vbuckets[0], replica.vbuckets[0]
    durable_set(avb, b"k", b"v", PERSIST, timeout_ms=10)
    link.pump()
    assert isinstance(active.clock, ManualClock)
    active.clock.advance(1)
    avb.durability_tick()
    assert [(o.cookie, o.status) for o in got] == [(b"k", Status.SyncWriteAmbiguous)]
    link.pump()
    assert not rvb.hash_table.prepared and rvb.high_seqno == avb.high_seqno == 2
    assert value(rvb, b"k") is None


def test_a_replica_keeps_a_pending_prepare_across_its_restart(buckets: Buckets) -> None:
    active, replica, link = replica_pair(buckets)
    avb = active.vbuckets[0]
    durable_set(avb, b"k", b"v", PERSIST)
    link.pump()
    replica.flush_once()
    replica.shutdown()
    again = Bucket(
        "default", replica.path, num_vbuckets=VBS, synchronous="NORMAL", clock=replica.clock
    )
    try:
        held = again.vbuckets[0].hash_table.prepared[b"k"]
        assert (held.by_seqno, held.value, held.level) == (1, b"v", PERSIST)
    finally:
        again.storage.close()


def test_markers_a_sync_write_replica_gets_are_v2(buckets: Buckets) -> None:
    active, _replica, link = replica_pair(buckets)
    durable_set(active.vbuckets[0], b"k", b"v", MAJORITY)
    assert link.producer is not None
    got = decode(link.producer.next_messages())
    markers = [m for m in got if isinstance(m, dcp.SnapshotMarker)]
    assert markers and all(isinstance(m, dcp.SnapshotMarkerV2_0) for m in markers)
    assert all(m.flags & SnapshotFlag.Memory for m in markers)


# -- from disk ---------------------------------------------------------------------------------


def on_disk_only(bucket: Bucket) -> None:
    """Persist vb 0 and free its checkpoints: a new stream from 0 backfills from disk."""
    bucket.vbuckets[0].checkpoints.close_open_checkpoint()
    bucket.flush_once()
    assert bucket.vbuckets[0].checkpoints.register_cursor("probe", 0) is None


def pending_on_disk(buckets: Buckets) -> Bucket:
    """vb 0: a 1, prepare of k 2, b 3, prepare of j 4 (both pending), all on disk only."""
    bucket = active_bucket(buckets)
    vb = bucket.vbuckets[0]
    vb.set(b"a", b"1")
    durable_set(vb, b"k", b"v", MAJORITY)
    vb.set(b"b", b"2")
    durable_set(vb, b"j", b"w", PERSIST)
    on_disk_only(bucket)
    return bucket


DISK_SEES = [
    ("plain", {}, [("marker", 0, 4), ("mutation", 1, b"a"), ("mutation", 3, b"b")]),
    (
        "sync writes",
        {"enable_sync_writes": "true"},
        [
            ("marker2", 0, 4, 4), ("mutation", 1, b"a"), ("prepare", 2, b"k", 1),
            ("mutation", 3, b"b"), ("prepare", 4, b"j", 3),
        ],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("controls", "expected"), [s[1:] for s in DISK_SEES], ids=[s[0] for s in DISK_SEES]
)
def test_a_disk_backfill_brings_the_pending_prepares_to_sync_write_connections_only(
    buckets: Buckets, controls: dict[str, str], expected: list[tuple[Any, ...]]
) -> None:
    got = stream(pending_on_disk(buckets), controls)
    assert all(m.flags & SnapshotFlag.Disk for m in got if isinstance(m, dcp.SnapshotMarker))
    assert summary(got) == expected


def test_a_disk_snapshot_marker_carries_the_high_completed_seqno(buckets: Buckets) -> None:
    """A V2 disk marker's high completed seqno: the highest prepare the disk holds completed
    (PROTOCOL.md, "SyncWrites"); a memory snapshot's is 0."""
    bucket = history(buckets)
    from_memory = stream(bucket, {"enable_sync_writes": "true"})
    (marker,) = [m for m in from_memory if isinstance(m, dcp.SnapshotMarkerV2_0)]
    assert marker.flags & SnapshotFlag.Memory and marker.high_completed_seqno == 0
    on_disk_only(bucket)
    from_disk = stream(bucket, {"enable_sync_writes": "true"})
    (marker,) = [m for m in from_disk if isinstance(m, dcp.SnapshotMarkerV2_0)]
    assert marker.flags & SnapshotFlag.Disk
    assert marker.high_completed_seqno == 4  # j's prepare, aborted at 5 (k's, 2, committed at 3)


def test_a_replica_built_from_disk_takes_the_prepares_and_acknowledges_them(
    buckets: Buckets,
) -> None:
    active = pending_on_disk(buckets)
    got = answers(active)
    replica = buckets("replica", VBucketState.REPLICA)
    link = Link(active, replica, consumer_name=REPLICA)
    link.connect()
    link.pump()
    rvb = replica.vbuckets[0]
    assert sorted(rvb.hash_table.prepared) == [b"j", b"k"]
    assert value(rvb, b"k") is None  # never a dirty read
    assert got == []  # a disk snapshot is acknowledged once persisted
    replica.flush_once()
    link.to_producer(link.due_acks())
    assert [(o.cookie, o.status) for o in got] == [(b"k", Status.Success), (b"j", Status.Success)]
    link.pump()
    assert (value(rvb, b"k"), value(rvb, b"j")) == (b"v", b"w") and not rvb.hash_table.prepared


def reopened(bucket: Bucket) -> Bucket:
    bucket.flush_once()
    bucket.shutdown()
    return Bucket(
        "default", bucket.path, num_vbuckets=VBS, synchronous="NORMAL", clock=bucket.clock
    )


def away(link: Link) -> None:
    """The replica's connection is gone (its stream's cursor with it)."""
    assert link.producer is not None
    link.producer.disconnect()


def test_a_prepare_aborted_while_its_replica_was_away_is_dropped_from_disk(
    buckets: Buckets,
) -> None:
    active, replica, link = replica_pair(buckets)
    got = answers(active)
    avb = active.vbuckets[0]
    durable_set(avb, b"k", b"v", PERSIST, timeout_ms=10)
    link.pump()  # the replica holds it, unpersisted: no ack
    away(link)
    assert isinstance(active.clock, ManualClock)
    active.clock.advance(1)
    avb.durability_tick()  # aborted while the replica's connection is gone
    on_disk_only(active)
    assert summary(stream(active, {"enable_sync_writes": "true"}))[1:] == [("abort", 1, 2, b"k")]
    again = Link(active, replica, consumer_name=REPLICA)
    again.connect()
    again.pump()
    rvb = replica.vbuckets[0]
    assert not rvb.hash_table.prepared and rvb.high_seqno == 2
    durable_set(avb, b"j", b"w", MAJORITY)  # the next SyncWrite replicates and commits
    again.pump()
    replica.flush_once()  # (once the disk snapshot before it is persisted: P3, P5)
    again.to_producer(again.due_acks())
    again.pump()
    assert [o.status for o in got] == [Status.SyncWriteAmbiguous, Status.Success]
    assert value(rvb, b"j") == b"w"
    restarted = reopened(replica)
    try:  # and it stays dropped: warm-up brings back no aborted prepare
        assert not restarted.vbuckets[0].hash_table.prepared
    finally:
        restarted.storage.close()


def test_a_prepare_committed_while_its_replica_was_away_completes_from_disk(
    buckets: Buckets,
) -> None:
    active, replica, link = replica_pair(buckets)
    avb = active.vbuckets[0]
    durable_set(avb, b"k", b"v", PERSIST)
    link.pump()  # the replica holds it, unpersisted: no ack
    replica.flush_once()  # persisted there (the ack due is never delivered)
    away(link)
    active.flush_once()
    avb.set_topology(parse_topology(f'{{"topology": [["{ACTIVE}"]]}}'))  # commits alone
    on_disk_only(active)
    again = Link(active, replica, consumer_name=REPLICA)
    again.connect()
    again.pump()
    rvb = replica.vbuckets[0]
    assert not rvb.hash_table.prepared and value(rvb, b"k") == b"v"
    restarted = reopened(replica)
    try:
        assert not restarted.vbuckets[0].hash_table.prepared
    finally:
        restarted.storage.close()


def test_a_commit_overwritten_before_a_reader_got_it_still_reaches_sync_write_readers(
    buckets: Buckets,
) -> None:
    """A checkpoint never deduplicates a commit away: a SyncWrite reader (a replica) must see
    it to complete its prepare; a plain reader still gets each key once per snapshot."""
    active, replica, link = replica_pair(buckets)
    avb = active.vbuckets[0]
    durable_set(avb, b"k", b"v", MAJORITY)
    avb.seqno_acknowledged(REPLICA, 1)  # committed at 2 before the replica read anything
    avb.set(b"k", b"later")  # 3, over the commit
    assert summary(stream(active, {"enable_sync_writes": "true"})) == [
        ("marker2", 0, 3, 3), ("prepare", 1, b"k", 1), ("commit", 1, 2, b"k"),
        ("mutation", 3, b"k"),
    ]  # fmt: skip
    assert summary(stream(active, {})) == [("marker", 0, 3), ("mutation", 3, b"k")]
    link.pump()
    rvb = replica.vbuckets[0]
    assert value(rvb, b"k") == b"later" and not rvb.hash_table.prepared
    got = answers(active)
    durable_set(avb, b"j", b"w", MAJORITY)  # the replica's monitor is in order: it acks
    link.pump()
    assert [o.status for o in got] == [Status.Success]


def test_a_replica_refuses_a_prepare_without_a_valid_level(buckets: Buckets) -> None:
    rvb = buckets("replica", VBucketState.REPLICA).vbuckets[0]
    with pytest.raises(Einval):
        rvb.replica_prepare(PrepareItem(b"k", b"v", by_seqno=1, level=0))
    assert rvb.high_seqno == 0 and not rvb.hash_table.prepared


def test_a_commit_of_a_prepare_the_replica_lost_rolls_it_back_below_the_prepare(
    buckets: Buckets,
) -> None:
    """A replica whose local rollback dropped a prepare (its commit was above the point)
    gets the commit: it rolls back below the prepare and streams it again, rather than
    failing the connection at every retry (found by the chaos suite)."""
    active, replica, link = replica_pair(buckets)
    avb, rvb = active.vbuckets[0], replica.vbuckets[0]
    avb.set(b"a", b"1")
    durable_set(avb, b"k", b"v", MAJORITY)
    assert link.producer is not None
    link.to_consumer(link.producer.next_messages())
    assert b"k" in rvb.hash_table.prepared
    replica.rollback(0, 1)  # under the open stream: the prepare (seqno 2) is gone
    assert not rvb.hash_table.prepared
    link.pump()  # the commit arrives, the replica rolls back to 1 and streams again
    assert link.consumer.streams[0].rollbacks == 1
    assert value(rvb, b"k") == b"v" and not rvb.hash_table.prepared
    assert [(i.key, i.by_seqno, i.cas) for i in rvb.items()] == [
        (i.key, i.by_seqno, i.cas) for i in avb.items()
    ]


def test_a_rollback_between_a_prepare_and_its_commit_gives_the_prepare_back(
    buckets: Buckets,
) -> None:
    """Storage replaces a prepare's row by its commit, so a replica rolled back to a point
    between the two (asked by an active that restarted without the commit) would hold neither,
    and the restarted active, re-committing the prepare, would wait for its ack for ever: reads
    of the key answered SyncWriteReCommitInProgress (found by the chaos suite). The prepare
    comes back pending, and the reopened stream acknowledges it."""
    active, replica, link = replica_pair(buckets)
    avb, rvb = active.vbuckets[0], replica.vbuckets[0]
    durable_set(avb, b"k", b"v", MAJORITY)
    assert link.producer is not None
    link.to_consumer(link.producer.next_messages())  # the prepare (seqno 1)
    replica.flush_once()  # a flush point at 1
    link.pump()  # acknowledged, committed (seqno 2)
    assert value(rvb, b"k") == b"v" and not rvb.hash_table.prepared
    replica.flush_once()
    replica.rollback(0, 1)
    held = rvb.hash_table.prepared[b"k"]
    assert (held.by_seqno, held.value) == (1, b"v")
    rvb.acknowledge_held()
    assert rvb.take_seqno_ack() == 1


@pytest.mark.parametrize(
    ("controls", "write", "waiting"),
    [
        ({"enable_sync_writes": "true", "consumer_name": REPLICA}, "prepare", True),
        ({"enable_sync_writes": "true", "consumer_name": REPLICA}, "plain", False),
        ({"enable_sync_writes": "true"}, "prepare", False),  # it cannot acknowledge
        ({}, "prepare", False),  # committed items only
    ],
    ids=["replica-prepare", "replica-plain", "no-consumer-name", "no-sync-writes"],
)
def test_a_replica_connection_notes_a_waiting_sync_write_until_the_next_pump(
    buckets: Buckets, controls: dict[str, str], write: str, waiting: bool
) -> None:
    """What the server's push cadence asks (case S): a write to a streamed vbucket that holds
    a prepare, on a connection whose consumer acknowledges prepares, means a SyncWrite's
    client waits on the next pump; the pump that takes the notification clears it."""
    bucket = active_bucket(buckets)
    producer = DcpProducer(bucket, "replica", OpenFlag.Producer, clock=bucket.clock)
    for key, value in controls.items():
        producer.control(key, value)
    for vb in (0, 1):
        decode([producer.stream_request(dcp.StreamRequest(opaque=vb, vbucket=vb))])
    producer.next_messages()
    vb = bucket.vbuckets[0]
    if write == "prepare":
        durable_set(vb, b"k", b"v", MAJORITY)
    else:
        vb.set(b"k", b"v")
    bucket.vbuckets[1].set(b"elsewhere", b"v")  # no prepare held there: no note of its own
    assert producer.sync_write_waiting is waiting
    assert producer.next_messages()
    assert producer.sync_write_waiting is False
