"""Disk backfills read by a worker (here a runner the test steps by hand, so nothing is timed):
the stream waits without blocking, is woken when a batch lands, sends exactly what an inline
read sends, buffers a bounded amount, and lets go of its read transaction when it ends."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from dcpkv.core.seqno import U64_MAX
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp import backfill
from dcpkv.dcp.active_stream import BATCH_ITEMS, RUN_BYTES, ActiveStream, encode_rows
from dcpkv.dcp.producer import DcpProducer
from dcpkv.dcp.stream import Stream
from dcpkv.dcp.values import ValueShape
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.storage import DELETED, EXPIRED
from dcpkv.protocol import dcp
from dcpkv.protocol.base import Message
from dcpkv.protocol.constants import OpenFlag, StreamEndReason
from dcpkv.protocol.frame import FrameParser
from dcpkv.protocol.messages import decode_message

NAME = "backfill:test"


class ManualRunner:
    """Queues reads; the test runs them one at a time (a worker thread, stepped by hand)."""

    inline = False

    def __init__(self) -> None:
        self.tasks: list[Callable[[], None]] = []

    def submit(self, task: Callable[[], None]) -> None:
        self.tasks.append(task)

    def run_one(self) -> None:
        self.tasks.pop(0)()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def bucket(tmp_path: Path, clock: ManualClock) -> Iterator[Bucket]:
    b = Bucket(
        "default", tmp_path / "data", num_vbuckets=8, clock=clock, rng=random.Random(3),
        checkpoint_max_items=5, synchronous="NORMAL",
    )  # fmt: skip
    for vb in range(8):
        b.set_vbucket_state(vb, VBucketState.ACTIVE)
        for i in range(40):
            b.get_vbucket(vb).set(b"k%d-%d" % (vb, i), b"value-%d" % i, flags=i)
        b.get_vbucket(vb).delete(b"k%d-3" % vb)
    b.flush_once()
    assert all(b.get_vbucket(vb).checkpoints.lowest_seqno_in_memory > 1 for vb in range(8))
    yield b
    b.storage.close()


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill, "BATCH_ROWS", 16)


def request_all(p: DcpProducer, bucket: Bucket, vbs: range = range(8)) -> None:
    for vb in vbs:
        msg = dcp.StreamRequest(opaque=vb + 100, vbucket=vb, end_seqno=U64_MAX)
        p.stream_request(msg)


def drain_inline(bucket: Bucket, clock: ManualClock) -> bytes:
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    request_all(p, bucket)
    out = b""
    while chunks := p.next_messages():
        out += b"".join(chunks)
    p.disconnect()
    return out


def test_a_worker_backfill_wakes_the_stream_and_sends_what_inline_sends(
    bucket: Bucket, clock: ManualClock
) -> None:
    inline = drain_inline(bucket, clock)
    runner, wakeups = ManualRunner(), []
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    p.attach(runner, lambda: wakeups.append(1))
    request_all(p, bucket)
    assert p.next_messages() == []  # nothing read yet: the streams wait, nothing blocks
    # one read in flight per producer; the other streams wait their turn
    assert p.stats()[f"ready_streams:{NAME}"] == "0" and len(runner.tasks) == 1
    assert len(p.backfills._waiting) == 7
    out, reads = b"", 0
    while True:
        chunks = p.next_messages()
        if chunks:
            out += b"".join(chunks)
        elif runner.tasks:
            runner.run_one()
            reads += 1
        else:
            break
    assert len(wakeups) == reads > 8  # one wake-up per landed batch, several per stream
    # Per stream the same messages in the same order (the interleaving follows the reads).
    assert per_vbucket(out) == per_vbucket(inline)
    assert p.backfills.buffered == 0
    p.disconnect()


def per_vbucket(data: bytes) -> dict[int, list[Message]]:
    out: dict[int, list[Message]] = {}
    for frame in FrameParser().feed(data):
        out.setdefault(frame.vbucket, []).append(decode_message(frame))
    return out


def test_backfill_buffers_are_bounded_per_producer(bucket: Bucket, clock: ManualClock) -> None:
    """A consumer that reads nothing: reads stop once the producer's buffer bound is reached
    (plus the batch that crossed it), and resume as the streams take from the buffer."""
    runner = ManualRunner()
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    p.backfills.buffer_bytes = 3000
    p.attach(runner, lambda: None)
    request_all(p, bucket)
    p.next_messages()  # every stream asks for its first read
    biggest = 0
    while runner.tasks:
        runner.run_one()
        biggest = max(biggest, max(b.nbytes for b in all_batches(p)))
        for vb in range(8):  # the streams look for data but the consumer takes nothing
            stream = p._streams[vb]
            if stream.backfill is not None and stream.backfill.opened:
                stream.backfill.request()
        assert p.backfills.buffered <= 3000 + biggest
    assert p.backfills._waiting  # some backfills wait for room
    # A consumer reading everything gets everything: waiting backfills resume.
    while True:
        chunks = p.next_messages(10_000)
        if not chunks and not runner.tasks:
            break
        if not chunks:
            runner.run_one()
    assert p.items_sent == 8 * 40 and p.backfills.buffered == 0  # 39 live + 1 tombstone
    p.disconnect()


def all_batches(p: DcpProducer) -> list[backfill.Batch]:
    return [b for s in p._streams.values() if s.backfill for b in s.backfill._batches]


def test_a_stream_closed_mid_read_lets_go_of_its_snapshot(
    bucket: Bucket, clock: ManualClock
) -> None:
    runner = ManualRunner()
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    p.attach(runner, lambda: None)
    request_all(p, bucket, range(1))
    p.next_messages()
    runner.run_one()  # opens the snapshot, first batch
    while p.next_messages():
        pass
    bf = p._streams[0].backfill
    assert bf is not None and bf._reading  # the next read is queued
    assert p.close_stream(0, 1)
    scan = bf._scan
    assert scan is not None and not scan.closed  # the worker still owns it
    runner.run_one()  # the read lands on a closed backfill: it closes the scan
    assert scan.closed and not bf._batches and p.backfills.buffered == 0
    p.disconnect()


# -- the fused encoding of stored rows ---------------------------------------------------------


def stream_row(row: tuple) -> tuple:
    """The StreamRow storage reads for a Row (storage.StreamRow, packed in Python)."""
    key, seqno, cas, rev, flags, expiry, datatype, deleted, delete_time, value = row
    flags_expiry = flags << 32 | expiry
    flags_expiry -= 1 << 64 if flags_expiry >= 1 << 63 else 0
    return (key, seqno, cas, rev, flags_expiry, datatype | deleted << 8 | delete_time << 10, value)


# The stand-in owners' bucket: encoding rows reads none of it.
NO_BUCKET = SimpleNamespace(vbuckets={})


@pytest.mark.parametrize(
    "flags", [OpenFlag.Producer, OpenFlag.Producer | OpenFlag.NoValue,
              OpenFlag.Producer | OpenFlag.NoValueWithUnderlyingDatatype,
              OpenFlag.Producer | OpenFlag.IncludeDeleteTimes],
)  # fmt: skip
@pytest.mark.parametrize("expiry_opcode", [False, True])
def test_rows_encode_to_the_typed_messages_bytes(flags: int, expiry_opcode: bool) -> None:
    owner = SimpleNamespace(
        name=NAME, flags=OpenFlag(flags), expiry_opcode=expiry_opcode, bucket=NO_BUCKET,
        no_value=bool(flags & (OpenFlag.NoValue | OpenFlag.NoValueWithUnderlyingDatatype)),
        keep_datatype=bool(flags & OpenFlag.NoValueWithUnderlyingDatatype),
        delete_times=bool(flags & OpenFlag.IncludeDeleteTimes),
    )  # fmt: skip
    # a Snappy consumer: the row's datatype 3 (JSON | Snappy) goes out as stored
    owner.shape = ValueShape(snappy=True, no_value=owner.no_value,
                             keep_datatype=owner.keep_datatype)  # fmt: skip
    stream = Stream(vbucket=1023, opaque=0xDEADBEEF, flags=0, start=0, end=U64_MAX, vb_uuid=1)
    active = ActiveStream(owner, stream, was_active=True, takeover=False)  # type: ignore[arg-type]
    big_cas = (1 << 64) - 5  # stored as a negative signed 64-bit integer
    rows = [
        (b"k", 1, big_cas - (1 << 64), 7, 0xFFFFFFFF, 2_000_000_000, 3, 0, 0, b'{"a":1}'),
        (b"key-2", 2, 12345, 1, 0, 0, 0, 0, 0, b""),
        (b"gone", 3, 99, 2, 0, 0, 0, DELETED, 1_700_000_000, b""),
        (b"old", 4, 100, 3, 0, 0, 0, EXPIRED, 1_700_000_001, b""),
    ]
    batch = encode_rows(active, [stream_row(r) for r in rows])  # type: ignore[arg-type]
    no_value = flags & (OpenFlag.NoValue | OpenFlag.NoValueWithUnderlyingDatatype)
    keep_datatype = flags & OpenFlag.NoValueWithUnderlyingDatatype
    head = {"opaque": 0xDEADBEEF, "vbucket": 1023}
    expected = [
        dcp.Mutation(**head, cas=big_cas, by_seqno=1, rev_seqno=7, flags=0xFFFFFFFF,
                     expiration=2_000_000_000, datatype=3 if not no_value or keep_datatype else 0,
                     key=b"k", value=b"" if no_value else b'{"a":1}').encode(),
        dcp.Mutation(**head, cas=12345, by_seqno=2, rev_seqno=1, key=b"key-2").encode(),
        (dcp.DeletionV2(**head, cas=99, by_seqno=3, rev_seqno=2, key=b"gone",
                        delete_time=1_700_000_000)
         if flags & OpenFlag.IncludeDeleteTimes
         else dcp.Deletion(**head, cas=99, by_seqno=3, rev_seqno=2, key=b"gone")).encode(),
    ]  # fmt: skip
    if expiry_opcode:
        expected.append(dcp.Expiration(**head, cas=100, by_seqno=4, rev_seqno=3, key=b"old",
                                       delete_time=1_700_000_001).encode())  # fmt: skip
    elif flags & OpenFlag.IncludeDeleteTimes:
        expected.append(dcp.DeletionV2(**head, cas=100, by_seqno=4, rev_seqno=3, key=b"old",
                                       delete_time=1_700_000_001).encode())  # fmt: skip
    else:
        expected.append(dcp.Deletion(**head, cas=100, by_seqno=4, rev_seqno=3, key=b"old").encode())
    # one run: the four messages joined, the last seqno, the item count
    assert batch.runs == [(b"".join(expected), 4, 4)]
    assert batch.nbytes == sum(map(len, expected))
    # a stream with an id gets a run per item (each message is tagged on its way out)
    sid_stream = ActiveStream(owner, stream, was_active=True, takeover=False, sid=5)  # type: ignore[arg-type]
    assert encode_rows(sid_stream, [stream_row(r) for r in rows]).runs == [  # type: ignore[arg-type]
        (m, seqno, 1) for m, seqno in zip(expected, [1, 2, 3, 4], strict=True)
    ]


def test_runs_hold_batch_items_each() -> None:
    owner = SimpleNamespace(name=NAME, no_value=False, keep_datatype=False,
                            shape=ValueShape(), bucket=NO_BUCKET)  # fmt: skip
    stream = Stream(vbucket=0, opaque=1, flags=0, start=0, end=U64_MAX, vb_uuid=1)
    active = ActiveStream(owner, stream, was_active=True, takeover=False)  # type: ignore[arg-type]
    rows = [(b"k%d" % i, i, 1, 1, 0, 0, b"v") for i in range(1, 2 * BATCH_ITEMS + 6)]
    runs = encode_rows(active, rows).runs  # type: ignore[arg-type]
    assert [(seqno, n) for _, seqno, n in runs] == [
        (BATCH_ITEMS, BATCH_ITEMS),
        (2 * BATCH_ITEMS, BATCH_ITEMS),
        (2 * BATCH_ITEMS + 5, 5),
    ]
    frames = list(FrameParser().feed(b"".join(r[0] for r in runs)))
    assert [int.from_bytes(f.extras[:8], "big") for f in frames] == [r[1] for r in rows]
    # large values: a run closes once it reaches RUN_BYTES
    big = [(b"k%d" % i, i, 1, 1, 0, 0, b"x" * (RUN_BYTES // 2 + 1)) for i in range(1, 6)]
    assert [(seqno, n) for _, seqno, n in encode_rows(active, big).runs] == [  # type: ignore[arg-type]
        (2, 2),
        (4, 2),
        (5, 1),
    ]


def test_a_stream_closed_mid_backfill_ends_and_frees_its_buffer(
    bucket: Bucket, clock: ManualClock
) -> None:
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    p.control("send_stream_end_on_client_close_stream", "true")
    request_all(p, bucket, range(2))
    p.next_messages(200)  # both mid-backfill (inline reads)
    assert p.backfills.buffered > 0
    p.close_stream(0, 1)
    msgs = [decode_message(f) for c in drain(p) for f in FrameParser().feed(c)]
    ends = [m for m in msgs if isinstance(m, dcp.StreamEnd)]
    assert [(e.vbucket, e.reason) for e in ends] == [(0, StreamEndReason.Closed)]
    assert 0 not in p._streams
    p.disconnect()
    assert p.backfills.buffered == 0


def drain(p: DcpProducer) -> list[bytes]:
    out = []
    while chunks := p.next_messages():
        out += chunks
    return out


def message_sizes(data: bytes) -> list[int]:
    """The size of each message in ``data`` (its header's body length, plus the header)."""
    sizes, off = [], 0
    while off < len(data):
        sizes.append(24 + int.from_bytes(data[off + 8 : off + 12], "big"))
        off += sizes[-1]
    return sizes


@pytest.mark.parametrize("window", [1, 300, 1000, 4000])
def test_runs_go_out_message_by_message_under_flow_control(
    bucket: Bucket, clock: ManualClock, window: int
) -> None:
    """A run is cut where flow control stops: every message of a round starts while fewer
    than ``window`` bytes are unacknowledged, and the streams send what they send without it."""
    reference = drain_inline(bucket, clock)
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    p.control("connection_buffer_size", str(window))
    request_all(p, bucket)
    out, rounds = b"", 0
    while True:
        data = b"".join(p.next_messages())
        if not data:
            if p.unacked_bytes == 0:
                break
            p.buffer_ack(p.unacked_bytes)  # the consumer read the round: the window reopens
            rounds += 1
            continue
        assert sum(message_sizes(data)[:-1]) < window  # only the last may overflow it
        out += data
    assert rounds > len(reference) // max(window, 200) // 2
    assert per_vbucket(out) == per_vbucket(reference)


@pytest.mark.parametrize("budget", [1, 150, 700])
def test_runs_are_cut_to_the_byte_budget(bucket: Bucket, clock: ManualClock, budget: int) -> None:
    reference = drain_inline(bucket, clock)
    p = DcpProducer(bucket, NAME, OpenFlag.Producer, clock=clock)
    request_all(p, bucket)
    out = b""
    while data := b"".join(p.next_messages(budget)):
        assert sum(message_sizes(data)[:-1]) < budget
        out += data
    assert per_vbucket(out) == per_vbucket(reference)
    assert p.items_sent == 8 * 40
