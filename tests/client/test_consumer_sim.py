"""The key property: a consumer following the client's rules is resumable and rollback-correct.

A simulated producer (the real ``needs_rollback`` and ``FailoverTable``, a by-seqno op log,
deduplicated snapshots whose markers start in each of the ways spec 004 allows) is driven
against :class:`ConsumerStream` through writes, partial deliveries, disconnects, stream ends
and failovers that lose the newest changes and cut a new history branch. Whatever happened, once
the dust settles the consumer holds exactly the producer's data, at the producer's high seqno
on the producer's branch.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dcpkv.client import events
from dcpkv.client.consumer_stream import ConsumerState, ConsumerStream
from dcpkv.client.mutation_log import MutationLog
from dcpkv.core.failover_table import FailoverTable
from dcpkv.core.rollback import needs_rollback
from dcpkv.protocol import dcp
from dcpkv.protocol.base import Message
from dcpkv.protocol.constants import StreamEndReason
from dcpkv.protocol.fast_dcp import feed_fields
from dcpkv.protocol.frame import FrameParser

VB = 5
EXAMPLES = int(os.environ.get("DCPKV_SIM_EXAMPLES", "1000"))


@dataclass
class Op:
    seqno: int
    key: bytes
    value: bytes | None  # None: a deletion


@dataclass
class SimStream:
    last_sent: int
    first: bool = True
    queue: list[Message] = field(default_factory=list)


class SimProducer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ops: list[Op] = []
        self.table = FailoverTable.fresh(0, rng=random.Random(rng.getrandbits(32)))
        self.stream: SimStream | None = None
        self.counter = 0

    @property
    def high(self) -> int:
        return self.ops[-1].seqno if self.ops else 0

    def write(self, key: bytes, delete: bool) -> None:
        self.counter += 1
        value = None if delete else b"v%d" % self.counter
        self.ops.append(Op(self.high + 1, key, value))

    def failover(self, lose: int) -> None:
        """Lose the newest ``lose`` changes (never persisted) and cut a new branch."""
        del self.ops[len(self.ops) - min(lose, len(self.ops)) :]
        self.table.create_entry(self.high)
        self.stream = None

    def data(self) -> dict[bytes, bytes]:
        return replay((op.seqno, op.key, op.value) for op in self.ops)

    def fetch(self, key: bytes) -> tuple[bytes | None, int]:
        """A KV read of the current document and its seqno (the high seqno when it is gone:
        a deletion's seqno may be purged, the high seqno bounds it)."""
        for op in reversed(self.ops):
            if op.key == key:
                return op.value, op.seqno if op.value is not None else self.high
        return None, self.high

    def answer(self, req: dcp.StreamRequest) -> Message:
        rb = needs_rollback(
            start=req.start_seqno,
            vb_uuid=req.vbucket_uuid,
            snap_start=req.snap_start_seqno,
            snap_end=req.snap_end_seqno,
            purge_seqno=0,
            failover_table=self.table,
            high_seqno=self.high,
        )
        if rb is not None:
            return dcp.StreamRequestRollback(rollback_seqno=rb.seqno)
        assert req.start_seqno <= self.high, "accepted a consumer ahead of the producer"
        self.stream = SimStream(req.start_seqno)
        return dcp.StreamRequestOk(failover_log=self.table.entries)

    def next_message(self) -> Message | None:
        s = self.stream
        if s is None:
            return None
        if not s.queue and s.last_sent < self.high:
            self._snapshot(s)
        return s.queue.pop(0) if s.queue else None

    def end_stream(self, reason: StreamEndReason) -> None:
        if self.stream is not None:
            self.stream.queue = [dcp.StreamEnd(vbucket=VB, reason=reason)]

    def _snapshot(self, s: SimStream) -> None:
        lo = s.last_sent
        # Often everything at once: long snapshots are where deduplication bites.
        hi = self.high if self.rng.random() < 0.5 else self.rng.randint(lo + 1, self.high)
        latest: dict[bytes, Op] = {}
        for op in self.ops:
            if lo < op.seqno <= hi:
                latest.pop(op.key, None)  # dedup: keep only the newest version of a key
                latest[op.key] = op
        items = sorted(latest.values(), key=lambda op: op.seqno)
        # Spec 004: the first marker of a stream may start at the requested start; others at
        # the range's first seqno (maybe deduplicated away) or at the first item sent.
        starts = [lo + 1, items[0].seqno] + ([lo] if s.first else [])
        start = self.rng.choice(starts)
        s.queue.append(dcp.SnapshotMarker(vbucket=VB, start_seqno=start, end_seqno=hi, flags=1))
        for op in items:
            if op.value is None:
                s.queue.append(dcp.Deletion(vbucket=VB, key=op.key, by_seqno=op.seqno))
            else:
                s.queue.append(
                    dcp.Mutation(vbucket=VB, key=op.key, value=op.value, by_seqno=op.seqno)
                )
        s.last_sent, s.first = hi, False


def replay(ops: object) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for _seqno, key, value in ops:  # type: ignore[attr-defined]
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


class ReplicaApp:
    """An application that can roll back natively: it keeps what it applied, by seqno."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes, bytes | None]] = []

    def handle(self, evs: list[events.Event], producer: SimProducer) -> None:
        for ev in evs:
            if isinstance(ev, events.Mutation):
                self._apply(ev.seqno, ev.key, ev.value)
            elif isinstance(ev, events.Deletion | events.Expiration):
                self._apply(ev.seqno, ev.key, None)
            elif isinstance(ev, events.Rollback):
                assert ev.rollback_seqno <= ev.producer_seqno
                self.applied = [a for a in self.applied if a[0] <= ev.rollback_seqno]

    def _apply(self, seqno: int, key: bytes, value: bytes | None) -> None:
        assert not self.applied or self.applied[-1][0] < seqno, "seqnos must only go up"
        self.applied.append((seqno, key, value))

    def data(self) -> dict[bytes, bytes]:
        return replay(self.applied)


class RingBufferApp:
    """An application that cannot roll back: spec 002's mutation log repairs it by re-fetching
    the keys changed above the rollback point (or wiping everything when they are gone)."""

    def __init__(self, log: MutationLog) -> None:
        self.log = log
        self.state: dict[bytes, bytes] = {}
        self.consumer: ConsumerStream | None = None  # set by the harness
        self.full_resyncs = 0

    def handle(self, evs: list[events.Event], producer: SimProducer) -> None:
        for ev in evs:
            if isinstance(ev, events.Mutation):
                self.log.record(VB, ev.seqno, ev.key)  # persisted before it is applied
                self.state[ev.key] = ev.value
            elif isinstance(ev, events.Deletion | events.Expiration):
                self.log.record(VB, ev.seqno, ev.key)
                self.state.pop(ev.key, None)
            elif isinstance(ev, events.Rollback):
                self._repair(ev.rollback_seqno, producer)

    def _repair(self, seqno: int, producer: SimProducer) -> None:
        plan = self.log.repair_plan(VB, seqno)
        if plan.full_resync:
            assert self.consumer is not None
            self.consumer.roll_back(0)
            self.state.clear()
            self.log.truncate_above(VB, 0)
            self.full_resyncs += 1
            return
        fetched = []
        for key in plan.refetch_keys:
            value, key_seqno = producer.fetch(key)
            if value is None:
                self.state.pop(key, None)
            else:
                self.state[key] = value
            fetched.append((key, key_seqno))
        self.log.repaired(VB, seqno, fetched)
        assert self.consumer is not None
        self.consumer.note_seen(max((s for _k, s in fetched), default=seqno))

    def data(self) -> dict[bytes, bytes]:
        return dict(self.state)


class Harness:
    def __init__(self, seed: int, use_failover_log: bool, app: ReplicaApp | RingBufferApp):
        self.producer = SimProducer(random.Random(seed))
        self.consumer = ConsumerStream(VB)
        self.app = app
        if isinstance(app, RingBufferApp):
            app.consumer = self.consumer
        self.use_failover_log = use_failover_log

    def feed(self, evs: list[events.Event]) -> None:
        self.app.handle(evs, self.producer)

    def connect(self) -> None:
        for _ in range(100):
            if not self.consumer.needs_request:
                return
            if self.use_failover_log:
                ev = self.consumer.check_failover_log(self.producer.table.entries)
                if ev is not None:
                    self.feed([ev])
            answer = self.producer.answer(self.consumer.request(opaque=7))
            self.feed(self.consumer.receive(answer))
        raise AssertionError("the stream request never got accepted")

    def deliver(self, n: int) -> None:
        self.connect()
        for _ in range(n):
            if self.consumer.state is not ConsumerState.STREAMING:
                return
            msg = self.producer.next_message()
            if msg is None:
                return
            self.feed(self.receive(msg))

    def receive(self, msg: Message) -> list[events.Event]:
        # Odd seqnos' mutations the way the client's receive path takes them (fields, no
        # message: fast_dcp), the rest as messages: the two must be interchangeable.
        if type(msg) is dcp.Mutation and msg.by_seqno % 2:
            (run,) = feed_fields(FrameParser(), msg.encode())
            assert isinstance(run, list)
            return [self.consumer.change(f) for f in run]
        return self.consumer.receive(msg)

    def disconnect(self) -> None:
        self.consumer.disconnected()
        self.producer.stream = None

    def settle(self) -> None:
        for _ in range(10_000):
            self.connect()
            msg = self.producer.next_message()
            if msg is None:
                return
            self.feed(self.receive(msg))
        raise AssertionError("the stream never caught up")


W_A, W_B, W_C = (("write", k, False) for k in (b"a", b"b", b"c"))
WRITE = st.tuples(st.just("write"), st.sampled_from([b"a", b"b", b"c"]), st.booleans())
ACTIONS = st.one_of(
    WRITE,
    WRITE,
    WRITE,
    st.tuples(st.just("deliver"), st.integers(1, 6)),
    st.tuples(st.just("disconnect")),
    st.tuples(st.just("failover"), st.integers(0, 4)),
    st.tuples(
        st.just("end"),
        st.sampled_from(
            [StreamEndReason.StateChanged, StreamEndReason.TooSlow, StreamEndReason.Rollback]
        ),
    ),
)


def run(h: Harness, actions: list[tuple]) -> None:
    for action in actions:
        match action:
            case ("write", key, delete):
                h.producer.write(key, delete)
            case ("deliver", n):
                h.deliver(n)
            case ("disconnect",):
                h.disconnect()
            case ("failover", lose):
                h.producer.failover(lose)
                h.consumer.disconnected()
            case ("end", reason):
                h.producer.end_stream(reason)
    h.settle()


def assert_caught_up(h: Harness) -> None:
    p, offset = h.producer, h.consumer.offset
    assert h.app.data() == p.data()
    assert (offset.seqno, offset.vb_uuid) == (p.high, p.table.latest_uuid)
    assert h.consumer.progress.failover_log == p.table.entries
    # The snapshot may still be open (the producer accepted a resume from inside one and
    # had nothing newer); a request from here must be accepted as it stands.
    start, uuid, snap_start, snap_end = offset.stream_request_fields()
    rb = needs_rollback(
        start=start, vb_uuid=uuid, snap_start=snap_start, snap_end=snap_end,
        purge_seqno=0, failover_table=p.table, high_seqno=p.high,
    )  # fmt: skip
    assert rb is None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.booleans(), st.lists(ACTIONS, max_size=50))
# A rollback seqno inside a completed snapshot whose first change was deduplicated (case 4b).
@example(0, False, [W_A, W_A, ("deliver", 2), W_A, ("failover", 2)])
# Resumed from inside a snapshot the producer then had nothing after.
@example(0, False, [W_A, W_B, ("deliver", 2), ("failover", 1)])
# Spec 001's shape: lost the deletion that deduplicated the snapshot's first change (case 4c).
@example(3, False, [W_A, W_B, W_C, ("write", b"a", True), ("deliver", 3), ("failover", 1)])
def test_replica_ends_with_exactly_the_producers_data(
    seed: int, use_failover_log: bool, actions: list[tuple]
) -> None:
    h = Harness(seed, use_failover_log, ReplicaApp())
    run(h, actions)
    assert_caught_up(h)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(1, 12), st.lists(ACTIONS, max_size=50))
# A re-fetched document the producer loses in the next failover, before the stream passes it.
@example(0, 1, [W_A, ("deliver", 2), ("failover", 1), W_A, ("deliver", 1), ("failover", 1)])
# Two re-fetched documents logged at the same seqno (both gone: the producer's high seqno).
@example(0, 2, [W_A, W_B, ("deliver", 3), ("failover", 1), ("deliver", 1), ("failover", 1)])
def test_ring_buffer_consumer_ends_with_exactly_the_producers_data(
    seed: int, capacity: int, actions: list[tuple]
) -> None:
    """Small buffers too: a rollback past the oldest entry must fall back to a full resync.
    Such a consumer compares failover logs before every request (see ``consumer_stream``)."""
    with MutationLog(":memory:", capacity=capacity) as log:
        h = Harness(seed, True, RingBufferApp(log))
        run(h, actions)
        assert_caught_up(h)


def test_spec_001_example_rolls_back_past_the_deduplicated_change() -> None:
    """[1]A 2B 3C 4DEL(A): the consumer saw {1,4} up to 3, the producer lost 4 and branched at
    3. The producer answers rollback to 1; stopping at 1 would never bring A back."""
    h = Harness(1, False, ReplicaApp())
    p = h.producer
    for key, delete in [(b"A", False), (b"B", False), (b"C", False), (b"A", True)]:
        p.write(key, delete)
    h.connect()
    p.stream.queue = [  # type: ignore[union-attr]
        dcp.SnapshotMarker(vbucket=VB, start_seqno=1, end_seqno=4, flags=1),
        dcp.Mutation(vbucket=VB, key=b"B", value=b"v2", by_seqno=2),
        dcp.Mutation(vbucket=VB, key=b"C", value=b"v3", by_seqno=3),
    ]
    p.stream.last_sent = 4  # type: ignore[union-attr]
    h.deliver(3)
    assert h.consumer.offset.stream_request_fields()[1:] == (p.table.latest_uuid, 1, 4)
    h.disconnect()
    p.failover(1)
    seen: list[events.Event] = []
    h.app.handle = lambda evs, _p, inner=h.app.handle: (seen.extend(evs), inner(evs, _p))  # type: ignore[method-assign]
    h.settle()
    rollback = next(e for e in seen if isinstance(e, events.Rollback))
    assert (rollback.producer_seqno, rollback.rollback_seqno) == (1, 0)
    assert h.app.data() == {b"A": b"v1", b"B": b"v2", b"C": b"v3"}
    assert_caught_up(h)
