"""Embedded, crash-safe storage for a bucket: one SQLite database in WAL mode.

Theory of operation
-------------------
One file, ``<folder>/<bucket>.sqlite3``, holds every vbucket of a bucket (a ``vb`` column),
so that one flush of many vbuckets is one transaction and one fsync (measured by
``bench/engine.py``: a database per vbucket costs a commit, an fsync and a file handle per
vbucket per flush, for no gain in a process that flushes from one thread).

Tables
    ``documents``  the latest version of every key (tombstones included), PK (vb, key), and
                   an index on (vb, by_seqno): a disk backfill is a range scan of that index.
    ``history``    versions replaced by a flush, with the seqno that replaced them, kept for a
                   window of the last ``history_window`` seqnos per vbucket (trimmed every
                   quarter window, so up to 1.25 windows): what a replica needs to roll back.
                   Indexed on (vb, replaced_by) only: a rollback reads the history above its
                   point in one scan. A (vb, key) index cost every flush of updates a
                   scattered page per key: 24.4 vs 16.2 us of flusher CPU and 16.3 vs 8.9 kB
                   written per updated item (100k keys, 6,000-item flushes).
    ``flush_points`` the high seqno of committed flushes inside the window: the states the
                   disk actually went through, hence the only exact rollback targets. Every
                   flush of the newest stride (``history_window // FLUSH_POINT_STRIDES``
                   seqnos) is kept; below it, the newest of each stride (see Rollback).
    ``vbstate``    per vbucket: state, failover table (JSON), persisted high seqno, the
                   persisted snapshot range, purge seqno, max CAS, and ``history_start``
                   (rollback to any flush point at or above it is exact).
    ``meta``       one row: format version and the ``clean_shutdown`` flag.
    ``prepares``   the pending SyncWrite prepares, PK (vb, key), with their durability level:
                   a flushed prepare is written here, never over its key's committed
                   ``documents`` row; its commit (a committed document) deletes it, its abort
                   replaces it (level 0, :func:`abort_row`). Warm-up reads the prepares back
                   (:meth:`Storage.load_prepares`); a SyncWrite consumer's backfill reads both
                   (``open_stream_backfill(prepares=True)``), a plain one neither.

Durability. :meth:`Storage.persist` writes the items of one or more snapshots, the vbucket
states and failover tables in ONE transaction, so the disk moves from one complete snapshot to
the next or not at all. The journal is WAL with ``synchronous=FULL`` by default: every commit
fsyncs the WAL, so a flush acknowledged as persisted survives not just kill -9 of the process
(``NORMAL`` would already give that, as the WAL write is in the kernel before commit returns)
but an OS crash or power cut too, which is what "persisted" promises to a client that waits for
persistence (observe-seqno). A flush is one transaction for all vbuckets, so the fsync is paid
once per flush, not per item: the measured cost of FULL over NORMAL is small.

The WAL is copied back into the database (a checkpoint, run by the commit that passes the
limit) every ``WAL_AUTOCHECKPOINT_PAGES`` pages rather than SQLite's 1,000: a flush of random
keys dirties most leaf pages of ``documents``, so with a 4 MiB WAL every flush was followed by
a checkpoint writing all those pages a second time; with 64 MiB, a page rewritten by several
flushes reaches the database once (measured: flush CPU -7 to -10 %, its commit -40 %). The
cost is disk, not memory: the WAL file grows to that size (and is read through on recovery).

Cache. The flusher's connection keeps 1/16 of the bucket's memory quota of pages (between
SQLite's default 2 MB and 16 MiB: :func:`storage_cache_bytes`): a flush upserts keys all over
the ``documents`` tree, and with 16 MiB instead of 2 MB a flush of 200,000 new keys costs 15 %
less CPU (updates 5-10 %), fewer pages read back from the OS. It is bounded by the quota so a
small bucket stays small (the quota's RSS margin, docs/server.md).

Rollback. Before a flush overwrites a key it copies the old row to ``history`` with the new
row's seqno as ``replaced_by``. Rolling back to seqno R picks the newest flush point C <= R;
every key changed after C gets back the version whose replacement came first after C (or is
removed when it had none: it did not exist at C). A flush adds one point per vbucket it
touches: at 10k writes/s over 1,024 vbuckets, 20 flushes a second, a window of 100k seqnos
held ~100M points after three hours, each flush writing one more page per vbucket. So points
older than the newest stride are thinned (every stride of seqnos, per vbucket) to the newest
of each stride, plus ``history_start``'s: at most ~80 old points per vbucket. A rollback to a
recent R still lands on the newest flush at or below it; an older R lands up to one stride
lower (still exact: the history covers the window), which only means re-streaming those
seqnos. When C is older than the retained window, the
vbucket is emptied and the answer is 0.

Compaction removes tombstones (by seqno or age) and raises the purge seqno: a DCP consumer
resuming from below it might miss a deletion and must roll back to 0.

Threads. Writes (persist, rollback, compact, state) must come from one thread at a time, the
flusher's; a lock enforces it. Point reads (:meth:`Storage.get`, a value fetch for an ejected
item) use a second connection under its own lock and may come from any thread; WAL lets them
run beside a flush. A backfill (:meth:`Storage.open_backfill`, and :meth:`Storage.backfill` /
:meth:`Storage.scan_by_seqno` built on it) opens its own connection and reads inside one
transaction, a consistent snapshot of the disk however long the stream takes; that connection
may be used from any one thread at a time (a DCP backfill reads it in a worker thread).

Unsigned 64-bit CAS values are stored as SQLite's signed 64-bit integers (two's complement).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from dcpkv.core.errors import DcpkvError
from dcpkv.engine import retention
from dcpkv.engine.item import AbortItem, CommitItem, Item, PrepareItem, SyncWriteItem
from dcpkv.engine.retention import DEFAULT_HISTORY_WINDOW

FORMAT_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL,
    clean_shutdown INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    vb INTEGER NOT NULL, key BLOB NOT NULL, by_seqno INTEGER NOT NULL, cas INTEGER NOT NULL,
    rev_seqno INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL,
    datatype INTEGER NOT NULL, deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (vb, key)
);
CREATE INDEX IF NOT EXISTS documents_by_seqno ON documents (vb, by_seqno);
CREATE TABLE IF NOT EXISTS history (
    vb INTEGER NOT NULL, key BLOB NOT NULL, by_seqno INTEGER NOT NULL, cas INTEGER NOT NULL,
    rev_seqno INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL,
    datatype INTEGER NOT NULL, deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL,
    value BLOB NOT NULL, replaced_by INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS history_replaced ON history (vb, replaced_by);
CREATE TABLE IF NOT EXISTS flush_points (
    vb INTEGER NOT NULL, seqno INTEGER NOT NULL, PRIMARY KEY (vb, seqno)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS prepares (
    vb INTEGER NOT NULL, key BLOB NOT NULL, by_seqno INTEGER NOT NULL, cas INTEGER NOT NULL,
    rev_seqno INTEGER NOT NULL, flags INTEGER NOT NULL, expiry INTEGER NOT NULL,
    datatype INTEGER NOT NULL, deleted INTEGER NOT NULL, delete_time INTEGER NOT NULL,
    value BLOB NOT NULL, level INTEGER NOT NULL,
    PRIMARY KEY (vb, key)
);
CREATE TABLE IF NOT EXISTS vbstate (
    vb INTEGER PRIMARY KEY, state TEXT NOT NULL, failover TEXT NOT NULL,
    high_seqno INTEGER NOT NULL, snap_start INTEGER NOT NULL, snap_end INTEGER NOT NULL,
    purge_seqno INTEGER NOT NULL, max_cas INTEGER NOT NULL, history_start INTEGER NOT NULL
);
"""

# The sqlite3 module binds int, float, str and bytearray parameters as they are, but sends any
# other type, bytes included, through its adapter lookup first: a tuple built, a registry
# miss, then two failed attribute lookups (``__adapt__``, ``__conform__``), ~110 ns per key and
# per value, with the GIL held (the flusher binds two per document). An adapter registered for
# bytes is found at the first step; ``bytes(b)`` returns ``b`` itself. (Process-wide, and
# harmless: the value bound is the same object.)
sqlite3.register_adapter(bytes, bytes)

_DOC_COLUMNS = "key, by_seqno, cas, rev_seqno, flags, expiry, datatype, deleted, delete_time, value"
_DELETED, _EXPIRED = 1, 2  # the `deleted` column: 0 live, 1 deleted, 2 deleted by expiry
_LIVE_COLUMNS = "key, by_seqno, cas, rev_seqno, flags, expiry, datatype, value"
_TWO_64 = 1 << 64


class StorageError(DcpkvError):
    """Storage could not be opened or used."""


class CorruptDatabaseError(StorageError):
    """The database file is not a (readable) dcpkv database."""


class BucketInUseError(StorageError):
    """Another process holds the bucket's files (a running server, a compaction)."""


class BucketLock:
    """An exclusive, advisory lock on ``<folder>/<bucket>.lock`` for the life of a process.

    SQLite would let two processes open one bucket file, but two engines would each believe
    they own the write queue, the failover table and the clean-shutdown flag. The lock makes
    the second one fail at once with a clear message. The kernel drops it when the process
    dies, so a kill -9 never leaves a stale lock behind.
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
    # Live documents as of ``high_seqno`` (None: not recorded). The RocksDB engine keeps it
    # with the state (warm-up under full eviction starts from it); SQLite counts its rows.
    item_count: int | None = None
    # SyncWrites: the high prepared seqno as of ``high_seqno`` (a lower bound: every prepare at
    # or below it is persisted), so a restarted replica reports and acknowledges it at once.
    # Kept by the RocksDB engine; SQLite reads back 0.
    high_prepared_seqno: int = 0
    # The highest prepare completed (committed or aborted) as of ``high_seqno``: what a disk
    # snapshot's V2 marker carries (RocksDB; SQLite reads back 0).
    high_completed_seqno: int = 0


@dataclass(frozen=True, slots=True)
class CompactResult:
    purged: int
    purge_seqno: int


# A raw ``documents`` row as a backfill reads it: (key, by_seqno, cas, rev_seqno, flags,
# expiry, datatype, deleted, delete_time, value). ``cas`` is the signed 64-bit form SQLite keeps
# (two's complement of the u64), ``deleted`` is 0, DELETED or EXPIRED.
Row = tuple[bytes, int, int, int, int, int, int, int, int, bytes]
DELETED, EXPIRED = _DELETED, _EXPIRED
# The same row as a DCP stream reads it (:meth:`Storage.open_stream_backfill`): seven columns
# for ten, because every column is one Python object built per row, and building them is most
# of a backfill's read. (key, by_seqno, cas, rev_seqno, flags << 32 | expiry, datatype |
# deleted << 8 | delete_time << 10, value): the fourth is signed 64-bit, big-endian the very
# eight bytes of flags and expiry on the wire; the fifth is the datatype alone for a live row.
StreamRow = tuple[bytes, int, int, int, int, int, bytes]
_STREAM_COLUMNS = (
    "key, by_seqno, cas, rev_seqno, (flags << 32) | expiry,"
    " datatype | (deleted << 8) | (delete_time << 10), value"
)
_U32 = 0xFFFFFFFF
R = TypeVar("R", Row, StreamRow)


class BackfillScan(Protocol[R]):
    """An open disk snapshot of one vbucket, ``start`` (exclusive) .. ``end``, latest version
    per key, read in seqno order (either engine's; one thread at a time)."""

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
    (:class:`Storage`, SQLite, or :class:`~dcpkv.engine.rocks_storage.RocksStorage`)."""

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


class SqliteScan(Generic[R]):
    """An open disk snapshot of one vbucket: ``start`` (exclusive) .. ``end``, latest version
    per key, read in seqno order by :meth:`read` inside one read transaction.

    Not thread-safe: one thread at a time (any thread). :meth:`close` ends the transaction;
    reading to the end closes it too, so a finished scan pins no WAL frames.
    """

    __slots__ = (
        "_conn", "_cursor", "end", "exhausted", "high_completed_seqno", "prepares",
        "purge_seqno", "start",
    )  # fmt: skip

    def __init__(
        self, conn: sqlite3.Connection, columns: str, vb: int, start: int, end: int, purge: int
    ) -> None:
        self.start, self.end, self.purge_seqno = start, end, purge
        self.high_completed_seqno = 0  # (not kept by this engine)
        self.prepares: list[PrepareItem | AbortItem] = []
        self._conn: sqlite3.Connection | None = conn
        self._cursor = conn.execute(
            f"SELECT {columns} FROM documents WHERE vb = ? AND by_seqno > ?"
            " AND by_seqno <= ? ORDER BY by_seqno",
            (vb, start, end),
        )
        self.exhausted = False

    @property
    def closed(self) -> bool:
        return self._conn is None

    def read(self, n: int) -> list[R]:
        """Up to ``n`` more rows; fewer means the snapshot is read to its end (and closed)."""
        if self._conn is None:
            return []
        rows = self._cursor.fetchmany(n)
        if len(rows) < n:
            self.exhausted = True
            self.close()
        return rows

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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
    """The flusher's page cache for a bucket of ``memory_quota`` bytes (module docstring)."""
    return max(MIN_CACHE_BYTES, min(MAX_CACHE_BYTES, memory_quota // 16))


def _s64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _u64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


def _row(vb: int, item: Item) -> tuple[object, ...]:
    deleted = (_EXPIRED if item.expired else _DELETED) if item.deleted else 0
    value = item.value if item.value is not None else b""
    return (
        vb, item.key, item.by_seqno, _s64(item.cas), item.rev_seqno, item.flags, item.expiry,
        item.datatype, deleted, item.delete_time, value,
    )  # fmt: skip


def _item(row: tuple) -> Item:
    key, by_seqno, cas, rev, flags, expiry, datatype, deleted, delete_time, value = row
    return Item(
        key, bytes(value), flags, expiry, _u64(cas), rev, by_seqno, datatype,
        bool(deleted), delete_time, deleted == _EXPIRED,
    )  # fmt: skip


def _prepare(row: tuple) -> PrepareItem:
    key, by_seqno, cas, rev, flags, expiry, datatype, deleted, delete_time, value, level = row
    return PrepareItem(
        key, bytes(value), flags, expiry, _u64(cas), rev, by_seqno, datatype,
        bool(deleted), delete_time, False, level,
    )  # fmt: skip


def split_sync_writes(
    items: Iterable[Item], last: dict[bytes, PrepareItem | None],
    ended: dict[bytes, int] | None = None,
) -> list[Item]:  # fmt: skip
    """The committed items of a flush's batch (what the documents get), for both engines; each
    key's last SyncWrite word goes to ``last`` (shared by a vbucket's batches of one flush, so
    the flush's last word per key wins): its pending prepare, or None when its prepare
    completed (a commit, an abort) and the stored prepare is to be deleted. ``ended`` (given):
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
    """An abort as the prepares table keeps it (both engines): level 0, its seqno, CAS and
    key, the aborted prepare's seqno in the rev seqno's place. It replaces its prepare's row, so
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


def _vbstate_row(vb: int, s: VBState) -> tuple[object, ...]:
    return (
        vb, s.state, s.failover_json, s.high_seqno, s.snap_start, s.snap_end, s.purge_seqno,
        _s64(s.max_cas),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _MultiRow:
    """A statement taking many rows at once: ``{rows}`` in ``sql`` becomes ``group`` (the
    placeholders of one row) repeated once per row."""

    sql: str
    group: str

    def text(self, rows: int) -> str:
        return _multirow_text(self.sql, self.group, rows)


@functools.cache
def _multirow_text(sql: str, group: str, rows: int) -> str:
    return sql.format(rows=", ".join([group] * rows))


def _placeholders(n: int, *literals: str) -> str:
    return "(" + ", ".join(["?"] * n + list(literals)) + ")"


# A flush writes each document with an upsert, whose UPDATE of an existing row (rather than
# REPLACE's delete and insert) leaves the (vb, key) index alone. When history is kept, a
# trigger on that UPDATE copies the version it replaces into history, tagged with its
# replacer: no second statement joins the new rows with the old ones, and the flusher binds
# each row once. The trigger is TEMP (this connection only, never in the file) and fires on
# UPDATE alone, which only this upsert does to ``documents`` (a rollback's restore REPLACEs
# and DELETEs, which fire no UPDATE trigger).
_DOCS_UPSERT = _MultiRow(
    f"INSERT INTO documents (vb, {_DOC_COLUMNS}) VALUES {{rows}} ON CONFLICT (vb, key) DO UPDATE"
    " SET " + ", ".join(f"{c} = excluded.{c}" for c in _DOC_COLUMNS.split(", ")[1:]),
    _placeholders(11),
)
_KEEP_HISTORY = (
    "CREATE TEMP TRIGGER IF NOT EXISTS keep_history BEFORE UPDATE ON main.documents BEGIN"
    f" INSERT INTO history (vb, {_DOC_COLUMNS}, replaced_by) VALUES (OLD.vb,"
    f" {', '.join('OLD.' + c for c in _DOC_COLUMNS.split(', '))}, NEW.by_seqno); END"
)
_VBSTATE_UPSERT = _MultiRow(  # history_start is 0 for a new row; storage owns it after that
    "INSERT INTO vbstate (vb, state, failover, high_seqno, snap_start, snap_end, purge_seqno,"
    " max_cas, history_start) VALUES {rows}"
    " ON CONFLICT (vb) DO UPDATE SET state = excluded.state,"
    " failover = excluded.failover, high_seqno = excluded.high_seqno,"
    " snap_start = excluded.snap_start, snap_end = excluded.snap_end,"
    " purge_seqno = max(purge_seqno, excluded.purge_seqno), max_cas = excluded.max_cas",
    _placeholders(8, "0"),
)
_FLUSH_POINTS_INSERT = _MultiRow(
    "INSERT OR IGNORE INTO flush_points VALUES {rows}", _placeholders(2)
)
_TRIM_START = _MultiRow(
    "WITH c(vb, cutoff) AS (VALUES {rows}) UPDATE vbstate SET history_start = max(history_start,"
    " coalesce((SELECT max(f.seqno) FROM c JOIN flush_points f ON f.vb = c.vb"
    " WHERE c.vb = vbstate.vb AND f.seqno <= c.cutoff), 0)) WHERE vb IN (SELECT vb FROM c)",
    _placeholders(2),
)
_TRIM_HISTORY = _MultiRow(
    "WITH c(vb) AS (VALUES {rows}) DELETE FROM history WHERE rowid IN (SELECT h.rowid FROM c"
    " JOIN vbstate s ON s.vb = c.vb JOIN history h ON h.vb = c.vb"
    " AND h.replaced_by <= s.history_start)",
    _placeholders(1),
)
# Thinning (module docstring, Rollback): of the points below (vb, cutoff), keep the newest of
# each stride of seqnos (the third value) and history_start's; delete the others.
_THIN_POINTS = _MultiRow(
    "WITH c(vb, cutoff, stride) AS (VALUES {rows}), ranked AS (SELECT f.vb, f.seqno,"
    " row_number() OVER (PARTITION BY f.vb, f.seqno / c.stride ORDER BY f.seqno DESC) AS n"
    " FROM c JOIN vbstate s ON s.vb = c.vb JOIN flush_points f ON f.vb = c.vb"
    " AND f.seqno < c.cutoff AND f.seqno <> s.history_start)"
    " DELETE FROM flush_points WHERE (vb, seqno) IN (SELECT vb, seqno FROM ranked WHERE n > 1)",
    _placeholders(3),
)
_TRIM_POINTS = _MultiRow(
    "WITH c(vb) AS (VALUES {rows}) DELETE FROM flush_points WHERE (vb, seqno) IN"
    " (SELECT f.vb, f.seqno FROM c JOIN vbstate s ON s.vb = c.vb JOIN flush_points f"
    " ON f.vb = c.vb AND f.seqno < s.history_start)",
    _placeholders(1),
)
WAL_AUTOCHECKPOINT_PAGES = 16384  # 64 MiB of 4 KiB pages (module docstring, Durability)
# The flusher's page cache (module docstring, Cache): SQLite's default, up to 16 MiB.
MIN_CACHE_BYTES = 2_048_000
MAX_CACHE_BYTES = 16 << 20
_MAX_ROWS = 2048  # rows per statement: 2048 x 11 parameters stays below SQLite's 32766


_flatten = itertools.chain.from_iterable  # the rows' values in one list, at C speed


def _chunked(db: sqlite3.Connection, stmt: _MultiRow, rows: Sequence[tuple[object, ...]]) -> None:
    """Execute ``stmt`` over ``rows``, many rows per statement.

    Chunks are ``_MAX_ROWS`` rows, and the remainder is split into powers of two, so only
    log2(_MAX_ROWS) + 1 distinct texts exist per statement and the connection's statement
    cache prepares each once.
    """
    i, n = 0, len(rows)
    while i < n:
        size = min(_MAX_ROWS, 1 << ((n - i).bit_length() - 1))
        db.execute(stmt.text(size), list(_flatten(rows[i : i + size])))
        i += size


class StorageReads:
    """What both engines derive from their own :meth:`open_backfill` and :meth:`persist`."""

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


class Storage(StorageReads):
    """The database of one bucket (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        history_window: int = DEFAULT_HISTORY_WINDOW,
        synchronous: str = "FULL",
        cache_bytes: int = MIN_CACHE_BYTES,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous}")
        self.path = Path(path)
        self.history_window = history_window
        self._synchronous = synchronous
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open(create=True)
        # Negative: a size in KiB rather than in pages.
        self._db.execute(f"PRAGMA cache_size=-{max(1, cache_bytes // 1024)}")
        if history_window > 0:
            self._db.execute(_KEEP_HISTORY)
        self._reader = self._open(create=False)
        self._trimmed_at: dict[int, int] = {}  # vb -> high seqno of its last history trim
        self._thinned_at: dict[int, int] = {}  # vb -> high seqno of its last point thinning

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    def _open(self, *, create: bool) -> sqlite3.Connection:
        try:
            conn = self._connect()
            if create:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
                conn.executescript(_SCHEMA)
                # Files written before it had a (vb, key, replaced_by) index on history; a
                # rollback no longer reads it (``_versions_at``) and updates paid for it.
                conn.execute("DROP INDEX IF EXISTS history_key")
                conn.execute(
                    "INSERT OR IGNORE INTO meta (id, version, clean_shutdown) VALUES (1, ?, 1)",
                    (FORMAT_VERSION,),
                )
                self._check_meta(conn)
            return conn
        except sqlite3.DatabaseError as exc:
            raise CorruptDatabaseError(f"{self.path}: not a usable dcpkv database ({exc})") from exc

    def _check_meta(self, conn: sqlite3.Connection) -> None:
        row = conn.execute("SELECT version FROM meta WHERE id = 1").fetchone()
        if row is None or row[0] != FORMAT_VERSION:
            raise CorruptDatabaseError(f"{self.path}: unknown format version {row}")

    def close(self) -> None:
        with self._write_lock, self._read_lock:
            self._reader.close()
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- bucket meta -----------------------------------------------------------------------

    def was_clean_shutdown(self) -> bool:
        with self._write_lock:
            row = self._db.execute("SELECT clean_shutdown FROM meta WHERE id = 1").fetchone()
        return bool(row[0])

    def set_clean_shutdown(self, clean: bool) -> None:
        with self._transaction() as db:
            db.execute("UPDATE meta SET clean_shutdown = ? WHERE id = 1", (int(clean),))

    # -- vbucket state ---------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """SQLite errors met while ``what`` become one clear error naming the file (warm-up
        reads a damaged file before it writes anything, so the file is left as it was)."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise CorruptDatabaseError(
                f"{self.path}: {what} cannot read this file ({exc}); it was left untouched: "
                "restore it from a backup, or move it away to start the bucket empty"
            ) from exc

    def vbucket_states(self) -> dict[int, VBState]:
        with self._write_lock:
            rows = self._db.execute(
                "SELECT vb, state, failover, high_seqno, snap_start, snap_end, purge_seqno,"
                " max_cas, history_start FROM vbstate ORDER BY vb"
            ).fetchall()
        return {
            vb: VBState(state, failover, high, snap_start, snap_end, purge, _u64(max_cas), hist)
            for vb, state, failover, high, snap_start, snap_end, purge, max_cas, hist in rows
        }

    def vbucket_state(self, vb: int) -> VBState | None:
        return self.vbucket_states().get(vb)

    def set_vbucket_state(self, vb: int, vbstate: VBState) -> None:
        with self._transaction() as db:
            self._write_vbstate(db, vb, vbstate)

    def _write_vbstate(self, db: sqlite3.Connection, vb: int, s: VBState) -> None:
        _chunked(db, _VBSTATE_UPSERT, [_vbstate_row(vb, s)])

    def delete_vbucket(self, vb: int) -> None:
        with self._transaction() as db:
            self._wipe(db, vb)
            db.execute("DELETE FROM vbstate WHERE vb = ?", (vb,))

    # -- documents -------------------------------------------------------------------------

    def get(self, vb: int, key: bytes) -> Item | None:
        """The persisted version of a key (tombstones included), from any thread."""
        with self._read_lock:
            row = self._reader.execute(
                f"SELECT {_DOC_COLUMNS} FROM documents WHERE vb = ? AND key = ?", (vb, key)
            ).fetchone()
        return _item(row) if row else None

    def get_many(self, keys: list[tuple[int, bytes]]) -> list[Item | None]:
        """:meth:`get` of each (vbucket, key), in order (a background fetch's batch)."""
        return [self.get(vb, key) for vb, key in keys]

    def may_exist(self, vb: int, key: bytes) -> bool:
        """Whether storage may hold ``key`` (without I/O; SQLite cannot tell: True)."""
        return True

    def load_items(self, vb: int, *, values: bool = True) -> Iterator[Item]:
        """Every live (not deleted) document of a vbucket, for warm-up (``values`` False: not
        resident, ``value`` None)."""
        # Only what a live row has (a column is a Python object per row: warm-up's main cost),
        # and the Item built at once, positionally.
        cols = _LIVE_COLUMNS if values else _LIVE_COLUMNS.replace("value", "NULL")
        with self._write_lock:
            rows = self._db.execute(
                f"SELECT {cols} FROM documents WHERE vb = ? AND deleted = 0", (vb,)
            ).fetchall()
        for key, seqno, cas, rev, flags, expiry, datatype, value in rows:
            yield Item(key, value, flags, expiry, cas if cas >= 0 else cas + _TWO_64, rev, seqno,
                       datatype)  # fmt: skip

    def item_count(self, vb: int) -> int:
        """The vbucket's live (not deleted) documents (warm-up under full eviction)."""
        with self._write_lock:
            row = self._db.execute(
                "SELECT count(*) FROM documents WHERE vb = ? AND deleted = 0", (vb,)
            ).fetchone()
        return int(row[0])

    def load_prepares(self, vb: int) -> list[PrepareItem]:
        """The vbucket's persisted pending prepares, in seqno order (warm-up)."""
        with self._write_lock:
            rows = self._db.execute(
                f"SELECT {_DOC_COLUMNS}, level FROM prepares WHERE vb = ? AND level > 0"
                " ORDER BY by_seqno",
                (vb,),
            ).fetchall()
        return [_prepare(row) for row in rows]

    def persist(self, batches: Iterable[tuple[int, Iterable[Item], VBState]]) -> None:
        """Write the snapshots and states of several vbuckets in one transaction.

        A constant number of statements per flush, whatever the number of vbuckets: each
        statement is one ``sqlite3_step``, the only place where the flusher's thread gives up
        the GIL and must win it back. While the event loop is busy, every such handoff waits
        up to the interpreter's switch interval (5 ms), so a flush made of one statement per
        row or per vbucket (thousands) took minutes under DCP load; multi-row statements
        (:func:`_chunked`) make it a few dozen handoffs.
        """
        docs: list[tuple[object, ...]] = []
        states: list[tuple[object, ...]] = []
        points: list[tuple[int, int]] = []
        trims: list[tuple[int, int]] = []
        thins: list[tuple[int, int]] = []
        history = self.history_window > 0
        sync: dict[int, dict[bytes, PrepareItem | None]] = {}
        for vb, items, vbstate in batches:  # (per dirty vbucket: kept to few calls)
            items = list(items)
            if has_sync_writes(items):
                items = split_sync_writes(items, sync.setdefault(vb, {}))
            # One row per key (its latest version): history copies each replaced row once.
            docs += [_row(vb, i) for i in {item.key: item for item in items}.values()]
            states.append(_vbstate_row(vb, vbstate))
            if history:
                points.append((vb, vbstate.high_seqno))
                if self._trim_due(vb, vbstate.high_seqno):
                    trims.append((vb, vbstate.high_seqno))
                if self._thin_due(vb, vbstate.high_seqno):
                    thins.append((vb, vbstate.high_seqno))
        # In (vb, key) order, so consecutive upserts walk the same pages of the (vb, key) tree
        # (5-12 % less SQLite CPU for scattered keys). A vbucket listed twice keeps its rows in
        # seqno order (the tuples' third field): the newest is upserted last and wins.
        docs.sort()
        prepares = [
            (*_row(vb, p), p.level) for vb, last in sync.items() for p in last.values() if p
        ]
        done = [(vb, key) for vb, last in sync.items() for key, p in last.items() if p is None]
        with self._transaction() as db:
            _chunked(db, _DOCS_UPSERT, docs)  # (and the history, by the trigger)
            if done:
                db.executemany("DELETE FROM prepares WHERE vb = ? AND key = ?", done)
            if prepares:
                db.executemany(
                    f"INSERT OR REPLACE INTO prepares (vb, {_DOC_COLUMNS}, level)"
                    f" VALUES {_placeholders(12)}",
                    prepares,
                )
            _chunked(db, _VBSTATE_UPSERT, states)
            _chunked(db, _FLUSH_POINTS_INSERT, points)
            self._trim_history(db, trims)
            self._thin_points(db, thins)
        for vb, high_seqno in trims:
            self._trimmed_at[vb] = high_seqno
        for vb, high_seqno in thins:
            self._thinned_at[vb] = high_seqno

    @property
    def flush_point_stride(self) -> int:
        """Seqnos per stride of thinned flush points (module docstring, Rollback)."""
        return retention.stride(self.history_window)

    def _thin_due(self, vb: int, high_seqno: int) -> bool:
        # Once per stride of seqnos: each run reads the vbucket's points below the cutoff, at
        # most ~80 kept ones plus the two strides that accumulated since the last run.
        return retention.thin_due(self._thinned_at.get(vb), high_seqno, self.history_window)

    def _thin_points(self, db: sqlite3.Connection, thins: list[tuple[int, int]]) -> None:
        stride = self.flush_point_stride
        _chunked(db, _THIN_POINTS, [(vb, high - stride, stride) for vb, high in thins])

    def _trim_due(self, vb: int, high_seqno: int) -> bool:
        # History is trimmed every quarter window, not every flush: keeping up to 1.25x the
        # window only makes more rollbacks exact, and a trim costs statements per vbucket.
        return retention.trim_due(self._trimmed_at.get(vb), high_seqno, self.history_window)

    def _trim_history(self, db: sqlite3.Connection, trims: list[tuple[int, int]]) -> None:
        """Drop history older than the window of each (vb, high seqno): ``history_start``
        becomes the newest flush point at least a window below the high seqno (rollback stays
        exact from there), then what only a rollback below it would need goes."""
        cutoffs = [(vb, high - self.history_window) for vb, high in trims]
        _chunked(db, _TRIM_START, cutoffs)
        due = [(vb,) for vb, _ in trims]
        _chunked(db, _TRIM_HISTORY, due)
        _chunked(db, _TRIM_POINTS, due)

    def flush_points(self, vb: int) -> list[int]:
        """The flush points kept for a vbucket (its exact rollback targets), in order."""
        with self._read_lock:
            rows = self._reader.execute(
                "SELECT seqno FROM flush_points WHERE vb = ? ORDER BY seqno", (vb,)
            ).fetchall()
        return [seqno for (seqno,) in rows]

    def history(self, vb: int) -> list[tuple[bytes, int, int]]:
        """The replaced versions kept for rollback: (key, their seqno, replacing seqno)."""
        with self._read_lock:
            rows = self._reader.execute(
                "SELECT key, by_seqno, replaced_by FROM history WHERE vb = ? ORDER BY by_seqno",
                (vb,),
            ).fetchall()
        return [(bytes(key), seqno, by) for key, seqno, by in rows]

    def versions(self, vb: int) -> Iterator[tuple[Item, int | None]]:
        """Every version kept of a vbucket (a migration's source, :mod:`dcpkv.engine.migrate`):
        (item, None) for each key's latest, tombstones included, then (item, the seqno that
        replaced it) for the history; read in pages, from one snapshot."""
        with self._read_lock:
            self._reader.execute("BEGIN")
            try:
                for table, extra in (("documents", "NULL"), ("history", "replaced_by")):
                    cursor = self._reader.execute(
                        f"SELECT {_DOC_COLUMNS}, {extra} FROM {table} WHERE vb = ?", (vb,)
                    )
                    while rows := cursor.fetchmany(4096):
                        for row in rows:
                            yield _item(row[:-1]), row[-1]
            finally:
                self._reader.execute("COMMIT")

    def count_versions(self) -> int:
        """How many versions :meth:`versions` yields over every vbucket."""
        with self._read_lock:
            (docs,) = self._reader.execute("SELECT COUNT(*) FROM documents").fetchone()
            (hist,) = self._reader.execute("SELECT COUNT(*) FROM history").fetchone()
        return int(docs) + int(hist)

    # -- backfill --------------------------------------------------------------------------

    def open_backfill(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> SqliteScan[Row]:
        """Open a disk snapshot (its own connection, one read transaction) for raw rows;
        ``end`` defaults to the persisted high seqno, and is capped by it."""
        return self._open_scan(_DOC_COLUMNS, vb, start_exclusive, end_inclusive)

    def open_stream_backfill(
        self,
        vb: int,
        start_exclusive: int,
        end_inclusive: int | None = None,
        *,
        prepares: bool = False,
    ) -> SqliteScan[StreamRow]:
        """:meth:`open_backfill` reading :data:`StreamRow` rows (a DCP stream's backfill);
        ``prepares``: with the pending prepares of the range, read in the same transaction."""
        scan: SqliteScan[StreamRow] = self._open_scan(
            _STREAM_COLUMNS, vb, start_exclusive, end_inclusive
        )
        if prepares and scan._conn is not None:
            rows = scan._conn.execute(
                f"SELECT {_DOC_COLUMNS}, level FROM prepares WHERE vb = ? AND by_seqno > ?"
                " AND by_seqno <= ? ORDER BY by_seqno",
                (vb, scan.start, scan.end),
            ).fetchall()
            scan.prepares = [completion(_prepare(row)) for row in rows]
        return scan

    def _open_scan(
        self, columns: str, vb: int, start_exclusive: int, end_inclusive: int | None
    ) -> SqliteScan[Any]:
        conn = self._open(create=False)
        try:
            conn.execute("BEGIN")
            row = conn.execute(
                "SELECT high_seqno, purge_seqno FROM vbstate WHERE vb = ?", (vb,)
            ).fetchone()
            high, purge = row if row else (0, 0)
            end = high if end_inclusive is None else min(end_inclusive, high)
            return SqliteScan(conn, columns, vb, start_exclusive, end, purge)
        except BaseException:
            conn.close()
            raise

    # -- rollback and compaction -------------------------------------------------------------

    def rollback(self, vb: int, seqno: int) -> int:
        """Restore the vbucket as of the newest flush point <= ``seqno``; return that seqno."""
        with self._transaction() as db:
            row = db.execute(
                "SELECT high_seqno, history_start, failover FROM vbstate WHERE vb = ?", (vb,)
            ).fetchone()
            if row is None:
                return 0
            high, history_start, failover = row
            if seqno >= high:
                return high
            point = self._rollback_point(db, vb, seqno, history_start)
            if point is None:
                point = 0
                self._wipe(db, vb)
            else:
                self._restore(db, vb, point)
            # (a prepare completed above the point is not brought back: its row is gone)
            db.execute("DELETE FROM prepares WHERE vb = ? AND by_seqno > ?", (vb, point))
            db.execute(
                "UPDATE vbstate SET high_seqno = ?, snap_start = ?, snap_end = ?, failover = ?,"
                " purge_seqno = min(purge_seqno, ?) WHERE vb = ?",
                (point, point, point, retention.prune_failover(failover, point), point, vb),
            )
            return point

    def _wipe(self, db: sqlite3.Connection, vb: int) -> None:
        for table in ("documents", "history", "flush_points", "prepares"):
            db.execute(f"DELETE FROM {table} WHERE vb = ?", (vb,))
        db.execute("UPDATE vbstate SET history_start = 0 WHERE vb = ?", (vb,))

    def divergence(self, vb: int, seqno: int) -> list[tuple[Row, Row | None]]:
        """What a rollback to ``seqno`` would undo: for every key changed above the point it
        would land on, (its latest version, its version at that point or None). Empty when
        the rollback would wipe the vbucket (no history to tell the versions at the point)."""
        out: list[tuple[Row, Row | None]] = []
        with self._read_lock:
            db = self._reader
            db.execute("BEGIN")  # one consistent state of the disk
            try:
                row = db.execute(
                    "SELECT high_seqno, history_start FROM vbstate WHERE vb = ?", (vb,)
                ).fetchone()
                point = None  # (no rollback at all, or a wipe)
                if row is not None and seqno < row[0]:
                    point = self._rollback_point(db, vb, seqno, history_start=row[1])
                for key, old in [] if point is None else self._versions_at(db, vb, point):
                    ours = db.execute(
                        f"SELECT {_DOC_COLUMNS} FROM documents WHERE vb = ? AND key = ?",
                        (vb, key),
                    ).fetchone()
                    if ours is not None and ours[1] > point:
                        out.append((ours, old))
            finally:
                db.execute("COMMIT")
        return out

    def _rollback_point(
        self, db: sqlite3.Connection, vb: int, seqno: int, history_start: int
    ) -> int | None:
        """Where a rollback to ``seqno`` lands: the newest flush point at or below it whose
        versions the history still holds; None when only a wipe (to 0) gets there."""
        newest: int | None = db.execute(
            "SELECT max(seqno) FROM flush_points WHERE vb = ? AND seqno <= ?", (vb, seqno)
        ).fetchone()[0]
        points = () if newest is None else (newest,)
        return retention.rollback_point(points, seqno, history_start, self.history_window)

    def _versions_at(
        self, db: sqlite3.Connection, vb: int, point: int
    ) -> Iterator[tuple[bytes, Row | None]]:
        """Every key changed above ``point``, with its version at ``point`` (None: absent)."""
        keys = [
            r[0]
            for r in db.execute(
                "SELECT key FROM documents WHERE vb = ? AND by_seqno > ?"
                " UNION SELECT key FROM history WHERE vb = ? AND replaced_by > ?",
                (vb, point, vb, point),
            )
        ]
        # The version live at the point: written at or before it, replaced after it, the first
        # such replacement (a version written after the point and replaced later is not it:
        # the key may not have existed at the point at all). One scan of the history above the
        # point, in replacement order, rather than a lookup per key: no (vb, key) index on
        # history, which cost every flush of updates a page write per key (module docstring).
        at_point: dict[bytes, Row] = {}
        for row in db.execute(
            f"SELECT {_DOC_COLUMNS} FROM history WHERE vb = ? AND replaced_by > ?"
            " AND by_seqno <= ? ORDER BY replaced_by",
            (vb, point, point),
        ):
            at_point.setdefault(row[0], row)
        for key in keys:
            yield key, at_point.get(key)

    def _restore(self, db: sqlite3.Connection, vb: int, point: int) -> None:
        for key, old in list(self._versions_at(db, vb, point)):
            if old is None:
                db.execute("DELETE FROM documents WHERE vb = ? AND key = ?", (vb, key))
            else:
                db.execute(
                    f"INSERT OR REPLACE INTO documents (vb, {_DOC_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (vb, *old),
                )
        db.execute("DELETE FROM history WHERE vb = ? AND replaced_by > ?", (vb, point))
        db.execute("DELETE FROM flush_points WHERE vb = ? AND seqno > ?", (vb, point))

    def compact(
        self,
        vb: int,
        *,
        purge_before_seqno: int | None = None,
        purge_older_than_secs: float | None = None,
        now: float | None = None,
    ) -> CompactResult:
        """Delete tombstones below a seqno and/or older than an age; raise the purge seqno."""
        conds, args = [], []
        if purge_before_seqno is not None:
            conds.append("by_seqno < ?")
            args.append(purge_before_seqno)
        if purge_older_than_secs is not None:
            conds.append("delete_time < ?")
            args.append(int((time.time() if now is None else now) - purge_older_than_secs))
        with self._transaction() as db:
            old = db.execute("SELECT purge_seqno FROM vbstate WHERE vb = ?", (vb,)).fetchone()
            if old is None or not conds:
                return CompactResult(0, old[0] if old else 0)
            where = f"vb = ? AND deleted != 0 AND ({' OR '.join(conds)})"
            count, top = db.execute(
                f"SELECT count(*), max(by_seqno) FROM documents WHERE {where}", (vb, *args)
            ).fetchone()
            db.execute(f"DELETE FROM documents WHERE {where}", (vb, *args))
            purge = max(old[0], top or 0)
            db.execute("UPDATE vbstate SET purge_seqno = ? WHERE vb = ?", (purge, vb))
            return CompactResult(count, purge)


def _items(scan: BackfillScan[Row]) -> Iterator[Item]:
    try:
        while rows := scan.read(512):
            for row in rows:
                yield _item(row)
    finally:
        scan.close()
