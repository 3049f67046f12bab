"""One vbucket's stream on a DCP producer connection: where its items come from (kv_engine's
ActiveStream).

Theory of operation
-------------------
An :class:`ActiveStream` is created when the producer accepts a stream request. It drives a
:class:`~dcpkv.dcp.stream.Stream` (the state machine and the accounting of what was sent) and
fills a small queue of encoded messages, ``pending``, that the producer takes from one message
per visit (round-robin over its ready streams, flow-controlled: connection matters stay in
:mod:`dcpkv.dcp.producer`).

Start
    The first refill registers a checkpoint cursor at the requested start. If memory no
    longer holds that point, the stream *backfills*: one disk snapshot (marker flag Disk) from
    the start to the persisted high seqno, read by a :class:`~dcpkv.dcp.backfill.DiskBackfill`
    in batches off the event loop. As soon as the snapshot is open, a cursor is registered at
    its end, so memory keeps what follows. Then the stream sends memory snapshots from the
    cursor (flag Memory, plus Checkpoint when the snapshot opens a checkpoint), already
    deduplicated by the checkpoint manager. A dropped cursor (slow consumer, memory pressure)
    sends the stream back to disk from the last seqno it queued, as kv_engine does. The marker
    start follows spec 004: the requested start for the first marker, the backfill's start for
    later backfills, the cursor's rule otherwise.

Output and memory
    ``pending`` holds ``(bytes, seqno, covers, items)`` entries: the encoded message, the item's
    seqno (0 for a marker, a StreamEnd, a state message), the seqno up to which the consumer is
    consistent once it is sent, and how many items it carries (0 or 1). An entry may also be a
    *run*: the messages of several consecutive items joined into one bytes object (``seqno``
    the last one's), so the event loop forwards a backfill batch or a memory snapshot with
    per-run work instead of per-item work; the producer splits a run at message boundaries
    where flow control, its byte budget or a barrier needs a finer cut. A memory snapshot of
    one item (a live write, the commonest entry of all) is one entry of one item, its marker
    and the item joined: never split, sent in one visit. Streams with a stream id get neither
    (each of their messages is tagged on its way out). It is refilled only when
    empty, with at most :data:`BATCH_ITEMS` items from the backfill's buffer or one memory
    snapshot (a soft limit: the checkpoint manager never splits a checkpoint, so a snapshot is
    bounded by the bucket's ``checkpoint_max_items``). What the consumer has not read stays on
    disk (the backfill's buffer is bounded per producer) or in the checkpoints, which may drop
    the cursor.

Encoding
    Items become wire bytes without a message object: a backfill's rows are packed straight
    from their stored fields in the backfill's worker (:func:`encode_rows`), memory items from
    their :class:`Item` (:meth:`ActiveStream.encode_item`). Both give the bytes the typed
    messages give (tests/dcp compare them).

Takeover (rebalance handoff)
    A stream requested with the TakeOver flag runs like any other until it has caught up
    (its memory cursor has nothing more). It then hands the vbucket over as kv_engine does:
    it sends SetVbucketState(pending) and waits for the consumer's answer; on that answer it
    sets its *own* vbucket dead (no front-end write may land after this point; other streams
    of the vbucket end with StateChanged), drains what was written meanwhile, sends
    SetVbucketState(active), waits for the answer, and ends with StreamEnd(OK). A takeover
    stream whose cursor is dropped in the handoff ends with TooSlow (the driver retries).

Rollback
    A replica vbucket that rolls back (:meth:`Bucket.rollback`) bumps its ``rollbacks``
    generation and wakes its streams; a stream opened before that ends with Rollback on its
    next refill, whatever it was doing (idle in memory, mid-backfill of the old disk snapshot).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Protocol

from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.backfill import BackfillManager, Batch, DiskBackfill, Run
from dcpkv.dcp.stream import Stream, StreamEvent, StreamState
from dcpkv.dcp.values import ValueShape
from dcpkv.engine import document
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.checkpoint import Cursor, CursorDropped, Snapshot
from dcpkv.engine.item import AbortItem, CommitItem, Item, PrepareItem, SyncWriteItem
from dcpkv.engine.storage import BackfillScan, StreamRow, item_from_row, row_of_stream_row
from dcpkv.protocol import dcp
from dcpkv.protocol.constants import OpenFlag, SnapshotFlag, StreamEndReason
from dcpkv.protocol.frame import HEADER

BATCH_ITEMS = 64  # items a stream queues at a time, from its backfill or from memory
# A run holds at most BATCH_ITEMS items and closes once it reaches RUN_BYTES: large values
# make short runs, so cutting one (flow control, the pump's budget) copies little.
RUN_BYTES = 64 * 1024
_HEADER_LEN = 24
# A mutation's header and extras packed from a StreamRow: the CAS (its signed form) and
# flags << 32 | expiry as signed 64-bit fields give the very bytes of their unsigned fields.
_PACK_S64 = struct.Struct(HEADER.format[:-1] + "qQQqIHB").pack
_PACK_ITEM = struct.Struct(HEADER.format + "QQIIIHB").pack  # the same from an Item's fields
_EXTRAS_LEN = dcp.MUTATION_EXTRAS_LEN
_MAGIC, _OPCODE = 0x80, 0x57  # ClientRequest, DcpMutation
# Plain ints: Flag arithmetic costs microseconds per snapshot.
_DISK, _MEMORY = int(SnapshotFlag.Disk), int(SnapshotFlag.Memory)
_MEMORY_CHECKPOINT = int(SnapshotFlag.Memory | SnapshotFlag.Checkpoint)
_XATTR, _SHAPED = document.XATTR, document.SHAPED

_SYNC_ITEMS = (SyncWriteItem, CommitItem)  # sent as their own messages to SyncWrite streams

# (message or run, last item seqno or 0, consistent-at seqno, items in it)
Pending = tuple[bytes, int, int, int]


def stream_key(vbucket: int, sid: int) -> int:
    """A stream's key on its connection: the vbucket alone without a stream id."""
    return vbucket | sid << 16


class StreamOwner(Protocol):
    """What a stream needs of its producer connection."""

    name: str
    bucket: Bucket
    flags: OpenFlag
    # what the Open flags say about items, as plain bools (Flag arithmetic is slow per item)
    no_value: bool  # NoValue or NoValueWithUnderlyingDatatype
    keep_datatype: bool  # NoValueWithUnderlyingDatatype
    delete_times: bool  # IncludeDeleteTimes
    expiry_opcode: bool
    shape: ValueShape  # xattrs, compression: what a value is sent as
    marker_version: str
    sync_writes: bool  # enable_sync_writes: prepares, commits and aborts, V2.0 markers
    backfills: BackfillManager

    def wake(self, vbucket: int) -> None:
        """Put the stream in the ready queue (its thread only)."""

    def notify(self, vbucket: int) -> None:
        """Put the stream in the ready queue from any thread."""


class ActiveStream:
    """A stream plus where its next items come from and what is ready to send."""

    __slots__ = (
        "_vbuckets", "backfill", "backfill_first", "backfill_remaining", "cursor", "cursor_name",
        "disk_prepares", "emitted_seqno", "generation", "key", "max_visible_seqno", "owner",
        "pending",
        "queued_seqno", "sid", "stream", "takeover_state", "was_active",
    )  # fmt: skip

    def __init__(
        self,
        owner: StreamOwner,
        stream: Stream,
        *,
        was_active: bool,
        takeover: bool,
        generation: int = 0,
        sid: int = 0,
    ) -> None:
        self.owner = owner
        self.stream = stream
        # The producer's key for this stream: the vbucket, or with a stream id (several
        # streams of one vbucket on a connection) the vbucket and the id.
        self.sid = sid
        self.key = stream_key(stream.vbucket, sid)
        self.cursor_name = f"dcp:{owner.name}:{stream.vbucket}" + (f":sid{sid}" if sid else "")
        self.was_active = was_active
        self.pending: deque[Pending] = deque()
        self.cursor: Cursor | None = None
        self.backfill: DiskBackfill | None = None
        self.backfill_first = True  # no marker sent yet for the current backfill
        self._vbuckets = owner.bucket.vbuckets  # (the bucket's dict, looked up per visit)
        self.queued_seqno = stream.start  # the last item seqno put in ``pending``
        self.emitted_seqno = stream.start  # the last seqno the consumer is consistent at
        self.backfill_remaining = 0
        self.max_visible_seqno = stream.start  # the last V2 marker's (SyncWrites)
        # the backfill's pending prepares and aborts, not sent yet
        self.disk_prepares: deque[PrepareItem | AbortItem] = deque()
        # the state the handoff sends next
        self.takeover_state: VBucketState | None = VBucketState.PENDING if takeover else None
        self.generation = generation  # the vbucket's ``rollbacks`` when the stream opened

    @property
    def vbucket(self) -> int:
        return self.stream.vbucket

    @property
    def finished(self) -> bool:
        return self.stream.state is StreamState.DEAD and not self.pending

    # -- the producer's side ------------------------------------------------------------------

    def take(self) -> Pending | None:
        """The next message to send, or None when there is nothing until a notification."""
        # Refill until a message is ready or a refill changes nothing: a refill may move the
        # stream on without queueing anything (a backfill ending empty hands over to memory),
        # and an idle stream leaves the ready queue, so "None" must mean "nothing for now".
        # (No idle() test first: a live stream leaves the queue on the visit that makes it
        # idle, so a visit is for something new, nearly always.)
        pending, stream = self.pending, self.stream
        while not pending and stream.state is not StreamState.DEAD:
            before = (stream.state, self.queued_seqno, self.backfill)
            self._refill()
            if not pending and (stream.state, self.queued_seqno, self.backfill) == before:
                break
        return pending.popleft() if pending else None

    def idle(self) -> bool:
        """Nothing to send until the next notification: nothing pending, and a live stream
        whose cursor has read all that is queued. A cheap test (no lock: an item queued
        meanwhile notifies us again) that lets the producer take the stream out of the ready
        queue on the visit that sent its last message, not on one more visit whose checkpoint
        read finds nothing. Not when a takeover waits for this moment, nor after a rollback
        (a refill must end the stream)."""
        cursor = self.cursor
        if self.pending or self.stream.state is not StreamState.IN_MEMORY or cursor is None:
            return False
        if cursor.dropped or self.takeover_state is not None or not cursor.caught_up():
            return False
        vb = self._vbuckets.get(self.stream.vbucket)
        return vb is not None and vb.rollbacks == self.generation

    def end(self, reason: StreamEndReason, *, send: bool = True) -> None:
        """End the stream: release its cursor and backfill; queue StreamEnd if ``send``."""
        stream = self.stream
        stream.finish(reason)
        vb = self.owner.bucket.vbuckets.get(stream.vbucket)
        if vb is not None:
            vb.checkpoints.drop_cursor(self.cursor_name)
        self.cursor = None
        self._close_backfill()
        if send:
            data = dcp.StreamEnd(opaque=stream.opaque, vbucket=stream.vbucket, reason=reason)
            self.pending.append((data.encode(), 0, 0, 0))
            self.owner.wake(self.key)

    def vbucket_state_changed(self) -> None:
        """End the stream if its vbucket left the active state (or disappeared)."""
        if self.stream.state in (StreamState.TAKEOVER_SEND, StreamState.TAKEOVER_WAIT):
            return  # the handoff itself moves the vbucket; it ends the stream when done
        vb = self.owner.bucket.vbuckets.get(self.stream.vbucket)
        state = vb.state if vb is not None else VBucketState.DEAD  # gone counts as dead
        if state == VBucketState.DEAD or (self.was_active and state != VBucketState.ACTIVE):
            self.end(StreamEndReason.StateChanged)

    def takeover_acked(self) -> None:
        """The consumer answered our SetVbucketState (the stream is in takeover_wait)."""
        if self.takeover_state == VBucketState.PENDING:
            self.takeover_state = VBucketState.ACTIVE
            self.stream.handle(StreamEvent.ACKED)
            # After the state event, so the producer's vbucket_state_changed spares us.
            self.owner.bucket.set_vbucket_state(self.stream.vbucket, VBucketState.DEAD)
            self.owner.wake(self.key)  # drain what was written meanwhile
        else:
            self.end(StreamEndReason.OK)

    # -- filling ``pending`` ------------------------------------------------------------------

    def _refill(self) -> None:
        vb = self._vbuckets.get(self.stream.vbucket)
        if vb is not None and vb.rollbacks != self.generation:
            # The vbucket rolled back under us (a replica): what we sent may be history that
            # no longer exists, and a backfill or cursor may mix both. The consumer re-requests
            # and gets the rollback answer (kv_engine ends such streams the same way).
            self.end(StreamEndReason.Rollback)
            return
        state = self.stream.state
        if state is StreamState.PENDING:
            self._begin()
            state = self.stream.state
        if state is StreamState.BACKFILLING:
            self._refill_from_disk()
        elif state is StreamState.IN_MEMORY:
            self._refill_from_memory()
        elif state is StreamState.TAKEOVER_SEND:
            self._refill_takeover()

    def _begin(self) -> None:
        vb = self.owner.bucket.vbuckets[self.stream.vbucket]
        self.cursor = vb.checkpoints.register_cursor(self.cursor_name, self.queued_seqno)
        if self.cursor is not None:
            self.stream.handle(StreamEvent.MEMORY)
        else:
            self.stream.handle(StreamEvent.BACKFILL)
            self._open_backfill()

    def _open_backfill(self) -> None:
        stream = self.stream
        storage, vbid, start, end = (
            self.owner.bucket.storage,
            stream.vbucket,
            self.queued_seqno,
            stream.end,
        )
        key = self.key
        self.disk_prepares = deque()
        if self.owner.sync_writes:  # with the pending prepares the disk snapshot holds
            opener = lambda: self._with_prepares(  # noqa: E731
                storage.open_stream_backfill(vbid, start, end, prepares=True)
            )
        else:
            opener = lambda: storage.open_stream_backfill(vbid, start, end)  # noqa: E731
        self.backfill = DiskBackfill(
            self.owner.backfills, opener, self._encode_rows, lambda: self.owner.notify(key)
        )
        self.backfill_first = True
        self.cursor = None

    def _with_prepares(self, scan: BackfillScan[StreamRow]) -> BackfillScan[StreamRow]:
        """(The backfill's thread, before its first batch is encoded.) The disk snapshot's
        pending prepares and aborts, which :func:`encode_rows` slots in between its rows by
        seqno."""
        self.disk_prepares = deque(scan.prepares)
        return scan

    def _backfill_opened(self, bf: DiskBackfill) -> None:
        """The disk snapshot is open: send its marker, pin memory right after its end."""
        self.backfill_first = False
        if bf.end > self.queued_seqno:
            start = self.stream.marker_start(self.queued_seqno)
            self._marker(start, bf.end, _DISK, bf.purge_seqno, bf.high_completed_seqno)
        if bf.end < self.stream.end:
            vb = self.owner.bucket.vbuckets[self.stream.vbucket]
            self.cursor = vb.checkpoints.register_cursor(self.cursor_name, bf.end)

    def _refill_from_disk(self) -> None:
        bf = self.backfill
        assert bf is not None
        if self.backfill_first:
            if not bf.opened:
                bf.request()  # an inline runner opens it now; a thread notifies us later
                if not bf.opened:
                    return
            self._backfill_opened(bf)
        taken = bf.take(BATCH_ITEMS)
        if taken is not None:
            self.pending.extend((data, seqno, seqno, n) for data, seqno, n in taken)
            self.queued_seqno = taken[-1][1]
        if not bf.finished:
            # More to come: in the buffer, or being read (its landing notifies us).
            self.backfill_remaining = max(0, bf.end - self.queued_seqno)
            return
        # The disk snapshot is complete: the consumer is consistent at its end. (Prepares
        # after its last row are sent first: no batch is being encoded any more.)
        rest, self.disk_prepares = self.disk_prepares, deque()
        if rest:
            encode = self.encode_sync_item
            self.pending.extend((encode(p), p.by_seqno, p.by_seqno, 1) for p in rest)
            self.queued_seqno = max(self.queued_seqno, rest[-1].by_seqno)
        self._advance(bf.end)
        self._close_backfill()
        self.backfill_remaining = 0
        if self._end_if_reached():
            return
        if self.cursor is None:
            self._open_backfill()  # memory moved on while we read: another disk snapshot
        else:
            self.stream.handle(StreamEvent.BACKFILL_DONE)

    def _refill_from_memory(self) -> None:
        assert self.cursor is not None
        try:
            snap = self.cursor.next_snapshot(BATCH_ITEMS)
        except CursorDropped:
            self.stream.handle(StreamEvent.CURSOR_DROPPED)
            self._open_backfill()
            self._refill_from_disk()
            return
        if snap is None:
            if self.takeover_state is not None:
                self.stream.handle(StreamEvent.TAKEOVER)  # caught up: start the handoff
                self._refill_takeover()
            return
        self._queue_snapshot(snap)
        if self.queued_seqno >= self.stream.end:  # (_end_if_reached, on the path of every write)
            self.end(StreamEndReason.OK)

    def _refill_takeover(self) -> None:
        """Drain what memory still holds, then send the next state of the handoff."""
        assert self.cursor is not None and self.takeover_state is not None
        try:
            snap = self.cursor.next_snapshot(BATCH_ITEMS)
        except CursorDropped:
            self.end(StreamEndReason.TooSlow)
            return
        if snap is not None:
            self._queue_snapshot(snap)
            self._end_if_reached()
            return
        stream = self.stream
        msg = dcp.SetVbucketState(
            opaque=stream.opaque, vbucket=stream.vbucket, state=self.takeover_state
        )
        self.pending.append((msg.encode(), 0, 0, 0))
        stream.handle(StreamEvent.STATE_SENT)

    def _queue_snapshot(self, snap: Snapshot) -> None:
        end = self.stream.end
        items = snap.items if snap.end <= end else [i for i in snap.items if i.by_seqno <= end]
        marker_end = min(snap.end, end)
        if items and self.cursor is not None and self.cursor.manager.sync_items:
            if not self.owner.sync_writes:
                items, marker_end = _committed_only(items, marker_end)
            elif any(isinstance(i, _SYNC_ITEMS) for i in items):
                self._queue_sync_snapshot(snap, items, marker_end)
                return
            # (else plain items: the ordinary path, runs and all)
        if not items:
            # Everything up to the end was deduplicated into later seqnos (or was prepares and
            # aborts, which this consumer never sees): nothing to send.
            self._advance(min(snap.end, end))
            return
        flags = _MEMORY_CHECKPOINT if snap.checkpoint else _MEMORY
        marker = self._marker_bytes(self.stream.marker_start(snap.start), marker_end, flags)
        encode, last = self.encode_item, items[-1].by_seqno
        if len(items) == 1 and not self.sid:  # a lone item (a live write): one entry, one visit
            self.pending.append((marker + encode(items[0]), last, last, 1))
        elif self.sid:
            self.pending.append((marker, 0, 0, 0))
            self.pending.extend((encode(i), i.by_seqno, i.by_seqno, 1) for i in items)
        else:  # runs: the loop forwards the snapshot's items a run at a time
            self.pending.append((marker, 0, 0, 0))
            start = 0
            while start < len(items):
                parts, stop = self._item_run(items, start)
                seqno = items[stop - 1].by_seqno
                self.pending.append((b"".join(parts), seqno, seqno, stop - start))
                start = stop
        self.queued_seqno = last
        if snap.end >= end:
            self._advance(end)

    def _queue_sync_snapshot(self, snap: Snapshot, items: list[Item], marker_end: int) -> None:
        """A memory snapshot as a SyncWrite consumer sees it: every item, prepares, commits and
        aborts as their own messages, one entry each (no runs: a Commit's extras do not begin
        with its seqno); the marker's max visible seqno is its last committed item's."""
        visible = [i.by_seqno for i in items if not isinstance(i, SyncWriteItem)]
        flags = _MEMORY_CHECKPOINT if snap.checkpoint else _MEMORY
        start = self.stream.marker_start(snap.start)
        marker = self._marker_bytes(start, marker_end, flags, max_visible=visible[-1:])
        self.pending.append((marker, 0, 0, 0))
        encode = self.encode_sync_item
        self.pending.extend((encode(i), i.by_seqno, i.by_seqno, 1) for i in items)
        self.queued_seqno = items[-1].by_seqno
        if snap.end >= self.stream.end:
            self._advance(self.stream.end)

    def _advance(self, seqno: int) -> None:
        """The consumer is consistent at ``seqno`` once what is queued now has gone out."""
        self.queued_seqno = max(self.queued_seqno, seqno)
        pending = self.pending
        if pending:
            data, item_seqno, _, items = pending[-1]
            pending[-1] = (data, item_seqno, self.queued_seqno, items)
        else:
            self.emitted_seqno = max(self.emitted_seqno, self.queued_seqno)

    def _end_if_reached(self) -> bool:
        if self.queued_seqno >= self.stream.end:
            self.end(StreamEndReason.OK)
            return True
        return False

    def _close_backfill(self) -> None:
        if self.backfill is not None:
            self.backfill.close()  # lets go of its disk snapshot now (or when it lands)
            self.backfill = None

    def _marker(
        self, start: int, end: int, flags: int, purge: int | None, completed: int = 0
    ) -> None:
        """Queue a snapshot marker (:meth:`_marker_bytes`)."""
        self.pending.append(
            (self._marker_bytes(start, end, flags, purge, None, completed), 0, 0, 0)
        )

    def _marker_bytes(
        self, start: int, end: int, flags: int, purge: int | None = None,
        max_visible: list[int] | None = None, completed: int = 0,
    ) -> bytes:  # fmt: skip
        """A snapshot marker, counted as sent; ``purge`` None: the vbucket's purge seqno now
        (looked up only for the V2.2 marker that carries it). ``max_visible``: [the highest
        committed seqno in the snapshot], or [] when it holds none (then the one before);
        None: ``end``. ``completed``: the high completed seqno a disk snapshot's V2 marker
        carries (the disk's, as of its end; 0 in a memory snapshot's). A SyncWrite connection
        gets V2.0 at least."""
        stream = self.stream
        version = self.owner.marker_version
        if version == "1.0" and self.owner.sync_writes:
            version = "2.0"
        data: bytes
        if version == "1.0":
            data = dcp.encode_snapshot_marker(stream.opaque, stream.vbucket, start, end, flags)
        else:
            if max_visible is not None:
                self.max_visible_seqno = max_visible[0] if max_visible else self.max_visible_seqno
            else:
                self.max_visible_seqno = end
            common = {
                "opaque": stream.opaque,
                "vbucket": stream.vbucket,
                "start_seqno": start,
                "end_seqno": end,
                "flags": int(flags),
                "max_visible_seqno": self.max_visible_seqno,
                "high_completed_seqno": completed,
            }
            if version == "2.0":
                data = dcp.SnapshotMarkerV2_0(**common).encode()
            else:
                if purge is None:
                    vb = self.owner.bucket.vbuckets.get(stream.vbucket)
                    purge = vb.purge_seqno if vb is not None else 0
                data = dcp.SnapshotMarkerV2_2(**common, purge_seqno=purge).encode()
        stream.note_snapshot(start, end)
        return data

    # -- encoding -----------------------------------------------------------------------------

    def _mutation_value(self, item: Item) -> tuple[bytes, int]:
        """The value and datatype a live item is sent with on this connection."""
        owner = self.owner
        value, datatype = item.value, item.datatype
        shape = owner.shape
        if owner.no_value and not (datatype & _XATTR and shape.xattrs):
            # No value: never read an ejected one back. Plain NoValue also drops the
            # datatype (it described the value), the other flag keeps it.
            return b"", datatype if owner.keep_datatype else 0
        if value is None:  # ejected from the hash table's copy: read it back
            stored = owner.bucket.get_from_storage(self.stream.vbucket, item.key)
            value = stored.value if stored is not None and stored.value is not None else b""
        if datatype & _SHAPED or not shape.plain:
            value, datatype = shape.mutation(value, datatype)
        return value, datatype

    def encode_item(self, item: Item) -> bytes:
        """The wire bytes of one item of this stream (mutation, deletion or expiration)."""
        stream = self.stream
        if item.deleted:
            return self._encode_tombstone(item)
        value, datatype = self._mutation_value(item)
        return dcp.encode_mutation(
            stream.opaque, stream.vbucket, item.cas, item.by_seqno, item.rev_seqno, item.flags,
            item.expiry, datatype, item.key, value,
        )  # fmt: skip

    def encode_sync_item(self, item: Item) -> bytes:
        """An item of a SyncWrite connection: a prepare as a DcpPrepare (its level, a durable
        delete flagged), a commit as a DcpCommit (the commit's CAS in the header), an abort as
        a DcpAbort; anything else as :meth:`encode_item`."""
        s = self.stream
        if isinstance(item, PrepareItem):
            if not item.deleted:
                value, datatype = self._mutation_value(item)
            elif item.datatype & _XATTR:  # a durable delete: the xattrs its tombstone keeps
                value, datatype = self.owner.shape.deletion(item.value or b"", item.datatype)
            else:
                value, datatype = b"", 0
            return dcp.Prepare(
                opaque=s.opaque, vbucket=s.vbucket, cas=item.cas, datatype=datatype,
                key=item.key, value=value, by_seqno=item.by_seqno, rev_seqno=item.rev_seqno,
                flags=item.flags, expiration=item.expiry, deleted=int(item.deleted),
                durability_level=item.level,
            ).encode()  # fmt: skip
        if isinstance(item, CommitItem):
            return dcp.Commit(
                opaque=s.opaque, vbucket=s.vbucket, cas=item.cas, key=item.key,
                prepared_seqno=item.prepared_seqno, commit_seqno=item.by_seqno,
            ).encode()  # fmt: skip
        if isinstance(item, AbortItem):
            return dcp.Abort(
                opaque=s.opaque, vbucket=s.vbucket, cas=item.cas, key=item.key,
                prepared_seqno=item.prepared_seqno, abort_seqno=item.by_seqno,
            ).encode()  # fmt: skip
        return self.encode_item(item)

    def _item_run(self, items: list[Item], start: int) -> tuple[list[bytes], int]:
        """The messages of the run of ``items`` from ``start`` as parts to join, and where the
        run stops (:data:`BATCH_ITEMS` items or :data:`RUN_BYTES`): a plain resident mutation
        as its packed header, key and value (no per-item call or concatenation), anything else
        through :meth:`encode_item`."""
        stream, owner = self.stream, self.owner
        opaque, vbid = stream.opaque, stream.vbucket
        simple = owner.shape.plain and not owner.no_value
        parts: list[bytes] = []
        append, extend, pack, encode = parts.append, parts.extend, _PACK_ITEM, self.encode_item
        stop, size = min(len(items), start + BATCH_ITEMS), 0
        for i in range(start, stop):
            item = items[i]
            value, datatype = item.value, item.datatype
            if not simple or item.deleted or value is None or datatype & _SHAPED:
                append(data := encode(item))
                size += len(data)
            else:
                key = item.key
                klen, body = len(key), _EXTRAS_LEN + len(key) + len(value)
                head = pack(
                    _MAGIC, _OPCODE, klen, _EXTRAS_LEN, datatype, vbid, body, opaque, item.cas,
                    item.by_seqno, item.rev_seqno, item.flags, item.expiry, 0, 0, 0,
                )  # fmt: skip
                extend((head, key, value))
                size += _HEADER_LEN + body
            if size >= RUN_BYTES:
                return parts, i + 1
        return parts, stop

    def _encode_tombstone(self, item: Item) -> bytes:
        s = self.stream
        value, datatype = b"", 0
        if item.datatype & _XATTR:  # system xattrs the tombstone kept, to IncludeXattrs only
            value, datatype = self.owner.shape.deletion(item.value or b"", item.datatype)
        if item.expired and self.owner.expiry_opcode:
            return dcp.Expiration(
                opaque=s.opaque, vbucket=s.vbucket, cas=item.cas, by_seqno=item.by_seqno,
                rev_seqno=item.rev_seqno, key=item.key, delete_time=item.delete_time,
            ).encode()  # fmt: skip
        if self.owner.delete_times:
            return dcp.DeletionV2(
                opaque=s.opaque, vbucket=s.vbucket, cas=item.cas, by_seqno=item.by_seqno,
                rev_seqno=item.rev_seqno, key=item.key, delete_time=item.delete_time,
                value=value, datatype=datatype,
            ).encode()  # fmt: skip
        return dcp.Deletion(
            opaque=s.opaque, vbucket=s.vbucket, cas=item.cas, by_seqno=item.by_seqno,
            rev_seqno=item.rev_seqno, key=item.key, value=value, datatype=datatype,
        ).encode()  # fmt: skip

    def _encode_rows(self, rows: list[StreamRow]) -> Batch:
        """A backfill batch: rows straight to wire bytes (in the backfill's worker thread)."""
        return encode_rows(self, rows)


def _committed_only(items: list[Item], marker_end: int) -> tuple[list[Item], int]:
    """A snapshot's items as a consumer without SyncWrites sees them: no prepares, no aborts
    (a commit is a plain mutation or deletion, left out when a later version of its key is in
    the snapshot: checkpoints keep commits for SyncWrite readers); its marker ends at the last
    item it gets (the max visible seqno) when the snapshot ends with a prepare or an abort."""
    latest = {i.key: i.by_seqno for i in items if not isinstance(i, SyncWriteItem)}
    visible = [
        i
        for i in items
        if not isinstance(i, SyncWriteItem)
        and (i.__class__ is not CommitItem or latest[i.key] == i.by_seqno)
    ]
    if visible and len(visible) < len(items) and isinstance(items[-1], SyncWriteItem):
        marker_end = visible[-1].by_seqno
    return visible, marker_end


def encode_rows(stream: ActiveStream, rows: list[StreamRow]) -> Batch:
    """Stored rows to runs of DCP messages of ``stream`` (:data:`BATCH_ITEMS` items a run, one
    item a run for a stream with an id): a mutation is one fused pack of header and extras from
    the row's fields (the stored CAS is signed: same bytes); tombstones take the typed path.
    Same bytes as :meth:`ActiveStream.encode_item` of the row's item."""
    per_run = 1 if stream.sid else BATCH_ITEMS
    runs: list[Run] = []
    start = 0
    prepares = stream.disk_prepares  # (a SyncWrite stream's: slotted in by seqno)
    while start < len(rows):
        if prepares and prepares[0].by_seqno < rows[start][1]:
            p = prepares.popleft()
            runs.append((stream.encode_sync_item(p), p.by_seqno, 1))
            continue
        stop = min(len(rows), start + per_run)
        if prepares:  # the run stops before the next prepare's seqno
            stop = start + 1 + _below(rows, start + 1, stop, prepares[0].by_seqno)
        parts, stop = _row_run(stream, rows, start, stop)
        runs.append((b"".join(parts), rows[stop - 1][1], stop - start))
        start = stop
    return Batch(runs, sum(len(r[0]) for r in runs))


def _below(rows: list[StreamRow], start: int, stop: int, seqno: int) -> int:
    """How many of ``rows[start:stop]`` (in seqno order) are below ``seqno``."""
    n = 0
    while start + n < stop and rows[start + n][1] < seqno:
        n += 1
    return n


def _row_run(
    stream: ActiveStream, rows: list[StreamRow], start: int, stop: int
) -> tuple[list[bytes], int]:
    """The messages of ``rows[start:stop]`` as parts to join (header and extras packed, key
    and value as stored), cut short once they reach :data:`RUN_BYTES`; where the run stops."""
    opaque, vbid = stream.stream.opaque, stream.stream.vbucket
    no_value, keep_datatype = stream.owner.no_value, stream.owner.keep_datatype
    shape = stream.owner.shape
    reshape, plain, no_value_xattrs = shape.mutation, shape.plain, shape.xattrs and no_value
    messages: list[bytes] = []
    append, extend, pack, size = messages.append, messages.extend, _PACK_S64, 0
    for i in range(start, stop):
        row = rows[i]
        key, seqno, cas, rev, flags_expiry, datatype, value = row
        if datatype > 0xFF:  # deleted (StreamRow: datatype | deleted << 8 | ...)
            append(data := stream._encode_tombstone(item_from_row(row_of_stream_row(row))))
            size += len(data)
        else:
            if no_value and not (no_value_xattrs and datatype & _XATTR):
                value = b""
                if not keep_datatype:
                    datatype = 0
            elif datatype & _SHAPED or not plain:
                value, datatype = reshape(value, datatype)
            # (the same pack as ActiveStream._item_run's, from a row's fields: a helper would
            # cost a call per item on the hottest loop of a backfill)
            klen, body = len(key), _EXTRAS_LEN + len(key) + len(value)
            head = pack(
                _MAGIC, _OPCODE, klen, _EXTRAS_LEN, datatype, vbid, body,
                opaque, cas, seqno, rev, flags_expiry, 0, 0, 0,
            )  # fmt: skip
            extend((head, key, value))
            size += _HEADER_LEN + body
        if size >= RUN_BYTES:
            return messages, i + 1
    return messages, stop
