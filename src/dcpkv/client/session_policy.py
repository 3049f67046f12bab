"""The DCP consumer's session policy: which stream a message is for, when to ask again, how
long to wait before reconnecting. Plain objects, no sockets and no clock of their own.

Theory of operation
-------------------
:class:`~dcpkv.client.consumer.Consumer` runs one :meth:`~dcpkv.client.consumer.Consumer.stream`
call as a series of *sessions* (one DCP connection each). What must survive a lost connection,
and every decision that is not I/O, lives here, so it is tested without a server:

* :class:`StreamRun` holds the vbuckets' :class:`~dcpkv.client.consumer_stream.ConsumerStream`
  machines across sessions, plus what belongs to one session only (stream-request opaques,
  high seqnos read for ``clamp_ends``), which :meth:`StreamRun.session_ended` drops. It routes
  a decoded message to its stream (on a cluster: only from the node the stream was last
  requested on, so a late message from a vbucket's old node never reaches its stream on the
  new one), says which streams need a (re-)request, and keeps the
  per-vbucket retry schedule after a refused request: a refusal that may succeed later
  (NotMyVbucket, Etmpfail...) is asked again 0.1 s × 2^n after the n-th refusal in a row,
  capped; a StreamStart forgets the count.
* A session spans the cluster: one DCP connection per node, each vbucket requested from its
  active. :meth:`StreamRun.node_lost` is what a lost node means: the streams requested on it
  resume later (on whatever node the refreshed map names), the others go on untouched.
* :class:`Backoff` is the delay between sessions: exponential from :data:`FIRST_BACKOFF`,
  capped, with jitter (half to all of the step) so a fleet of consumers does not reconnect in
  lockstep after an outage. A session that opened resets it.

The caller passes the time (``now``, seconds of its event loop's monotonic clock).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator

from dcpkv.client.consumer_stream import ConsumerState, ConsumerStream
from dcpkv.protocol import dcp
from dcpkv.protocol.base import Message, Response
from dcpkv.protocol.constants import Opcode

FIRST_BACKOFF = 0.05  # seconds before the second session; doubles per failed one
REFUSAL_RETRY_UNIT = 0.1  # seconds; times 2^n after the n-th retryable refusal in a row
STREAM_MESSAGES = (
    dcp.SnapshotMarker, dcp.Mutation, dcp.Deletion, dcp.DeletionV2, dcp.Expiration,
    dcp.SeqnoAdvanced, dcp.SystemEvent, dcp.StreamEnd, dcp.Prepare, dcp.Commit, dcp.Abort,
)  # fmt: skip
_STREAM_TYPES = frozenset(STREAM_MESSAGES)  # exact types; marker versions take the isinstance
DONE = frozenset({ConsumerState.ENDED, ConsumerState.FAILED})


class Backoff:
    """The delay before each new session: see the module docstring."""

    __slots__ = ("attempt", "cap", "first", "rng")

    def __init__(
        self, cap: float, *, first: float = FIRST_BACKOFF, rng: random.Random | None = None
    ) -> None:
        self.cap = cap
        self.first = first
        self.rng = rng if rng is not None else random.Random()
        self.attempt = 0

    def opened(self) -> None:
        """A session opened: the next failure starts from the first step again."""
        self.attempt = 0

    def next_delay(self) -> float:
        step = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return step * (0.5 + 0.5 * self.rng.random())


def refusal_delay(refusals: int, cap: float) -> float:
    """Seconds before asking again after the ``refusals``-th refusal in a row."""
    return min(cap, REFUSAL_RETRY_UNIT * 2**refusals)


class StreamRun:
    """The streams of one ``Consumer.stream`` call, across sessions."""

    __slots__ = (
        "clamp", "highs", "opaques", "owed", "refusals", "retry_at", "streams", "where",
    )  # fmt: skip

    def __init__(self, streams: dict[int, ConsumerStream], *, clamp: bool = False) -> None:
        self.streams = streams
        self.clamp = clamp  # clamp_ends: see the consumer's module docstring
        self.highs: dict[int, int] = {}  # high seqnos read this session, used once each
        self.opaques: dict[int, int] = {}  # stream-request opaque -> vbucket, this session
        self.retry_at: dict[int, float] = {}  # vbucket -> when to ask again after a refusal
        self.refusals: dict[int, int] = {}
        self.owed: set[int] = set()  # vbuckets whose mutation-log repair is not committed
        self.where: dict[int, Hashable] = {}  # vbucket -> node last requested on, this session

    @property
    def finished(self) -> bool:
        return all(cs.state in DONE for cs in self.streams.values())

    def stream_for(self, msg: Message, node: Hashable = None) -> ConsumerStream | None:
        """The stream ``msg`` (received from ``node``) is for, if any."""
        if type(msg) in _STREAM_TYPES:  # the hot path: one set lookup for a change
            vb = msg.vbucket  # type: ignore[attr-defined]
        elif isinstance(msg, Response):
            if msg.opcode != Opcode.DcpStreamRequest:
                return None
            vb = self.opaques.pop(msg.opaque, None)
        elif isinstance(msg, STREAM_MESSAGES):
            vb = msg.vbucket
        else:
            return None  # barriers, takeover state changes: nothing for a plain consumer
        if vb is None:
            return None
        return self.route(vb, node)

    def route(self, vb: int, node: Hashable = None) -> ConsumerStream | None:
        """The stream of vbucket ``vb`` if it was last requested on ``node`` (a change from the
        receive path's runs, which need no look at the message type)."""
        where = self.where.get(vb)
        if where is not node and where != node:
            return None
        return self.streams.get(vb)

    # -- requests ---------------------------------------------------------------------------

    def first_requests(self) -> Iterator[ConsumerStream]:
        """The streams to request when a session opens (checked as the caller goes)."""
        return (cs for cs in self.streams.values() if cs.needs_request)

    def reads_highs_at_once(self) -> bool:
        """``clamp_ends`` with several requests due: one Stat for all instead of one each."""
        return self.clamp and sum(cs.needs_request for cs in self.streams.values()) > 1

    def wants_request(self, cs: ConsumerStream) -> bool:
        """Ask again now: the stream needs it and is not waiting out a refusal."""
        return cs.needs_request and cs.vbucket not in self.retry_at

    def requested(self, vbucket: int, opaque: int, node: Hashable = None) -> None:
        """A stream request went out (``opaque``) to ``node``."""
        self.opaques[opaque] = vbucket
        self.where[vbucket] = node

    def node_lost(self, node: Hashable, now: float, cap: float) -> list[int]:
        """``node``'s connection is gone: its streams resume after a pause (module
        docstring); the vbuckets they were for."""
        lost = sorted(vb for vb, n in self.where.items() if n == node)
        for vb in lost:
            del self.where[vb]
            cs = self.streams[vb]
            cs.disconnected()
            if cs.needs_request:
                self.refused(vb, now, cap)
        return lost

    def refused(self, vbucket: int, now: float, cap: float) -> None:
        """A retryable refusal: schedule the next request (see the module docstring)."""
        n = self.refusals[vbucket] = self.refusals.get(vbucket, 0) + 1
        self.retry_at[vbucket] = now + refusal_delay(n, cap)

    def started(self, vbucket: int) -> None:
        self.refusals.pop(vbucket, None)

    def retry_timeout(self, now: float) -> float | None:
        return max(0.0, min(self.retry_at.values()) - now) if self.retry_at else None

    def due_retries(self, now: float) -> list[ConsumerStream]:
        due = [vb for vb, at in self.retry_at.items() if at <= now]
        for vb in due:
            del self.retry_at[vb]
        return [self.streams[vb] for vb in due]

    # -- sessions ---------------------------------------------------------------------------

    def session_ended(self) -> None:
        """The connection is gone: every stream must be asked again on the next one."""
        for cs in self.streams.values():
            cs.disconnected()
        self.opaques.clear()
        self.highs.clear()
        self.where.clear()
