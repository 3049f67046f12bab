"""The DCP producer side of one connection, sans-I/O.

Theory of operation
-------------------
A :class:`DcpProducer` is created when a consumer's DcpOpen carries the Producer flag. It
never touches a socket: the server feeds it the typed messages it decoded (:meth:`handle`,
or the per-message methods) and writes whatever bytes it returns, then asks
:meth:`DcpProducer.next_messages` for the DCP messages ready to go whenever the socket can
take more, and polls :meth:`noop_due` / :meth:`is_dead` on a timer.

Streams
    A stream request is answered by :func:`decide_stream_request`; an accepted one becomes a
    :class:`_Out`: a :class:`Stream` (state machine and accounting) plus where its items come
    from. It starts by registering a checkpoint cursor at the requested start. If memory no
    longer holds that point, it *backfills*: one disk snapshot (marker flag Disk) from the
    start to the persisted high seqno, read lazily from a SQLite read transaction, with a
    cursor registered at the backfill's end at once so memory keeps what follows. Then it
    sends memory snapshots from the cursor (flag Memory, plus Checkpoint when the snapshot
    opens a checkpoint), already deduplicated by the checkpoint manager. A dropped cursor
    (slow consumer, memory pressure) sends the stream back to disk from the last seqno it
    queued, as kv_engine does. The marker start follows spec 004: the requested start for
    the first marker, the backfill's start for later backfills, the cursor's rule otherwise.

Output and memory
    Each stream holds a small queue of encoded messages (``pending``). It is refilled only
    when empty and only when flow control would let something out, with at most
    :data:`BATCH_ITEMS` items from a backfill or one memory snapshot (a soft limit: the
    checkpoint manager never splits a checkpoint, so a snapshot is bounded by the bucket's
    ``checkpoint_max_items``). A slow consumer therefore costs a bounded amount of memory per
    stream: what it has not read stays on disk or in the checkpoints, which may drop its
    cursor.

    ``next_messages`` takes one message per stream per round (round-robin, as kv_engine's
    producer does), while the byte budget of the call and the flow-control window allow: with
    ``connection_buffer_size`` N, a message is sent only while fewer than N bytes are
    unacknowledged (so one message may overflow N); every message but Noop counts, header
    included; BufferAck releases.

Ready queue
    A write must not cost O(open streams): a replica or a Spark query streams all 1024
    vbuckets, and most of them are idle at any moment. As kv_engine does, the producer keeps a
    *ready queue* of the streams that may have something to send, and ``next_messages`` visits
    only those. A stream joins it when it opens, when its vbucket queues an item (the
    producer subscribes to the bucket's ``seqno_listeners``; the listener may run on any
    thread, so it only appends to a thread-safe deque that ``next_messages`` drains), when a
    takeover answer or a state change gives it something to do, and when it ends. It leaves
    when a visit finds nothing to send (``_take`` refills until the stream either has a
    message or made no progress, so "nothing" means "nothing until the next notification").
    A stream waiting on the flow-control window stays queued. Invariant: a vbucket is in
    ``_ready`` at most once, exactly when it is in ``_in_ready``. ``stream_polls`` counts the
    visits: the work per write, which a test holds independent of the number of streams.

Barriers
    A DcpBarrier cookie records, for every live stream, the vbucket high seqno at arrival
    (capped at the stream's end). It is echoed (magic 0x82, same key and opaque) from
    ``next_messages`` right after the message that brings the last of those streams to its
    target (or at once, when there is nothing to wait for). Cookies are echoed in arrival
    order. A barrier keeps only the streams it still waits for, and a stream is struck off
    when a visit moves it past its target, so a pending barrier costs nothing per message.

Driving it (the server's side)
    On DcpOpen with the Producer flag: ``DcpProducer(bucket, name, flags, clock=...)`` (a
    second Open with the same name must ``disconnect()`` the first: cursor names are per
    connection name). For every decoded frame from the consumer: ``answer = handle(msg)``
    and write ``answer`` when not None. Whenever the socket is writable, and after every
    handled frame and every engine write to a streamed vbucket: write ``next_messages()``.
    On a timer: write ``noop_due(now)`` if any, close when ``is_dead(now)``. After a
    vbucket state change: ``vbucket_state_changed(vb)``. On close: ``disconnect()``.
    Nothing here blocks except the SQLite reads of a backfill batch (``BATCH_ITEMS`` rows).

Takeover (rebalance handoff)
    A stream requested with the TakeOver flag runs like any other until it has caught up
    (its memory cursor has nothing more). It then hands the vbucket over as kv_engine does:
    it sends SetVbucketState(pending) and waits for the consumer's answer; on that answer the
    producer sets its *own* vbucket dead (no front-end write may land after this point; other
    streams of the vbucket end with StateChanged), drains what was written meanwhile, sends
    SetVbucketState(active), waits for the answer, and ends the stream with StreamEnd(OK).
    The consumer's answers are matched by the stream's opaque. A takeover stream whose cursor
    is dropped in the handoff ends with TooSlow (the rebalance is retried by its driver).

Liveness
    With ``enable_noop``, a connection that has sent nothing for an interval sends a Noop;
    a Noop unanswered for one more interval makes :meth:`is_dead` true.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.stream import Stream, StreamEvent, StreamState
from dcpkv.dcp.stream_request import (
    Accept,
    RollbackTo,
    StreamRequest,
    VBucketView,
    decide_stream_request,
)
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.checkpoint import Cursor, CursorDropped, Snapshot
from dcpkv.engine.hlc import Clock
from dcpkv.engine.item import Item
from dcpkv.engine.storage import Backfill
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import (
    Opcode,
    OpenFlag,
    SnapshotFlag,
    StreamEndReason,
    StreamRequestFlag,
)
from dcpkv.protocol.errors import CodecError

BATCH_ITEMS = 64  # items a stream pulls from disk or memory at a time
DEFAULT_NOOP_INTERVAL = 20.0
_BOOLS = {"true": True, "false": False}
_PRIORITIES = frozenset({"low", "medium", "high"})
_MARKER_VERSIONS = frozenset({"1.0", "2.0", "2.2"})


class ProducerError(DcpkvError):
    """A request the producer refuses; ``status`` is the memcached status to answer with."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status

    def response(self, opcode: int, opaque: int) -> bytes:
        return _error(opcode, opaque, self.status, str(self))


def _error(opcode: int, opaque: int, status: int, message: str) -> bytes:
    return GenericResponse(
        opcode=opcode, opaque=opaque, status=status, value=message.encode()
    ).encode()


def _ok(opcode: int, opaque: int) -> bytes:
    return GenericResponse(opcode=opcode, opaque=opaque).encode()


@dataclass(slots=True)
class _Queued:
    data: bytes
    seqno: int | None = None  # the item's seqno (None: marker, stream end)
    is_item: bool = False
    covers: int = 0  # once this is sent, the consumer has everything up to this seqno


@dataclass(slots=True)
class _Out:
    """A stream plus where its next items come from and what is ready to send."""

    stream: Stream
    cursor_name: str
    was_active: bool
    pending: deque[_Queued] = field(default_factory=deque)
    cursor: Cursor | None = None
    backfill: Backfill | None = None
    backfill_items: Iterator[Item] | None = None
    backfill_first: bool = True  # no marker sent yet for the current backfill
    queued_seqno: int = 0  # the last item seqno put in ``pending`` (what is committed)
    emitted_seqno: int = 0  # the last item seqno handed out by next_messages
    backfill_remaining: int = 0
    takeover_state: VBucketState | None = None  # the state the handoff sends next

    @property
    def finished(self) -> bool:
        return not self.stream.alive and not self.pending


@dataclass(slots=True)
class _Barrier:
    cookie: bytes
    opaque: int
    waiting: dict[int, int]  # vbucket -> seqno its stream must still emit (struck off when it has)


class DcpProducer:
    """One DCP producer connection (see the module docstring)."""

    def __init__(self, bucket: Bucket, name: str, flags: int, *, clock: Clock) -> None:
        self.bucket = bucket
        self.name = name
        self.flags = OpenFlag(flags)
        self.clock = clock
        self.buffer_size = 0
        self.unacked_bytes = 0
        self.noop_enabled = False
        self.noop_interval = DEFAULT_NOOP_INTERVAL
        self.stream_end_on_close = False
        self.expiry_opcode = False
        self.priority = "medium"
        self.marker_version = "1.0"
        self.items_sent = 0
        self.bytes_sent = 0
        self.disconnected = False
        self._streams: dict[int, _Out] = {}
        self._ready: deque[int] = deque()  # streams that may have something to send, in turn
        self._in_ready: set[int] = set()  # exactly the vbuckets in _ready
        self._notified: deque[int] = deque()  # vbuckets that queued items (any thread)
        self.stream_polls = 0  # visits to a stream by next_messages (work, counted)
        self._barriers: deque[_Barrier] = deque()
        self._last_send = clock.time()
        self._noop_sent_at: float | None = None
        self._noop_opaques = itertools.count(0x1000_0000)
        bucket.seqno_listeners.append(self._on_queued)

    # -- requests from the consumer --------------------------------------------------------

    def handle(self, msg: Message) -> bytes | None:
        """Dispatch one decoded DCP message from the consumer; the answer to send, if any."""
        if isinstance(msg, GenericResponse):
            if msg.opcode == Opcode.DcpNoop:
                self.noop_response()
            elif msg.opcode == Opcode.DcpSetVbucketState:
                self.set_vbucket_state_ack(msg.opaque)
            return None  # answers to our other server-side messages need nothing
        if isinstance(msg, dcp.DcpControl):
            try:
                self.control(msg.key, msg.value)
            except ProducerError as exc:
                return exc.response(Opcode.DcpControl, msg.opaque)
            return _ok(Opcode.DcpControl, msg.opaque)
        if isinstance(msg, dcp.StreamRequest):
            return self.stream_request(msg)
        if isinstance(msg, dcp.CloseStream):
            return self.close_stream(msg.vbucket, msg.opaque)
        if isinstance(msg, dcp.GetFailoverLog):
            return self.get_failover_log(msg.vbucket, msg.opaque)
        if isinstance(msg, dcp.BufferAck):
            self.buffer_ack(msg.bytes_acked)
            return None
        if isinstance(msg, dcp.DcpBarrier) and not msg.echo:
            self.barrier(bytes(msg.cookie), msg.opaque)
            return None
        return _error(msg.opcode, msg.opaque, Status.NotSupported, "not for a DCP producer")

    def control(self, key: str, value: str) -> None:
        """Apply a DcpControl setting; ``ProducerError(Einval)`` for an unknown key or value."""
        setter = _CONTROLS.get(key)
        if setter is None:
            raise ProducerError(Status.Einval, f"unknown control {key!r}")
        setter(self, value)

    def _set_buffer_size(self, value: str) -> None:
        self.buffer_size = _parse_uint(value, "connection_buffer_size")

    def _set_enable_noop(self, value: str) -> None:
        self.noop_enabled = _parse_bool(value, "enable_noop")
        self._noop_sent_at = None

    def _set_noop_interval(self, value: str) -> None:
        try:
            interval = float(value)
        except ValueError:
            interval = 0.0
        if not interval > 0 or interval != interval or interval == float("inf"):
            raise ProducerError(Status.Einval, f"set_noop_interval: bad value {value!r}")
        self.noop_interval = interval

    def _set_stream_end_on_close(self, value: str) -> None:
        self.stream_end_on_close = _parse_bool(value, "send_stream_end_on_client_close_stream")

    def _set_expiry_opcode(self, value: str) -> None:
        self.expiry_opcode = _parse_bool(value, "enable_expiry_opcode")

    def _set_priority(self, value: str) -> None:
        if value not in _PRIORITIES:
            raise ProducerError(Status.Einval, f"set_priority: bad value {value!r}")
        self.priority = value

    def _set_marker_version(self, value: str) -> None:
        if value not in _MARKER_VERSIONS:
            raise ProducerError(Status.Einval, f"max_marker_version: bad value {value!r}")
        self.marker_version = value

    def stream_request(self, msg: dcp.StreamRequest) -> bytes:
        """Answer a stream request: OK + failover log, Rollback + seqno, or an error."""
        op, opaque = Opcode.DcpStreamRequest, msg.opaque
        try:
            consumer_purge = msg.purge_seqno
        except CodecError as exc:
            return _error(op, opaque, Status.Einval, str(exc))
        vb = self.bucket.vbuckets.get(msg.vbucket)
        request = StreamRequest(
            vbucket=msg.vbucket,
            flags=StreamRequestFlag(msg.flags),
            start=msg.start_seqno,
            end=msg.end_seqno,
            vb_uuid=msg.vbucket_uuid,
            snap_start=msg.snap_start_seqno,
            snap_end=msg.snap_end_seqno,
            consumer_purge_seqno=consumer_purge,
        )
        existing = self._streams.get(msg.vbucket)
        answer = decide_stream_request(
            request,
            _view(vb) if vb is not None else None,
            stream_exists=existing is not None and existing.stream.alive,
        )
        if isinstance(answer, RollbackTo):
            return dcp.StreamRequestRollback(opaque=opaque, rollback_seqno=answer.seqno).encode()
        if not isinstance(answer, Accept):
            return _error(op, opaque, answer.status, answer.message)
        assert vb is not None
        self._open_stream(vb, msg, answer, existing)
        return dcp.StreamRequestOk(opaque=opaque, failover_log=vb.failover.entries).encode()

    def _open_stream(
        self, vb: VBucket, msg: dcp.StreamRequest, accept: Accept, old: _Out | None
    ) -> None:
        stream = Stream(
            vbucket=vb.id,
            opaque=msg.opaque,
            flags=msg.flags,
            start=accept.start,
            end=accept.end,
            vb_uuid=accept.vb_uuid,
        )
        out = _Out(
            stream,
            cursor_name=f"dcp:{self.name}:{vb.id}",
            was_active=vb.state == VBucketState.ACTIVE,
            queued_seqno=accept.start,
            emitted_seqno=accept.start,
        )
        if msg.flags & StreamRequestFlag.TakeOver:
            out.takeover_state = VBucketState.PENDING
        if old is not None:
            out.pending = old.pending  # the old stream's StreamEnd must still go out, first
        self._streams[vb.id] = out
        self._wake(vb.id)
        if accept.start >= accept.end:
            self._end(out, StreamEndReason.OK)

    def close_stream(self, vbucket: int, opaque: int) -> bytes:
        out = self._streams.get(vbucket)
        if out is None or not out.stream.alive:
            return _error(
                Opcode.DcpCloseStream, opaque, Status.KeyEnoent, f"no stream for vb {vbucket}"
            )
        if self.stream_end_on_close:
            self._end(out, StreamEndReason.Closed)
        else:
            self._end(out, StreamEndReason.Closed, send=False)
            out.pending.clear()
            self._forget(vbucket)
        return _ok(Opcode.DcpCloseStream, opaque)

    def get_failover_log(self, vbucket: int, opaque: int) -> bytes:
        vb = self.bucket.vbuckets.get(vbucket)
        if vb is None:
            return _error(
                Opcode.DcpGetFailoverLog, opaque, Status.NotMyVbucket, f"no vbucket {vbucket}"
            )
        return dcp.GetFailoverLogResponse(opaque=opaque, failover_log=vb.failover.entries).encode()

    def buffer_ack(self, nbytes: int) -> None:
        self.unacked_bytes = max(0, self.unacked_bytes - nbytes)

    def noop_response(self) -> None:
        self._noop_sent_at = None

    def barrier(self, cookie: bytes, opaque: int) -> None:
        waiting: dict[int, int] = {}
        for vbid, out in self._streams.items():
            if not out.stream.alive:
                continue  # its StreamEnd is already queued: draining the queue is enough
            vb = self.bucket.vbuckets.get(vbid)
            high = vb.high_seqno if vb is not None else 0
            target = min(high, out.stream.end)
            if out.emitted_seqno < target:
                waiting[vbid] = target
        self._barriers.append(_Barrier(cookie, opaque, waiting))

    def set_vbucket_state_ack(self, opaque: int) -> None:
        """The consumer answered a takeover stream's SetVbucketState (see the docstring)."""
        out = next(
            (o for o in self._streams.values()
             if o.stream.opaque == opaque and o.stream.state is StreamState.TAKEOVER_WAIT),
            None,
        )  # fmt: skip
        if out is None:
            return  # a stray or late answer: nothing waits for it
        if out.takeover_state == VBucketState.PENDING:
            out.takeover_state = VBucketState.ACTIVE
            out.stream.handle(StreamEvent.ACKED)
            # After the state event, so our own vbucket_state_changed spares this stream.
            self.bucket.set_vbucket_state(out.stream.vbucket, VBucketState.DEAD)
            self._wake(out.stream.vbucket)  # drain what was written meanwhile, then Active
        else:
            self._end(out, StreamEndReason.OK)

    # -- events from the engine ---------------------------------------------------------------

    def vbucket_state_changed(self, vbucket: int) -> None:
        """End the streams of a vbucket that left the active state (or disappeared)."""
        out = self._streams.get(vbucket)
        if out is None or not out.stream.alive:
            return
        if out.stream.state in (StreamState.TAKEOVER_SEND, StreamState.TAKEOVER_WAIT):
            return  # the handoff itself moves the vbucket; it ends the stream when done
        vb = self.bucket.vbuckets.get(vbucket)
        gone = vb is None or vb.state == VBucketState.DEAD
        if gone or (out.was_active and vb.state != VBucketState.ACTIVE):
            self._end(out, StreamEndReason.StateChanged)

    def disconnect(self) -> None:
        """The connection is gone: release every cursor and backfill, forget everything."""
        for out in self._streams.values():
            if out.stream.alive:
                self._end(out, StreamEndReason.Disconnected, send=False)
        self._streams.clear()
        self._ready.clear()
        self._in_ready.clear()
        self._notified.clear()
        self._barriers.clear()
        with contextlib.suppress(ValueError):
            self.bucket.seqno_listeners.remove(self._on_queued)
        self.disconnected = True

    # -- the ready queue ---------------------------------------------------------------------

    def _on_queued(self, vbucket: int) -> None:
        # A bucket listener: any thread, under the vbucket's lock. Only take note.
        if vbucket in self._streams:
            self._notified.append(vbucket)

    def _wake(self, vbid: int) -> None:
        if vbid not in self._in_ready:
            self._in_ready.add(vbid)
            self._ready.append(vbid)

    def _drain_notified(self) -> None:
        notified = self._notified
        while notified:
            self._wake(notified.popleft())

    @property
    def has_ready(self) -> bool:
        """Whether a ``next_messages`` call may find something to send (or a barrier to echo)."""
        return bool(self._ready or self._notified or self._barriers)

    # -- output ----------------------------------------------------------------------------

    def next_messages(self, max_bytes: int = 1 << 20) -> list[bytes]:
        """Encoded DCP messages to send now (round-robin over the ready streams,
        flow-controlled)."""
        out: list[bytes] = []
        budget = max_bytes
        self._drain_notified()
        self._echo_barriers(out)
        ready = self._ready
        while ready and budget > 0 and self._window_open():
            vbid = ready.popleft()
            entry = self._streams.get(vbid)
            if entry is None:
                self._in_ready.discard(vbid)  # forgotten while it waited in line
                continue
            self.stream_polls += 1
            msg = self._take(entry)
            if msg is not None:
                out.append(msg.data)
                budget -= len(msg.data)
                self._account(entry, msg)
            if self._barriers:
                self._barrier_progress(vbid, entry)
                self._echo_barriers(out)
            if entry.finished:
                self._in_ready.discard(vbid)
                self._forget(vbid)
            elif msg is None:
                self._in_ready.discard(vbid)  # idle until its vbucket queues something
            else:
                ready.append(vbid)
        if out:
            self._last_send = self.clock.time()
        return out

    def _window_open(self) -> bool:
        return self.buffer_size == 0 or self.unacked_bytes < self.buffer_size

    def _take(self, out: _Out) -> _Queued | None:
        # Refill until a message is ready or a refill changes nothing: a refill may move the
        # stream on without queueing anything (a backfill ending empty hands over to memory),
        # and an idle stream leaves the ready queue, so "None" must mean "nothing for now".
        stream = out.stream
        while not out.pending and stream.alive:
            before = (stream.state, out.queued_seqno)
            self._refill(out)
            if not out.pending and (stream.state, out.queued_seqno) == before:
                break
        return out.pending.popleft() if out.pending else None

    def _account(self, out: _Out, msg: _Queued) -> None:
        size = len(msg.data)
        self.unacked_bytes += size
        self.bytes_sent += size
        out.stream.bytes_sent += 0 if msg.is_item else size
        if msg.is_item:
            assert msg.seqno is not None
            out.stream.note_item(msg.seqno, size)
            self.items_sent += 1
        out.emitted_seqno = max(out.emitted_seqno, msg.covers)

    def _echo_barriers(self, out: list[bytes]) -> None:
        while self._barriers and not self._barriers[0].waiting:
            b = self._barriers.popleft()
            data = dcp.DcpBarrier(cookie=b.cookie, opaque=b.opaque, echo=True).encode()
            self.unacked_bytes += len(data)
            self.bytes_sent += len(data)
            out.append(data)

    def _barrier_progress(self, vbid: int, entry: _Out | None) -> None:
        """Strike ``vbid`` off every barrier whose target it has now reached."""
        for barrier in self._barriers:
            target = barrier.waiting.get(vbid)
            if target is None:
                continue
            done = entry is None or entry.finished or entry.emitted_seqno >= target
            if done or not (entry.stream.alive or entry.pending):
                del barrier.waiting[vbid]

    def _forget(self, vbid: int) -> None:
        # A queued entry stays in _ready and is dropped when reached (no O(n) removal).
        self._streams.pop(vbid, None)
        if self._barriers:
            self._barrier_progress(vbid, None)

    # -- filling a stream's queue ---------------------------------------------------------

    def _refill(self, out: _Out) -> None:
        stream = out.stream
        if stream.state is StreamState.PENDING:
            self._begin(out)
        if stream.state is StreamState.BACKFILLING:
            self._refill_from_disk(out)
        elif stream.state is StreamState.IN_MEMORY:
            self._refill_from_memory(out)
        elif stream.state is StreamState.TAKEOVER_SEND:
            self._refill_takeover(out)

    def _begin(self, out: _Out) -> None:
        vb = self.bucket.vbuckets[out.stream.vbucket]
        out.cursor = vb.checkpoints.register_cursor(out.cursor_name, out.queued_seqno)
        if out.cursor is not None:
            out.stream.handle(StreamEvent.MEMORY)
        else:
            out.stream.handle(StreamEvent.BACKFILL)
            self._open_backfill(out)

    def _open_backfill(self, out: _Out) -> None:
        stream = out.stream
        vbid = stream.vbucket
        bf = self.bucket.storage.backfill(vbid, out.queued_seqno, stream.end)
        out.backfill, out.backfill_items, out.backfill_first = bf, iter(bf.items), True
        out.backfill_remaining = max(0, bf.end - out.queued_seqno)
        # Pin memory right after the disk snapshot's end, so no backfill is needed next.
        out.cursor = None
        if bf.end < stream.end:
            vb = self.bucket.vbuckets[vbid]
            out.cursor = vb.checkpoints.register_cursor(out.cursor_name, bf.end)

    def _refill_from_disk(self, out: _Out) -> None:
        bf, items = out.backfill, out.backfill_items
        assert bf is not None and items is not None
        batch = list(itertools.islice(items, BATCH_ITEMS))
        if out.backfill_first:
            out.backfill_first = False
            if bf.end > out.queued_seqno:
                start = out.stream.marker_start(out.queued_seqno)
                self._marker(out, start, bf.end, SnapshotFlag.Disk, bf.purge_seqno)
        for item in batch:
            self._queue_item(out, item)
        out.backfill_remaining = max(0, bf.end - out.queued_seqno)
        if len(batch) == BATCH_ITEMS:
            return
        # The disk snapshot is complete: the consumer is consistent at its end.
        self._advance(out, bf.end)
        _close_backfill(out)
        out.backfill_remaining = 0
        if self._end_if_reached(out):
            return
        if out.cursor is None:
            self._open_backfill(out)  # memory moved on while we read: another disk snapshot
        else:
            out.stream.handle(StreamEvent.BACKFILL_DONE)

    def _refill_from_memory(self, out: _Out) -> None:
        assert out.cursor is not None
        try:
            snap = out.cursor.next_snapshot(BATCH_ITEMS)
        except CursorDropped:
            out.stream.handle(StreamEvent.CURSOR_DROPPED)
            self._open_backfill(out)
            self._refill_from_disk(out)
            return
        if snap is None:
            if out.takeover_state is not None:
                out.stream.handle(StreamEvent.TAKEOVER)  # caught up: start the handoff
                self._refill_takeover(out)
            return
        self._queue_snapshot(out, snap)
        self._end_if_reached(out)

    def _refill_takeover(self, out: _Out) -> None:
        """Drain what memory still holds, then send the next state of the handoff."""
        assert out.cursor is not None and out.takeover_state is not None
        try:
            snap = out.cursor.next_snapshot(BATCH_ITEMS)
        except CursorDropped:
            self._end(out, StreamEndReason.TooSlow)
            return
        if snap is not None:
            self._queue_snapshot(out, snap)
            self._end_if_reached(out)
            return
        stream = out.stream
        msg = dcp.SetVbucketState(
            opaque=stream.opaque, vbucket=stream.vbucket, state=out.takeover_state
        )
        out.pending.append(_Queued(msg.encode()))
        stream.handle(StreamEvent.STATE_SENT)

    def _queue_snapshot(self, out: _Out, snap: Snapshot) -> None:
        end = out.stream.end
        items = [i for i in snap.items if i.by_seqno <= end]
        if not items:
            # Everything up to the end was deduplicated into later seqnos: nothing to send.
            self._advance(out, min(snap.end, end))
            return
        flags = SnapshotFlag.Memory | (SnapshotFlag.Checkpoint if snap.checkpoint else 0)
        vb = self.bucket.vbuckets.get(out.stream.vbucket)
        purge = vb.purge_seqno if vb is not None else 0
        start = out.stream.marker_start(snap.start)
        self._marker(out, start, min(snap.end, end), flags, purge)
        for item in items:
            self._queue_item(out, item)
        if snap.end >= end:
            self._advance(out, end)

    def _advance(self, out: _Out, seqno: int) -> None:
        """The consumer is consistent at ``seqno`` once what is queued now has gone out."""
        out.queued_seqno = max(out.queued_seqno, seqno)
        if out.pending:
            out.pending[-1].covers = out.queued_seqno
        else:
            out.emitted_seqno = max(out.emitted_seqno, out.queued_seqno)

    def _end_if_reached(self, out: _Out) -> bool:
        if out.queued_seqno >= out.stream.end:
            self._end(out, StreamEndReason.OK)
            return True
        return False

    def _end(self, out: _Out, reason: StreamEndReason, *, send: bool = True) -> None:
        stream = out.stream
        stream.finish(reason)
        vb = self.bucket.vbuckets.get(stream.vbucket)
        if vb is not None:
            vb.checkpoints.drop_cursor(out.cursor_name)
        out.cursor = None
        _close_backfill(out)
        if send:
            data = dcp.StreamEnd(opaque=stream.opaque, vbucket=stream.vbucket, reason=reason)
            out.pending.append(_Queued(data.encode(), seqno=None))
            self._wake(stream.vbucket)

    def _marker(self, out: _Out, start: int, end: int, flags: int, purge: int) -> None:
        stream = out.stream
        common = {
            "opaque": stream.opaque,
            "vbucket": stream.vbucket,
            "start_seqno": start,
            "end_seqno": end,
            "flags": int(flags),
        }
        marker: dcp.SnapshotMarker
        if self.marker_version == "1.0":
            marker = dcp.SnapshotMarker(**common)
        elif self.marker_version == "2.0":
            marker = dcp.SnapshotMarkerV2_0(**common, max_visible_seqno=end)
        else:
            marker = dcp.SnapshotMarkerV2_2(**common, max_visible_seqno=end, purge_seqno=purge)
        stream.note_snapshot(start, end)
        out.pending.append(_Queued(marker.encode()))

    def _queue_item(self, out: _Out, item: Item) -> None:
        data = self._encode_item(out.stream, item)
        out.pending.append(_Queued(data, item.by_seqno, True, covers=item.by_seqno))
        out.queued_seqno = item.by_seqno

    def _encode_item(self, stream: Stream, item: Item) -> bytes:
        head = {"opaque": stream.opaque, "vbucket": stream.vbucket, "cas": item.cas}
        seqnos = {"by_seqno": item.by_seqno, "rev_seqno": item.rev_seqno}
        if not item.deleted:
            value, datatype = item.value, item.datatype
            if self.flags & (OpenFlag.NoValue | OpenFlag.NoValueWithUnderlyingDatatype):
                # No value: never read an ejected one back. Plain NoValue also drops the
                # datatype (it described the value), the other flag keeps it.
                value = b""
                if not self.flags & OpenFlag.NoValueWithUnderlyingDatatype:
                    datatype = 0
            elif value is None:  # ejected from the hash table's copy: read it back
                stored = self.bucket.get_from_storage(stream.vbucket, item.key)
                value = stored.value if stored is not None and stored.value is not None else b""
            return dcp.Mutation(
                **head, **seqnos, datatype=datatype, key=item.key, value=value,
                flags=item.flags, expiration=item.expiry,
            ).encode()  # fmt: skip
        if item.expired and self.expiry_opcode:
            return dcp.Expiration(
                **head, **seqnos, key=item.key, delete_time=item.delete_time
            ).encode()
        if self.flags & OpenFlag.IncludeDeleteTimes:
            return dcp.DeletionV2(
                **head, **seqnos, key=item.key, delete_time=item.delete_time
            ).encode()
        return dcp.Deletion(**head, **seqnos, key=item.key).encode()

    # -- liveness --------------------------------------------------------------------------

    def noop_due(self, now: float) -> bytes | None:
        """A Noop to send when the connection was idle for an interval (and none is pending)."""
        if not self.noop_enabled or self._noop_sent_at is not None:
            return None
        if now - self._last_send < self.noop_interval:
            return None
        self._noop_sent_at = self._last_send = now
        return dcp.DcpNoop(opaque=next(self._noop_opaques)).encode()

    def is_dead(self, now: float) -> bool:
        """A Noop went unanswered for a whole interval: drop the connection."""
        return self._noop_sent_at is not None and now - self._noop_sent_at >= self.noop_interval

    # -- stats -----------------------------------------------------------------------------

    def stats(self) -> dict[str, str]:
        """Per-connection ``stat:name`` and per-stream ``stat:vb:name`` values (spec 002)."""
        n = self.name
        stats = {
            f"items_sent:{n}": self.items_sent,
            f"total_bytes_sent:{n}": self.bytes_sent,
            f"unacked_bytes:{n}": self.unacked_bytes,
            f"max_buffer_bytes:{n}": self.buffer_size,
            f"flow_control:{n}": "enabled" if self.buffer_size else "disabled",
            f"num_streams:{n}": sum(1 for o in self._streams.values() if o.stream.alive),
            f"noop_enabled:{n}": str(self.noop_enabled).lower(),
            f"noop_interval:{n}": self.noop_interval,
            f"priority:{n}": self.priority,
            f"pending_barriers:{n}": len(self._barriers),
            f"ready_streams:{n}": len(self._in_ready),
            f"stream_polls:{n}": self.stream_polls,
        }
        for vbid, out in sorted(self._streams.items()):
            s = out.stream
            per = {
                "state": s.state.value,
                "opaque": s.opaque,
                "start_seqno": s.start,
                "end_seqno": s.end,
                "last_sent_seqno": s.last_sent_seqno,
                "items_sent": s.items_sent,
                "bytes_sent": s.bytes_sent,
                "snapshots_sent": s.snapshots_sent,
                "backfill_remaining": out.backfill_remaining,
                "ready_queue_items": len(out.pending),
                "ready_queue_bytes": sum(len(q.data) for q in out.pending),
            }
            stats.update({f"{k}:{vbid}:{n}": v for k, v in per.items()})
        return {k: str(v) for k, v in stats.items()}


_CONTROLS = {
    "connection_buffer_size": DcpProducer._set_buffer_size,
    "enable_noop": DcpProducer._set_enable_noop,
    "set_noop_interval": DcpProducer._set_noop_interval,
    "send_stream_end_on_client_close_stream": DcpProducer._set_stream_end_on_close,
    "enable_expiry_opcode": DcpProducer._set_expiry_opcode,
    "set_priority": DcpProducer._set_priority,
    "max_marker_version": DcpProducer._set_marker_version,
}


def _parse_bool(value: str, key: str) -> bool:
    parsed = _BOOLS.get(value)
    if parsed is None:
        raise ProducerError(Status.Einval, f"{key}: {value!r} is not true or false")
    return parsed


def _parse_uint(value: str, key: str) -> int:
    if not value.isascii() or not value.isdigit() or int(value) >= 1 << 32:
        raise ProducerError(Status.Einval, f"{key}: {value!r} is not an unsigned 32-bit number")
    return int(value)


def _close_backfill(out: _Out) -> None:
    items = out.backfill_items
    close = getattr(items, "close", None)
    if close is not None:
        close()  # a generator: closing it ends the SQLite read transaction now
    out.backfill = out.backfill_items = None


def _view(vb: VBucket) -> VBucketView:
    with vb.lock:
        return VBucketView(
            state=vb.state,
            high_seqno=vb.high_seqno,
            persisted_seqno=vb.persisted_seqno,
            purge_seqno=vb.purge_seqno,
            failover_table=vb.failover,
        )
