"""The DCP producer, driven like the server will: a real Bucket on disk, and a consumer made of
nothing but the codec (FrameParser + decode_message) reading the producer's bytes."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.active_stream import RUN_BYTES
from dcpkv.dcp.producer import BATCH_ITEMS, VISITS_PER_CLOCK_READ, DcpProducer, ProducerError
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.checkpoint import Cursor, Snapshot
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import Item
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import dcp, snappy
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import (
    Opcode,
    OpenFlag,
    SnapshotFlag,
    StreamEndReason,
    StreamRequestFlag,
)
from dcpkv.protocol.frame import FrameParser
from dcpkv.protocol.messages import decode_message

NAME = "replica:node2"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def open_bucket(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., Bucket]]:
    opened: list[Bucket] = []

    def factory(**kwargs: object) -> Bucket:
        kwargs.setdefault("num_vbuckets", 8)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("rng", random.Random(len(opened) + 3))
        kwargs.setdefault("checkpoint_max_items", 5)
        kwargs.setdefault("synchronous", "NORMAL")
        bucket = Bucket("default", tmp_path / "data", **kwargs)  # type: ignore[arg-type]
        opened.append(bucket)
        return bucket

    yield factory
    for bucket in opened:
        if not bucket.closed:
            bucket.storage.close()


@pytest.fixture
def bucket(open_bucket: Callable[..., Bucket]) -> Bucket:
    b = open_bucket()
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    b.set_vbucket_state(1, VBucketState.ACTIVE)
    return b


def decode_all(chunks: list[bytes]) -> list[Message]:
    parser = FrameParser()
    return [decode_message(f) for c in chunks for f in parser.feed(c)]


def decode_one(data: bytes) -> Message:
    (msg,) = decode_all([data])
    return msg


@dataclass
class Consumer:
    """A consumer that knows only the codec: applies what it receives by key."""

    docs: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    seqno: dict[int, int] = field(default_factory=dict)
    snapshot: dict[int, tuple[int, int]] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    nbytes: int = 0

    def receive(self, chunks: list[bytes]) -> list[Message]:
        self.nbytes += sum(len(c) for c in chunks)
        msgs = decode_all(chunks)
        for m in msgs:
            self.apply(m)
        self.messages.extend(msgs)
        return msgs

    def apply(self, m: Message) -> None:
        if isinstance(m, dcp.SnapshotMarker):
            self.snapshot[m.vbucket] = (m.start_seqno, m.end_seqno)
        elif isinstance(m, dcp.Mutation):
            assert m.by_seqno > self.seqno.get(m.vbucket, 0)
            self.docs.setdefault(m.vbucket, {})[bytes(m.key)] = bytes(m.value)
            self.seqno[m.vbucket] = m.by_seqno
        elif isinstance(m, dcp.Deletion | dcp.DeletionV2 | dcp.Expiration):
            assert m.by_seqno > self.seqno.get(m.vbucket, 0)
            self.docs.setdefault(m.vbucket, {}).pop(bytes(m.key), None)
            self.seqno[m.vbucket] = m.by_seqno

    def drain(self, producer: DcpProducer, max_rounds: int = 1000) -> list[Message]:
        got: list[Message] = []
        for _ in range(max_rounds):
            chunks = producer.next_messages()
            if not chunks:
                return got
            got += self.receive(chunks)
        raise AssertionError("producer never ran dry")

    def of(self, kind: type[Message]) -> list[Message]:
        return [m for m in self.messages if isinstance(m, kind)]


def live(vb: VBucket) -> dict[bytes, bytes]:
    return {i.key: i.value or b"" for i in vb.items() if not i.deleted}


def producer(bucket: Bucket, clock: ManualClock, flags: int = OpenFlag.Producer) -> DcpProducer:
    return DcpProducer(bucket, NAME, flags, clock=clock)


def request(
    p: DcpProducer,
    vb: int = 0,
    *,
    start: int = 0,
    end: int = U64_MAX,
    uuid: int = 0,
    snap: tuple[int, int] | None = None,
    flags: int = 0,
    opaque: int = 0xBEEF,
    value: bytes = b"",
) -> Message:
    snap_start, snap_end = snap if snap is not None else (start, start)
    msg = dcp.StreamRequest(
        opaque=opaque, vbucket=vb, flags=flags, start_seqno=start, end_seqno=end,
        vbucket_uuid=uuid, snap_start_seqno=snap_start, snap_end_seqno=snap_end, value=value,
    )  # fmt: skip
    return decode_one(p.stream_request(msg))


def write(vb: VBucket, n: int, prefix: str = "k") -> None:
    for i in range(n):
        vb.set(f"{prefix}{i}".encode(), f"v{i}-{vb.high_seqno}".encode())


# -- following a bucket ----------------------------------------------------------------------


def test_consumer_follows_bucket_from_zero_disk_then_memory(
    bucket: Bucket, clock: ManualClock
) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 30)
    vb.delete(b"k3")
    bucket.flush_once()
    assert vb.checkpoints.lowest_seqno_in_memory > 1  # memory no longer covers seqno 1
    p, c = producer(bucket, clock), Consumer()
    ok = request(p)
    assert isinstance(ok, dcp.StreamRequestOk)
    assert ok.opaque == 0xBEEF and ok.failover_log == vb.failover.entries
    c.drain(p)
    first = c.of(dcp.SnapshotMarker)[0]
    assert first.flags == SnapshotFlag.Disk and first.start_seqno == 0
    assert first.end_seqno == vb.persisted_seqno == vb.high_seqno
    assert c.docs[0] == live(vb)
    # live changes: memory snapshots
    vb.set(b"ttl", b"x", expiry=10)
    write(vb, 7, prefix="m")
    vb.delete(b"k4")
    clock.advance(11)
    assert bucket.expiry_pager() == 1
    c.drain(p)
    later = c.of(dcp.SnapshotMarker)[1:]
    assert later and all(m.flags & SnapshotFlag.Memory for m in later)
    assert c.docs[0] == live(vb) and b"ttl" not in c.docs[0]
    assert c.seqno[0] == vb.high_seqno
    assert all(m.opaque == 0xBEEF and m.vbucket == 0 for m in c.messages)
    assert not c.of(dcp.StreamEnd)


def test_memory_snapshot_is_deduplicated(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    p, c = producer(bucket, clock), Consumer()
    assert isinstance(request(p), dcp.StreamRequestOk)
    assert p.next_messages() == []  # registers the cursor at 0
    vb.set(b"A", b"1")
    vb.set(b"B", b"2")
    vb.set(b"A", b"3")
    c.drain(p)
    (marker,) = c.of(dcp.SnapshotMarker)
    assert marker.flags & SnapshotFlag.Memory and marker.end_seqno == 3
    assert [(bytes(m.key), m.by_seqno) for m in c.of(dcp.Mutation)] == [(b"B", 2), (b"A", 3)]
    # a later snapshot starts at its first item (spec 004, memory notes)
    vb.set(b"C", b"4")
    c.drain(p)
    assert c.of(dcp.SnapshotMarker)[-1].start_seqno == 4


def test_cursor_dropped_falls_back_to_disk(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    p, c = producer(bucket, clock), Consumer()
    request(p)
    write(vb, 3)
    c.drain(p)
    write(vb, 40, prefix="x")
    bucket.flush_once()
    assert vb.checkpoints.drop_cursor(f"dcp:{NAME}:0")
    c.drain(p)
    disk = [m for m in c.of(dcp.SnapshotMarker) if m.flags & SnapshotFlag.Disk]
    assert disk and disk[0].start_seqno == 3  # a later backfill starts where the stream was
    assert c.docs[0] == live(vb) and c.seqno[0] == vb.high_seqno
    assert not c.of(dcp.StreamEnd)


def test_stream_with_end_stops_with_stream_end_ok(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 12)
    bucket.flush_once()
    p, c = producer(bucket, clock), Consumer()
    request(p, end=7)
    c.drain(p)
    assert max(m.by_seqno for m in c.of(dcp.Mutation)) == 7
    (end,) = c.of(dcp.StreamEnd)
    assert end.reason == StreamEndReason.OK and c.messages[-1] is end
    assert p.stats()[f"num_streams:{NAME}"] == "0"


@pytest.mark.parametrize("start", [0, 4])
def test_end_equal_start_answers_ok_then_stream_end(
    bucket: Bucket, clock: ManualClock, start: int
) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, start)
    p, c = producer(bucket, clock), Consumer()
    assert isinstance(request(p, start=start, end=start, uuid=vb.uuid), dcp.StreamRequestOk)
    c.drain(p)
    assert [type(m) for m in c.messages] == [dcp.StreamEnd]
    assert c.messages[0].reason == StreamEndReason.OK and c.messages[0].opaque == 0xBEEF


# -- stream request answers (spec 000) ---------------------------------------------------------


def test_stream_request_errors(bucket: Bucket, clock: ManualClock) -> None:
    write(bucket.get_vbucket(0), 10)
    p = producer(bucket, clock)

    def status(**kw: object) -> int:
        return request(p, **kw).status  # type: ignore[arg-type]

    assert status(vb=5) == Status.NotMyVbucket
    assert status(start=5, end=4) == Status.Erange
    assert status(start=5, snap=(6, 8)) == Status.Erange
    uuid = bucket.get_vbucket(0).uuid
    assert status(start=11, snap=(11, 11), uuid=uuid) == Status.Rollback  # checked before range
    assert status(start=0) == Status.Success
    assert status(start=0) == Status.KeyEexists
    assert status(vb=1, value=b'{"purge_seqno":"x"}') == Status.Einval


def test_rollback_answers(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 10)
    p = producer(bucket, clock)
    uuid = vb.uuid

    def rollback(**kw: object) -> int:
        msg = request(p, **kw)
        assert isinstance(msg, dcp.StreamRequestRollback), msg
        return msg.rollback_seqno

    assert rollback(start=5, uuid=12345) == 0  # unknown branch: no common history
    assert rollback(start=15, snap=(15, 15), uuid=uuid) == 10  # consumer ahead
    assert rollback(start=12, snap=(8, 15), uuid=uuid) == 8  # snapshot mismatch
    assert isinstance(request(p, start=10, uuid=uuid), dcp.StreamRequestOk)  # lagging: fine


def test_rollback_after_purge(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 6)
    vb.delete(b"k1")
    write(vb, 3, prefix="z")
    bucket.flush_once()
    bucket.compact(0, purge_before_seqno=vb.high_seqno)
    assert vb.purge_seqno == 7
    p = producer(bucket, clock)
    msg = request(p, start=3, uuid=vb.uuid)
    assert isinstance(msg, dcp.StreamRequestRollback) and msg.rollback_seqno == 0
    # a consumer that learnt the purge seqno (V2.2 markers) may resume
    ok = request(p, start=3, uuid=vb.uuid, value=dcp.stream_request_value(purge_seqno=7))
    assert isinstance(ok, dcp.StreamRequestOk)


def test_unclean_restart_branch_rolls_consumer_back(
    open_bucket: Callable[..., Bucket], clock: ManualClock
) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    write(vb, 10)
    bucket.flush_once()
    write(vb, 5, prefix="lost")  # seen by the consumer, never persisted
    p, c = producer(bucket, clock), Consumer()
    request(p)
    c.drain(p)
    assert c.seqno[0] == 15
    old_uuid = vb.uuid
    p.disconnect()
    bucket.storage.close()  # dropped without shutdown()
    again = open_bucket()
    vb2 = again.get_vbucket(0)
    assert vb2.high_seqno == 10 and vb2.uuid != old_uuid
    snap = c.snapshot[0]
    msg = request(producer(again, clock), start=c.seqno[0], snap=snap, uuid=old_uuid)
    assert isinstance(msg, dcp.StreamRequestRollback) and msg.rollback_seqno == 10


# -- flow control, markers, opcodes --------------------------------------------------------------


def test_flow_control_bounds_bytes_in_flight(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 200)
    bucket.flush_once()
    p, c = producer(bucket, clock), Consumer()
    p.control("connection_buffer_size", "1000")
    request(p)
    biggest, in_flight, rounds = 0, 0, 0
    while True:
        chunks = p.next_messages()
        if not chunks:
            assert p.next_messages() == []  # stuck until acknowledged
            if in_flight == 0:
                break
            p.buffer_ack(in_flight)
            in_flight = 0
            rounds += 1
            continue
        biggest = max(biggest, *map(len, chunks))
        in_flight += sum(map(len, chunks))
        assert in_flight <= 1000 + biggest
        c.receive(chunks)
        # never more than one bounded batch held per stream
        assert int(p.stats()[f"ready_queue_items:0:{NAME}"]) <= BATCH_ITEMS + 2
    assert rounds > 5 and c.docs[0] == live(vb)
    assert p.stats()[f"unacked_bytes:{NAME}"] == "0"


def test_noop_is_not_flow_controlled_and_liveness(bucket: Bucket, clock: ManualClock) -> None:
    p = producer(bucket, clock)
    now = clock.time()
    assert p.noop_due(now + 1000) is None  # only after enable_noop
    p.control("enable_noop", "true")
    p.control("set_noop_interval", "5")
    assert p.noop_due(now + 4) is None
    noop = decode_one(p.noop_due(now + 5) or b"")
    assert isinstance(noop, dcp.DcpNoop)
    assert p.noop_due(now + 6) is None and not p.is_dead(now + 9)
    assert p.is_dead(now + 10)
    reply = GenericResponse(opcode=Opcode.DcpNoop, opaque=noop.opaque).encode()
    assert p.handle(decode_one(reply)) is None
    assert not p.is_dead(now + 10) and p.unacked_bytes == 0


def test_v2_2_markers_when_asked(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 8)
    vb.delete(b"k0")
    vb.set(b"k1", b"again")
    bucket.flush_once()
    bucket.compact(0, purge_before_seqno=vb.high_seqno)
    write(vb, 2, prefix="n")
    p, c = producer(bucket, clock), Consumer()
    p.control("max_marker_version", "2.2")
    request(p)
    c.drain(p)
    markers = c.of(dcp.SnapshotMarker)
    assert markers and all(isinstance(m, dcp.SnapshotMarkerV2_2) for m in markers)
    assert vb.purge_seqno > 0
    assert [m.purge_seqno for m in markers] == [vb.purge_seqno] * len(markers)
    assert markers[-1].max_visible_seqno == vb.high_seqno
    p2, c2 = producer(bucket, clock), Consumer()
    request(p2)
    c2.drain(p2)
    assert all(type(m) is dcp.SnapshotMarker for m in c2.of(dcp.SnapshotMarker))


@pytest.mark.parametrize(
    ("flags", "expiry_opcode", "kind"),
    [
        (OpenFlag.Producer, False, dcp.Deletion),
        (OpenFlag.Producer, True, dcp.Deletion),  # no delete-time layout: no Expiration
        (OpenFlag.Producer | OpenFlag.IncludeDeleteTimes, False, dcp.DeletionV2),
        (OpenFlag.Producer | OpenFlag.IncludeDeleteTimes, True, dcp.Expiration),
    ],
)
def test_expiry_opcode_only_when_enabled(
    bucket: Bucket, clock: ManualClock, flags: int, expiry_opcode: bool, kind: type
) -> None:
    vb = bucket.get_vbucket(0)
    vb.set(b"e", b"v", expiry=5)
    clock.advance(6)
    bucket.expiry_pager()
    p, c = producer(bucket, clock, flags), Consumer()
    if expiry_opcode:
        p.control("enable_expiry_opcode", "true")
    request(p)
    c.drain(p)
    last = c.messages[-1]
    assert type(last) is kind and last.by_seqno == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("no_such_thing", "1"),
        ("connection_buffer_size", "-1"),
        ("connection_buffer_size", "lots"),
        ("enable_noop", "yes"),
        ("set_noop_interval", "0"),
        ("set_noop_interval", "soon"),
        ("send_stream_end_on_client_close_stream", "1"),
        ("enable_expiry_opcode", ""),
        ("set_priority", "urgent"),
        ("max_marker_version", "2.1"),
    ],
)
def test_control_errors_are_einval(
    bucket: Bucket, clock: ManualClock, key: str, value: str
) -> None:
    p = producer(bucket, clock)
    with pytest.raises(ProducerError) as err:
        p.control(key, value)
    assert err.value.status == Status.Einval
    answer = decode_one(p.handle(dcp.DcpControl(key=key, value=value, opaque=9)) or b"")
    assert answer.status == Status.Einval and answer.opaque == 9


def test_controls_accepted(bucket: Bucket, clock: ManualClock) -> None:
    p = producer(bucket, clock)
    for key, value in [
        ("connection_buffer_size", "0"), ("enable_noop", "false"), ("set_noop_interval", "20"),
        ("send_stream_end_on_client_close_stream", "true"), ("enable_expiry_opcode", "true"),
        ("set_priority", "high"), ("max_marker_version", "2.0"),
    ]:  # fmt: skip
        answer = decode_one(p.handle(dcp.DcpControl(key=key, value=value, opaque=3)) or b"")
        assert answer.status == Status.Success


# -- closing, state changes, barriers, stats ----------------------------------------------


@pytest.mark.parametrize("stream_end", [True, False])
def test_close_stream(bucket: Bucket, clock: ManualClock, stream_end: bool) -> None:
    p, c = producer(bucket, clock), Consumer()
    if stream_end:
        p.control("send_stream_end_on_client_close_stream", "true")
    request(p)
    write(bucket.get_vbucket(0), 2)
    c.drain(p)
    assert decode_one(p.close_stream(0, 4)).status == Status.Success
    got = c.drain(p)
    if stream_end:
        assert [(type(m), m.reason) for m in got] == [(dcp.StreamEnd, StreamEndReason.Closed)]
    else:
        assert got == []
    assert decode_one(p.close_stream(0, 4)).status == Status.KeyEnoent
    assert f"dcp:{NAME}:0" not in bucket.get_vbucket(0).checkpoints.cursors


def test_state_change_ends_stream(bucket: Bucket, clock: ManualClock) -> None:
    p, c = producer(bucket, clock), Consumer()
    request(p)
    request(p, vb=1)
    bucket.set_vbucket_state(0, VBucketState.REPLICA)
    p.vbucket_state_changed(0)
    p.vbucket_state_changed(1)  # still active: nothing happens
    c.drain(p)
    (end,) = c.of(dcp.StreamEnd)
    assert end.vbucket == 0 and end.reason == StreamEndReason.StateChanged


def test_barrier_echo_follows_everything_before_it(bucket: Bucket, clock: ManualClock) -> None:
    p, c = producer(bucket, clock), Consumer()
    p.handle(dcp.DcpBarrier(cookie=b"early", opaque=1))
    assert decode_all(p.next_messages()) == [dcp.DcpBarrier(cookie=b"early", opaque=1, echo=True)]
    request(p, vb=0, opaque=10)
    request(p, vb=1, opaque=11)
    write(bucket.get_vbucket(0), 30)
    write(bucket.get_vbucket(1), 3)
    p.barrier(b"cookie-1", 77)
    write(bucket.get_vbucket(1), 20, prefix="after")
    p.control("connection_buffer_size", "2000")
    while True:
        chunks = p.next_messages()
        if not chunks:
            if p.unacked_bytes == 0:
                break
            p.buffer_ack(p.unacked_bytes)
        c.receive(chunks)
    idx = next(i for i, m in enumerate(c.messages) if isinstance(m, dcp.DcpBarrier))
    echo = c.messages[idx]
    assert echo.echo and bytes(echo.cookie) == b"cookie-1" and echo.opaque == 77
    before = [m for m in c.messages[:idx] if isinstance(m, dcp.Mutation)]
    assert max(m.by_seqno for m in before if m.vbucket == 0) == 30
    assert max(m.by_seqno for m in before if m.vbucket == 1) >= 3
    # round-robin: the streams take turns rather than one draining first
    vbs = [m.vbucket for m in c.messages if isinstance(m, dcp.Mutation)]
    assert vbs.index(1) < vbs.index(0) + 3
    assert c.docs[0] == live(bucket.get_vbucket(0)) and c.docs[1] == live(bucket.get_vbucket(1))


def test_stats_naming(bucket: Bucket, clock: ManualClock) -> None:
    bucket.set_vbucket_state(5, VBucketState.ACTIVE)
    write(bucket.get_vbucket(5), 4)
    p, c = producer(bucket, clock), Consumer()
    request(p, vb=5)
    c.drain(p)
    stats = p.stats()
    assert stats[f"items_sent:5:{NAME}"] == "4"
    assert stats[f"items_sent:{NAME}"] == "4"
    assert stats[f"total_bytes_sent:{NAME}"] == str(c.nbytes)
    assert stats[f"backfill_remaining:5:{NAME}"] == "0"
    assert stats[f"state:5:{NAME}"] == "in_memory"
    assert all(isinstance(v, str) for v in stats.values())


def test_disconnect_releases_cursors(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 20)
    bucket.flush_once()
    p = producer(bucket, clock)
    p.control("connection_buffer_size", "100")
    request(p)
    p.next_messages()  # mid-backfill
    p.disconnect()
    assert f"dcp:{NAME}:0" not in vb.checkpoints.cursors
    assert p.next_messages() == []


# -- takeover ----------------------------------------------------------------------------------


def ack(p: DcpProducer, msg: Message) -> None:
    """The consumer's answer to a SetVbucketState the producer sent."""
    p.handle(GenericResponse(opcode=Opcode.DcpSetVbucketState, opaque=msg.opaque))


def test_takeover_hands_the_vbucket_over(bucket: Bucket, clock: ManualClock) -> None:
    vb = bucket.get_vbucket(0)
    write(vb, 12)
    bucket.flush_once()
    other, oc = DcpProducer(bucket, "indexer", OpenFlag.Producer, clock=clock), Consumer()
    request(other)  # a plain stream of the same vbucket, on another connection
    oc.drain(other)
    p, c = producer(bucket, clock), Consumer()
    assert isinstance(request(p, flags=StreamRequestFlag.TakeOver), dcp.StreamRequestOk)
    c.drain(p)
    pending = c.messages[-1]
    assert isinstance(pending, dcp.SetVbucketState) and pending.state == VBucketState.PENDING
    assert c.seqno[0] == 12 and vb.state == VBucketState.ACTIVE
    vb.set(b"late", b"written before the consumer's ack")
    assert c.drain(p) == []  # waits for the ack, sends nothing
    ack(p, pending)
    assert vb.state == VBucketState.DEAD
    other.vbucket_state_changed(0)  # what the server does for every producer of the bucket
    p.vbucket_state_changed(0)  # the handoff's own stream is spared
    tail = c.drain(p)
    active = tail[-1]
    assert isinstance(active, dcp.SetVbucketState) and active.state == VBucketState.ACTIVE
    assert c.docs[0][b"late"] == b"written before the consumer's ack" and c.seqno[0] == 13
    assert c.drain(p) == []
    ack(p, active)
    (end,) = c.drain(p)
    assert isinstance(end, dcp.StreamEnd) and end.reason == StreamEndReason.OK
    assert c.docs[0] == live(vb)
    oc.drain(other)
    assert [e.reason for e in oc.of(dcp.StreamEnd)] == [StreamEndReason.StateChanged]
    assert f"dcp:{NAME}:0" not in vb.checkpoints.cursors


def test_takeover_ignores_stray_acks(bucket: Bucket, clock: ManualClock) -> None:
    p, c = producer(bucket, clock), Consumer()
    request(p, flags=StreamRequestFlag.TakeOver, opaque=5)
    p.handle(GenericResponse(opcode=Opcode.DcpSetVbucketState, opaque=5))  # nothing sent yet
    assert bucket.get_vbucket(0).state == VBucketState.ACTIVE
    (msg,) = c.drain(p)
    assert isinstance(msg, dcp.SetVbucketState)


@pytest.mark.parametrize(
    ("flag", "datatype"),
    [(OpenFlag.NoValue, 0), (OpenFlag.NoValueWithUnderlyingDatatype, 1)],
)
def test_no_value_flags_send_keys_and_metadata_only(
    bucket: Bucket, clock: ManualClock, flag: OpenFlag, datatype: int
) -> None:
    vb = bucket.get_vbucket(0)
    vb.set(b"doc", b'{"a": 1}', flags=7, datatype=1)  # 1: JSON
    vb.set(b"gone", b"x")
    vb.delete(b"gone")
    p, c = producer(bucket, clock, OpenFlag.Producer | flag), Consumer()
    assert isinstance(request(p), dcp.StreamRequestOk)
    c.drain(p)
    (m,) = c.of(dcp.Mutation)
    assert (bytes(m.key), bytes(m.value), m.flags, m.datatype) == (b"doc", b"", 7, datatype)
    assert len(c.of(dcp.Deletion)) == 1


# -- the ready queue: a write's cost does not depend on the open streams -------------------------


def test_a_write_visits_only_its_own_stream(
    open_bucket: Callable[..., Bucket], clock: ManualClock
) -> None:
    """Work per write, counted: with every vbucket streamed, a write to one vbucket makes the
    producer visit that vbucket's stream only (it visited all of them per write before): the
    visits per write are the same with 1 and with 1024 open streams."""
    bucket = open_bucket(num_vbuckets=1024, checkpoint_max_items=1000)
    for vb in range(1024):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    rng = random.Random(5)
    written = [rng.randrange(1024) for _ in range(200)]
    visits = {}
    for streams in (1, 1024):
        p, c = producer(bucket, clock), Consumer()
        for vb in range(streams):
            v = bucket.vbuckets[vb]
            ok = request(p, vb, opaque=vb, start=v.high_seqno, uuid=v.uuid)
            assert isinstance(ok, dcp.StreamRequestOk)
        c.drain(p)
        before = p.stream_polls
        for i, vb in enumerate(written):
            bucket.get_vbucket(vb % streams).set(b"key%d-%d" % (streams, i), b"v")
            c.drain(p)
        visits[streams] = p.stream_polls - before
        assert sum(len(docs) for docs in c.docs.values()) == len(written)
        assert p.next_messages() == [] and p.stats()[f"ready_streams:{NAME}"] == "0"
        p.disconnect()
    # one visit: the marker and its lone item are one entry, and the stream leaves the ready
    # queue on the visit that sent them (its cursor has read everything)
    assert visits[1] == visits[1024] == len(written)


def test_a_live_snapshot_goes_out_in_one_turn_with_one_checkpoint_read(
    bucket: Bucket, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live write (a snapshot of one item) is sent marker then item in one visit of its
    stream, which then leaves the ready queue having read the checkpoints once: no round per
    message, no second read or visit to find nothing."""
    p, c = producer(bucket, clock), Consumer()
    for vb in (0, 1):
        assert isinstance(request(p, vb, opaque=vb), dcp.StreamRequestOk)
    c.drain(p)
    reads = {0: 0, 1: 0}
    for vb in (0, 1):
        manager = bucket.get_vbucket(vb).checkpoints
        read = manager.read

        def counted(
            cursor: Cursor, max_items: int, vb: int = vb, read: Any = read
        ) -> Snapshot | None:
            reads[vb] += 1
            return read(cursor, max_items)

        monkeypatch.setattr(manager, "read", counted)
    write(bucket.get_vbucket(0), 1, prefix="a")
    write(bucket.get_vbucket(1), 1, prefix="b")
    polls = p.stream_polls
    msgs = c.receive(p.next_messages())
    kinds = [(isinstance(m, dcp.SnapshotMarker), m.vbucket) for m in msgs]
    assert kinds == [(True, 0), (False, 0), (True, 1), (False, 1)]
    assert p.stats()[f"ready_streams:{NAME}"] == "0"
    assert reads == {0: 1, 1: 1} and p.stream_polls - polls == 2


def test_a_bounded_turn_sends_what_an_unbounded_one_does_in_more_calls(
    open_bucket: Callable[..., Bucket], clock: ManualClock
) -> None:
    """``next_messages(max_visits=n)`` visits at most n streams and says ``has_ready`` while
    more waits; calls in a row send the very bytes one unbounded call sends, in its order (a
    turn cut by the bound goes on at the next call). ``notified`` counts the writes since."""
    bucket = open_bucket(num_vbuckets=16, checkpoint_max_items=1000)
    for vb in range(16):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    whole = producer(bucket, clock)
    cut = DcpProducer(bucket, "bounded", OpenFlag.Producer, clock=clock)
    for p in (whole, cut):
        for vb in range(16):
            assert isinstance(request(p, vb, opaque=vb), dcp.StreamRequestOk)
        Consumer().drain(p)
    for vb in range(16):
        write(bucket.get_vbucket(vb), 1 if vb % 3 else 70, prefix="w")  # lone items and runs
    assert whole.notified == cut.notified == 6 * 70 + 10
    expected = b"".join(whole.next_messages())
    assert not whole.has_ready
    got, calls = b"", 0
    while cut.has_ready:
        before = cut.stream_polls
        got += b"".join(cut.next_messages(max_visits=3))
        assert cut.stream_polls - before <= 3 and cut.notified == 0
        calls += 1
    assert got == expected and calls > 16 // 3
    assert cut.next_messages(max_visits=3) == []


def test_a_turn_stops_at_its_time_bound_and_the_next_goes_on(
    open_bucket: Callable[..., Bucket], clock: ManualClock
) -> None:
    """``next_messages(until=t)`` stops once the producer's clock reads ``t`` (looked at every
    few visits) and says ``has_ready``; a time bound not yet reached does not cut a turn."""
    bucket = open_bucket(num_vbuckets=64, checkpoint_max_items=1000)
    for vb in range(64):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    p = producer(bucket, clock)
    for vb in range(64):
        assert isinstance(request(p, vb, opaque=vb), dcp.StreamRequestOk)
    Consumer().drain(p)
    for vb in range(64):
        write(bucket.get_vbucket(vb), 1, prefix="t")
    before = p.stream_polls
    assert p.next_messages(until=clock.time())  # the time is up: one clock read's worth
    assert p.stream_polls - before == VISITS_PER_CLOCK_READ and p.has_ready
    before = p.stream_polls
    assert p.next_messages(until=clock.time() + 1.0)  # not up: the turn drains the queue
    assert p.stream_polls - before >= 64 - VISITS_PER_CLOCK_READ and not p.has_ready
    assert p.items_sent == 64


def test_idle_streams_wake_for_state_changes_and_takeover_acks(
    bucket: Bucket, clock: ManualClock
) -> None:
    """Streams that left the ready queue still get their StreamEnd out when their vbucket
    changes state, without any write to wake them."""
    p, c = producer(bucket, clock), Consumer()
    for vb in (0, 1):
        assert isinstance(request(p, vb, opaque=vb), dcp.StreamRequestOk)
    c.drain(p)
    bucket.set_vbucket_state(1, VBucketState.DEAD)
    p.vbucket_state_changed(1)
    c.drain(p)
    (end,) = c.of(dcp.StreamEnd)
    assert (end.vbucket, end.reason) == (1, StreamEndReason.StateChanged)


def test_backfill_that_ends_empty_hands_over_to_memory_at_once(
    bucket: Bucket, clock: ManualClock
) -> None:
    """A stream whose disk snapshot is empty must go on to what memory holds in the same
    visit: it would otherwise leave the ready queue with items still to send."""
    vb = bucket.get_vbucket(0)
    write(vb, 12)
    bucket.flush_once()
    write(vb, 3, prefix="late")  # in memory only, no notification after the request
    p, c = producer(bucket, clock), Consumer()
    assert isinstance(request(p, start=0), dcp.StreamRequestOk)
    c.drain(p)
    assert c.seqno[0] == vb.high_seqno and c.docs[0] == live(vb)


# -- a replica that rolls back under its streams ---------------------------------------------


def replica_rounds(bucket: Bucket, rounds: int) -> VBucket:
    """A replica vbucket 2 fed ``rounds`` snapshots of two keys each, every one flushed."""
    vb = bucket.set_vbucket_state(2, VBucketState.REPLICA)
    for round_ in range(rounds):
        seqno = vb.high_seqno
        vb.replica_snapshot_marker(seqno + 1, seqno + 2)
        for i, key in enumerate((b"a", b"b")):
            vb.set_with_meta(Item(key, b"%d" % round_, cas=seqno + 1 + i, by_seqno=seqno + 1 + i))
        bucket.flush_once()
    return vb


@pytest.mark.parametrize("idle", [True, False], ids=["idle-in-memory", "mid-backfill"])
def test_replica_rollback_ends_its_streams_with_rollback(
    open_bucket: Callable[..., Bucket], clock: ManualClock, idle: bool
) -> None:
    """A stream opened before its replica vbucket rolls back carries the old history: it ends
    with Rollback (the consumer re-requests and is told where to roll back), whether it was
    idle in memory (and must be woken: no write follows) or still reading its disk snapshot."""
    bucket = open_bucket(history_window=1000, checkpoint_max_items=2)
    replica_rounds(bucket, 4)  # seqnos 1..8
    p, c = producer(bucket, clock), Consumer()
    notified: list[int] = []
    bucket.seqno_listeners.append(notified.append)
    assert isinstance(request(p, vb=2), dcp.StreamRequestOk)
    if idle:
        c.drain(p)
        assert c.seqno[2] == 8 and not c.of(dcp.StreamEnd)
    else:
        c.receive(p.next_messages(1))  # the disk snapshot is open and partly sent
        assert c.of(dcp.SnapshotMarker) and c.seqno.get(2, 0) < 8
    assert bucket.rollback(2, 5) == 4
    assert notified[-1] == 2  # the rollback woke the vbucket's streams
    c.drain(p)
    (end,) = c.of(dcp.StreamEnd)
    assert end.vbucket == 2 and end.reason == StreamEndReason.Rollback
    # A new request from where the consumer is gets the rollback answer.
    again = request(p, vb=2, start=c.seqno.get(2, 0), uuid=bucket.get_vbucket(2).uuid)
    if c.seqno.get(2, 0) > 4:
        assert isinstance(again, dcp.StreamRequestRollback) and again.rollback_seqno == 4


def test_liveness_due_is_the_next_moment_that_matters(bucket: Bucket, clock: ManualClock) -> None:
    p = producer(bucket, clock)
    assert p.liveness_due() is None  # no Noops asked for
    p.control("enable_noop", "true")
    p.control("set_noop_interval", "2")
    start = clock.time()
    assert p.liveness_due() == start + 2  # a Noop one interval after the last message
    clock.advance(2)
    assert p.noop_due(clock.time()) is not None
    sent = clock.time()
    assert p.liveness_due() == sent + 2  # and the end of the connection one interval later
    clock.advance(1.999)
    assert not p.is_dead(clock.time())
    clock.advance(0.001)
    assert p.is_dead(clock.time())
    p.noop_response()
    assert p.liveness_due() == sent + 2 and not p.is_dead(clock.time())


@pytest.mark.parametrize("flags", [OpenFlag.Producer, OpenFlag.Producer | OpenFlag.NoValue,
                                   OpenFlag.Producer | OpenFlag.IncludeDeleteTimes])  # fmt: skip
def test_a_snapshot_run_holds_each_items_own_bytes(
    bucket: Bucket, clock: ManualClock, flags: int
) -> None:
    """A memory snapshot's run packs plain items itself: the very bytes of encoding each item
    (and of the typed Mutation), other items (tombstones, Snappy values) as they encode."""
    p = producer(bucket, clock, flags)
    request(p, vb=0, opaque=0xBEEF)
    active = p._streams[0]
    items = [
        Item(b"plain", b"v" * 100, flags=0xFFFFFFFF, expiry=0xFFFFFFFF, cas=(1 << 64) - 1,
             rev_seqno=3, by_seqno=1),
        Item(b"json", b'{"a":1}', cas=7, rev_seqno=1, by_seqno=2, datatype=1),
        Item(b"gone", b"", cas=8, rev_seqno=2, by_seqno=3, deleted=True, delete_time=5),
        Item(b"packed", snappy.deflate(b"x" * 64), cas=9, rev_seqno=1, by_seqno=4,
             datatype=snappy.SNAPPY),
    ]  # fmt: skip
    parts, stop = active._item_run(items, 0)
    run = b"".join(parts)
    assert stop == len(items)
    assert run == b"".join(map(active.encode_item, items))
    if flags == OpenFlag.Producer:
        first = dcp.Mutation(
            opaque=0xBEEF, vbucket=0, key=b"plain", value=b"v" * 100, flags=0xFFFFFFFF,
            expiration=0xFFFFFFFF, cas=(1 << 64) - 1, rev_seqno=3, by_seqno=1,
        )  # fmt: skip
        assert run.startswith(first.encode())
    assert [m.by_seqno for m in decode_all([run])] == [1, 2, 3, 4]  # type: ignore[attr-defined]


def test_memory_runs_close_at_run_bytes(bucket: Bucket, clock: ManualClock) -> None:
    """Large values make short runs (cutting one copies little), each run its items' bytes."""
    p, c = producer(bucket, clock), Consumer()
    request(p, vb=0)
    p.next_messages()  # the stream is in memory, caught up
    vb = bucket.get_vbucket(0)
    for i in range(5):
        vb.set(b"big%d" % i, b"%d" % i * (RUN_BYTES // 2 + 1))
    active = p._streams[0]
    active.take()  # refills: the marker, then the runs
    runs = [entry for entry in active.pending if entry[3]]
    assert [n for *_, n in runs] == [2, 2, 1] and [r[1] for r in runs] == [2, 4, 5]
    c.drain(p)
    assert c.docs[0] == live(vb)
