"""The life of one producer stream (one vbucket on one DCP connection).

Theory of operation
-------------------
A stream is born when a stream request is accepted and dies with a StreamEnd. In between it
sends snapshots, either read from disk (*backfilling*: one disk snapshot covering everything
from the requested start up to what memory holds) or from the vbucket's write queue
(*in-memory*: a cursor on the checkpoints). A slow consumer's cursor may be dropped to bound
the server's memory; the stream then goes back to disk for what it missed. A takeover stream
(rebalance) ends by handing the vbucket over: it sends SetVbucketState(pending), waits for the
consumer's answer, sends SetVbucketState(active), waits again, and is done.

The shape is kv_engine's active stream. Every legal move is in ``TRANSITIONS``; anything else
raises :class:`StreamStateError` (a bug in the caller, never a consumer's fault):

    =============== ================ ================
    state           event            next state
    =============== ================ ================
    pending         backfill         backfilling
    pending         memory           in_memory
    backfilling     backfill_done    in_memory
    in_memory       cursor_dropped   backfilling
    in_memory       takeover         takeover_send
    takeover_send   state_sent       takeover_wait
    takeover_wait   acked            takeover_send
    (any but dead)  end              dead
    =============== ================ ================

This module keeps the state and the stream's accounting (what was last sent, snapshot
bounds, items and bytes) as a plain object; the producer decides when events happen.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dcpkv.core.errors import DcpkvError


class StreamState(enum.Enum):
    PENDING = "pending"
    BACKFILLING = "backfilling"
    IN_MEMORY = "in_memory"
    TAKEOVER_SEND = "takeover_send"
    TAKEOVER_WAIT = "takeover_wait"
    DEAD = "dead"


class StreamEvent(enum.Enum):
    BACKFILL = "backfill"
    MEMORY = "memory"
    BACKFILL_DONE = "backfill_done"
    CURSOR_DROPPED = "cursor_dropped"
    TAKEOVER = "takeover"
    STATE_SENT = "state_sent"
    ACKED = "acked"
    END = "end"


S, E = StreamState, StreamEvent
TRANSITIONS: dict[tuple[StreamState, StreamEvent], StreamState] = {
    (S.PENDING, E.BACKFILL): S.BACKFILLING,
    (S.PENDING, E.MEMORY): S.IN_MEMORY,
    (S.BACKFILLING, E.BACKFILL_DONE): S.IN_MEMORY,
    (S.IN_MEMORY, E.CURSOR_DROPPED): S.BACKFILLING,
    (S.IN_MEMORY, E.TAKEOVER): S.TAKEOVER_SEND,
    (S.TAKEOVER_SEND, E.STATE_SENT): S.TAKEOVER_WAIT,
    (S.TAKEOVER_WAIT, E.ACKED): S.TAKEOVER_SEND,
    **{(state, E.END): S.DEAD for state in S if state is not S.DEAD},
}


class StreamStateError(DcpkvError, RuntimeError):
    """An event that is not legal in the stream's current state."""


@dataclass(slots=True)
class Stream:
    """One vbucket's stream on a producer connection."""

    vbucket: int
    opaque: int
    flags: int
    start: int
    end: int
    vb_uuid: int
    state: StreamState = StreamState.PENDING
    # What the consumer has been sent: the last seqno and the snapshot it belongs to.
    last_sent_seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    items_sent: int = 0
    bytes_sent: int = 0
    snapshots_sent: int = 0
    end_reason: int | None = None
    history: list[StreamState] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.last_sent_seqno = self.start

    def handle(self, event: StreamEvent) -> StreamState:
        next_state = TRANSITIONS.get((self.state, event))
        if next_state is None:
            raise StreamStateError(
                f"vb {self.vbucket} stream: event {event.value} is illegal in state "
                f"{self.state.value}"
            )
        self.history.append(self.state)
        self.state = next_state
        return next_state

    def finish(self, reason: int) -> None:
        """Move to dead, remembering the StreamEnd reason."""
        self.handle(StreamEvent.END)
        self.end_reason = reason

    @property
    def alive(self) -> bool:
        return self.state is not StreamState.DEAD

    @property
    def first_snapshot(self) -> bool:
        return self.snapshots_sent == 0

    @property
    def reached_end(self) -> bool:
        return self.last_sent_seqno >= self.end

    def marker_start(self, first_seqno: int) -> int:
        """The start seqno of the next snapshot marker: the requested start for the first
        marker of a stream (spec 004, implementation notes), else the snapshot's own start."""
        return self.start if self.snapshots_sent == 0 else first_seqno

    def note_snapshot(self, start: int, end: int) -> None:
        self.snap_start, self.snap_end = start, end
        self.snapshots_sent += 1

    def note_item(self, seqno: int, nbytes: int) -> None:
        self.last_sent_seqno = seqno
        self.items_sent += 1
        self.bytes_sent += nbytes
