"""The DCP producer side of one connection, sans-I/O.

Theory of operation
-------------------
A :class:`DcpProducer` is created when a consumer's DcpOpen carries the Producer flag. It
never touches a socket: the server feeds it the typed messages it decoded (:meth:`handle`,
or the per-message methods) and writes whatever bytes it returns, then asks
:meth:`DcpProducer.next_messages` for the DCP messages ready to go whenever the socket can
take more, and polls :meth:`noop_due` / :meth:`is_dead` on a timer.

Streams
    A stream request is answered by :func:`decide_stream_request`; an accepted one becomes an
    :class:`~dcpkv.dcp.active_stream.ActiveStream` (:mod:`dcpkv.dcp.active_stream`: the state
    machine, backfill, memory snapshots and takeover of one vbucket). Its disk backfills are
    read by the producer's :class:`~dcpkv.dcp.backfill.BackfillManager`, inline by default
    (sans-I/O, deterministic), in the server's worker thread once the server attaches it
    (:meth:`DcpProducer.attach`): then a batch landing calls :meth:`DcpProducer.notify`, which
    queues the stream's vbucket and calls the server's ``wakeup`` so it pumps this connection.

Output and memory
    Each stream holds a small queue of encoded messages (see the stream's module); what a
    slow consumer has not read stays on disk or in the checkpoints, and backfill buffers are
    bounded per producer (``BackfillManager.buffer_bytes``).

    ``next_messages`` gives each ready stream a short turn per round (round-robin, as
    kv_engine's producer does; :mod:`dcpkv.dcp.ready_queue`): each visit sends one message
    (or one run of items: a backfill batch's or a memory snapshot's consecutive items joined
    into one bytes object; or a live write's snapshot of one item, its marker and the item
    joined: see :mod:`dcpkv.dcp.active_stream`) or finds the stream idle. A live write is
    thus one visit, after which the stream leaves the ready queue when its cursor has read
    everything (``ActiveStream.idle``). It goes on while the byte and visit budgets of the
    call (the server's bound on one turn of its event loop) and the flow-control window
    (:mod:`dcpkv.dcp.flow_control`: ``connection_buffer_size``, BufferAck, how a run is cut)
    allow.

Ready queue
    :mod:`dcpkv.dcp.ready_queue`: ``next_messages`` visits only the streams that may have
    something to send. A stream is woken when it opens, when a takeover answer or a state
    change gives it something to do, and when it ends; it is noted (any thread) when its
    vbucket queues an item (the producer subscribes to the bucket's ``seqno_listeners``, then
    calls the server's ``queued_hook`` so it knows to send) and when a backfill batch lands
    (:meth:`notify`). It leaves when a visit finds nothing to send (``ActiveStream.take``
    refills until the stream either has a message or made no progress, so "nothing" means
    "nothing until the next notification"), or on the visit that sent its last message when
    it is idle (a live stream caught up with its vbucket). ``stream_polls`` counts the visits:
    the work per write, which a test holds independent of the number of streams.

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
    handled frame and every engine write to a streamed vbucket: write ``next_messages()``
    (bounded or not; ``has_ready`` says whether a call stopped with more to send,
    ``notified`` how many writes wait for the next, and ``sync_write_waiting`` whether a
    SyncWrite's client waits on them). On a timer: write ``noop_due(now)`` if
    any, close when ``is_dead(now)``. After a vbucket state change:
    ``vbucket_state_changed(vb)``. On close: ``disconnect()``. To
    read backfills off the loop: ``attach(runner, wakeup)`` before the first
    ``next_messages``, where ``wakeup`` (called from the worker thread) makes the loop pump
    this connection soon. Unattached, a backfill batch is read inside ``next_messages``.

Takeover (rebalance handoff)
    See :mod:`dcpkv.dcp.active_stream`; the producer routes the consumer's answers to our
    SetVbucketState to the stream in takeover_wait with the same opaque.

Liveness
    With ``enable_noop``, a connection that has sent nothing for an interval sends a Noop;
    a Noop unanswered for one more interval makes :meth:`is_dead` true.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.active_stream import BATCH_ITEMS, ActiveStream, stream_key
from dcpkv.dcp.backfill import BackfillManager, BackfillRunner
from dcpkv.dcp.flow_control import FlowWindow, split_run
from dcpkv.dcp.ready_queue import ReadyQueue
from dcpkv.dcp.stream import Stream, StreamState
from dcpkv.dcp.stream_request import (
    Accept,
    RollbackTo,
    StreamRequest,
    VBucketView,
    decide_stream_request,
)
from dcpkv.dcp.values import ValueShape
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import Clock
from dcpkv.engine.item import EngineError, NotMyVbucket
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import (
    Opcode,
    OpenFlag,
    StreamEndReason,
    StreamRequestFlag,
)
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import tag_stream_id

__all__ = ["BATCH_ITEMS", "DcpProducer", "ProducerError"]

DEFAULT_NOOP_INTERVAL = 20.0
# A bounded turn (``next_messages(until=...)``) reads the clock once per this many visits: a
# visit costs a few microseconds, a clock read ~0.05 us.
VISITS_PER_CLOCK_READ = 8
_BOOLS = {"true": True, "false": False}
_PRIORITIES = frozenset({"low", "medium", "high"})
_MARKER_VERSIONS = frozenset({"1.0", "2.0", "2.2"})


class ProducerError(DcpkvError):
    """A request the producer refuses; ``status`` is the memcached status to answer with."""

    status: Status

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
class _Barrier:
    cookie: bytes
    opaque: int
    waiting: dict[int, int]  # vbucket -> seqno its stream must still emit (struck off when it has)


class DcpProducer:
    """One DCP producer connection (see the module docstring)."""

    def __init__(
        self, bucket: Bucket, name: str, flags: int, *, clock: Clock, snappy: bool = False
    ) -> None:
        self.bucket = bucket
        self.name = name
        self.flags = OpenFlag(flags)
        self.no_value = bool(flags & (OpenFlag.NoValue | OpenFlag.NoValueWithUnderlyingDatatype))
        self.keep_datatype = bool(flags & OpenFlag.NoValueWithUnderlyingDatatype)
        self.delete_times = bool(flags & OpenFlag.IncludeDeleteTimes)
        # how values are sent (xattrs, compression): snappy = the connection's Hello said so
        self.shape = ValueShape(
            xattrs=bool(flags & OpenFlag.IncludeXattrs), snappy=snappy,
            no_value=self.no_value, keep_datatype=self.keep_datatype,
        )  # fmt: skip
        self.clock = clock
        self.window = FlowWindow()  # connection_buffer_size and the bytes not yet acked
        self.noop_enabled = False
        self.noop_interval = DEFAULT_NOOP_INTERVAL
        self.stream_end_on_close = False
        self.expiry_opcode = False
        self.priority = "medium"
        self.marker_version = "1.0"
        # SyncWrites (PROTOCOL.md): enable_sync_writes = this connection gets prepares, commits
        # and aborts (and V2.0 markers at least); consumer_name = the node it acknowledges as
        self.sync_writes = False
        self.consumer_name: str | None = None
        self.items_sent = 0
        self.bytes_sent = 0
        self.rollbacks_answered = 0  # stream requests answered Rollback (a metric)
        self.disconnected = False
        self._streams: dict[int, ActiveStream] = {}  # by stream key (active_stream.stream_key)
        # enable_stream_id: several streams of a vbucket, each tagged with its id
        self.stream_ids = False
        self._by_vb: dict[int, tuple[int, ...]] = {}  # vbucket -> its stream keys (with ids)
        self.ready = ReadyQueue(self._forget)  # the streams that may have something to send
        # a notified vbucket held a prepare and the consumer acks them: a SyncWrite's client
        # waits on the next pump (the server's push cadence, case S); cleared by that pump
        self.sync_write_waiting = False
        self.stream_polls = 0  # visits to a stream by next_messages (work, counted)
        self._barriers: deque[_Barrier] = deque()
        self._last_send = clock.time()
        self._noop_sent_at: float | None = None
        self._noop_opaques = itertools.count(0x1000_0000)
        self.backfills = BackfillManager()
        self.wakeup: Callable[[], None] | None = None  # the server's "pump me soon" (any thread)
        # The server's "items were queued" (any thread, under the vbucket's lock: it must only
        # take note), called after every write to a streamed vbucket, once noted.
        self.queued_hook: Callable[[], None] | None = None
        bucket.seqno_listeners.append(self._on_queued)

    def attach(self, runner: BackfillRunner, wakeup: Callable[[], None]) -> None:
        """Read backfills on ``runner`` (a worker thread); ``wakeup`` is called from that thread
        when a batch lands, and must make the server call :meth:`next_messages` soon."""
        self.wakeup = wakeup
        self.backfills.attach(runner)

    # -- requests from the consumer --------------------------------------------------------

    def handle(self, msg: Message) -> bytes | None:
        """Dispatch one decoded DCP message from the consumer; the answer to send, if any."""
        if isinstance(msg, GenericResponse):
            if msg.opcode == Opcode.DcpNoop:
                self.noop_response()
            elif msg.opcode == Opcode.DcpSetVbucketState and msg.status == Status.Success:
                # a refusal leaves the handoff waiting: the manager times it out and reverts
                self.set_vbucket_state_ack(msg.opaque)
            return None  # answers to our other server-side messages need nothing
        serve = _REQUESTS.get(type(msg))
        if serve is None or (isinstance(msg, dcp.DcpBarrier) and msg.echo):
            return _error(msg.opcode, msg.opaque, Status.NotSupported, "not for a DCP producer")
        return serve(self, msg)

    def _control_request(self, msg: dcp.DcpControl) -> bytes:
        try:
            self.control(msg.key, msg.value)
        except ProducerError as exc:
            return exc.response(Opcode.DcpControl, msg.opaque)
        return _ok(Opcode.DcpControl, msg.opaque)

    def _close_stream_request(self, msg: dcp.CloseStream) -> bytes:
        return self.close_stream(msg.vbucket, msg.opaque, msg.stream_id)

    def _failover_log_request(self, msg: dcp.GetFailoverLog) -> bytes:
        return self.get_failover_log(msg.vbucket, msg.opaque)

    def _buffer_ack_request(self, msg: dcp.BufferAck) -> None:
        self.buffer_ack(msg.bytes_acked)

    def _barrier_request(self, msg: dcp.DcpBarrier) -> None:
        self.barrier(bytes(msg.cookie), msg.opaque)

    def control(self, key: str, value: str) -> None:
        """Apply a DcpControl setting; ``ProducerError(Einval)`` for an unknown key or value."""
        setter = _CONTROLS.get(key)
        if setter is None:
            raise ProducerError(Status.Einval, f"unknown control {key!r}")
        setter(self, value)

    def _set_buffer_size(self, value: str) -> None:
        self.window.size = _parse_uint(value, "connection_buffer_size")

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
        # An Expiration carries a delete time (the DeletionV2 layout): a connection opened
        # without IncludeDeleteTimes cannot read one, so the control is accepted and has no
        # effect there, as on the reference producer (expirations go out as Deletions).
        self.expiry_opcode = _parse_bool(value, "enable_expiry_opcode") and self.delete_times

    def _set_force_compression(self, value: str) -> None:
        force = _parse_bool(value, "force_value_compression")
        if force and not self.shape.snappy:
            raise ProducerError(
                Status.Einval, "force_value_compression needs Snappy negotiated with Hello"
            )
        self.shape = dataclasses.replace(self.shape, force_compression=force)

    def _set_stream_ids(self, value: str) -> None:
        if value != "true" or self._streams:
            raise ProducerError(
                Status.Einval, "enable_stream_id: only 'true', before any stream is opened"
            )
        if self.sync_writes:
            raise ProducerError(Status.NotSupported, "enable_stream_id: SyncWrites are enabled")
        self.stream_ids = True

    def _set_sync_writes(self, value: str) -> None:
        enable = _parse_bool(value, "enable_sync_writes")
        if enable and self.stream_ids:  # as the reference: no SyncWrites with stream ids
            raise ProducerError(
                Status.NotSupported, "enable_sync_writes: not on a connection with stream ids"
            )
        self.sync_writes = enable

    def _set_consumer_name(self, value: str) -> None:
        if not value:
            raise ProducerError(Status.Einval, "consumer_name: empty")
        self.consumer_name = value

    def _seqno_ack_request(self, msg: dcp.SeqnoAcknowledged) -> bytes | None:
        """A replica's high prepared seqno (no answer unless refused)."""
        op, opaque = Opcode.DcpSeqnoAcknowledged, msg.opaque
        name = self.consumer_name
        if not self.sync_writes or name is None:
            return _error(op, opaque, Status.Einval, "needs enable_sync_writes and consumer_name")
        vb = self.bucket.vbuckets.get(msg.vbucket)
        try:
            if vb is None:
                raise NotMyVbucket(f"no vbucket {msg.vbucket}")
            vb.seqno_acknowledged(name, msg.prepared_seqno)
        except EngineError as exc:
            return _error(op, opaque, exc.status, str(exc))
        return None

    def _stream_id_error(self, sid: int | None) -> str | None:
        """Why a request's stream id does not fit this connection, or None."""
        if self.stream_ids and not sid:
            return "this connection enabled stream ids: the request needs one"
        if not self.stream_ids and sid is not None:
            return "a stream id needs the enable_stream_id control first"
        return None

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
        problem = self._stream_id_error(msg.stream_id)
        if problem is not None:
            return _error(op, opaque, Status.DcpStreamIdInvalid, problem)
        existing = self._streams.get(stream_key(msg.vbucket, msg.stream_id or 0))
        answer = decide_stream_request(
            request,
            _view(vb) if vb is not None else None,
            stream_exists=existing is not None and existing.stream.alive,
        )
        if isinstance(answer, RollbackTo):
            self.rollbacks_answered += 1
            return dcp.StreamRequestRollback(opaque=opaque, rollback_seqno=answer.seqno).encode()
        if not isinstance(answer, Accept):
            return _error(op, opaque, answer.status, answer.message)
        assert vb is not None
        self._open_stream(vb, msg, answer, existing)
        return dcp.StreamRequestOk(opaque=opaque, failover_log=vb.failover.entries).encode()

    def _open_stream(
        self, vb: VBucket, msg: dcp.StreamRequest, accept: Accept, old: ActiveStream | None
    ) -> None:
        stream = Stream(
            vbucket=vb.id,
            opaque=msg.opaque,
            flags=msg.flags,
            start=accept.start,
            end=accept.end,
            vb_uuid=accept.vb_uuid,
        )
        active = ActiveStream(
            self,
            stream,
            was_active=vb.state == VBucketState.ACTIVE,
            takeover=bool(msg.flags & StreamRequestFlag.TakeOver),
            generation=vb.rollbacks,
            sid=msg.stream_id or 0,
        )
        if old is not None:
            active.pending = old.pending  # the old stream's StreamEnd must still go out, first
        self._streams[active.key] = active
        if active.sid:
            keys = self._by_vb.get(vb.id, ())
            self._by_vb[vb.id] = keys if active.key in keys else (*keys, active.key)
        self.wake(active.key)
        if accept.start >= accept.end:
            active.end(StreamEndReason.OK)

    def close_stream(self, vbucket: int, opaque: int, sid: int | None = None) -> bytes:
        problem = self._stream_id_error(sid)
        if problem is not None:
            return _error(Opcode.DcpCloseStream, opaque, Status.DcpStreamIdInvalid, problem)
        out = self._streams.get(stream_key(vbucket, sid or 0))
        if out is None or not out.stream.alive:
            return _error(
                Opcode.DcpCloseStream, opaque, Status.KeyEnoent, f"no stream for vb {vbucket}"
            )
        if self.stream_end_on_close:
            out.end(StreamEndReason.Closed)
        else:
            out.end(StreamEndReason.Closed, send=False)
            out.pending.clear()
            self._forget(out.key)
        return _ok(Opcode.DcpCloseStream, opaque)

    def get_failover_log(self, vbucket: int, opaque: int) -> bytes:
        vb = self.bucket.vbuckets.get(vbucket)
        if vb is None:
            return _error(
                Opcode.DcpGetFailoverLog, opaque, Status.NotMyVbucket, f"no vbucket {vbucket}"
            )
        return dcp.GetFailoverLogResponse(opaque=opaque, failover_log=vb.failover.entries).encode()

    def buffer_ack(self, nbytes: int) -> None:
        self.window.ack(nbytes)

    @property
    def buffer_size(self) -> int:
        """``connection_buffer_size`` (0: no flow control)."""
        return self.window.size

    @property
    def unacked_bytes(self) -> int:
        return self.window.unacked

    def noop_response(self) -> None:
        self._noop_sent_at = None

    def barrier(self, cookie: bytes, opaque: int) -> None:
        waiting: dict[int, int] = {}
        for key, out in self._streams.items():
            if not out.stream.alive:
                continue  # its StreamEnd is already queued: draining the queue is enough
            vb = self.bucket.vbuckets.get(out.vbucket)
            high = vb.high_seqno if vb is not None else 0
            target = min(high, out.stream.end)
            if out.emitted_seqno < target:
                waiting[key] = target
        self._barriers.append(_Barrier(cookie, opaque, waiting))

    def set_vbucket_state_ack(self, opaque: int) -> None:
        """The consumer answered a takeover stream's SetVbucketState."""
        out = next(
            (o for o in self._streams.values()
             if o.stream.opaque == opaque and o.stream.state is StreamState.TAKEOVER_WAIT),
            None,
        )  # fmt: skip
        if out is not None:  # else a stray or late answer: nothing waits for it
            out.takeover_acked()

    # -- events from the engine ---------------------------------------------------------------

    def vbucket_state_changed(self, vbucket: int) -> None:
        """End the streams of a vbucket that left the active state (or disappeared)."""
        for key in self._by_vb.get(vbucket, ()) if self.stream_ids else (vbucket,):
            out = self._streams.get(key)
            if out is not None and out.stream.alive:
                out.vbucket_state_changed()

    def disconnect(self) -> None:
        """The connection is gone: release every cursor and backfill, forget everything."""
        for out in self._streams.values():
            if out.stream.alive:
                out.end(StreamEndReason.Disconnected, send=False)
        self._streams.clear()
        self._by_vb.clear()
        self.ready.clear()
        self._barriers.clear()
        with contextlib.suppress(ValueError):
            self.bucket.seqno_listeners.remove(self._on_queued)
        self.queued_hook = None  # (the server's connection: no reference left to it)
        self.disconnected = True

    # -- the ready queue ---------------------------------------------------------------------

    def _on_queued(self, vbucket: int) -> None:
        # A bucket listener: any thread, under the vbucket's lock. Only take note.
        if self.stream_ids:
            keys = self._by_vb.get(vbucket, ())  # a tuple: replaced, never edited
            if not keys:
                return
            self.ready.note_all(keys)
        elif vbucket in self._streams:
            if self.consumer_name is not None and self.sync_writes:
                self._note_sync_write(vbucket)
            self.ready.notes.append(vbucket)  # ReadyQueue.note, inlined: once per write
        else:
            return
        hook = self.queued_hook
        if hook is not None:
            hook()

    def _note_sync_write(self, vbucket: int) -> None:
        # Noted before the notification is queued, and a pump clears the flag before it
        # drains: a prepare that pump did not take keeps the flag for the next decision (at
        # worst a flag outlives its prepare, and one pump comes at once).
        vb = self.bucket.vbuckets.get(vbucket)
        if vb is not None and vb.holds_prepares:
            self.sync_write_waiting = True

    def wake(self, vbid: int) -> None:
        """Put a stream in the ready queue (the producer's own thread)."""
        self.ready.wake(vbid)

    def notify(self, vbid: int) -> None:
        """A stream has something new to send (any thread: a backfill batch landed)."""
        self.ready.note(vbid)
        wakeup = self.wakeup
        if wakeup is not None:
            wakeup()

    # -- output ----------------------------------------------------------------------------

    @property
    def notified(self) -> int:
        """Notifications not yet taken by :meth:`next_messages`: about the items its streams'
        vbuckets queued since (the server's push cadence reads it)."""
        return len(self.ready.notes)

    @property
    def has_ready(self) -> bool:
        """Whether a stream may have something to send now: after :meth:`next_messages`, true
        when it stopped on its bounds or on the flow-control window (or a notification came
        from another thread meanwhile)."""
        return self.ready.has_work

    def next_messages(
        self, max_bytes: int = 1 << 20, max_visits: int = 1 << 62, until: float = math.inf
    ) -> list[bytes]:
        """Encoded DCP messages to send now (round-robin over the ready streams,
        flow-controlled), at most about ``max_bytes`` of them, in at most ``max_visits``
        visits to a stream, stopping once the producer's clock reads ``until`` or later
        (looked at every :data:`VISITS_PER_CLOCK_READ` visits)."""
        out: list[bytes] = []
        self.sync_write_waiting = False  # (before the drain: a later note is for a later pump)
        queue, window = self.ready, self.window
        queue.drain()
        self._echo_barriers(out)
        ready, streams, end_visit = queue.line, self._streams, queue.end_visit
        budget, polls, limit = max_bytes, 0, window.limit
        # The loop runs once per message (or run) sent: the counters it bumps are locals,
        # written back before anything else reads them (barrier echoes count bytes too).
        unacked, sent, items = window.unacked, 0, 0
        append, popleft = out.append, ready.popleft
        turn = 0  # messages the stream at the head of ``ready`` sent in this turn
        now, every = self.clock.time, VISITS_PER_CLOCK_READ
        while ready and budget > 0 and unacked < limit and polls < max_visits:
            if polls and polls % every == 0 and now() >= until:
                break
            vbid = popleft()
            entry = streams.get(vbid)
            if entry is None:
                queue.drop(vbid)  # forgotten while it waited in line
                continue
            polls += 1
            pending = entry.pending
            msg = pending.popleft() if pending else entry.take()
            if msg is not None:
                data, seqno, covers, count = msg
                size = len(data)
                if entry.sid or (
                    count > 1 and (size >= budget or unacked + size >= limit or self._barriers)
                ):
                    data, seqno, covers, count = self._fit(msg, entry, budget, limit - unacked)
                    size = len(data)
                append(data)
                budget -= size
                unacked += size
                sent += size
                stream = entry.stream
                if count:  # items: Stream.note_item, inlined
                    stream.last_sent_seqno = seqno
                    stream.items_sent += count
                    items += count
                stream.bytes_sent += size
                if covers > entry.emitted_seqno:
                    entry.emitted_seqno = covers
            if self._barriers:
                window.unacked = unacked
                self._barrier_progress(vbid, entry)
                self._echo_barriers(out)
                unacked = window.unacked
            turn = end_visit(vbid, msg is None or entry.idle(), entry.finished, turn)
        window.unacked = unacked
        self.bytes_sent += sent
        self.items_sent += items
        self.stream_polls += polls
        if out:
            self._last_send = self.clock.time()
        return out

    def _fit(
        self, msg: tuple[bytes, int, int, int], entry: ActiveStream, budget: int, room: int
    ) -> tuple[bytes, int, int, int]:
        """``msg`` as it may go out now: a run that may not go out whole cut to the part that
        may (the rest back in the stream's pending), a stream id's message tagged with it."""
        data, seqno, covers, count = msg
        size = len(data)
        if count > 1 and (size >= budget or size >= room or self._barriers):
            return split_run(msg, entry.pending, budget, room, bool(self._barriers))
        if entry.sid:  # every message of a stream with an id carries it
            return tag_stream_id(data, entry.sid), seqno, covers, count
        return msg

    def _echo_barriers(self, out: list[bytes]) -> None:
        while self._barriers and not self._barriers[0].waiting:
            b = self._barriers.popleft()
            data = dcp.DcpBarrier(cookie=b.cookie, opaque=b.opaque, echo=True).encode()
            self.window.sent(len(data))
            self.bytes_sent += len(data)
            out.append(data)

    def _barrier_progress(self, vbid: int, entry: ActiveStream | None) -> None:
        """Strike ``vbid`` off every barrier whose target it has now reached."""
        for barrier in self._barriers:
            target = barrier.waiting.get(vbid)
            if target is None:
                continue
            if entry is None or entry.finished or entry.emitted_seqno >= target:
                del barrier.waiting[vbid]
            elif not (entry.stream.alive or entry.pending):
                del barrier.waiting[vbid]  # it will send nothing more: nothing to wait for

    def _forget(self, vbid: int) -> None:
        # A queued key stays in the ready queue and is dropped when reached (no O(n) removal).
        gone = self._streams.pop(vbid, None)
        if gone is not None and gone.sid:
            rest = tuple(k for k in self._by_vb.get(gone.vbucket, ()) if k != vbid)
            self._by_vb[gone.vbucket] = rest
        if self._barriers:
            self._barrier_progress(vbid, None)

    # -- liveness --------------------------------------------------------------------------

    def noop_due(self, now: float) -> bytes | None:
        """A Noop to send when the connection was idle for an interval (and none is pending)."""
        if not self.noop_enabled or self._noop_sent_at is not None:
            return None
        if now - self._last_send < self.noop_interval:
            return None
        self._noop_sent_at = self._last_send = now
        return dcp.DcpNoop(opaque=next(self._noop_opaques)).encode()

    def liveness_due(self) -> float | None:
        """When :meth:`noop_due` or :meth:`is_dead` may next change its answer (clock time):
        the shell checks then, not on a coarse tick, so a Noop goes out one interval after
        the last message and an unanswered one closes the connection one interval after it
        was sent, whatever the timer's period."""
        if not self.noop_enabled:
            return None
        if self._noop_sent_at is not None:
            return self._noop_sent_at + self.noop_interval
        return self._last_send + self.noop_interval

    def is_dead(self, now: float) -> bool:
        """A Noop went unanswered for a whole interval: drop the connection."""
        return self._noop_sent_at is not None and now - self._noop_sent_at >= self.noop_interval

    # -- stats -----------------------------------------------------------------------------

    def items_remaining(self) -> int:
        """Items the open streams have still to send: each stream's distance from its last
        sent seqno to its vbucket's high seqno (or its end seqno, when lower)."""
        vbuckets = self.bucket.vbuckets
        remaining = 0
        for out in self._streams.values():
            s = out.stream
            vb = vbuckets.get(s.vbucket)
            if s.alive and vb is not None:
                remaining += max(0, min(s.end, vb.high_seqno) - s.last_sent_seqno)
        return remaining

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
            f"ready_streams:{n}": len(self.ready),
            f"stream_polls:{n}": self.stream_polls,
        }
        for _, out in sorted(self._streams.items()):
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
                "ready_queue_items": sum(max(q[3], 1) for q in out.pending),
                "ready_queue_bytes": sum(len(q[0]) for q in out.pending),
            }
            where = f"{s.vbucket}:sid{out.sid}" if out.sid else str(s.vbucket)
            stats.update({f"{k}:{where}:{n}": v for k, v in per.items()})
        return {k: str(v) for k, v in stats.items()}


# What a producer serves of the requests a consumer sends it, by message type; the rest
# answers NotSupported (handle).
_REQUESTS: dict[type, Callable[[DcpProducer, Any], bytes | None]] = {
    dcp.DcpControl: DcpProducer._control_request,
    dcp.StreamRequest: DcpProducer.stream_request,
    dcp.CloseStream: DcpProducer._close_stream_request,
    dcp.GetFailoverLog: DcpProducer._failover_log_request,
    dcp.BufferAck: DcpProducer._buffer_ack_request,
    dcp.DcpBarrier: DcpProducer._barrier_request,
    dcp.SeqnoAcknowledged: DcpProducer._seqno_ack_request,
}

_CONTROLS = {
    "connection_buffer_size": DcpProducer._set_buffer_size,
    "enable_noop": DcpProducer._set_enable_noop,
    "set_noop_interval": DcpProducer._set_noop_interval,
    "send_stream_end_on_client_close_stream": DcpProducer._set_stream_end_on_close,
    "enable_expiry_opcode": DcpProducer._set_expiry_opcode,
    "set_priority": DcpProducer._set_priority,
    "force_value_compression": DcpProducer._set_force_compression,
    "enable_stream_id": DcpProducer._set_stream_ids,
    "max_marker_version": DcpProducer._set_marker_version,
    "enable_sync_writes": DcpProducer._set_sync_writes,
    "consumer_name": DcpProducer._set_consumer_name,
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


def _view(vb: VBucket) -> VBucketView:
    with vb.lock:
        return VBucketView(
            state=vb.state,
            high_seqno=vb.high_seqno,
            persisted_seqno=vb.persisted_seqno,
            purge_seqno=vb.purge_seqno,
            failover_table=vb.failover,
        )
