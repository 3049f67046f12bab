"""The consumer side of one vbucket's DCP stream, as a sans-I/O state machine.

Theory of operation
-------------------
A :class:`ConsumerStream` turns what the producer sends for one vbucket into the events an
application sees (``dcpkv.client.events``), and says what to send next. It does no I/O: the
caller (the asyncio client) writes the :class:`StreamRequest` it returns, feeds it every
decoded message for this vbucket with :meth:`receive`, and tells it about lost connections
with :meth:`disconnected`. Progress lives in a :class:`VbucketProgress` (``offsets.py``), which
moves only as events are returned; each event carries the offset after it.

States and moves (``TRANSITIONS``; anything else raises :class:`ConsumerStateError`)::

    idle ──request──▶ requested ──ok──▶ streaming ──marker/item──▶ streaming
                        │   │               │
                        │   └──refused──▶ failed       end OK/Closed/FilterEmpty ──▶ ended
                        │                   │
                        └──rollback──▶ rolling_back ◀── local rollback (GetFailoverLog mode)
                                            │
                        ◀──────request──────┘
    streaming ──end (StateChanged, TooSlow, Disconnected, BackfillFailed, Rollback)──▶ resuming
    requested/streaming ──disconnect──▶ resuming ──request──▶ requested

``rolling_back`` means the producer (or the failover-log comparison) refused the offset: the
:class:`~dcpkv.client.events.Rollback` event tells the application where to roll back to, and
the caller requests again only once the application has done so. ``resuming`` means the stream
stopped but the offset is still good: request again, on the next connection if this one died.
A StreamEnd with reason Rollback lands there too; the producer then answers the new request
with a rollback.

The rollback point. The producer's answer carries only a seqno R. The consumer keeps its own
failover log pruned to R and re-requests from the newest consistent point p <= R (a complete
snapshot's end, see ``offsets.py``) with the snapshot ``{p, p}`` and the uuid of the newest
failover entry at or below p (0 if none). It does not stop at R itself: R can lie inside a
snapshot the consumer saw only part of (spec 001's example answers R=1 for a consumer that
never completed snapshot {1, 4}; resuming from 1 would lose the deduplicated change at 1).

Saving a round trip (optional). With the producer's failover log at hand (a GetFailoverLog
answer, or the log on the previous connection's OK), :meth:`check_failover_log` runs spec
002's client algorithm (``rollback_point.py``) before the request: when the logs already show
that the consumer is on a dead branch it rolls back at once instead of asking, being refused
and asking again. The producer still checks the request (it alone knows its purge seqno), so a
second rollback can follow; and an "impossible history" result is left to the producer.

A consumer repaired from spec 002's mutation log must use this mode (spec 002 has it fetch the
failover logs first too): the documents it re-fetched are newer than its offset, and if the
producer loses them in a later failover, a stream request from the offset is accepted without
a word. Only the comparison with ``seen_seqno`` (:meth:`note_seen`) notices.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from dcpkv.client import events
from dcpkv.client.offsets import VbucketOffset, VbucketProgress
from dcpkv.client.rollback_point import ImpossibleHistoryError, consumer_rollback_point
from dcpkv.core.errors import DcpkvError
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.fastinit import fast_builder
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import retryable
from dcpkv.protocol import dcp, snappy
from dcpkv.protocol.base import GenericResponse, Message, Request, Response
from dcpkv.protocol.constants import Opcode, StreamEndReason
from dcpkv.protocol.fast_dcp import MutationFields


class ConsumerStateError(DcpkvError):
    """An event that is illegal in the stream's current state (a caller or producer bug)."""


class ConsumerState(enum.Enum):
    IDLE = "idle"
    REQUESTED = "requested"
    STREAMING = "streaming"
    ROLLING_BACK = "rolling_back"
    RESUMING = "resuming"
    ENDED = "ended"
    FAILED = "failed"


class ConsumerEvent(enum.Enum):
    REQUEST_SENT = "request_sent"
    ACCEPTED = "accepted"
    ROLLBACK = "rollback"
    REFUSED_RETRY = "refused_retry"
    REFUSED = "refused"
    LOCAL_ROLLBACK = "local_rollback"
    MARKER = "marker"
    ITEM = "item"
    END_DONE = "end_done"
    END_RESUME = "end_resume"
    END_FAILED = "end_failed"
    DISCONNECT = "disconnect"


S, E = ConsumerState, ConsumerEvent
TRANSITIONS: dict[tuple[ConsumerState, ConsumerEvent], ConsumerState] = {
    (S.IDLE, E.REQUEST_SENT): S.REQUESTED,
    (S.IDLE, E.LOCAL_ROLLBACK): S.ROLLING_BACK,
    (S.IDLE, E.DISCONNECT): S.IDLE,
    (S.REQUESTED, E.ACCEPTED): S.STREAMING,
    (S.REQUESTED, E.ROLLBACK): S.ROLLING_BACK,
    (S.REQUESTED, E.REFUSED_RETRY): S.RESUMING,
    (S.REQUESTED, E.REFUSED): S.FAILED,
    (S.REQUESTED, E.DISCONNECT): S.RESUMING,
    (S.STREAMING, E.MARKER): S.STREAMING,
    (S.STREAMING, E.ITEM): S.STREAMING,
    (S.STREAMING, E.END_DONE): S.ENDED,
    (S.STREAMING, E.END_RESUME): S.RESUMING,
    (S.STREAMING, E.END_FAILED): S.FAILED,
    (S.STREAMING, E.DISCONNECT): S.RESUMING,
    (S.ROLLING_BACK, E.REQUEST_SENT): S.REQUESTED,
    (S.ROLLING_BACK, E.LOCAL_ROLLBACK): S.ROLLING_BACK,
    (S.ROLLING_BACK, E.DISCONNECT): S.ROLLING_BACK,  # the rollback is still owed
    (S.RESUMING, E.REQUEST_SENT): S.REQUESTED,
    (S.RESUMING, E.LOCAL_ROLLBACK): S.ROLLING_BACK,
    (S.RESUMING, E.DISCONNECT): S.RESUMING,
    (S.ENDED, E.DISCONNECT): S.ENDED,
    (S.FAILED, E.DISCONNECT): S.FAILED,
}
del S, E

# States from which the caller should (re)send a stream request.
NEEDS_REQUEST = frozenset({ConsumerState.IDLE, ConsumerState.RESUMING, ConsumerState.ROLLING_BACK})

END_DONE_REASONS = frozenset(
    {StreamEndReason.OK, StreamEndReason.Closed, StreamEndReason.FilterEmpty}
)
END_FAILED_REASONS = frozenset({StreamEndReason.LostPrivileges})
# Refusals worth asking again for (after a cluster-map reload for NotMyVbucket).

_ITEMS = (dcp.Mutation, dcp.Deletion, dcp.DeletionV2, dcp.Expiration)
_SNAPPY = snappy.SNAPPY
_INFLATE_LIMIT = 1 << 31  # a producer's value; the server checked sizes at the door
_ADVANCES = (dcp.SeqnoAdvanced, dcp.SystemEvent)
_SYNC_WRITES = (dcp.Prepare, dcp.Commit, dcp.Abort)  # ClientSettings.include_prepares only
# The item types exactly (no subclass exists): a set lookup instead of the isinstance chain.
_CHANGES = frozenset(_ITEMS)
_STREAMING = ConsumerState.STREAMING
# The change event from fields already checked (decoded from the wire): no __init__
_new_mutation = fast_builder(events.Mutation)


class ConsumerStream:
    """One vbucket's stream on the consumer side: see the module docstring."""

    __slots__ = ("end_seqno", "flags", "progress", "state", "vbucket")

    def __init__(
        self,
        vbucket: int,
        progress: VbucketProgress | None = None,
        *,
        end_seqno: int = U64_MAX,
        flags: int = 0,
    ) -> None:
        self.vbucket = vbucket
        self.progress = progress or VbucketProgress()
        self.end_seqno = end_seqno
        self.flags = flags
        self.state = ConsumerState.IDLE

    @property
    def offset(self) -> VbucketOffset:
        return self.progress.offset

    @property
    def needs_request(self) -> bool:
        return self.state in NEEDS_REQUEST

    def _move(self, event: ConsumerEvent) -> None:
        try:
            self.state = TRANSITIONS[self.state, event]
        except KeyError:
            raise ConsumerStateError(
                f"vbucket {self.vbucket}: {event.value} is illegal in state {self.state.value}"
            ) from None

    # -- what the caller does -----------------------------------------------------------

    def request(self, *, opaque: int = 0) -> dcp.StreamRequest:
        """The stream request to send now, from the current offset."""
        self._move(ConsumerEvent.REQUEST_SENT)
        start, uuid, snap_start, snap_end = self.offset.stream_request_fields()
        return dcp.StreamRequest(
            opaque=opaque,
            vbucket=self.vbucket,
            flags=self.flags,
            start_seqno=start,
            end_seqno=max(self.end_seqno, start),
            vbucket_uuid=uuid,
            snap_start_seqno=snap_start,
            snap_end_seqno=snap_end,
        )

    def check_failover_log(self, producer_log: Sequence[FailoverEntry]) -> events.Rollback | None:
        """Optional, before :meth:`request`: roll back now if the logs already demand it."""
        seen = self.progress.seen_seqno
        try:
            point = consumer_rollback_point(
                producer_log,
                self.progress.failover_log,
                snapshot_seqno=self.progress.snapshot_seqno,
                seen_seqno=seen,
            )
        except ImpossibleHistoryError:
            return None  # let the producer judge the request
        if point >= seen:
            return None
        self._move(ConsumerEvent.LOCAL_ROLLBACK)
        return self._roll_back(point)

    def note_seen(self, seqno: int) -> None:
        """A mutation-log repair re-fetched documents up to ``seqno``: the application holds
        data newer than its offset, which only :meth:`check_failover_log` can protect."""
        self.progress.note_seen(seqno)

    def roll_back(self, seqno: int) -> events.Rollback:
        """The application rolls back further than it was told, to (at most) ``seqno``: e.g.
        its mutation log no longer reaches the rollback point (:class:`RepairPlan` with
        ``full_resync``), so it starts over from 0. Legal wherever a request is due."""
        self._move(ConsumerEvent.LOCAL_ROLLBACK)
        return self._roll_back(seqno)

    def disconnected(self) -> None:
        """The connection dropped; a later :meth:`request` resumes from the offset."""
        self._move(ConsumerEvent.DISCONNECT)
        self.progress.discard_pending()

    def receive(self, message: Message) -> list[events.Event]:
        """Apply one message from the producer for this vbucket; the events it produces."""
        return [self.event_for(message)]

    def event_for(self, message: Message) -> events.Event:
        """:meth:`receive`'s one event (every message makes exactly one): the hot path."""
        kind = type(message)
        if kind in _CHANGES:  # first: all but a handful of a stream's messages are changes
            if message.vbucket != self.vbucket:  # type: ignore[attr-defined]
                self._wrong_vbucket(message)
            return self._item(message)  # type: ignore[arg-type]
        if isinstance(message, Response):
            return self._answer(message)
        if isinstance(message, Request) and message.vbucket != self.vbucket:
            self._wrong_vbucket(message)
        if isinstance(message, dcp.SnapshotMarker):
            return self._marker(message)
        if isinstance(message, _ITEMS):
            return self._item(message)
        if isinstance(message, _SYNC_WRITES):
            return self._sync_write(message)
        if isinstance(message, _ADVANCES):
            self._move(ConsumerEvent.ITEM)
            offset = self.progress.deliver(message.by_seqno)
            return events.SeqnoAdvanced(self.vbucket, message.by_seqno, offset)
        if isinstance(message, dcp.StreamEnd):
            return self._end(message.reason)
        raise ConsumerStateError(
            f"vbucket {self.vbucket}: a consumer stream does not handle {type(message).__name__}"
        )

    def change(self, fields: MutationFields) -> events.Mutation:
        """:meth:`event_for` of a plain mutation the receive path decoded to its fields
        (``protocol.fast_dcp``), not to a message: the hot path of a stream."""
        _, vb, key, value, seqno, rev, flags, expiry, cas, datatype, _, _, _, _ = fields
        if vb != self.vbucket:
            raise ConsumerStateError(f"vbucket {self.vbucket}: got a Mutation for vbucket {vb}")
        if self.state is not _STREAMING:  # the table's only ITEM move keeps STREAMING
            self._move(ConsumerEvent.ITEM)
        offset = self.progress.deliver(seqno)
        if datatype & _SNAPPY:  # the application sees the value, whatever the wire had
            value, datatype = snappy.inflate(value, _INFLATE_LIMIT), datatype & ~_SNAPPY
        return _new_mutation(vb, key, value, seqno, rev, flags, expiry, cas, datatype, offset)

    def _answer(self, message: Message) -> events.Event:
        """The answer to our stream request: accepted, rollback or refused."""
        if isinstance(message, dcp.StreamRequestOk):
            return self._accepted(message)
        if isinstance(message, dcp.StreamRequestRollback):
            self._move(ConsumerEvent.ROLLBACK)
            return self._roll_back(message.rollback_seqno)
        if isinstance(message, GenericResponse) and message.opcode == Opcode.DcpStreamRequest:
            return self._refused(message.status)
        raise ConsumerStateError(
            f"vbucket {self.vbucket}: a consumer stream does not handle {type(message).__name__}"
        )

    def _wrong_vbucket(self, message: Message) -> None:
        raise ConsumerStateError(
            f"vbucket {self.vbucket}: got {type(message).__name__} for vbucket {message.vbucket}"  # type: ignore[attr-defined]
        )

    # -- handlers -------------------------------------------------------------------------

    def _accepted(self, message: dcp.StreamRequestOk) -> events.StreamStart:
        self._move(ConsumerEvent.ACCEPTED)
        offset = self.progress.accepted(message.failover_log)
        return events.StreamStart(self.vbucket, tuple(message.failover_log), offset)

    def _roll_back(self, producer_seqno: int) -> events.Rollback:
        failed = self.offset
        offset = self.progress.roll_back(producer_seqno)
        return events.Rollback(self.vbucket, offset.seqno, producer_seqno, failed, offset)

    def _refused(self, status: int) -> events.StreamRefused:
        retry = retryable(status)
        self._move(ConsumerEvent.REFUSED_RETRY if retry else ConsumerEvent.REFUSED)
        return events.StreamRefused(self.vbucket, status, retry, self.offset)

    def _marker(self, message: dcp.SnapshotMarker) -> events.SnapshotStart:
        self._move(ConsumerEvent.MARKER)
        offset = self.progress.marker(message.start_seqno, message.end_seqno)
        return events.SnapshotStart(
            self.vbucket, message.start_seqno, message.end_seqno, message.flags, offset
        )

    def _item(
        self, m: dcp.Mutation | dcp.Deletion | dcp.DeletionV2 | dcp.Expiration
    ) -> events.Mutation | events.Deletion | events.Expiration:
        if self.state is not _STREAMING:  # the table's only ITEM move keeps STREAMING
            self._move(ConsumerEvent.ITEM)
        offset = self.progress.deliver(m.by_seqno)
        vb, key = self.vbucket, bytes(m.key)
        if isinstance(m, dcp.Mutation):
            value, datatype = bytes(m.value), m.datatype
            if datatype & _SNAPPY:  # the application sees the value, whatever the wire had
                value, datatype = snappy.inflate(value, _INFLATE_LIMIT), datatype & ~_SNAPPY
            return _new_mutation(
                vb, key, value, m.by_seqno, m.rev_seqno, m.flags, m.expiration,
                m.cas, datatype, offset,
            )  # fmt: skip
        if isinstance(m, dcp.Expiration):
            return events.Expiration(vb, key, m.by_seqno, m.rev_seqno, m.cas, offset, m.delete_time)
        delete_time = m.delete_time if isinstance(m, dcp.DeletionV2) else 0
        return events.Deletion(vb, key, m.by_seqno, m.rev_seqno, m.cas, offset, delete_time)

    def _sync_write(
        self, m: dcp.Prepare | dcp.Commit | dcp.Abort
    ) -> events.Prepare | events.Commit | events.Abort:
        """A prepare, commit or abort (the connection enabled SyncWrites)."""
        if self.state is not _STREAMING:
            self._move(ConsumerEvent.ITEM)
        vb, key = self.vbucket, bytes(m.key)
        if isinstance(m, dcp.Commit):
            offset = self.progress.deliver(m.commit_seqno)
            return events.Commit(vb, key, m.prepared_seqno, m.commit_seqno, m.cas, offset)
        if isinstance(m, dcp.Abort):
            offset = self.progress.deliver(m.abort_seqno)
            return events.Abort(vb, key, m.prepared_seqno, m.abort_seqno, offset)
        offset = self.progress.deliver(m.by_seqno)
        value, datatype = bytes(m.value), m.datatype
        if datatype & _SNAPPY:
            value, datatype = snappy.inflate(value, _INFLATE_LIMIT), datatype & ~_SNAPPY
        return events.Prepare(
            vb, key, value, m.by_seqno, m.rev_seqno, m.flags, m.expiration, m.cas, datatype,
            bool(m.deleted), m.durability_level, offset,
        )  # fmt: skip

    def _end(self, reason: int) -> events.StreamEnd:
        if reason in END_DONE_REASONS:
            move = ConsumerEvent.END_DONE
        elif reason in END_FAILED_REASONS:
            move = ConsumerEvent.END_FAILED
        else:  # StateChanged, Disconnected, TooSlow, BackfillFailed, Rollback, unknown
            move = ConsumerEvent.END_RESUME
        self._move(move)
        self.progress.discard_pending()
        resume = move is ConsumerEvent.END_RESUME
        return events.StreamEnd(self.vbucket, reason, resume, self.offset)
