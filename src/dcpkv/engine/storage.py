"""The storage seam: what a bucket asks of its storage engine, and the types they share.

Theory of operation
-------------------
A :class:`~dcpkv.engine.bucket.Bucket` keeps its data through :class:`BucketStorage`, which
:class:`~dcpkv.engine.rocks_storage.RocksStorage` implements (docs/storage.md). This module
holds what any engine behind the seam shares with its callers:

==========================  ====================================================================
:class:`VBState`            what storage keeps about a vbucket besides its documents
:data:`Row`, StreamRow      a version as a backfill reads it (plain, or packed for a DCP stream)
:class:`BackfillScan`       an open disk snapshot of one vbucket, read in seqno order
:class:`StorageReads`       the reads derived from an engine's own ``open_backfill``
sync-write helpers          how a flush's batch splits into committed items and the last word
                            per key on its SyncWrite prepare (``split_sync_writes``,
                            ``abort_row``, ``completion``)
:class:`BucketLock`         one process per bucket's files
errors                      :class:`StorageError` and its kinds
==========================  ====================================================================

What is kept for rollback and what compaction may purge is decided in
:mod:`dcpkv.engine.retention`; a data folder written by the SQLite engine of earlier versions is
read by :mod:`dcpkv.engine.sqlite_reader` and converted by :mod:`dcpkv.engine.migrate`.

Unsigned 64-bit CAS values travel in rows as signed 64-bit integers (two's complement), as
RocksDB's records and the SQLite engine's files keep them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from dcpkv.core.errors import DcpkvError
from dcpkv.engine.item import AbortItem, CommitItem, Item, PrepareItem, SyncWriteItem

_DELETED, _EXPIRED = 1, 2  # a row's `deleted` field: 0 live, 1 deleted, 2 deleted by expiry
_U32 = 0xFFFFFFFF
# The flusher's cache (the engine's block cache; memtables are sized from it): between 2 MB
# and 16 MiB, 1/16 of the bucket's quota (storage_cache_bytes).
MIN_CACHE_BYTES = 2_048_000
MAX_CACHE_BYTES = 16 << 20


class StorageError(DcpkvError):
    """Storage could not be opened or used."""


class CorruptDatabaseError(StorageError):
    """The database file is not a (readable) dcpkv database."""


class BucketInUseError(StorageError):
    """Another process holds the bucket's files (a running server, a compaction)."""


class BucketLock:
    """An exclusive, advisory lock on ``<folder>/<bucket>.lock`` for the life of a process.

    Two processes serving one bucket's files would each believe they own the write queue, the
    failover table and the clean-shutdown flag. The lock makes the second one fail at once
    with a clear message. The kernel drops it when the process dies, so a kill -9 never leaves
    a stale lock behind.
    """

    def __init__(self, folder: Path, bucket: str) -> None:
        self.path = Path(folder) / f"{bucket}.lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise BucketInUseError(
                f"bucket {bucket!r} in {folder} is in use by another process (lock {self.path})"
            ) from None

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1


@dataclass(slots=True)
class VBState:
    """What storage keeps about a vbucket besides its documents."""

    state: str
    failover_json: str
    high_seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    purge_seqno: int = 0
    max_cas: int = 0
    history_start: int = 0  # owned by storage: ignored when persisted
    # Live documents as of ``high_seqno`` (None: not recorded, as in a state converted from
    # the SQLite engine: the engine then counts its key index). Kept with the state: warm-up
    # under full eviction starts from it.
    item_count: int | None = None
    # SyncWrites: the high prepared seqno as of ``high_seqno`` (a lower bound: every prepare at
    # or below it is persisted), so a restarted replica reports and acknowledges it at once
    # (0: not recorded).
    high_prepared_seqno: int = 0
    # The highest prepare completed (committed or aborted) as of ``high_seqno``: what a disk
    # snapshot's V2 marker carries (0: not recorded).
    high_completed_seqno: int = 0


@dataclass(frozen=True, slots=True)
class CompactResult:
    purged: int
    purge_seqno: int


# A version as a backfill reads it: (key, by_seqno, cas, rev_seqno, flags, expiry, datatype,
# deleted, delete_time, value). ``cas`` is the signed 64-bit form (two's complement of the
# u64), ``deleted`` is 0, DELETED or EXPIRED.
Row = tuple[bytes, int, int, int, int, int, int, int, int, bytes]
DELETED, EXPIRED = _DELETED, _EXPIRED
# The same row as a DCP stream reads it (:meth:`BucketStorage.open_stream_backfill`): seven
# columns for ten, because every column is one Python object built per row, and building them
# is most of a backfill's read. (key, by_seqno, cas, rev_seqno, flags << 32 | expiry,
# datatype | deleted << 8 | delete_time << 10, value): the fourth is signed 64-bit, big-endian
# the very eight bytes of flags and expiry on the wire; the fifth is the datatype alone for a
# live row.
StreamRow = tuple[bytes, int, int, int, int, int, bytes]
R = TypeVar("R", Row, StreamRow)


class BackfillScan(Protocol[R]):
    """An open disk snapshot of one vbucket, ``start`` (exclusive) .. ``end``, latest version
    per key, read in seqno order (one thread at a time)."""

    start: int
    end: int
    purge_seqno: int
    high_completed_seqno: int  # as of ``end`` (0: not known)
    exhausted: bool  # read to its end (and then closed)
    # the pending prepares and the aborts in the range, in seqno order, read with the snapshot
    # (asked for: a SyncWrite consumer's backfill; else empty)
    prepares: list[PrepareItem | AbortItem]

    @property
    def closed(self) -> bool:
        """Its snapshot let go (closed, or read to its end)."""
        ...

    def read(self, n: int) -> list[R]:
        """Up to ``n`` more rows; fewer means the snapshot is read to its end."""
        ...

    def close(self) -> None: ...


class BucketStorage(Protocol):
    """The storage seam: what a :class:`~dcpkv.engine.bucket.Bucket` asks of its engine
    (:class:`~dcpkv.engine.rocks_storage.RocksStorage`)."""

    path: Path
    history_window: int

    def reading(self, what: str) -> contextlib.AbstractContextManager[None]: ...
    def was_clean_shutdown(self) -> bool: ...
    def set_clean_shutdown(self, clean: bool) -> None: ...
    def vbucket_states(self) -> dict[int, VBState]: ...
    def vbucket_state(self, vb: int) -> VBState | None: ...
    def set_vbucket_state(self, vb: int, vbstate: VBState) -> None: ...
    def delete_vbucket(self, vb: int) -> None: ...
    def get(self, vb: int, key: bytes) -> Item | None: ...
    def get_many(self, keys: list[tuple[int, bytes]]) -> list[Item | None]: ...
    def may_exist(self, vb: int, key: bytes) -> bool: ...
    def load_items(self, vb: int, *, values: bool = True) -> Iterator[Item]: ...
    def load_prepares(self, vb: int) -> list[PrepareItem]: ...
    def item_count(self, vb: int) -> int: ...
    def persist(self, batches: Iterable[tuple[int, Iterable[Item], VBState]]) -> None: ...
    def persist_snapshot(self, vb: int, items: Iterable[Item], vbstate: VBState) -> None: ...
    def scan_by_seqno(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> Iterator[Item]: ...
    def backfill(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> Backfill: ...
    def open_backfill(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> BackfillScan[Row]: ...
    def open_stream_backfill(
        self,
        vb: int,
        start_exclusive: int,
        end_inclusive: int | None = None,
        *,
        prepares: bool = False,
    ) -> BackfillScan[StreamRow]: ...
    def rollback(self, vb: int, seqno: int) -> int: ...
    def flush_points(self, vb: int) -> list[int]: ...
    def history(self, vb: int) -> list[tuple[bytes, int, int]]: ...
    def divergence(self, vb: int, seqno: int) -> list[tuple[Row, Row | None]]: ...
    def compact(
        self,
        vb: int,
        *,
        purge_before_seqno: int | None = None,
        purge_older_than_secs: float | None = None,
        now: float | None = None,
    ) -> CompactResult: ...
    def close(self) -> None: ...


def row_of_stream_row(row: StreamRow) -> Row:
    """The :data:`Row` a :data:`StreamRow` was read from."""
    key, seqno, cas, rev, flags_expiry, packed, value = row
    flags, expiry = (flags_expiry >> 32) & _U32, flags_expiry & _U32
    return (key, seqno, cas, rev, flags, expiry, packed & 0xFF, (packed >> 8) & 3, packed >> 10,
            value)  # fmt: skip


def item_from_row(row: Row) -> Item:
    """The :class:`Item` of a raw row (see :data:`Row`)."""
    return _item(row)


@dataclass(slots=True)
class Backfill:
    """A consistent disk snapshot ``start`` (exclusive) .. ``end``, latest version per key."""

    start: int
    end: int
    purge_seqno: int
    items: Iterator[Item]


def storage_cache_bytes(memory_quota: int) -> int:
    """The engine's cache for a bucket of ``memory_quota`` bytes (:data:`MIN_CACHE_BYTES`)."""
    return max(MIN_CACHE_BYTES, min(MAX_CACHE_BYTES, memory_quota // 16))


def _u64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


def _item(row: tuple) -> Item:
    key, by_seqno, cas, rev, flags, expiry, datatype, deleted, delete_time, value = row
    return Item(
        key, bytes(value), flags, expiry, _u64(cas), rev, by_seqno, datatype,
        bool(deleted), delete_time, deleted == _EXPIRED,
    )  # fmt: skip


def split_sync_writes(
    items: Iterable[Item], last: dict[bytes, PrepareItem | None],
    ended: dict[bytes, int] | None = None,
) -> list[Item]:  # fmt: skip
    """The committed items of a flush's batch (what the documents get); each key's last
    SyncWrite word goes to ``last`` (shared by a vbucket's batches of one flush, so the flush's
    last word per key wins): its pending prepare, or None when its prepare completed (a
    commit, an abort) and the stored prepare is to be deleted. ``ended`` (given):
    each key whose prepare completed, with the seqno of its last completion."""
    committed: list[Item] = []
    for item in items:
        if isinstance(item, PrepareItem):
            last[item.key] = item
            continue
        if isinstance(item, AbortItem):
            last[item.key] = abort_row(item)
        elif isinstance(item, CommitItem):
            last[item.key] = None
        if ended is not None and isinstance(item, AbortItem | CommitItem):
            ended[item.key] = item.by_seqno
        if not isinstance(item, SyncWriteItem):
            committed.append(item)
    return committed


def abort_row(abort: AbortItem) -> PrepareItem:
    """An abort as the engine's prepares keep it: level 0, its seqno, CAS and key, the
    aborted prepare's seqno in the rev seqno's place. It replaces its prepare's row, so
    a SyncWrite consumer's disk backfill can send it (a replica that held the prepare must
    drop it); a later prepare of the key replaces it in turn, a commit deletes it."""
    return PrepareItem(
        abort.key, b"", 0, 0, abort.cas, abort.prepared_seqno, abort.by_seqno, level=0
    )


def completion(row: PrepareItem) -> PrepareItem | AbortItem:
    """A prepares-table row as its item: a pending prepare, or an abort (:func:`abort_row`)."""
    if row.level:
        return row
    return AbortItem(row.key, b"", 0, 0, row.cas, 0, row.by_seqno, prepared_seqno=row.rev_seqno)


def has_sync_writes(items: Sequence[Item]) -> bool:
    """Whether a batch holds any SyncWrite item (only then is it split)."""
    return any(isinstance(i, SyncWriteItem | CommitItem) for i in items)


class StorageReads:
    """What an engine derives from its own :meth:`open_backfill` and :meth:`persist`."""

    def open_backfill(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> BackfillScan[Row]:
        raise NotImplementedError

    def persist(self, batches: Iterable[tuple[int, Iterable[Item], VBState]]) -> None:
        raise NotImplementedError

    def persist_snapshot(self, vb: int, items: Iterable[Item], vbstate: VBState) -> None:
        """Write one snapshot and the vbucket's state."""
        self.persist([(vb, items, vbstate)])

    def scan_by_seqno(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> Iterator[Item]:
        """Latest version of each key with start < by_seqno <= end, in seqno order."""
        return self.backfill(vb, start_exclusive, end_inclusive).items

    def backfill(self, vb: int, start_exclusive: int, end_inclusive: int | None = None) -> Backfill:
        """A consistent disk snapshot; ``end`` defaults to the persisted high seqno."""
        scan = self.open_backfill(vb, start_exclusive, end_inclusive)
        return Backfill(scan.start, scan.end, scan.purge_seqno, _items(scan))


def _items(scan: BackfillScan[Row]) -> Iterator[Item]:
    try:
        while rows := scan.read(512):
            for row in rows:
                yield _item(row)
    finally:
        scan.close()
