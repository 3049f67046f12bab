"""The replica side of one vbucket's DCP stream: what arrives is applied to a replica vbucket.

Theory of operation
-------------------
A :class:`PassiveStream` (kv_engine's name) belongs to a :class:`~dcpkv.dcp.consumer.DcpConsumer`
and owns nothing but the decisions: it never touches a socket, and the only I/O it causes is
what the engine does when it applies an item (in memory; the flusher persists later).

Spec 002, "How KV mutations flow into Replicas": the replica keeps the active's seqnos, and
persists in seqno order; the vbucket's checkpoints hold each snapshot as the marker announced
it, so the flusher writes whole snapshots (or records where inside one it stopped).

=================  =======================================  ==============================
state              event                                    then
=================  =======================================  ==============================
PENDING            ``request()``: StreamRequest from the     AWAITING
                   vbucket's own position (high seqno, its
                   current snapshot, the newest uuid that
                   wrote at or below the high seqno)
AWAITING           StreamRequest OK + the active's log       READING (the log adopted:
                                                             a replica's history *is* the
                                                             active's)
AWAITING           Rollback to R                             ROLLING_BACK (the shell rolls
                                                             the vbucket back on the disk
                                                             thread, then ``rolled_back()``)
ROLLING_BACK       ``rolled_back()``                         PENDING
AWAITING           any other refusal (NotMyVbucket...)       PENDING, after a pause (the
                                                             map may not be there yet)
READING            marker / mutation / deletion /            READING (applied in order)
                   expiration
READING            SetVbucketState(pending), takeover        READING (answered; the vbucket
                   (``takeover_state``)                      is pending already)
READING            SetVbucketState(active), takeover         READING (the vbucket made
                                                             active, its log kept; StreamEnd
                                                             follows)
READING            a commit or abort of a prepare the        ROLLING_BACK to below the
                   vbucket does not hold (a local rollback   prepare (the consumer closes
                   landed between the two)                   the stream; asked again from
                                                             there, the prepare comes anew)
READING            StreamEnd                                 PENDING (asked again after a
                                                             pause: the active moved or
                                                             restarted) or ENDED (closed)
any                ``close()``                               ENDED
=================  =======================================  ==============================

Takeover (spec 002, "How ns_server performs a partition rebalance"): a vbucket the node holds
as *pending* is asked for with the TakeOver flag, so its producer hands the vbucket over once
this copy caught up: it sends SetVbucketState(pending), sets its own copy dead on our answer,
drains what landed meanwhile, then sends SetVbucketState(active). The consumer answers each
only when its vbucket is pending (anything else is refused, so a copy the manager moved away
meanwhile is never made active), and on the second makes the vbucket active as a *transfer*:
the failover log it adopted from the old active stays as it is, so a consumer that followed the
old active resumes on the new one without a rollback.

SyncWrites (PROTOCOL.md): on a connection that enabled them, a DcpPrepare is kept beside the
key's committed value (:meth:`VBucket.replica_prepare`, with its seqno, persisted, tracked by the
vbucket's passive durability monitor), a DcpCommit makes it the committed value and a DcpAbort
drops it. A snapshot ends when its last seqno arrives, or when the next marker does (a disk
snapshot's end may be an item the disk no longer has); the vbucket is told, and the monitor
decides whether the replica's high prepared seqno moved (for PersistToMajority prepares only
once persisted, which the flusher reports): :meth:`PassiveStream.seqno_ack` then gives the
DcpSeqnoAcknowledged to send to the active.

Asking again always starts from what the vbucket holds *now*, with its snapshot range, so the
producer's rollback rules (spec 000) decide whether anything must be undone: a replica never
guesses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.seqno import U64_MAX
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.item import Item, PrepareItem
from dcpkv.engine.vbucket import VBucket
from dcpkv.protocol import dcp
from dcpkv.protocol.constants import SnapshotFlag, StreamRequestFlag


class PassiveState(enum.Enum):
    PENDING = "pending"
    AWAITING = "awaiting"
    ROLLING_BACK = "rolling_back"
    READING = "reading"
    ENDED = "ended"


@dataclass
class PassiveStream:
    vbucket: VBucket
    opaque: int
    state: PassiveState = PassiveState.PENDING
    items_received: int = 0
    rollbacks: int = 0
    rollback_to: int | None = None  # set while ROLLING_BACK
    retry_at: float = 0.0  # a PENDING stream asks again from this time on (after a refusal)
    takeover: bool = False  # asked with the TakeOver flag (the vbucket was pending)
    snapshot_end: int = 0  # the end of the snapshot being received (its last marker's)
    snapshot_done: bool = True  # that snapshot arrived whole (told to the vbucket)

    @property
    def vbid(self) -> int:
        return self.vbucket.id

    def request(self) -> dcp.StreamRequest:
        """The stream request to send now (PENDING -> AWAITING)."""
        vb = self.vbucket
        with vb.lock:
            high = vb.high_seqno
            start, end = vb.replica_snapshot
            uuid = vb.failover.uuid_holding(high)  # not a branch cut since (warm-up)
        if not start <= high <= end:
            start = end = high  # consistent where it stands (a fresh or just reset vbucket)
        self.state = PassiveState.AWAITING
        self.takeover = vb.state == VBucketState.PENDING
        return dcp.StreamRequest(
            opaque=self.opaque, vbucket=vb.id, start_seqno=high, end_seqno=U64_MAX,
            flags=StreamRequestFlag.TakeOver if self.takeover else 0,
            vbucket_uuid=uuid, snap_start_seqno=start, snap_end_seqno=end,
        )  # fmt: skip

    def takeover_changed(self) -> bool:
        """The stream was asked for (or is being read) with the wrong TakeOver flag."""
        asked = self.state in (PassiveState.AWAITING, PassiveState.READING)
        return asked and self.takeover != (self.vbucket.state == VBucketState.PENDING)

    def accepted(self, failover_log: tuple[FailoverEntry, ...]) -> None:
        self.vbucket.adopt_failover_log(failover_log)
        self.state = PassiveState.READING
        self.snapshot_done = True  # a new stream: its first marker opens the next snapshot

    def told_to_roll_back(self, seqno: int) -> None:
        self.rollbacks += 1
        self.rollback_to = seqno
        self.state = PassiveState.ROLLING_BACK

    def rolled_back(self) -> None:
        self.rollback_to = None
        self.state = PassiveState.PENDING

    def refused(self, retry_at: float) -> None:
        self.state, self.retry_at = PassiveState.PENDING, retry_at

    def ended(self, retry_at: float) -> None:
        if self.state is not PassiveState.ENDED:
            self.state, self.retry_at = PassiveState.PENDING, retry_at

    def close(self) -> None:
        self.state = PassiveState.ENDED

    # -- applying what arrives -------------------------------------------------------------

    def marker(self, msg: dcp.SnapshotMarker) -> None:
        self._snapshot_end()  # a disk snapshot's last seqno may be no item we get
        disk = bool(msg.flags & SnapshotFlag.Disk)
        self.vbucket.replica_snapshot_marker(msg.start_seqno, msg.end_seqno, disk=disk)
        self.snapshot_end, self.snapshot_done = msg.end_seqno, False

    def mutation(self, msg: dcp.Mutation) -> None:
        self.vbucket.set_with_meta(
            Item(
                bytes(msg.key), bytes(msg.value), flags=msg.flags, expiry=msg.expiration,
                cas=msg.cas, rev_seqno=msg.rev_seqno, by_seqno=msg.by_seqno,
                datatype=msg.datatype,
            )
        )  # fmt: skip
        self.items_received += 1  # (after: a write that waits for a read runs again)
        self._applied(msg.by_seqno)

    def deletion(self, msg: dcp.Deletion | dcp.DeletionV2 | dcp.Expiration) -> None:
        delete_time = getattr(msg, "delete_time", 0)
        self.vbucket.delete_with_meta(
            Item(
                bytes(msg.key), bytes(msg.value), cas=msg.cas, rev_seqno=msg.rev_seqno,
                by_seqno=msg.by_seqno, datatype=msg.datatype, deleted=True,
                delete_time=delete_time, expired=isinstance(msg, dcp.Expiration),
            )
        )  # fmt: skip
        self.items_received += 1
        self._applied(msg.by_seqno)

    # -- SyncWrites (the connection enabled them: module docstring) -----------------------------

    def prepare(self, msg: dcp.Prepare) -> None:
        self.items_received += 1
        self.vbucket.replica_prepare(
            PrepareItem(
                bytes(msg.key), bytes(msg.value), msg.flags, msg.expiration, msg.cas,
                msg.rev_seqno, msg.by_seqno, msg.datatype, bool(msg.deleted), 0, False,
                msg.durability_level,
            )
        )  # fmt: skip
        self._applied(msg.by_seqno)

    def commit(self, msg: dcp.Commit) -> None:
        key = bytes(msg.key)
        self.vbucket.replica_commit(key, msg.prepared_seqno, msg.commit_seqno, msg.cas)
        self.items_received += 1
        self._applied(msg.commit_seqno)

    def abort(self, msg: dcp.Abort) -> None:
        self.items_received += 1
        self.vbucket.replica_abort(bytes(msg.key), msg.prepared_seqno, msg.abort_seqno, msg.cas)
        self._applied(msg.abort_seqno)

    def _applied(self, seqno: int) -> None:
        if seqno >= self.snapshot_end:
            self._snapshot_end()

    def _snapshot_end(self) -> None:
        """The current snapshot arrived whole: the vbucket may acknowledge its prepares."""
        if not self.snapshot_done:
            self.snapshot_done = True
            self.vbucket.replica_snapshot_end(self.snapshot_end)

    def seqno_ack(self) -> dcp.SeqnoAcknowledged | None:
        """The DcpSeqnoAcknowledged due for this stream's vbucket, if any (only while reading:
        otherwise it stays due)."""
        if self.state is not PassiveState.READING:
            return None
        seqno = self.vbucket.take_seqno_ack()
        if seqno is None:
            return None
        return dcp.SeqnoAcknowledged(opaque=self.opaque, vbucket=self.vbid, prepared_seqno=seqno)
