"""Embedded, crash-safe storage for a bucket on RocksDB: one database, six column families.

Theory of operation
-------------------
One directory, ``<folder>/<bucket>.rocksdb``, is one RocksDB database holding every vbucket
of the bucket; every key of every column family starts with the vbucket id (2 bytes,
big-endian), so a vbucket is a contiguous range of each.

Column families
    ``by_seqno``  the log: every version a flush wrote, key (vb, seqno), value a 34-byte
                  header (CAS, rev seqno, flags and expiry, datatype with the tombstone's
                  fields, key length), the key and the value. A disk backfill is a range scan
                  of it, and so is warm-up. A version a later flush replaced stays here as
                  history (what a replica needs to roll back) until trimmed.
    ``by_key``    the latest version of every key (tombstones included): key (vb, key), value
                  its seqno and the tombstone's fields (16 bytes). A point read (an ejected
                  value, a key not in memory) is this then ``by_seqno``.
    ``replaced``  one mark per replaced version still in the log: key (vb, its seqno), value
                  the seqno that replaced it. A backfill skips the log entries marked here (a
                  merge of two ordered scans, no lookups); a rollback restores from them.
    ``flush_points`` one entry per committed flush of a vbucket inside the history window,
                  key (vb, its high seqno), value the vbucket's state as that flush left it
                  (state, failover table, persisted snapshot, purge seqno, max CAS, history
                  start, and its live documents when the flush gave their count: a rollback
                  to the point finds the count there, warm-up under full eviction in the
                  newest; without one, :meth:`RocksStorage.item_count` counts the key
                  index). The keys are the exact rollback targets; the newest entry is the
                  vbucket's state (a vbucket's flush writes one entry, not a point and a
                  state: the flusher pays ~1 us per entry, per vbucket it touches).
    ``local``     the format version and the clean-shutdown flag.
    ``prepares``  the pending SyncWrite prepares: key (vb, key), value the prepare's seqno, its
                  durability level and its log record. A flushed prepare is written here,
                  never to the log or the key index (a plain backfill never sees it); its
                  commit (a committed version) deletes it and its abort replaces it (level 0,
                  ``storage.abort_row``: a SyncWrite consumer's backfill sends it), in its
                  vbucket's last write batch of the flush, the one with its state. Warm-up
                  reads the prepares back
                  (:meth:`RocksStorage.load_prepares`). A database made before this family
                  existed gets it, empty, at open.
    ``completed`` with history kept: each flushed prepare a later flush completed, key (vb,
                  the completion's seqno), value its ``prepares`` entry. A rollback to a point
                  between the two makes it pending again (the active re-commits it once the
                  replica acknowledges it): rolling the completion back must not drop the
                  prepare too. Trimmed with the history (a completion at or below the
                  history's start is never rolled back).

What is kept, trimmed, thinned and where a rollback lands is decided by
:mod:`dcpkv.engine.retention`.

A flush (:meth:`RocksStorage.persist`) first reads, in one multi-get, the seqno of the version
each of its keys replaces (``by_key``: the bloom filters make a new key's miss cheap, and
being in partitions keeps it cheap once they outgrow the cache), then writes per vbucket its
versions to the log and the key index, a replaced mark per replaced version, its state and
its flush point. Each vbucket's part is in one write batch, so each vbucket's disk state
moves from one snapshot to the next or not at all; the batches of a flush are written
without a sync, then the write-ahead log is fsynced once (``synchronous="FULL"``): a flush
is acknowledged as persisted only after that.

Why the WAL is fsynced here and not by RocksDB: rocksdict holds the interpreter lock for the
whole of a write, a synced write's fsync included, so every synced flush stopped the server's
event loop for as long as the disk took (tens of ms on this machine). The WAL data reaches the
kernel before a write returns (kill -9 loses nothing written), and :func:`os.fsync` of the
WAL files releases the lock. Likewise the batches are cut at :data:`GROUP_ITEMS` items (whole
vbuckets): a write holds the lock for its memtable inserts, ~1 us per entry.

Durability and damage. RocksDB replays its WAL at open (a torn last record, from a crash
mid-write, is dropped; damage elsewhere is an error). A clean shutdown flushes the memtables,
so the data then lives in table files whose sizes the MANIFEST records: a truncated or damaged
file is an error at open or when warm-up reads it, never a silently shorter bucket (rocksdict's
own iterators stop silently at a read error: this module checks each scan's status). The
database is opened with automatic compactions off and they are turned on at the first write,
so warm-up only reads: a damaged file is left as it was.

A write that fails (a full disk) leaves RocksDB refusing every later write; the next flush
closes and reopens the database first (open backfills then end with an error), which
recovers once there is space again.

Compaction (:meth:`RocksStorage.compact`) removes tombstones (by seqno or age) and raises the
purge seqno; RocksDB compacts its own files in background threads.

Threads. Writes come from one thread at a time, the flusher's; a lock enforces it. Point reads
may come from any thread. A backfill scan holds two RocksDB iterators made together under the
write lock, each a consistent view of the database as of its creation, however long the stream
takes; one thread at a time may read it.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

import rocksdict

from dcpkv.core.files import fsync_dir
from dcpkv.engine import retention
from dcpkv.engine.item import AbortItem, Item, PrepareItem
from dcpkv.engine.storage import (
    CompactResult,
    CorruptDatabaseError,
    R,
    Row,
    StorageError,
    StorageReads,
    StreamRow,
    VBState,
    completion,
    has_sync_writes,
    row_of_stream_row,
    split_sync_writes,
)

FORMAT_VERSION = b"1"
GROUP_ITEMS = 1024  # items per write batch (whole vbuckets): the interpreter lock's longest hold
# Bytes per write batch: a batch is held three times over while written (the records, the
# batch, the memtable), memory the bucket's quota does not count (4 KiB values: 1024 items
# made the RSS grow 10 MiB past a small quota).
GROUP_BYTES = 1 << 20
_CFS = ("by_key", "by_seqno", "replaced", "flush_points", "local", "prepares", "completed")
_VB = struct.Struct(">H")
_VB_SEQNO = struct.Struct(">HQ")
_U64 = struct.Struct(">Q")
_KEY_META = struct.Struct(">QQ")  # by_key value: seqno, packed (datatype | deleted << 8 | ...)
# by_seqno value header: CAS, rev seqno, flags << 32 | expiry, packed, key length. Written
# unsigned, read back signed where a StreamRow keeps the signed form (CAS, flags and expiry).
_RECORD_OUT = struct.Struct(">QQQQH")
_RECORD_IN = struct.Struct(">qQqQH")
_HEADER = _RECORD_OUT.size
_PREPARE = struct.Struct(">QB")  # prepares value head: seqno, durability level
_STATE = struct.Struct(">QQQQQQ")  # high, snap start, snap end, purge, max CAS, history start
_U32 = 0xFFFFFFFF
_DELETED, _EXPIRED = 1, 2
_LOCAL_FORMAT, _LOCAL_CLEAN = b"format", b"clean_shutdown"
_MEMTABLES_MIN, _MEMTABLES_MAX = 4 << 20, 32 << 20
# Level-0 table files that start a compaction into level 1 (RocksDB's default is 4): see
# _family_options.
_L0_COMPACTION_TRIGGER = 8
T = TypeVar("T")  # what a scan makes of each version it reads (a backfill's row, an item)
# Part of a flush's write batch: a vbucket, items of it in key order, and its state when the
# batch ends that vbucket's part of the flush (None: more of its items follow).
Chunk = tuple[int, list[tuple[bytes, Item]], VBState | None]
# Per vbucket of a flush, each key's last SyncWrite word (storage.split_sync_writes).
SyncWords = dict[int, dict[bytes, PrepareItem | None]]
# Per vbucket of a flush, each key whose prepare completed and its completion's seqno.
Completions = dict[int, dict[bytes, int]]


def _stream_row(seqno: int, record: bytes) -> StreamRow:
    cas, rev, flags_expiry, packed, klen = _RECORD_IN.unpack_from(record)
    end = _HEADER + klen
    return (record[_HEADER:end], seqno, cas, rev, flags_expiry, packed, record[end:])


def _row(seqno: int, record: bytes) -> Row:
    return row_of_stream_row(_stream_row(seqno, record))


def _item(seqno: int, record: bytes, *, value: bool = True) -> Item:
    cas, rev, flags_expiry, packed, klen = _RECORD_OUT.unpack_from(record)
    end = _HEADER + klen
    deleted = (packed >> 8) & 3
    return Item(
        record[_HEADER:end], record[end:] if value else None, flags_expiry >> 32,
        flags_expiry & _U32, cas, rev, seqno, packed & 0xFF, bool(deleted), packed >> 10,
        deleted == _EXPIRED,
    )  # fmt: skip


def _live_item(seqno: int, record: bytes, *, value: bool = True) -> Item | None:
    """Warm-up's item of a log record (``value``: with its value, else not resident); None
    for a tombstone. Built here rather than from a stream row: a warm-up makes one per
    document."""
    cas, rev, flags_expiry, packed, klen = _RECORD_OUT.unpack_from(record)
    if packed & 0x300:
        return None
    end = _HEADER + klen
    return Item(
        record[_HEADER:end], record[end:] if value else None, flags_expiry >> 32,
        flags_expiry & _U32, cas, rev, seqno, packed & 0xFF,
    )  # fmt: skip


def _record(item: Item, packed: int) -> bytes:
    head = _RECORD_OUT.pack(item.cas, item.rev_seqno, item.flags << 32 | item.expiry, packed,
                            len(item.key))  # fmt: skip
    return b"".join((head, item.key, item.value or b""))


def _packed(item: Item) -> int:
    packed = item.datatype | item.delete_time << 10
    if item.deleted:
        packed |= (_EXPIRED if item.expired else _DELETED) << 8
    return packed


def _prepare_bytes(p: PrepareItem) -> bytes:
    return _PREPARE.pack(p.by_seqno, p.level) + _record(p, _packed(p))


def _prepare_of(data: bytes) -> PrepareItem:
    seqno, level = _PREPARE.unpack_from(data)
    i = _item(seqno, data[_PREPARE.size :])
    return PrepareItem(
        i.key, i.value, i.flags, i.expiry, i.cas, i.rev_seqno, seqno, i.datatype, i.deleted,
        i.delete_time, False, level,
    )  # fmt: skip


def _state_bytes(s: VBState) -> bytes:
    head = _STATE.pack(
        s.high_seqno, s.snap_start, s.snap_end, s.purge_seqno, s.max_cas, s.history_start
    )
    # After the failover JSON (which has no newline), each on a line of its own: the item
    # count (empty: unknown, read back as None), the high prepared and the high completed
    # seqnos (empty: 0); trailing empty ones are left out (a state written without them).
    tail = [
        b"" if s.item_count is None else b"%d" % s.item_count,
        b"%d" % s.high_prepared_seqno if s.high_prepared_seqno else b"",
        b"%d" % s.high_completed_seqno if s.high_completed_seqno else b"",
    ]
    while tail and not tail[-1]:
        tail.pop()
    return b"\n".join([head + s.state.encode(), s.failover_json.encode(), *tail])


def _state_of(data: bytes) -> VBState:
    high, snap_start, snap_end, purge, max_cas, history = _STATE.unpack_from(data)
    state, _, rest = data[_STATE.size :].partition(b"\n")
    failover, *tail = rest.split(b"\n")
    count, prepared, completed = (*tail, b"", b"", b"")[:3]
    return VBState(
        state.decode(), failover.decode(), high, snap_start, snap_end, purge, max_cas, history,
        int(count) if count else None, int(prepared) if prepared else 0,
        int(completed) if completed else 0,
    )  # fmt: skip


def _empty(db: _Db) -> bool:
    it = _iterator(db.cf["flush_points"], b"")
    valid = it.valid()
    it.status()
    return not valid


def _vb_range(vb: int) -> tuple[bytes, bytes]:
    return _VB.pack(vb), _VB.pack(vb + 1) if vb < 0xFFFF else b"\xff\xff\xff"


def _seqno_key(vb: int, seqno: int) -> bytes:
    return _VB_SEQNO.pack(vb, seqno)


class _Db:
    """The open database: the Rdict, its column families and their handles."""

    def __init__(self, path: Path, *, create: bool, cache_bytes: int) -> None:
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(create)
        options.create_missing_column_families(True)  # (``prepares``, in an older database)
        options.set_paranoid_checks(True)
        # A torn last record (a crash mid-write) is dropped; damage anywhere else is an error.
        options.set_wal_recovery_mode(rocksdict.DBRecoveryMode.tolerate_corrupted_tail_records())
        options.set_max_background_jobs(2)
        options.set_keep_log_file_num(2)
        options.set_max_log_file_size(1 << 20)
        options.set_allow_concurrent_memtable_write(False)  # one writer: cheaper inserts
        # The block cache (index and filter blocks in it) is storage_cache_bytes (1/16 of the
        # quota, 2 MB to 16 MiB); memtables, RSS the bucket's quota does not count either, are
        # bounded by one budget of twice that (so an eighth of the quota), 4 to 32 MiB.
        memtables = max(_MEMTABLES_MIN, min(_MEMTABLES_MAX, 2 * cache_bytes))
        options.set_db_write_buffer_size(memtables)
        cache = rocksdict.Cache(max(1 << 20, cache_bytes))
        families = {name: _family_options(name, cache, memtables) for name in _CFS}
        self.rdict = rocksdict.Rdict(str(path), options, column_families=families)
        # (Any: rocksdict's stubs narrow keys and values to what pickling takes, not raw bytes)
        self.cf: dict[str, Any] = {name: self.rdict.get_column_family(name) for name in _CFS}
        self.handle = {name: self.rdict.get_column_family_handle(name) for name in _CFS}
        self.compacting = False

    def enable_compactions(self) -> None:
        if not self.compacting:
            for cf in self.cf.values():
                cf.set_options({"disable_auto_compactions": "false"})
            self.compacting = True

    def close(self, *, flush: bool) -> None:
        if flush:
            for cf in self.cf.values():
                cf.flush(True)
        self.cf.clear()
        self.handle.clear()
        with contextlib.suppress(Exception):  # a failed write left it unable to flush
            self.rdict.close()


def _family_options(name: str, cache: rocksdict.Cache, memtables: int) -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.set_write_buffer_size(memtables // 2)
    options.set_disable_auto_compactions(True)  # until the first write (module docstring)
    # Every memtable flush holds keys of all 1,024 vbuckets, so each level-0 file overlaps the
    # whole of level 1 and each compaction into it rewrites all of level 1: merging twice as
    # many files at a time, half as often, writes ~30 % fewer bytes filling a bucket and
    # spends ~40 % less compaction CPU. A lookup probes each level-0 file's filter, so more
    # files make a flush's multi-get and a non-resident Get dearer: 12 and 16 wrote fewer
    # bytes still but saved no more CPU in all.
    options.set_level_zero_file_num_compaction_trigger(_L0_COMPACTION_TRIGGER)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    # Partitioned index and filters: a table file's index and bloom filter are split into
    # blocks of a few KiB under a small top level, which stays pinned in the cache; a lookup
    # reads one partition of each. Whole per-file filters (~1.25 B a key: ~400 KB for a
    # 64 MiB file, over 1 MiB at 1M keys) were evicted once a bucket's filters outgrew the
    # cache (past ~1M keys at 16 MiB), so a flush's lookup of a new key loaded whole filters
    # back (its Python part went from 2 to 11 us a key by 2.4M keys; 3.5 us partitioned), a
    # missing key's Get read a whole one again (~100 us), and key_may_exist, which never
    # reads, said "maybe" for most keys.
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    if name == "by_key":
        # A flush looks up every key it writes, and a full-eviction bucket every key it is
        # asked for that memory lacks: a missing key costs a filter probe (key_may_exist: no
        # I/O at all, on the event loop).
        table.set_bloom_filter(10, False)
        options.set_memtable_prefix_bloom_ratio(0.1)
        options.set_memtable_whole_key_filtering(True)
    elif name == "by_seqno":
        # A point read of a document (a background fetch) reads one data block, not one per
        # table file its key range overlaps (every L0 file, one per level)
        table.set_bloom_filter(10, False)
        # ... but its filter in the last level, which holds most of the log, is not consulted
        # (nor written when a compaction writes that level): every point read of the log is
        # of a seqno the key index or a replaced mark named, so it would always say "maybe"
        # (a partition looked up in the cache, a probe, for nothing), and its partitions
        # (1.25 B a version) would crowd the key index's filters out of the block cache.
        options.set_optimize_filters_for_hits(True)
    # No compression: values are compressed, when at all, by the bucket's compression mode
    # (Snappy documents, as clients send them), and the other families hold small binary
    # values; RocksDB's Snappy would spend CPU at every table write and read for little.
    options.set_compression_type(rocksdict.DBCompressionType.none())
    options.set_block_based_table_factory(table)
    return options


class RocksScan(Generic[T]):
    """An open disk snapshot of one vbucket: ``start`` (exclusive) .. ``end``, latest version
    per key, read in seqno order by :meth:`read` (two iterators made together: the log and the
    replaced marks, merged), each version as ``make`` builds it from its seqno and log record.
    One thread at a time; reading to the end closes it."""

    def __init__(
        self, db: _Db, vb: int, start: int, end: int, purge: int, *,
        make: Callable[[int, bytes], T],
    ) -> None:  # fmt: skip
        self.start, self.end, self.purge_seqno = start, end, purge
        self.high_completed_seqno = 0  # (the opener's: the state's, when ``end`` is its high)
        self.exhausted = False
        self.prepares: list[PrepareItem | AbortItem] = []
        self._make: Callable[[int, bytes], T] = make
        self._lock = threading.Lock()
        self._error: str | None = None
        lower, self._upper = _seqno_key(vb, start + 1), _seqno_key(vb, end + 1)
        self._log: Any = _iterator(db.cf["by_seqno"], lower)
        self._marks: Any = _iterator(db.cf["replaced"], lower)
        self._next_mark = self._mark()

    def _mark(self) -> int:
        """The seqno of the next replaced mark in the range (2**64: none left)."""
        it = self._marks
        if not it.valid():
            it.status()
            return 1 << 64
        key = it.key()
        if key >= self._upper:
            return 1 << 64
        it.next()
        return int(_VB_SEQNO.unpack(key)[1])

    @property
    def closed(self) -> bool:
        """Its iterators let go (closed, read to its end, or the database closed)."""
        return self._log is None

    def read(self, n: int) -> list[T]:
        """Up to ``n`` more rows; fewer means the snapshot is read to its end (and closed)."""
        with self._lock:
            if self._error is not None:
                raise StorageError(self._error)
            if self._log is None:
                return []
            rows = self._read(n)
            if len(rows) < n:
                self.exhausted = True
                self._release()
            return rows

    def _read(self, n: int) -> list[T]:
        it, mark, upper, make = self._log, self._next_mark, self._upper, self._make
        rows: list[T] = []
        while len(rows) < n and it.valid():
            key = it.key()
            if key >= upper:
                return rows
            seqno = _VB_SEQNO.unpack(key)[1]
            while mark < seqno:
                mark = self._mark()
            if mark != seqno:  # (a marked version was replaced: history, not sent)
                rows.append(make(seqno, it.value()))
            it.next()
        self._next_mark = mark
        if not it.valid():
            it.status()  # a read error ends the iteration too: raise it
        return rows

    def _release(self) -> None:
        self._log = self._marks = None

    def invalidate(self, why: str) -> None:
        """The database is being closed under this scan: its next read raises."""
        with self._lock:
            self._release()
            self._error = why

    def close(self) -> None:
        with self._lock:
            self._release()


def _iterator(cf: Any, lower: bytes) -> Any:
    """An iterator of ``cf`` at ``lower``. (Callers check their upper bound: rocksdict's
    ``iterate_upper_bound`` was seen to end a scan early at random, its bound's memory not
    kept alive with the iterator.)"""
    it = cf.iter(rocksdict.ReadOptions())
    it.seek(lower)
    return it


def _scan(cf: Any, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of ``cf`` in [lower, upper), raising a read error rather than
    stopping early (which rocksdict's own ``items`` does)."""
    it = _iterator(cf, lower)
    while it.valid():
        key = it.key()
        if key >= upper:
            return
        yield key, it.value()
        it.next()
    it.status()


class RocksStorage(StorageReads):
    """The RocksDB database of one bucket (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        history_window: int = retention.DEFAULT_HISTORY_WINDOW,
        synchronous: str = "FULL",
        cache_bytes: int = 0,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous}")
        self.path = Path(path)
        self.history_window = history_window
        self._sync = synchronous != "NORMAL"
        self._cache_bytes = cache_bytes
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._scans: weakref.WeakSet[RocksScan[Any]] = weakref.WeakSet()
        self._broken: str | None = None  # why a write failed: reopen before the next one
        self._wal_synced: dict[str, tuple[int, int]] = {}  # WAL file -> (inode, size) synced
        self._trimmed_at: dict[int, int] = {}
        self._thinned_at: dict[int, int] = {}
        self._write_options = rocksdict.WriteOptions()
        self._write_options.sync = False  # fsynced by _sync_wal (module docstring)
        self._db = self._open()
        self._states = self._load_states()
        self._repair()

    # -- opening and closing -------------------------------------------------------------------

    def _open(self) -> _Db:
        exists = self.path.exists()
        if exists and not (self.path / "CURRENT").exists():
            raise CorruptDatabaseError(
                f"{self.path}: not a usable dcpkv database (no RocksDB CURRENT file); it was "
                "left untouched: restore it from a backup, or move it away to start empty"
            )
        try:
            db = _Db(self.path, create=not exists, cache_bytes=self._cache_bytes)
        except Exception as exc:  # rocksdict raises plain Exceptions
            raise CorruptDatabaseError(f"{self.path}: not a usable dcpkv database ({exc})") from exc
        try:
            local = db.cf["local"]
            version = local.get(_LOCAL_FORMAT)
            if version is None and (not exists or _empty(db)):  # (or died being created)
                self._write_fresh(db)
            elif version != FORMAT_VERSION:
                raise CorruptDatabaseError(f"{self.path}: unknown format version {version!r}")
        except BaseException:
            db.close(flush=False)
            raise
        return db

    def _write_fresh(self, db: _Db) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        batch.put(_LOCAL_FORMAT, FORMAT_VERSION, db.handle["local"])
        batch.put(_LOCAL_CLEAN, b"1", db.handle["local"])
        options = rocksdict.WriteOptions()
        options.sync = True  # (once, at creation)
        db.rdict.write(batch, options)

    def _load_states(self) -> dict[int, VBState]:
        """Each vbucket's state: the value of its newest flush point (two seeks a vbucket)."""
        states: dict[int, VBState] = {}
        with self.reading("open"):
            it = _iterator(self._db.cf["flush_points"], b"")
            while it.valid():
                vb = _VB.unpack_from(it.key())[0]
                upper = _vb_range(vb)[1]
                it.seek_for_prev(upper)
                states[vb] = _state_of(it.value())
                it.seek(upper)
            it.status()
        return states

    def _repair(self) -> None:
        """Undo torn flushes: a vbucket whose items span write batches (:func:`_chunks`) may
        have some on disk above its persisted state if the process died between them; they
        are rolled back to that state (from the replaced marks they wrote), or removed with
        the vbucket when it has no state yet. Two seeks a vbucket; writes only when torn."""
        torn: list[int] = []
        with self.reading("open"):
            it = _iterator(self._db.cf["by_seqno"], b"")
            while it.valid():
                prefix = it.key()[:2]
                vb = _VB.unpack(prefix)[0]
                state = self._states.get(vb)
                it.seek(_seqno_key(vb, state.high_seqno + 1) if state else prefix)
                if it.valid() and it.key()[:2] == prefix:
                    torn.append(vb)
                it.seek(_vb_range(vb)[1])
            it.status()
        if not torn:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        for vb in torn:
            state = self._states.get(vb)
            if state is None:
                self._wipe(batch, vb)
            else:
                self._restore(batch, vb, state.high_seqno)
        self._write(batch)
        self._sync_wal()

    def close(self) -> None:
        """Close, flushing the memtables first (a clean close leaves an empty WAL)."""
        with self._write_lock, self._read_lock:
            self._close_db(flush=self._broken is None, why="the storage was closed")

    def _close_db(self, *, flush: bool, why: str) -> None:
        for scan in list(self._scans):
            scan.invalidate(f"{self.path}: {why}")
        try:
            self._db.close(flush=flush)
        except Exception as exc:
            raise StorageError(f"{self.path}: {exc}") from exc

    def _reopen(self) -> None:
        """After a failed write RocksDB refuses every write until reopened. It is reopened
        only once a probe write succeeds: until then the open database still serves reads."""
        probe = self.path / "space-probe"
        try:
            with open(probe, "wb") as f:
                f.write(bytes(1 << 16))
                os.fsync(f.fileno())
        except OSError as exc:
            raise StorageError(f"{self.path}: still cannot write ({exc})") from exc
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
        with self._read_lock:
            self._close_db(flush=False, why=f"reopened after a failed write ({self._broken})")
            try:
                self._db = self._open()
            except StorageError as exc:
                raise StorageError(
                    f"{self.path}: cannot reopen after a failed write ({exc})"
                ) from exc
            self._db.enable_compactions()
        self._states = self._load_states()
        self._wal_synced.clear()
        self._broken = None
        self._repair()

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """RocksDB errors met while ``what`` become one clear error naming the database (and
        RocksDB's message names the file): warm-up only reads, so the files stay as they are."""
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            raise CorruptDatabaseError(
                f"{self.path}: {what} cannot read this database ({exc}); it was left "
                "untouched: restore it from a backup, or move it away to start the bucket empty"
            ) from exc

    # -- writing ------------------------------------------------------------------------------

    def _write(self, batch: rocksdict.WriteBatch) -> None:
        """Write (not yet synced); a failure marks the database for a reopen."""
        try:
            self._db.enable_compactions()
            self._db.rdict.write(batch, self._write_options)
        except Exception as exc:
            self._broken = str(exc)
            raise StorageError(f"{self.path}: {exc}") from exc

    def _sync_wal(self) -> None:
        """fsync every WAL file written since the last sync (module docstring), and the
        directory when the set of WAL files changed, with the interpreter lock released."""
        if not self._sync:
            return
        seen: dict[str, tuple[int, int]] = {}
        try:
            with os.scandir(self.path) as entries:
                for entry in entries:
                    if entry.name.endswith(".log"):
                        # (RocksDB deletes a WAL file whose memtable a table file now holds,
                        # synced, from a background thread: one listed may be gone already)
                        with contextlib.suppress(FileNotFoundError):
                            stat = entry.stat()
                            seen[entry.name] = (stat.st_ino, stat.st_size)
            for name, version in seen.items():
                if self._wal_synced.get(name) != version:
                    with contextlib.suppress(FileNotFoundError):  # obsolete meanwhile: its
                        fsync_dir(self.path / name)  # data is in a table file RocksDB synced
            if seen.keys() != self._wal_synced.keys():
                fsync_dir(self.path)
        except OSError as exc:
            self._broken = str(exc)
            raise StorageError(f"{self.path}: cannot sync the write-ahead log ({exc})") from exc
        self._wal_synced = seen

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        with self._write_lock:
            if self._broken is not None:
                self._reopen()
            yield
            self._sync_wal()

    # -- bucket meta ---------------------------------------------------------------------

    def was_clean_shutdown(self) -> bool:
        with self._write_lock:
            return bool(self._db.cf["local"].get(_LOCAL_CLEAN) == b"1")

    def set_clean_shutdown(self, clean: bool) -> None:
        with self._writing():
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.put(_LOCAL_CLEAN, b"1" if clean else b"0", self._db.handle["local"])
            self._write(batch)

    # -- vbucket state -------------------------------------------------------------------

    def vbucket_states(self) -> dict[int, VBState]:
        with self._write_lock:
            return {vb: _copy(s) for vb, s in sorted(self._states.items())}

    def vbucket_state(self, vb: int) -> VBState | None:
        with self._write_lock:
            s = self._states.get(vb)
            return None if s is None else _copy(s)

    def set_vbucket_state(self, vb: int, vbstate: VBState) -> None:
        with self._writing():
            batch = rocksdict.WriteBatch(raw_mode=True)
            self._write(self._put_state(batch, vb, vbstate))

    def _merged(self, vb: int, s: VBState) -> VBState:
        """The state to store: the purge seqno never goes down, the history start is ours."""
        old = self._states.get(vb)
        purge, start = (max(s.purge_seqno, old.purge_seqno), old.history_start) if old else (
            s.purge_seqno, 0)  # fmt: skip
        return VBState(
            s.state, s.failover_json, s.high_seqno, s.snap_start, s.snap_end, purge, s.max_cas,
            start, s.item_count, s.high_prepared_seqno, s.high_completed_seqno,
        )  # fmt: skip

    def _put_state(
        self, batch: rocksdict.WriteBatch, vb: int, s: VBState, *, merge: bool = True
    ) -> rocksdict.WriteBatch:
        """Write the state as its flush point's value (module docstring): a new high seqno is
        a new flush point; without history only the newest is kept."""
        state = self._merged(vb, s) if merge else s
        handle = self._db.handle["flush_points"]
        old = self._states.get(vb)
        if self.history_window <= 0 and old is not None and old.high_seqno != state.high_seqno:
            batch.delete(_seqno_key(vb, old.high_seqno), handle)
        batch.put(_seqno_key(vb, state.high_seqno), _state_bytes(state), handle)
        self._states[vb] = state
        return batch

    def delete_vbucket(self, vb: int) -> None:
        with self._writing():
            batch = rocksdict.WriteBatch(raw_mode=True)
            self._wipe(batch, vb)
            self._write(batch)
            self._states.pop(vb, None)

    def _wipe(self, batch: rocksdict.WriteBatch, vb: int) -> None:
        lower, upper = _vb_range(vb)
        for name in ("by_key", "by_seqno", "replaced", "flush_points", "prepares", "completed"):
            batch.delete_range(lower, upper, self._db.handle[name])
        self._trimmed_at.pop(vb, None)
        self._thinned_at.pop(vb, None)

    # -- documents -------------------------------------------------------------------------

    def get(self, vb: int, key: bytes) -> Item | None:
        """The persisted version of a key (tombstones included), from any thread."""
        with self._read_lock:
            db = self._db
            try:
                meta = db.cf["by_key"].get(_VB.pack(vb) + key)
                if meta is None:
                    return None
                seqno = _KEY_META.unpack(meta)[0]
                record = db.cf["by_seqno"].get(_seqno_key(vb, seqno))
            except Exception as exc:
                raise StorageError(f"{self.path}: {exc}") from exc
        return None if record is None else _item(seqno, record)

    def get_many(self, keys: list[tuple[int, bytes]]) -> list[Item | None]:
        """:meth:`get` of each (vbucket, key), in order, in two multi-gets (the key index,
        then the log), which give up the interpreter lock while they read: a background
        fetch's batch, from its own thread."""
        with self._read_lock:
            db = self._db
            try:
                metas = db.cf["by_key"].get([_VB.pack(vb) + key for vb, key in keys])
                found = [
                    (i, vb, _KEY_META.unpack(meta)[0])
                    for i, ((vb, _), meta) in enumerate(zip(keys, metas, strict=True))
                    if meta is not None
                ]
                records = db.cf["by_seqno"].get([_seqno_key(vb, seqno) for _, vb, seqno in found])
            except Exception as exc:
                raise StorageError(f"{self.path}: {exc}") from exc
        items: list[Item | None] = [None] * len(keys)
        for (i, _, seqno), record in zip(found, records, strict=True):
            if record is not None:
                items[i] = _item(seqno, record)
        return items

    def may_exist(self, vb: int, key: bytes) -> bool:
        """Whether the database may hold ``key`` (tombstones included): False only when the
        memtables and the bloom filters in memory rule it out, with no I/O."""
        try:
            return bool(self._db.cf["by_key"].key_may_exist(_VB.pack(vb) + key))
        except Exception:
            return True  # (the database is being reopened: the read will tell)

    def load_items(self, vb: int, *, values: bool = True) -> Iterator[Item]:
        """Every live (not deleted) document of a vbucket, for warm-up (``values`` False: not
        resident, ``value`` None)."""
        with self._write_lock:
            s = self._states.get(vb)
            scan = RocksScan(
                self._db, vb, 0, s.high_seqno if s else 0, 0,
                make=partial(_live_item, value=values),
            )  # fmt: skip
            self._scans.add(scan)
        while items := scan.read(4096):
            yield from filter(None, items)  # (None: a tombstone)

    def item_count(self, vb: int) -> int:
        """The vbucket's live (not deleted) documents (warm-up under full eviction): the count
        its state keeps, else (a state written without one) a count of the key index."""
        with self._write_lock:
            s = self._states.get(vb)
            if s is not None and s.item_count is not None:
                return s.item_count
            return sum(
                1
                for _, meta in _scan(self._db.cf["by_key"], *_vb_range(vb))
                if not (_KEY_META.unpack(meta)[1] >> 8) & 3
            )

    def load_prepares(self, vb: int) -> list[PrepareItem]:
        """The vbucket's persisted pending prepares, in seqno order (warm-up)."""
        with self._write_lock:
            prepares = [_prepare_of(v) for _, v in _scan(self._db.cf["prepares"], *_vb_range(vb))]
        return sorted((p for p in prepares if p.level), key=lambda p: p.by_seqno)  # no aborts

    def persist(self, batches: Iterable[tuple[int, Iterable[Item], VBState]]) -> None:
        """Write the snapshots and states of several vbuckets, each vbucket's end state
        atomically, synced once (module docstring)."""
        per_vb: dict[int, tuple[dict[bytes, Item], VBState]] = {}
        sync: SyncWords = {}
        ended: Completions = {}
        for vb, items, vbstate in batches:
            latest = per_vb[vb][0] if vb in per_vb else {}
            items = list(items)
            if has_sync_writes(items):
                items = split_sync_writes(items, sync.setdefault(vb, {}), ended.setdefault(vb, {}))
            for item in items:  # (one version per key: its latest)
                latest[item.key] = item
            per_vb[vb] = (latest, vbstate)
        with self._writing():
            for chunk in _chunks(per_vb, split=self.history_window > 0):
                self._write(self._flush_batch(chunk, sync, ended))

    def import_vbucket(
        self,
        vb: int,
        state: VBState,
        versions: Iterable[tuple[Item, int | None]],
        points: Iterable[int],
        prepares: Iterable[PrepareItem],
    ) -> int:
        """Write a vbucket as another engine kept it (:mod:`dcpkv.engine.migrate`): its
        versions as (item, the seqno that replaced it or None for the latest), its flush
        points (each stored with the state, at that high seqno), its pending prepares, and its
        state last. Not atomic: the caller discards the whole database if it does not finish.
        Returns the versions written."""
        written = 0
        with self._writing():
            handles, prefix = self._db.handle, _VB.pack(vb)
            batch = rocksdict.WriteBatch(raw_mode=True)
            for item, replaced_by in versions:
                tail, packed = _U64.pack(item.by_seqno), _packed(item)
                batch.put(prefix + tail, _record(item, packed), handles["by_seqno"])
                if replaced_by is None:
                    batch.put(prefix + item.key, tail + _U64.pack(packed), handles["by_key"])
                else:
                    batch.put(prefix + tail, _U64.pack(replaced_by), handles["replaced"])
                written += 1
                if written % GROUP_ITEMS == 0:
                    self._write(batch)
                    batch = rocksdict.WriteBatch(raw_mode=True)
            for p in points:
                if p < state.high_seqno:
                    point_state = _copy(state)
                    point_state.high_seqno = point_state.snap_start = point_state.snap_end = p
                    batch.put(_seqno_key(vb, p), _state_bytes(point_state), handles["flush_points"])
            for prepare in prepares:
                batch.put(prefix + prepare.key, _prepare_bytes(prepare), handles["prepares"])
            self._put_state(batch, vb, state, merge=False)
            self._write(batch)
        return written

    def _put_prepares(
        self, batch: rocksdict.WriteBatch, vb: int, words: dict[bytes, PrepareItem | None],
        ended: dict[bytes, int],
    ) -> None:  # fmt: skip
        """A vbucket's pending prepares written, its completed ones deleted (module docstring);
        with history, each stored prepare completed now kept in ``completed``."""
        handle, prefix = self._db.handle["prepares"], _VB.pack(vb)
        if ended and self.history_window > 0:
            self._keep_completed(batch, vb, ended)
        for key, prepare in words.items():
            if prepare is None:
                batch.delete(prefix + key, handle)
            else:
                batch.put(prefix + key, _prepare_bytes(prepare), handle)

    def _keep_completed(
        self, batch: rocksdict.WriteBatch, vb: int, ended: dict[bytes, int]
    ) -> None:
        """The stored pending prepares of ``ended``'s keys, kept under their completion's seqno
        (one prepared and completed within this flush was never stored: no rollback lands
        between the two)."""
        prefix, keys = _VB.pack(vb), list(ended)
        try:
            stored = self._db.cf["prepares"].get([prefix + key for key in keys])
        except Exception as exc:
            raise StorageError(f"{self.path}: {exc}") from exc
        handle = self._db.handle["completed"]
        for key, row in zip(keys, stored, strict=True):
            if row is not None and _PREPARE.unpack_from(row)[1]:  # (level 0: an abort's row)
                batch.put(_seqno_key(vb, ended[key]), row, handle)

    def _flush_batch(self, chunk: list[Chunk], sync: SyncWords, ended: Completions) -> Any:
        """One write batch: items of some vbuckets, and the state of those it ends."""
        db = self._db
        keys = [_VB.pack(vb) + key for vb, items, _ in chunk for key, _ in items]
        try:  # the seqno of every version this flush replaces
            olds = db.cf["by_key"].get(keys)
        except Exception as exc:
            raise StorageError(f"{self.path}: {exc}") from exc
        batch = rocksdict.WriteBatch(raw_mode=True)
        put, delete, u64, header = batch.put, batch.delete, _U64.pack, _RECORD_OUT.pack
        by_key, by_seqno, replaced = (db.handle[n] for n in ("by_key", "by_seqno", "replaced"))
        history, i = self.history_window > 0, 0
        for vb, items, vbstate in chunk:
            prefix = _VB.pack(vb)
            # (inlined: ~1 us an item of Python is most of what a flush costs beside RocksDB)
            for _, item in items:
                tail, key = u64(item.by_seqno), item.key
                packed = item.datatype | item.delete_time << 10
                if item.deleted:
                    packed |= (_EXPIRED if item.expired else _DELETED) << 8
                put(keys[i], tail + u64(packed), by_key)
                head = header(item.cas, item.rev_seqno, item.flags << 32 | item.expiry, packed,
                              len(key))  # fmt: skip
                put(prefix + tail, b"".join((head, key, item.value or b"")), by_seqno)
                old = olds[i]
                i += 1
                if old is not None and (old_tail := old[:8]) != tail:  # (not a retried write)
                    if history:
                        put(prefix + old_tail, tail, replaced)
                    else:
                        delete(prefix + old_tail, by_seqno)
            if vbstate is not None:
                if vb in sync:
                    self._put_prepares(batch, vb, sync[vb], ended.get(vb, {}))
                self._put_state(batch, vb, vbstate)
                if history:
                    self._retain(batch, vb, vbstate.high_seqno)
        return batch

    # -- history: flush points, trims, thinning ----------------------------------------------

    def _points(self, vb: int) -> list[int]:
        lower, upper = _vb_range(vb)
        return [_VB_SEQNO.unpack(k)[1] for k, _ in _scan(self._db.cf["flush_points"], lower, upper)]

    def flush_points(self, vb: int) -> list[int]:
        """The flush points kept for a vbucket (its exact rollback targets), in order."""
        with self._write_lock:
            return self._points(vb)

    def history(self, vb: int) -> list[tuple[bytes, int, int]]:
        """The replaced versions kept for rollback: (key, their seqno, replacing seqno)."""
        out = []
        with self._write_lock:
            for key, value in _scan(self._db.cf["replaced"], *_vb_range(vb)):
                record = self._db.cf["by_seqno"].get(key)
                klen = _RECORD_IN.unpack_from(record)[4]
                seqno, by = _VB_SEQNO.unpack(key)[1], _U64.unpack(value)[0]
                out.append((record[_HEADER : _HEADER + klen], seqno, by))
        return out

    def _retain(self, batch: rocksdict.WriteBatch, vb: int, high: int) -> None:
        """Trim and thin the vbucket's history when due (retention); its new flush point is
        already in the batch (:meth:`_put_state`)."""
        window = self.history_window
        trim = retention.trim_due(self._trimmed_at.get(vb), high, window)
        thin = retention.thin_due(self._thinned_at.get(vb), high, window)
        if not (trim or thin):
            return
        points = sorted({*self._points(vb), high})
        if trim:
            self._trim(batch, vb, points, high)
            self._trimmed_at[vb] = high
        if thin:
            state = self._states[vb]
            stride = retention.stride(window)
            for p in retention.points_to_thin(points, high - stride, stride, state.history_start):
                batch.delete(_seqno_key(vb, p), self._db.handle["flush_points"])
            self._thinned_at[vb] = high

    def _trim(self, batch: rocksdict.WriteBatch, vb: int, points: list[int], high: int) -> None:
        state = self._states[vb]
        start = retention.history_start(points, high, self.history_window, state.history_start)
        if start != state.history_start:
            state.history_start = start
            self._put_state(batch, vb, state, merge=False)
        handles = self._db.handle
        marks = _scan(self._db.cf["replaced"], _seqno_key(vb, 0), _seqno_key(vb, start))
        for key, replaced_by in marks:
            if _U64.unpack(replaced_by)[0] <= start:  # only a rollback below start needs it
                batch.delete(key, handles["replaced"])
                batch.delete(key, handles["by_seqno"])
        for p in points:
            if p < start:
                batch.delete(_seqno_key(vb, p), handles["flush_points"])
        batch.delete_range(_seqno_key(vb, 0), _seqno_key(vb, start + 1), handles["completed"])

    # -- backfill --------------------------------------------------------------------------

    def open_backfill(
        self, vb: int, start_exclusive: int, end_inclusive: int | None = None
    ) -> RocksScan[Row]:
        """Open a disk snapshot for raw rows; ``end`` defaults to the persisted high seqno,
        and is capped by it."""
        return self._open_scan(vb, start_exclusive, end_inclusive, _row)

    def open_stream_backfill(
        self,
        vb: int,
        start_exclusive: int,
        end_inclusive: int | None = None,
        *,
        prepares: bool = False,
    ) -> RocksScan[StreamRow]:
        """:meth:`open_backfill` reading :data:`StreamRow` rows (a DCP stream's backfill);
        ``prepares``: with the pending prepares of the range, read with the iterators."""
        return self._open_scan(vb, start_exclusive, end_inclusive, _stream_row, prepares=prepares)

    def _open_scan(
        self, vb: int, start: int, end: int | None, make: Callable[[int, bytes], R], *,
        prepares: bool = False,
    ) -> RocksScan[R]:  # fmt: skip
        with self._write_lock:  # (no write between the two iterators: one consistent view)
            s = self._states.get(vb)
            high, purge = (s.high_seqno, s.purge_seqno) if s else (0, 0)
            end = high if end is None else min(end, high)
            try:
                scan = RocksScan(self._db, vb, start, end, purge, make=make)
                if s is not None and end == s.high_seqno:
                    scan.high_completed_seqno = s.high_completed_seqno
                if prepares:
                    cf = self._db.cf["prepares"]
                    held = (_prepare_of(v) for _, v in _scan(cf, *_vb_range(vb)))
                    scan.prepares = [
                        completion(p)
                        for p in sorted(held, key=lambda p: p.by_seqno)
                        if start < p.by_seqno <= end
                    ]
            except Exception as exc:
                raise StorageError(f"{self.path}: {exc}") from exc
            self._scans.add(scan)
            return scan

    # -- rollback and compaction -------------------------------------------------------------

    def rollback(self, vb: int, seqno: int) -> int:
        """Restore the vbucket as of the newest flush point <= ``seqno``; return that seqno."""
        with self._writing():
            state = self._states.get(vb)
            if state is None:
                return 0
            if seqno >= state.high_seqno:
                return state.high_seqno
            batch = rocksdict.WriteBatch(raw_mode=True)
            point = self._rollback_point(vb, seqno, state)
            at_point = None if point is None else self._state_at(vb, point)
            counted = at_point.item_count if at_point else None
            state.item_count = 0 if point is None else counted
            state.high_completed_seqno = at_point.high_completed_seqno if at_point else 0
            if point is None:
                point = 0
                self._wipe(batch, vb)
                state.history_start = 0
            else:
                self._restore(batch, vb, point)
                self._drop_prepares_above(batch, vb, point)
                self._revive_completed(batch, vb, point)
            state.high_seqno = state.snap_start = state.snap_end = point
            state.failover_json = retention.prune_failover(state.failover_json, point)
            state.purge_seqno = min(state.purge_seqno, point)
            state.high_prepared_seqno = 0  # (VBucket.reset: a rollback claims nothing)
            self._put_state(batch, vb, state, merge=False)
            self._write(batch)
            return point

    def _state_at(self, vb: int, point: int) -> VBState | None:
        """The state the flush point at ``point`` recorded (None: none)."""
        data = self._db.cf["flush_points"].get(_seqno_key(vb, point))
        return None if data is None else _state_of(data)

    def _drop_prepares_above(self, batch: rocksdict.WriteBatch, vb: int, point: int) -> None:
        handle = self._db.handle["prepares"]
        for key, value in _scan(self._db.cf["prepares"], *_vb_range(vb)):
            if _PREPARE.unpack_from(value)[0] > point:
                batch.delete(key, handle)

    def _revive_completed(self, batch: rocksdict.WriteBatch, vb: int, point: int) -> None:
        """Every completion above ``point`` is rolled back: its prepare, if at or below the
        point, is pending again (after :meth:`_drop_prepares_above`: the batch applies in
        order, so it replaces an abort's row dropped there)."""
        prefix, handles = _VB.pack(vb), self._db.handle
        lower, upper = _seqno_key(vb, point + 1), _vb_range(vb)[1]
        for _, row in _scan(self._db.cf["completed"], lower, upper):
            if _PREPARE.unpack_from(row)[0] <= point:
                batch.put(prefix + _prepare_of(row).key, row, handles["prepares"])
        batch.delete_range(lower, upper, handles["completed"])

    def _rollback_point(self, vb: int, seqno: int, state: VBState) -> int | None:
        return retention.rollback_point(
            self._points(vb), seqno, state.history_start, self.history_window
        )

    def _changes_since(
        self, vb: int, point: int
    ) -> tuple[dict[bytes, int], dict[bytes, int | None], list[bytes]]:
        """Above ``point``: every key changed and its log entries ({key: newest seqno}), each
        such key's version at the point ({key: seqno or None}), and the replaced marks that
        the rollback makes void."""
        cf = self._db.cf
        changed: dict[bytes, int] = {}
        for key, record in _scan(cf["by_seqno"], _seqno_key(vb, point + 1), _vb_range(vb)[1]):
            klen = _RECORD_IN.unpack_from(record)[4]
            changed[record[_HEADER : _HEADER + klen]] = _VB_SEQNO.unpack(key)[1]
        candidates: dict[bytes, list[tuple[int, int]]] = {}
        void: list[bytes] = []
        for key, value in _scan(cf["replaced"], _seqno_key(vb, 0), _vb_range(vb)[1]):
            old, by = _VB_SEQNO.unpack(key)[1], _U64.unpack(value)[0]
            if by <= point:
                continue
            void.append(key)
            if old <= point:
                record = cf["by_seqno"].get(key)
                if record is not None:
                    klen = _RECORD_IN.unpack_from(record)[4]
                    candidates.setdefault(record[_HEADER : _HEADER + klen], []).append((old, by))
        at_point = {k: retention.version_at(point, v) for k, v in candidates.items()}
        for key in changed:
            at_point.setdefault(key, None)
        return changed, at_point, void

    def _restore(self, batch: rocksdict.WriteBatch, vb: int, point: int) -> None:
        handles, cf = self._db.handle, self._db.cf
        _, at_point, void = self._changes_since(vb, point)
        prefix = _VB.pack(vb)
        for key, seqno in at_point.items():
            if seqno is None:
                batch.delete(prefix + key, handles["by_key"])
                continue
            record = cf["by_seqno"].get(_seqno_key(vb, seqno))
            packed = _RECORD_IN.unpack_from(record)[3]
            batch.put(prefix + key, _KEY_META.pack(seqno, packed), handles["by_key"])
        for key in void:
            batch.delete(key, handles["replaced"])
        upper = _vb_range(vb)[1]
        batch.delete_range(_seqno_key(vb, point + 1), upper, handles["by_seqno"])
        batch.delete_range(_seqno_key(vb, point + 1), upper, handles["flush_points"])
        self._trimmed_at.pop(vb, None)
        self._thinned_at.pop(vb, None)

    def divergence(self, vb: int, seqno: int) -> list[tuple[Row, Row | None]]:
        """What a rollback to ``seqno`` would undo: for every key changed above the point it
        would land on, (its latest version, its version at that point or None). Empty when
        the rollback would wipe the vbucket (no history to tell the versions at the point)."""
        with self._write_lock:  # (no write meanwhile: one consistent state of the disk)
            state = self._states.get(vb)
            if state is None or seqno >= state.high_seqno:
                return []
            point = self._rollback_point(vb, seqno, state)
            if point is None:
                return []
            _, at_point, _ = self._changes_since(vb, point)
            out: list[tuple[Row, Row | None]] = []
            for key, old in at_point.items():
                ours = self._row_of_key(vb, key)
                if ours is not None and ours[1] > point:
                    out.append((ours, None if old is None else self._row(vb, old)))
            return out

    def _row_of_key(self, vb: int, key: bytes) -> Row | None:
        meta = self._db.cf["by_key"].get(_VB.pack(vb) + key)
        return None if meta is None else self._row(vb, _KEY_META.unpack(meta)[0])

    def _row(self, vb: int, seqno: int) -> Row:
        record = self._db.cf["by_seqno"].get(_seqno_key(vb, seqno))
        return row_of_stream_row(_stream_row(seqno, record))

    def compact(
        self,
        vb: int,
        *,
        purge_before_seqno: int | None = None,
        purge_older_than_secs: float | None = None,
        now: float | None = None,
    ) -> CompactResult:
        """Delete tombstones below a seqno and/or older than an age; raise the purge seqno."""
        deleted_before = None
        if purge_older_than_secs is not None:
            deleted_before = int((time.time() if now is None else now) - purge_older_than_secs)
        with self._writing():
            state = self._states.get(vb)
            if state is None or (purge_before_seqno is None and deleted_before is None):
                return CompactResult(0, state.purge_seqno if state else 0)
            batch = rocksdict.WriteBatch(raw_mode=True)
            handles, count, top = self._db.handle, 0, 0
            for key, meta in _scan(self._db.cf["by_key"], *_vb_range(vb)):
                seqno, packed = _KEY_META.unpack(meta)
                if retention.purgeable(
                    bool(packed >> 8 & 3), seqno, packed >> 10, purge_before_seqno, deleted_before
                ):
                    batch.delete(key, handles["by_key"])
                    batch.delete(_seqno_key(vb, seqno), handles["by_seqno"])
                    count, top = count + 1, max(top, seqno)
            state.purge_seqno = max(state.purge_seqno, top)
            self._put_state(batch, vb, state, merge=False)
            self._write(batch)
            return CompactResult(count, state.purge_seqno)


def _chunks(
    per_vb: dict[int, tuple[dict[bytes, Item], VBState]], *, split: bool
) -> Iterator[list[Chunk]]:
    """The vbuckets in id order, each one's items in key order (a memtable insert is a
    skiplist search, and one next to the last one finds its path in the cache: 2.6 -> 1.0 us
    an entry for 6,000 random keys), cut into write batches of about :data:`GROUP_ITEMS`
    items and :data:`GROUP_BYTES` bytes. A vbucket's state goes with its last items;
    ``split``: a vbucket's items may span batches (a torn tail is repaired at open,
    :meth:`RocksStorage._repair`; without history there is nothing to repair it from, so a
    vbucket then stays whole)."""
    chunk: list[Chunk] = []
    count = size = 0
    for vb in sorted(per_vb):
        latest, state = per_vb[vb]
        items = sorted(latest.items())
        nbytes = sum(_bytes_of(item) for _, item in items)
        if chunk and (count + len(items) > GROUP_ITEMS or size + nbytes > GROUP_BYTES):
            yield chunk
            chunk, count, size = [], 0, 0
        while split and (len(items) > GROUP_ITEMS or nbytes > GROUP_BYTES):
            n, head_bytes = _head_within_limits(items)
            yield [(vb, items[:n], None)]
            items, nbytes = items[n:], nbytes - head_bytes
        chunk.append((vb, items, state))
        count, size = count + len(items) + 1, size + nbytes
    if chunk:
        yield chunk


def _bytes_of(item: Item) -> int:
    return len(item.key) + len(item.value or b"")


def _head_within_limits(items: list[tuple[bytes, Item]]) -> tuple[int, int]:
    """How many of the first ``items`` (at least one) fit one write batch, and their bytes."""
    n = total = 0
    for _, item in items[:GROUP_ITEMS]:
        size = _bytes_of(item)
        if n and total + size > GROUP_BYTES:
            break
        n, total = n + 1, total + size
    return n, total


def _copy(s: VBState) -> VBState:
    return VBState(
        s.state, s.failover_json, s.high_seqno, s.snap_start, s.snap_end, s.purge_seqno,
        s.max_cas, s.history_start, s.item_count, s.high_prepared_seqno, s.high_completed_seqno,
    )  # fmt: skip
