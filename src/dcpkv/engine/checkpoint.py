"""The per-vbucket in-memory write queue: a list of checkpoints read by named cursors.

Theory of operation
-------------------
Every accepted mutation of a vbucket is *queued* here in seqno order, after the hash table has
been updated. The queue is what the flusher persists and what DCP streams send from memory;
both read it through a :class:`Cursor`. This is kv_engine's CheckpointManager, in miniature.

State kept
    ``checkpoints``: oldest first. Only the last one is *open* (takes new items); the others
    are *closed* (never change again). A checkpoint holds ``items`` (a slot per queued item;
    a slot becomes ``None`` when deduplicated), the parallel ``seqnos`` of the slots,
    ``base`` (the lowest seqno it may hold: high seqno + 1 when it was created), and the
    snapshot range ``snap_start..snap_end`` it represents: for an active vbucket from its
    first to its last item; for a replica, the range of the producer's snapshot marker
    (:meth:`CheckpointManager.snapshot_marker`), which may run past the items received so far.
    ``cursors``: name -> (checkpoint, slot position of the next item to read).
    ``memory_used``: bytes of the items still held (see :meth:`Item.size`).

Invariants
    * seqnos strictly increase along the slots of all checkpoints together;
    * a key has at most one live slot in the open checkpoint *at or after any cursor's
      position in it*: when a newer version arrives, the older slot is emptied unless some
      cursor has already read past it (that cursor must still see the newer one, so both stay).
      Closed checkpoints never change: dedup happens only in the open one. Prepares and
      aborts (SyncWrites) are never deduplicated and deduplicate nothing: they are queued
      beside their key's committed versions (:meth:`CheckpointManager.queue_sync`); a commit
      deduplicates the key's older versions but is never deduplicated itself (a SyncWrite
      reader needs it to complete its prepare);
    * the persistence cursor (the flusher's) always exists and is never dropped, so an item is
      freed only after it is persisted;
    * the oldest checkpoints are freed as soon as they are closed and no cursor is in them
      (a cursor never goes backwards, so nobody can need them again).

What a cursor sees
    :meth:`Cursor.next_snapshot` returns the rest of the cursor's checkpoint, and, while fewer
    than ``max_items`` items are collected, of the following closed checkpoints, deduplicated
    to the latest version per key in ascending seqno order. A checkpoint is never split: an
    emptied slot's newer version always lies later in the *same* checkpoint, so reading up to a
    checkpoint's current end is consistent, while stopping in the middle could drop both
    versions of a key. ``max_items`` is therefore a soft limit. The snapshot range follows the
    spec's implementation notes (``004_20d1633ae76612fc.txt``, memory snapshots):

    ======================================= ================================ ==========
    situation                                snap_start                       CHK flag
    ======================================= ================================ ==========
    first snapshot of a new cursor           the seqno it was registered from at slot 0
    cursor at the first slot of a checkpoint the checkpoint's ``snap_start``  yes
    cursor in the middle of a checkpoint     seqno of the first item sent     no
    ======================================= ================================ ==========

    ``snap_end`` is the last checkpoint's ``snap_end``. When that lies above the last seqno read
    (a replica's snapshot still arriving), ``snap_start`` is at most the marker's start: the
    reader is inside that snapshot, not at a consistent point.

    A cursor asked for a seqno older than anything in memory is refused (``None``): its owner
    must backfill from disk first and register again at the backfill's end.

Slow cursors
    A DCP cursor that does not move pins its checkpoint and every newer one.
    :meth:`CheckpointManager.drop_slow_cursors` drops the cursors in the oldest checkpoints
    (never the persistence cursor) until memory is under a limit; their owner sees
    :class:`CursorDropped` and falls back to a backfill.

Threading: every method runs under the owning vbucket's lock (passed in), so a DCP stream or
the flusher thread may read while the front end writes.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from dcpkv.core.errors import DcpkvError
from dcpkv.engine.item import CommitItem, Item, SyncWriteItem

PERSISTENCE_CURSOR = "persistence"
DEFAULT_CHECKPOINT_MAX_ITEMS = 10_000


class CursorDropped(DcpkvError):
    """The cursor was dropped (slow consumer, rollback): backfill from disk and re-register."""


class Snapshot(NamedTuple):
    """A consistent, deduplicated batch of items: the state moves from snap_start to snap_end.
    (A named tuple: a live reader makes one per write, and a frozen dataclass cost 1.4 us to
    build against 0.2 us.)"""

    start: int
    end: int
    items: list[Item]
    checkpoint: bool  # the snapshot begins a checkpoint (the marker's CHK flag)
    high_seqno: int  # the last seqno read (below ``end`` for a partial replica snapshot)


@dataclass(eq=False, slots=True)
class Checkpoint:
    id: int
    base: int
    snap_start: int
    snap_end: int
    is_open: bool = True
    items: list[Item | None] = field(default_factory=list)
    seqnos: list[int] = field(default_factory=list)
    key_index: dict[bytes, int] = field(default_factory=dict)
    memory: int = 0
    # The highest slot holding an older version kept because a cursor had read past it
    # (-1: none): a read starting beyond it meets every key once, and needs no dedup.
    last_kept: int = -1

    def __len__(self) -> int:
        return len(self.items)

    def close(self) -> None:
        self.is_open = False
        self.key_index = {}  # only the open checkpoint dedups; free the index


class Cursor:
    """A reader's position in the write queue."""

    __slots__ = ("_first", "_manager", "checkpoint", "dropped", "name", "pos", "start_seqno")

    def __init__(
        self, manager: CheckpointManager, name: str, checkpoint: Checkpoint, pos: int, start: int
    ) -> None:
        self._manager = manager
        self.name = name
        self.checkpoint = checkpoint
        self.pos = pos
        self.start_seqno = start
        self._first = True
        self.dropped = False

    def next_snapshot(self, max_items: int = 1000) -> Snapshot | None:
        """The next snapshot, or None when the cursor has read everything queued so far."""
        return self._manager.read(self, max_items)

    @property
    def manager(self) -> CheckpointManager:
        return self._manager

    def caught_up(self) -> bool:
        """Whether the cursor has read all that is queued (False may still find nothing new:
        a cheap test that spares a reader a :meth:`next_snapshot` call that returns None)."""
        ckpt = self.checkpoint
        return ckpt.is_open and self.pos >= len(ckpt.items)

    def remaining(self) -> int:
        """Slots not read yet (an upper bound on the items the next snapshots hold)."""
        return self._manager.remaining(self)

    def __repr__(self) -> str:
        return f"Cursor({self.name!r}, ckpt={self.checkpoint.id}, pos={self.pos})"


class CheckpointManager:
    """The write queue of one vbucket (see the module docstring)."""

    def __init__(
        self,
        high_seqno: int = 0,
        *,
        max_items: int = DEFAULT_CHECKPOINT_MAX_ITEMS,
        lock: threading.RLock | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError("a checkpoint holds at least one item")
        self._lock = lock or threading.RLock()
        self.max_items = max_items
        self.memory_used = 0
        # Prepares, aborts and commits ever queued: until the first, a reader has none to skip
        # (and a SyncWrite one none to send as its own message).
        self.sync_items = 0
        self._next_id = 1
        self._checkpoints: list[Checkpoint] = []
        self._cursors: dict[str, Cursor] = {}
        self.high_seqno = high_seqno
        self._open_new(high_seqno + 1, high_seqno)
        self.persistence_cursor = self._place(PERSISTENCE_CURSOR, high_seqno)

    # -- reading the state ----------------------------------------------------------------

    @property
    def checkpoints(self) -> tuple[Checkpoint, ...]:
        return tuple(self._checkpoints)

    @property
    def open_checkpoint(self) -> Checkpoint:
        return self._checkpoints[-1]

    @property
    def cursors(self) -> dict[str, Cursor]:
        return dict(self._cursors)

    @property
    def lowest_seqno_in_memory(self) -> int:
        """Cursors can start from this seqno - 1 or later without a backfill."""
        return self._checkpoints[0].base

    def num_items(self) -> int:
        return sum(1 for c in self._checkpoints for i in c.items if i is not None)

    # -- writing ---------------------------------------------------------------------------

    def queue(self, item: Item) -> None:
        """Append an item that already has its seqno (strictly above the high seqno)."""
        with self._lock:
            if item.by_seqno <= self.high_seqno:
                raise ValueError(f"seqno {item.by_seqno} is not above {self.high_seqno}")
            self.queue_next(item, item.size())

    def queue_next(self, item: Item, size: int) -> None:
        """:meth:`queue` for a caller that holds the lock, gave the item a seqno above the
        high seqno (a front-end write: high seqno + 1) and knows its ``size()``, so nothing
        needs checking or computing. The hot path of every write: few calls, plain ints."""
        ckpt = self._checkpoints[-1]  # the open one (the property costs a call per write)
        items, key, seqno = ckpt.items, item.key, item.by_seqno
        if len(items) >= self.max_items:
            ckpt = self._close_open()
            items = ckpt.items
        key_index = ckpt.key_index
        older = key_index.get(key)
        if older is not None:
            self._dedup(ckpt, older)
        key_index[key] = len(items)
        items.append(item)
        ckpt.seqnos.append(seqno)
        ckpt.memory += size
        self.memory_used += size
        if seqno > ckpt.snap_end:
            ckpt.snap_end = seqno
        self.high_seqno = seqno

    def queue_sync(self, item: SyncWriteItem) -> None:
        """Queue a prepare or an abort (the caller holds the lock and gave it the next seqno).
        Never deduplicated, and deduplicating nothing: a prepare must reach the flusher and
        SyncWrite consumers beside its key's committed versions (reads keep them apart too,
        :func:`_collect`)."""
        ckpt = self._checkpoints[-1]
        if len(ckpt.items) >= self.max_items:
            ckpt = self._close_open()
        size = item.size()
        ckpt.items.append(item)
        ckpt.seqnos.append(item.by_seqno)
        ckpt.memory += size
        self.memory_used += size
        ckpt.snap_end = max(ckpt.snap_end, item.by_seqno)
        self.high_seqno = item.by_seqno
        self.sync_items += 1

    def _dedup(self, ckpt: Checkpoint, old: int) -> None:
        """Empty the slot ``old`` of the open checkpoint (a key's older version), unless a
        cursor has read past it: that cursor must also see the newer version, so both stay."""
        for cursor in self._cursors.values():  # (a loop, not any(): no generator per write)
            if cursor.checkpoint is ckpt and cursor.pos > old:
                # (tested first: the cursors are few and hot, the old item is not)
                if old > ckpt.last_kept:
                    ckpt.last_kept = old
                return
        stale = ckpt.items[old]
        if stale is None or stale.__class__ is CommitItem:
            return  # a commit stays: a SyncWrite reader must see it (queue_sync)
        size = stale.size()
        ckpt.items[old] = None
        ckpt.memory -= size
        self.memory_used -= size

    def snapshot_marker(self, start: int, end: int) -> None:
        """A replica received a snapshot marker: the next items form ``start..end``."""
        with self._lock:
            ckpt = self.open_checkpoint
            if len(ckpt):
                ckpt = self._close_open()
            ckpt.snap_start, ckpt.snap_end = start, end

    def close_open_checkpoint(self) -> None:
        """Close the open checkpoint now (if it holds anything) and open a new one."""
        with self._lock:
            if len(self.open_checkpoint):
                self._close_open()

    def _close_open(self) -> Checkpoint:
        old = self.open_checkpoint
        old.close()
        if old.snap_end > self.high_seqno:
            # A replica snapshot still arriving: its remainder keeps the marker's range, since
            # the consumer is only consistent at the marker's end.
            new = self._open_new(old.snap_start, old.snap_end)
        else:
            new = self._open_new(self.high_seqno + 1, self.high_seqno)
        for cursor in self._cursors.values():
            if cursor.checkpoint is old and cursor.pos >= len(old):
                cursor.checkpoint, cursor.pos = new, 0
        self._free_unreferenced()
        return new

    def _open_new(self, snap_start: int, snap_end: int) -> Checkpoint:
        ckpt = Checkpoint(self._next_id, self.high_seqno + 1, snap_start, snap_end)
        self._next_id += 1
        self._checkpoints.append(ckpt)
        return ckpt

    def _free_unreferenced(self) -> None:
        if len(self._checkpoints) == 1:
            return  # the open one is never freed (the common case of every read)
        pinned = {id(c.checkpoint) for c in self._cursors.values()}
        while len(self._checkpoints) > 1:
            head = self._checkpoints[0]
            if head.is_open or id(head) in pinned:
                break
            self._checkpoints.pop(0)
            self.memory_used -= head.memory

    # -- cursors ---------------------------------------------------------------------------

    def register_cursor(self, name: str, from_seqno: int) -> Cursor | None:
        """A cursor reading items above ``from_seqno``; None if they are no longer in memory.

        Registering a name that exists replaces that cursor.
        """
        with self._lock:
            if name == PERSISTENCE_CURSOR:
                raise ValueError("the persistence cursor is owned by the manager")
            self._drop(name)
            if from_seqno + 1 < self.lowest_seqno_in_memory:
                self._free_unreferenced()
                return None
            return self._place(name, from_seqno)

    def _place(self, name: str, from_seqno: int) -> Cursor:
        for ckpt in self._checkpoints:
            if ckpt.seqnos and ckpt.seqnos[-1] > from_seqno:
                pos = bisect.bisect_right(ckpt.seqnos, from_seqno)
                break
        else:
            ckpt, pos = self.open_checkpoint, len(self.open_checkpoint)
        cursor = Cursor(self, name, ckpt, pos, from_seqno)
        self._cursors[name] = cursor
        self._free_unreferenced()
        return cursor

    def drop_cursor(self, name: str) -> bool:
        with self._lock:
            if name == PERSISTENCE_CURSOR:
                raise ValueError("the persistence cursor is never dropped")
            found = self._drop(name)
            self._free_unreferenced()
            return found

    def _drop(self, name: str) -> bool:
        cursor = self._cursors.pop(name, None)
        if cursor is None:
            return False
        cursor.dropped = True
        return True

    def drop_slow_cursors(self, limit: int) -> list[str]:
        """Drop cursors pinning the oldest checkpoints until memory is at most ``limit``.

        Returns the names dropped. Stops at the checkpoint holding the persistence cursor:
        what it has not flushed yet cannot be freed.
        """
        dropped: list[str] = []
        with self._lock:
            while self.memory_used > limit and len(self._checkpoints) > 1:
                head = self._checkpoints[0]
                in_head = [c for c in self._cursors.values() if c.checkpoint is head]
                if head.is_open or any(c.name == PERSISTENCE_CURSOR for c in in_head):
                    break
                for cursor in in_head:
                    self._drop(cursor.name)
                    dropped.append(cursor.name)
                self._free_unreferenced()
        return dropped

    def reset(self, high_seqno: int) -> None:
        """Forget everything queued (rollback, reload): every cursor but the flusher's drops."""
        with self._lock:
            for name in [n for n in self._cursors if n != PERSISTENCE_CURSOR]:
                self._drop(name)
            self._checkpoints.clear()
            self.memory_used = 0
            self.high_seqno = high_seqno
            ckpt = self._open_new(high_seqno + 1, high_seqno)
            self.persistence_cursor.checkpoint, self.persistence_cursor.pos = ckpt, 0

    # -- reading ---------------------------------------------------------------------------

    def remaining(self, cursor: Cursor) -> int:
        with self._lock:
            if cursor.dropped:
                return 0
            total, seen = 0, False
            for ckpt in self._checkpoints:
                if ckpt is cursor.checkpoint:
                    seen = True
                    total += len(ckpt) - cursor.pos
                elif seen:
                    total += len(ckpt)
            return total

    def read(self, cursor: Cursor, max_items: int) -> Snapshot | None:
        with self._lock:
            if cursor.dropped:
                raise CursorDropped(cursor.name)
            if cursor.checkpoint.is_open:
                return self._read_open(cursor)
            self._skip_read_checkpoints(cursor)
            ckpt = cursor.checkpoint
            if cursor.pos >= len(ckpt):
                return None
            at_start = cursor.pos == 0
            ckpt_snap_start = ckpt.snap_start
            collected: dict[object, Item] = {}
            while True:
                _collect(collected, ckpt.items[cursor.pos :])
                cursor.pos = len(ckpt)
                end, high, last_start = ckpt.snap_end, ckpt.seqnos[-1], ckpt.snap_start
                if ckpt.is_open or not self._advance(cursor) or len(collected) >= max_items:
                    break
                ckpt = cursor.checkpoint
                if not len(ckpt):
                    break
            self._free_unreferenced()
            if not collected:
                return None
            items = list(collected.values())
            return _snapshot(cursor, items, at_start, ckpt_snap_start, (last_start, end, high))

    def _read_open(self, cursor: Cursor) -> Snapshot | None:
        """:meth:`read` of a cursor in the open checkpoint (a live reader's every read and the
        flusher's): one slice, nothing to cross or free, and no dedup when the slots read hold
        each key once (a single new item; or a read from beyond ``last_kept``, since the
        queue empties every other older slot): the same items, without a dict per read."""
        ckpt, pos = cursor.checkpoint, cursor.pos
        slots = ckpt.items
        if pos >= len(slots):
            return None
        cursor.pos = len(slots)
        if cursor.pos == pos + 1:
            items = [] if (one := slots[pos]) is None else [one]
        elif pos > ckpt.last_kept:
            items = [item for item in slots[pos:] if item is not None]
        else:
            collected: dict[object, Item] = {}
            _collect(collected, slots[pos:])
            items = list(collected.values())
        if not items:
            return None
        last = (ckpt.snap_start, ckpt.snap_end, ckpt.seqnos[-1])
        return _snapshot(cursor, items, pos == 0, ckpt.snap_start, last)

    def _skip_read_checkpoints(self, cursor: Cursor) -> None:
        while cursor.pos >= len(cursor.checkpoint) and not cursor.checkpoint.is_open:
            if not self._advance(cursor):
                break

    def _advance(self, cursor: Cursor) -> bool:
        """Move a cursor at the end of a closed checkpoint to the start of the next one."""
        idx = self._index_of(cursor.checkpoint)
        if idx + 1 >= len(self._checkpoints):
            return False
        cursor.checkpoint, cursor.pos = self._checkpoints[idx + 1], 0
        return True

    def _index_of(self, ckpt: Checkpoint) -> int:
        for i, c in enumerate(self._checkpoints):
            if c is ckpt:
                return i
        raise LookupError("cursor in a freed checkpoint")


_OWN_SLOT = (SyncWriteItem, CommitItem)


def _collect(into: dict[object, Item], slots: Iterable[Item | None]) -> None:
    # Re-inserting a key moves it to the end: the dict stays in ascending seqno order. A
    # prepare, an abort or a commit has a key of its own (its seqno): it is not replaced by its
    # key's later versions, so a SyncWrite reader sees every prepare completed
    # (CheckpointManager.queue_sync); a plain reader's stream drops a superseded commit.
    for item in slots:
        if item is not None:
            key: object = item.by_seqno if isinstance(item, _OWN_SLOT) else item.key
            into.pop(key, None)
            into[key] = item


def _snapshot(
    cursor: Cursor,
    items: list[Item],
    at_start: bool,
    first_snap_start: int,
    last: tuple[int, int, int],
) -> Snapshot:
    """The snapshot a read returns: ``items`` (in seqno order) read from a checkpoint whose
    start is ``first_snap_start`` (from its first slot if ``at_start``) up to one whose
    (snap_start, snap_end, last seqno) is ``last``."""
    last_start, end, high = last
    if cursor._first:
        start = cursor.start_seqno
    elif at_start:
        start = first_snap_start
    else:
        start = items[0].by_seqno
    cursor._first = False
    if high < end:
        # Part of a replica snapshot still arriving: the state is only consistent at
        # ``end``, so the range must reach back to the marker's start.
        start = min(start, last_start)
    return Snapshot(start, end, items, at_start, high)
