"""The replica side of one DCP connection: a node streams its replica vbuckets from one source.

Theory of operation
-------------------
A :class:`DcpConsumer` (kv_engine's name) is sans-I/O: the shell (:mod:`dcpkv.server.replication`)
dials the source node, writes what :meth:`DcpConsumer.opening` returns, then hands every decoded
message it reads to :meth:`DcpConsumer.handle` and writes what comes back. Everything about a
vbucket's stream is its :class:`~dcpkv.dcp.passive_stream.PassiveStream`'s business; the
consumer keeps the connection: the Open and its controls, opaques, flow control, Noops.

One connection per source node and bucket (spec 002, "How UPR stats are tracked"): it is opened
as ``Replica:<this node>``, so the source's ``stat dcp`` reads
``%StatName%:%PartitionID%:Replica:%NodeId%`` for each stream.

Opaques: a stream's opaque is ``OPAQUE_BASE + vbucket``, so the answer to its request and every
message of the stream find it; the connection's own requests (Open, Controls, CloseStream) use
opaques below that and their answers need nothing.

SyncWrites: given a ``consumer_name`` (the node's name in the active's replication topology)
the consumer enables them on its connection and names itself, so prepares, commits and aborts
arrive (:mod:`dcpkv.dcp.passive_stream` applies them) and the replica acknowledges its high
prepared seqno (DcpSeqnoAcknowledged): at a snapshot's end, with the answers :meth:`handle`
returns, or once persisted, from :meth:`seqno_acks` when the shell is told one is due.

Flow control: the consumer asks for a ``connection_buffer_size`` window and acknowledges what it
has applied once half a window is used, so a slow replica slows its producer instead of
growing its memory. Noops: the producer sends one when idle; the consumer answers it.

What the shell must do besides writing answers: :meth:`DcpConsumer.handle` returns
:class:`RollbackOrder` actions (the vbucket must be rolled back on the disk thread, then
:meth:`rolled_back`), and :meth:`retry_due` lists streams to ask again after a pause (refused,
ended). :meth:`set_vbuckets` follows the map: new vbuckets are requested, dropped ones closed.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.passive_stream import PassiveState, PassiveStream
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.item import MissingPrepare
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import Opcode, OpenFlag

OPAQUE_BASE = 0x1_0000  # stream opaques: OPAQUE_BASE + vbucket (vbuckets are < 65536)
BUFFER_SIZE = 10 * 1024 * 1024  # the flow-control window asked of the producer
NOOP_INTERVAL_S = 10
RETRY_S = 0.25  # a refused or ended stream asks again after this pause (the map may lag)
_STREAMED = (VBucketState.REPLICA, VBucketState.PENDING)  # the states a consumer feeds


@dataclass(frozen=True, slots=True)
class RollbackOrder:
    """The producer told vbucket ``vbucket`` to roll back to (at most) ``seqno``."""

    vbucket: int
    seqno: int


class DcpConsumer:
    def __init__(
        self,
        bucket: Bucket,
        name: str,
        vbuckets: Iterable[int] = (),
        *,
        consumer_name: str | None = None,
    ) -> None:
        self.bucket = bucket
        self.name = name
        # SyncWrites: this node's name in the active's topology; None: committed items only
        self.consumer_name = consumer_name
        self.streams: dict[int, PassiveStream] = {}
        self.unacked_bytes = 0
        self.items_received = 0
        self.takeovers = 0  # vbuckets this connection took over (made active)
        self._opaque = 0
        self.set_vbuckets(vbuckets)

    # -- what to send ----------------------------------------------------------------------

    def opening(self, now: float) -> list[bytes]:
        """Open (asking the source for a producer), controls, then every stream request."""
        # IncludeXattrs: a replica keeps a document's xattrs (and a tombstone's system ones)
        flags = OpenFlag.Producer | OpenFlag.IncludeXattrs
        out = [dcp.DcpOpen(opaque=self._next(), name=self.name, flags=flags).encode()]
        controls = [
            ("connection_buffer_size", str(BUFFER_SIZE)),
            ("enable_noop", "true"),
            ("set_noop_interval", str(NOOP_INTERVAL_S)),
        ]
        if self.consumer_name is not None:
            controls += [("enable_sync_writes", "true"), ("consumer_name", self.consumer_name)]
        for key, value in controls:
            out.append(dcp.DcpControl(opaque=self._next(), key=key, value=value).encode())
        for stream in self.streams.values():
            if stream.state is not PassiveState.ROLLING_BACK:
                stream.state = PassiveState.PENDING  # a new connection: every stream asks again
        return out + self.requests(now)

    def requests(self, now: float, held: Container[int] = ()) -> list[bytes]:
        """Stream requests for every stream that should ask now (a vbucket that became
        active or dead meanwhile waits for the shell's next ``set_vbuckets`` to drop it).
        ``held``: vbuckets a rollback is under way for (ordered on another connection, say,
        one the shell replaced): a request now would ask from where the vbucket stands before
        the rollback, and what it streamed would land on the rolled-back vbucket with a gap."""
        return [
            s.request().encode()
            for s in self.streams.values()
            if s.state is PassiveState.PENDING
            and s.retry_at <= now
            and s.vbucket.state in _STREAMED
            and s.vbid not in held
        ]

    def set_vbuckets(self, vbuckets: Iterable[int]) -> list[bytes]:
        """Follow the map: streams for new vbuckets, CloseStream for the ones no longer ours."""
        wanted = set(vbuckets)
        out = []
        # a replica turned pending must ask again with TakeOver (and a pending turned back
        # to replica without it): close its stream, a new one asks from where it stands
        redo = {vb for vb, s in self.streams.items() if vb in wanted and s.takeover_changed()}
        for vb in sorted(set(self.streams) - wanted | redo):
            stream = self.streams.pop(vb)
            if stream.state in (PassiveState.AWAITING, PassiveState.READING):
                out.append(dcp.CloseStream(opaque=self._next(), vbucket=vb).encode())
            stream.close()
        for vb in sorted(wanted - set(self.streams)):
            vbucket = self.bucket.vbuckets.get(vb)
            if vbucket is not None:
                self.streams[vb] = PassiveStream(vbucket, OPAQUE_BASE + vb)
        return out

    def rolled_back(self, vbucket: int) -> None:
        stream = self.streams.get(vbucket)
        if stream is not None and stream.state is PassiveState.ROLLING_BACK:
            stream.rolled_back()

    # -- what arrives ----------------------------------------------------------------------

    def handle(
        self, msg: Message, size: int, now: float
    ) -> tuple[list[bytes], list[RollbackOrder]]:
        """Apply one message from the producer; (answers to write, rollbacks to perform)."""
        if isinstance(msg, dcp.DcpNoop):
            return [GenericResponse(opcode=Opcode.DcpNoop, opaque=msg.opaque).encode()], []
        if isinstance(msg, dcp.StreamRequestOk | dcp.StreamRequestRollback | GenericResponse):
            rollbacks = self._answer(msg, now)
            return self._due_ack(msg), rollbacks
        stream = self.streams.get(msg.opaque - OPAQUE_BASE)
        if isinstance(msg, dcp.SetVbucketState):
            return [self._takeover_state(stream, msg), *self._ack(size)], []
        if stream is not None and stream.state is PassiveState.READING:
            try:
                self._apply(stream, msg, now)
            except MissingPrepare as exc:
                return self._lost_prepare(stream, exc.prepared_seqno, size)
            ack = stream.seqno_ack()
            if ack is not None:
                return [ack.encode(), *self._ack(size)], []
        return self._ack(size), []

    def _lost_prepare(
        self, stream: PassiveStream, prepared_seqno: int, size: int
    ) -> tuple[list[bytes], list[RollbackOrder]]:
        """A commit or abort of a prepare the replica does not hold (a local rollback landed
        between the two): the stream is closed, the vbucket rolled back below the prepare, and
        asked again from there, so the producer sends the prepare (or its committed version)
        anew. Ending the whole connection instead would fail it again at every retry."""
        seqno = max(prepared_seqno - 1, 0)
        stream.told_to_roll_back(seqno)
        close = dcp.CloseStream(opaque=self._next(), vbucket=stream.vbid).encode()
        return [close, *self._ack(size)], [RollbackOrder(stream.vbid, seqno)]

    def _due_ack(self, msg: Message) -> list[bytes]:
        """The acknowledgement a stream just accepted owes (its vbucket's held prepares)."""
        stream = self.streams.get(msg.opaque - OPAQUE_BASE)
        if self.consumer_name is None or stream is None:
            return []
        ack = stream.seqno_ack()
        return [] if ack is None else [ack.encode()]

    def seqno_acks(self, vbuckets: Iterable[int]) -> list[bytes]:
        """The DcpSeqnoAcknowledged due now for ``vbuckets`` (a replica persisted a
        PersistToMajority prepare: the shell asks for the vbuckets the bucket's
        ``seqno_ack_listeners`` named; asking every stream cost O(streams) a snapshot)."""
        streams = (self.streams.get(vb) for vb in vbuckets)
        acks = (s.seqno_ack() for s in streams if s is not None)
        return [a.encode() for a in acks if a is not None]

    def _takeover_state(self, stream: PassiveStream | None, msg: dcp.SetVbucketState) -> bytes:
        """Answer one step of a takeover handshake (module docstring of passive_stream)."""
        status = Status.Success
        if stream is None or stream.state is not PassiveState.READING:
            status = Status.NotMyVbucket
        elif stream.vbucket.state != VBucketState.PENDING:
            status = Status.NotMyVbucket  # moved away meanwhile: never made active by us
        elif msg.state == VBucketState.ACTIVE:
            self.bucket.set_vbucket_state(stream.vbid, VBucketState.ACTIVE, transfer=True)
            self.takeovers += 1
        elif msg.state != VBucketState.PENDING:
            status = Status.Einval
        answer = GenericResponse(opcode=Opcode.DcpSetVbucketState, opaque=msg.opaque, status=status)
        return answer.encode()

    def _answer(self, msg: Message, now: float) -> list[RollbackOrder]:
        stream = self.streams.get(msg.opaque - OPAQUE_BASE)
        if stream is None or stream.state is not PassiveState.AWAITING:
            return []  # an Open/Control/CloseStream answer, or one for a forgotten stream
        if isinstance(msg, dcp.StreamRequestOk):
            stream.accepted(msg.failover_log)
            stream.vbucket.acknowledge_held()
        elif isinstance(msg, dcp.StreamRequestRollback):
            stream.told_to_roll_back(msg.rollback_seqno)
            return [RollbackOrder(stream.vbid, msg.rollback_seqno)]
        elif getattr(msg, "status", Status.Success) != Status.Success:
            stream.refused(now + RETRY_S)
        return []

    def _apply(self, stream: PassiveStream, msg: Message, now: float) -> None:
        if isinstance(msg, dcp.StreamEnd):
            stream.ended(now + RETRY_S)
        elif stream.vbucket.state not in _STREAMED:
            # Set dead (a move) or active under the open stream: what was in flight for it is
            # dropped, and the shell's next set_vbuckets closes the stream. Applying it would
            # fail on the vbucket and end the whole connection.
            return
        elif isinstance(msg, dcp.SnapshotMarker):
            stream.marker(msg)
        elif isinstance(msg, dcp.Mutation):
            stream.mutation(msg)
            self.items_received += 1
        elif isinstance(msg, dcp.Deletion | dcp.DeletionV2 | dcp.Expiration):
            stream.deletion(msg)
            self.items_received += 1
        elif isinstance(msg, dcp.Prepare | dcp.Commit | dcp.Abort):
            self._apply_sync_write(stream, msg)

    def _apply_sync_write(
        self, stream: PassiveStream, msg: dcp.Prepare | dcp.Commit | dcp.Abort
    ) -> None:
        if isinstance(msg, dcp.Prepare):
            stream.prepare(msg)
        elif isinstance(msg, dcp.Commit):
            stream.commit(msg)
        else:
            stream.abort(msg)
        self.items_received += 1

    def _ack(self, size: int) -> list[bytes]:
        self.unacked_bytes += size
        if self.unacked_bytes < BUFFER_SIZE // 2:
            return []
        acked, self.unacked_bytes = self.unacked_bytes, 0
        return [dcp.BufferAck(opaque=self._next(), bytes_acked=acked).encode()]

    def _next(self) -> int:
        self._opaque = (self._opaque + 1) % OPAQUE_BASE
        return self._opaque

    # -- stats -----------------------------------------------------------------------------

    def stats(self) -> dict[str, str]:
        n = self.name
        out = {
            f"items_received:{n}": str(self.items_received),
            f"takeovers:{n}": str(self.takeovers),
        }
        for vb, s in sorted(self.streams.items()):
            out[f"state:{vb}:{n}"] = s.state.value
            out[f"items_received:{vb}:{n}"] = str(s.items_received)
            out[f"rollbacks:{vb}:{n}"] = str(s.rollbacks)
        return out
