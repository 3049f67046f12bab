"""Storage: backfill scans, rollback history, compaction, corrupt files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.core.failover_table import FailoverTable
from dcpkv.engine.bucket import open_storage, storage_path
from dcpkv.engine.item import Item
from dcpkv.engine.rocks_storage import GROUP_BYTES, GROUP_ITEMS, RocksStorage
from dcpkv.engine.storage import (
    BucketStorage,
    CorruptDatabaseError,
    VBState,
    row_of_stream_row,
)

FAILOVER = '[{"id":7,"seq":5},{"id":3,"seq":0}]'


def _state(high: int) -> VBState:
    return VBState("replica", FAILOVER, high_seqno=high, snap_start=high, snap_end=high)


def _open(folder: Path, history_window: int = 10) -> BucketStorage:
    return open_storage(folder, "b", history_window=history_window, cache_bytes=0)


def _put(storage: BucketStorage, *versions: tuple[int, bytes, bytes | None]) -> None:
    """Persist one snapshot; value None is a tombstone."""
    items = [
        Item(key, value or b"", by_seqno=seqno, cas=seqno, rev_seqno=seqno, deleted=value is None)
        for seqno, key, value in versions
    ]
    storage.persist_snapshot(0, items, _state(versions[-1][0]))


def _docs(storage: BucketStorage) -> dict[bytes, tuple[int, bytes, bool]]:
    return {i.key: (i.by_seqno, i.value, i.deleted) for i in storage.scan_by_seqno(0, 0)}


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[BucketStorage]:
    opened = _open(tmp_path)
    yield opened
    with contextlib.suppress(Exception):
        opened.close()


def test_scan_by_seqno_latest_version_per_key_with_tombstones(storage: BucketStorage) -> None:
    _put(storage, (1, b"a", b"1"), (2, b"b", b"1"), (3, b"c", b"1"))
    _put(storage, (4, b"a", b"2"), (5, b"b", None))
    scanned = [(i.by_seqno, i.key, i.deleted) for i in storage.scan_by_seqno(0, 0)]
    assert scanned == [(3, b"c", False), (4, b"a", False), (5, b"b", True)]
    assert [i.by_seqno for i in storage.scan_by_seqno(0, 3, 4)] == [4]
    backfill = storage.backfill(0, 3)
    assert (backfill.start, backfill.end) == (3, 5)
    assert [i.key for i in backfill.items] == [b"a", b"b"]


def test_values_and_meta_round_trip(storage: BucketStorage) -> None:
    item = Item(b"k", b"v", flags=0xDEADBEEF, expiry=99, cas=(1 << 64) - 1, rev_seqno=3,
                by_seqno=1, datatype=1)  # fmt: skip
    storage.persist_snapshot(0, [item], _state(1))
    assert storage.get(0, b"k") == item
    assert list(storage.load_items(0)) == [item]  # warm-up's read
    assert [i.value for i in storage.load_items(0, values=False)] == [None]
    assert storage.vbucket_state(0) == VBState("replica", FAILOVER, 1, 1, 1, 0, 0, 0)


U32 = 0xFFFFFFFF


@pytest.mark.parametrize("flags", [0, 1, 0x7FFFFFFF, 0x80000000, U32])
@pytest.mark.parametrize("expiry", [0, 0x80000000, U32])
def test_stream_rows_hold_what_rows_hold(storage: BucketStorage, flags: int, expiry: int) -> None:
    """A DCP backfill's packed rows (flags with expiry, datatype with the tombstone's fields,
    packed by the engine) unpack to the very rows a plain backfill reads, at every edge of the
    unsigned 32-bit fields and of the signed 64-bit CAS."""
    items = [
        Item(b"live", b"v", flags=flags, expiry=expiry, cas=(1 << 64) - 1, rev_seqno=U32 + 1,
             by_seqno=1, datatype=0xFF),
        Item(b"gone", b"", flags=flags, expiry=expiry, cas=1 << 63, rev_seqno=2, by_seqno=2,
             datatype=4, deleted=True, delete_time=U32),
        Item(b"old", b"", cas=(1 << 63) - 1, by_seqno=3, deleted=True, delete_time=expiry,
             expired=True),
    ]  # fmt: skip
    storage.persist_snapshot(0, items, _state(3))
    plain, packed = storage.open_backfill(0, 0), storage.open_stream_backfill(0, 0)
    rows = plain.read(10)
    assert [row_of_stream_row(r) for r in packed.read(10)] == rows and len(rows) == 3
    assert packed.exhausted and plain.exhausted  # read to the end: closed


def test_rollback_within_window_restores_old_versions(storage: BucketStorage) -> None:
    _put(storage, (1, b"a", b"1"), (2, b"b", b"1"))
    _put(storage, (3, b"a", b"2"), (4, b"c", b"1"))
    _put(storage, (5, b"b", None), (6, b"a", b"3"))
    assert storage.rollback(0, 5) == 4  # the newest flush point at or below 5
    assert _docs(storage) == {
        b"a": (3, b"2", False), b"b": (2, b"1", False), b"c": (4, b"1", False),
    }  # fmt: skip
    # The restore wrote the old versions back without adding history: the history holds
    # just what was replaced at or below 4.
    assert storage.history(0) == [(b"a", 1, 3)]
    state = storage.vbucket_state(0)
    assert state is not None and (state.high_seqno, state.snap_start, state.snap_end) == (4, 4, 4)
    # the branch 7 began at 5, above the rollback point: forgotten
    assert [e.uuid for e in FailoverTable.from_json(state.failover_json, 4)] == [3]
    assert storage.rollback(0, 2) == 2
    assert _docs(storage) == {b"a": (1, b"1", False), b"b": (2, b"1", False)}
    pruned = FailoverTable.from_json(storage.vbucket_state(0).failover_json, 2)  # type: ignore[union-attr]
    assert [e.uuid for e in pruned] == [3]


def test_rollback_past_window_empties_the_vbucket(storage: BucketStorage) -> None:
    for seqno in range(1, 31, 2):
        _put(storage, (seqno, b"a", b"%d" % seqno), (seqno + 1, b"b", b"%d" % seqno))
    assert storage.rollback(0, 25) == 24  # inside the window of 10
    assert _docs(storage)[b"a"] == (23, b"23", False)
    assert storage.rollback(0, 5) == 0
    assert _docs(storage) == {}
    assert storage.vbucket_state(0).high_seqno == 0  # type: ignore[union-attr]


def _flush_points(storage: BucketStorage) -> list[int]:
    return [p for (p,) in storage._db.execute("SELECT seqno FROM flush_points WHERE vb = 0")]


# (history window, flushes at seqnos 1..n, one each) -> the flush points kept, where a
# rollback to a seqno lands. Stride = window // 64; thinning runs every stride of seqnos
# (first at seqno 1) and keeps, below high - stride, the newest point of each stride.
THINNING = [
    pytest.param(
        640, 100,
        [9, 19, 29, 39, 49, 59, 69, 79, 80, *range(81, 101)],
        {100: 100, 85: 85, 80: 80, 79: 79, 78: 69, 15: 9, 9: 9, 8: 0},
        id="stride 10: dense above 81 (cutoff of the run at 91), newest of each ten below",
    ),
    pytest.param(
        640, 5, [1, 2, 3, 4, 5], {3: 3},
        id="younger than a stride: every point kept",
    ),
    pytest.param(
        63, 30, list(range(1, 31)), {25: 25},
        id="window under 64: a stride of one seqno keeps every point",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("window", "flushes", "kept", "lands"), THINNING)
def test_older_flush_points_are_thinned_to_one_per_stride(
    tmp_path: Path, window: int, flushes: int, kept: list[int], lands: dict[int, int]
) -> None:
    """A flush point per vbucket per flush, kept for the whole history window, grew without
    bound under a steady load (~100M rows after three hours at 10k writes/s); older ones are
    thinned, and a rollback lands on the newest point kept at or below its target."""
    for target, expected in lands.items():
        storage = _open(tmp_path / str(target), window)
        for seqno in range(1, flushes + 1):
            _put(storage, (seqno, b"k%d" % (seqno % 7), b"v%d" % seqno))
        assert storage.flush_points(0) == kept
        assert storage.rollback(0, target) == expected
        if expected:  # exact: every key as it was at that flush
            assert _docs(storage) == {
                b"k%d" % (s % 7): (s, b"v%d" % s, False)
                for s in range(max(1, expected - 6), expected + 1)
            }  # fmt: skip
        storage.close()


def test_rollback_to_or_above_high_is_a_no_op(storage: BucketStorage) -> None:
    _put(storage, (1, b"a", b"1"))
    assert storage.rollback(0, 9) == 1
    assert _docs(storage) == {b"a": (1, b"1", False)}


def test_rollback_restores_a_key_whose_tombstone_was_purged(storage: BucketStorage) -> None:
    _put(storage, (1, b"a", b"1"))
    _put(storage, (2, b"a", None), (3, b"b", b"1"))
    storage.compact(0, purge_before_seqno=3)
    assert storage.rollback(0, 1) == 1
    assert _docs(storage) == {b"a": (1, b"1", False)}


def test_compaction_purges_tombstones_and_raises_purge_seqno(storage: BucketStorage) -> None:
    _put(storage, (1, b"a", b"1"), (2, b"b", None), (3, b"c", None), (4, b"d", b"1"))
    result = storage.compact(0, purge_before_seqno=3)
    assert (result.purged, result.purge_seqno) == (1, 2)
    assert set(_docs(storage)) == {b"a", b"c", b"d"}
    result = storage.compact(0, purge_older_than_secs=0, now=10**10)
    assert (result.purged, result.purge_seqno) == (1, 3)
    # a later flush never lowers the purge seqno
    _put(storage, (5, b"e", b"1"))
    assert storage.vbucket_state(0).purge_seqno == 3  # type: ignore[union-attr]


def test_corrupt_file_is_named(tmp_path: Path) -> None:
    # a database whose manifest (the list of its files) is damaged
    _open(tmp_path).close()
    (named,) = storage_path(tmp_path, "b").glob("MANIFEST-*")
    named.write_bytes(b"this is not a manifest" * 100)
    with pytest.raises(CorruptDatabaseError, match=str(named)):
        _open(tmp_path)


def test_a_folder_without_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    folder = storage_path(tmp_path, "b")
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(CorruptDatabaseError, match="no RocksDB CURRENT file"):
        _open(tmp_path)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


def test_clean_shutdown_flag(storage: BucketStorage) -> None:
    assert storage.was_clean_shutdown()
    storage.set_clean_shutdown(False)
    assert not storage.was_clean_shutdown()


def test_a_flush_of_one_vbucket_twice_keeps_the_newest_version(storage: BucketStorage) -> None:
    # persist sorts its rows by (vb, key) before the upserts: two snapshots of one vbucket in one
    # flush must still leave each key at its newest version, whatever the order of the keys.
    def item(key: bytes, seqno: int) -> Item:
        return Item(key, b"v%d" % seqno, by_seqno=seqno, cas=seqno, rev_seqno=seqno)

    storage.persist([
        (0, [item(b"z", 1), item(b"a", 2)], _state(2)),
        (0, [item(b"a", 3), item(b"z", 4)], _state(4)),
    ])  # fmt: skip
    assert _docs(storage) == {b"a": (3, b"v3", False), b"z": (4, b"v4", False)}
    assert storage.vbucket_state(0) is not None and storage.vbucket_state(0).high_seqno == 4


def test_a_backfill_reads_the_disk_as_it_was_when_opened(storage: BucketStorage) -> None:
    """A scan is one consistent state of the disk however long it is read: keys replaced,
    deleted or added by flushes meanwhile are sent as they were (RocksDB iterators made
    together, each a view as of its creation)."""
    _put(storage, *[(i, b"k%d" % i, b"old") for i in range(1, 9)])
    scan = storage.open_stream_backfill(0, 0)
    first = scan.read(3)
    _put(storage, (9, b"k5", b"new"), (10, b"k6", None), (11, b"k9", b"new"))
    rest = scan.read(100)
    assert scan.exhausted and (scan.start, scan.end) == (0, 8)
    rows = [row_of_stream_row(r) for r in first + rest]
    assert [(r[0], r[1], r[-1]) for r in rows] == [(b"k%d" % i, i, b"old") for i in range(1, 9)]
    assert [i.by_seqno for i in storage.scan_by_seqno(0, 0)] == [1, 2, 3, 4, 7, 8, 9, 10, 11]


def _rocks(tmp_path: Path, window: int = 1000) -> RocksStorage:
    storage = _open(tmp_path, window)
    assert isinstance(storage, RocksStorage)
    return storage


def test_a_large_vbucket_is_written_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rocksdict holds the interpreter lock for a whole write: a flush is cut into batches of
    about GROUP_ITEMS items, a vbucket's items across several when it has more."""
    storage = _rocks(tmp_path)
    writes: list[int] = []
    write = storage._write
    monkeypatch.setattr(storage, "_write", lambda batch: (writes.append(len(batch)), write(batch)))
    _put(storage, *[(i, b"k%05d" % i, b"v") for i in range(1, 2 * GROUP_ITEMS + 100)])
    assert len(writes) == 3 and max(writes) <= 2 * GROUP_ITEMS + 16  # (2 entries an item)
    assert len(list(storage.scan_by_seqno(0, 0))) == 2 * GROUP_ITEMS + 99
    storage.close()


def test_large_values_are_written_in_batches_of_bounded_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is held several times over while written, outside the bucket's quota: large
    values cut a flush at about GROUP_BYTES, in a vbucket too, and every value reaches disk."""
    storage = _rocks(tmp_path)
    sizes: list[int] = []
    write = storage._write
    monkeypatch.setattr(
        storage, "_write", lambda batch: (sizes.append(batch.size_in_bytes()), write(batch))
    )
    value = b"v" * 4096
    count = 3 * GROUP_BYTES // len(value)
    _put(storage, *[(i, b"k%05d" % i, value) for i in range(1, count + 1)])
    assert len(sizes) >= 3 and max(sizes) <= GROUP_BYTES + 64 * 1024  # (keys and records)
    assert [d.value for d in storage.scan_by_seqno(0, 0)] == [value] * count
    storage.close()


def test_a_flush_torn_between_batches_is_undone_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that dies between two write batches of one vbucket leaves items above its
    persisted state on disk: the next open rolls them back (from the replaced marks), so the
    vbucket is exactly as its last complete flush left it."""
    storage = _rocks(tmp_path)
    _put(storage, (1, b"a", b"1"), (2, b"b", b"1"))
    monkeypatch.setattr("dcpkv.engine.rocks_storage.GROUP_ITEMS", 2)
    write = storage._write
    writes: list[int] = []

    def dies_after_the_first(batch: object) -> None:
        if writes:
            raise SystemExit("killed")  # (the process dies: nothing more reaches the disk)
        writes.append(1)
        write(batch)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "_write", dies_after_the_first)
    with pytest.raises(SystemExit):  # keys in order: a, b (replaced), then c, d
        _put(storage, (3, b"b", b"2"), (4, b"a", b"2"), (5, b"c", b"2"), (6, b"d", b"2"))
    assert storage.get(0, b"a") is not None and storage.get(0, b"a").by_seqno == 4  # type: ignore[union-attr]
    storage._broken = "killed"  # (a dead process does not flush its memtables at close)
    storage.close()
    again = _rocks(tmp_path)
    assert _docs(again) == {b"a": (1, b"1", False), b"b": (2, b"1", False)}
    assert again.get(0, b"a") == Item(b"a", b"1", cas=1, rev_seqno=1, by_seqno=1)
    assert again.history(0) == [] and again.flush_points(0) == [2]
    _put(again, (3, b"c", b"3"))  # and it goes on from there
    assert again.rollback(0, 2) == 2 and _docs(again) == {
        b"a": (1, b"1", False), b"b": (2, b"1", False),
    }  # fmt: skip
    again.close()


def _index_partitions(storage: RocksStorage, family: str) -> str:
    """What the family's table files say of their index ("" when they have none)."""
    props = storage._db.cf[family].property_value("rocksdb.aggregated-table-properties") or ""
    return next((p.strip() for p in props.split(";") if "index partitions" in p), "")


def test_table_files_are_written_with_partitioned_index_and_filters(tmp_path: Path) -> None:
    """A flush's lookup of a new key must not load a table file's whole filter back into the
    cache: the key and log families' files are written with their index (and filters) in
    partitions, and read back through them."""
    storage = _rocks(tmp_path)
    _put(storage, *[(i, b"k%05d" % i, b"v") for i in range(1, 2001)])
    storage.close()  # (a clean close writes the memtables to table files)
    again = _rocks(tmp_path)
    for family in ("by_key", "by_seqno"):
        assert _index_partitions(again, family).startswith("# index partitions=")
    assert again.get(0, b"k01234") == Item(b"k01234", b"v", cas=1234, rev_seqno=1234, by_seqno=1234)
    assert again.get(0, b"missing") is None
    again.close()


def _filter_bytes(storage: RocksStorage, family: str) -> int:
    props = storage._db.cf[family].property_value("rocksdb.aggregated-table-properties") or ""
    return next(int(p.split("=")[1]) for p in props.split(";") if "filter block size" in p)


def test_the_log_keeps_no_filter_in_its_last_level(tmp_path: Path) -> None:
    """Every point read of the log is of a seqno the key index named: a compaction that
    writes the log's last level writes it no filter (the key index keeps its own: a missing
    key is ruled out there), and the log is read as before."""
    import rocksdict

    storage = _rocks(tmp_path)
    _put(storage, *[(i, b"k%05d" % i, b"v") for i in range(1, 2001)])
    storage.close()
    again = _rocks(tmp_path)
    assert _filter_bytes(again, "by_seqno") > 0  # (a flush's file, in level 0)
    rewrite = rocksdict.CompactOptions()
    rewrite.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force())
    for family in ("by_key", "by_seqno"):
        again._db.cf[family].compact_range(None, None, rewrite)
    assert _filter_bytes(again, "by_seqno") == 0 and _filter_bytes(again, "by_key") > 0
    assert again.get(0, b"k01234") == Item(b"k01234", b"v", cas=1234, rev_seqno=1234, by_seqno=1234)
    assert again.get(0, b"missing") is None
    again.close()


def _whole_filter_options(name: str, cache: object, memtables: int) -> object:
    """A family's options as databases made before partitioned filters have their files."""
    import rocksdict

    options = rocksdict.Options(raw_mode=True)
    options.set_write_buffer_size(memtables // 2)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)  # type: ignore[arg-type]
    table.set_cache_index_and_filter_blocks(True)
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def test_a_database_with_whole_filters_opens_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Table files written with one whole index and filter each (before partitions) are
    read as they are; the files written after are partitioned."""
    with monkeypatch.context() as patched:
        patched.setattr("dcpkv.engine.rocks_storage._family_options", _whole_filter_options)
        old = _rocks(tmp_path)
        _put(old, *[(i, b"k%05d" % i, b"v") for i in range(1, 101)])
        old.close()
    storage = _rocks(tmp_path)
    assert _index_partitions(storage, "by_key") == ""
    assert storage.get(0, b"k00042") == Item(b"k00042", b"v", cas=42, rev_seqno=42, by_seqno=42)
    _put(storage, (101, b"k00042", b"new"))
    storage.close()
    again = _rocks(tmp_path)
    assert _index_partitions(again, "by_key").startswith("# index partitions=")
    assert again.get(0, b"k00042") == Item(b"k00042", b"new", cas=101, rev_seqno=101, by_seqno=101)
    assert len(_docs(again)) == 100
    again.close()


class _GoneEntry:
    """A directory entry for a file deleted between the listing and its stat."""

    name = "000999.log"

    def stat(self) -> os.stat_result:
        raise FileNotFoundError(2, "No such file or directory", self.name)


def test_a_wal_file_deleted_while_the_flush_syncs_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocksDB deletes an obsolete WAL file from a background thread at any moment, so a file
    the sync lists may be gone by its stat: the flush succeeds (seen failing a 6M-key fill)."""
    storage = _rocks(tmp_path)
    scandir = os.scandir

    @contextlib.contextmanager
    def listing_a_gone_file(path: Path) -> Iterator[list[object]]:
        with scandir(path) as entries:
            yield [*entries, _GoneEntry()]

    monkeypatch.setattr("dcpkv.engine.rocks_storage.os.scandir", listing_a_gone_file)
    _put(storage, (1, b"a", b"1"))
    _put(storage, (2, b"a", b"2"))
    monkeypatch.undo()
    storage.close()
    again = _rocks(tmp_path)
    assert _docs(again) == {b"a": (2, b"2", False)}
    again.close()


def _files_at(storage: RocksStorage, family: str, level: int) -> int:
    return int(storage._db.cf[family].property_int_value(f"rocksdb.num-files-at-level{level}"))


def _flushed_files(storage: RocksStorage, first_seqno: int, files: int) -> None:
    """``files`` snapshots of 50 new keys each, each written to its own level-0 files."""
    for f in range(files):
        base = first_seqno + 50 * f
        _put(storage, *[(base + i, b"k%05d" % (base + i), b"v") for i in range(50)])
        for cf in storage._db.cf.values():
            cf.flush(True)


def _compact_all(storage: RocksStorage) -> None:
    for cf in storage._db.cf.values():  # (in a function: no family outlives the close)
        cf.compact_range(None, None)


def test_level_zero_files_are_compacted_eight_at_a_time(tmp_path: Path) -> None:
    """Each flush's table file spans every vbucket, so level 0 collects eight of them
    before a compaction merges them into level 1 (not RocksDB's four)."""
    storage = _rocks(tmp_path)
    _flushed_files(storage, 1, 7)
    for family in ("by_key", "by_seqno"):
        assert _files_at(storage, family, 0) == 7
    assert len(_docs(storage)) == 350
    storage.close()


def test_a_database_compacted_under_other_options_opens_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data folder written with RocksDB's default level-0 trigger, with table files in
    levels 0 and 1, opens and reads every document, and takes new writes."""
    with monkeypatch.context() as patched:
        patched.setattr("dcpkv.engine.rocks_storage._L0_COMPACTION_TRIGGER", 4)
        old = _rocks(tmp_path)
        _flushed_files(old, 1, 3)
        _compact_all(old)  # (the three files merged, below level 0)
        _flushed_files(old, 151, 2)
        old.close()
    storage = _rocks(tmp_path)
    assert _files_at(storage, "by_seqno", 0) > 0
    assert sum(_files_at(storage, "by_seqno", level) for level in range(1, 7)) > 0
    assert storage.get(0, b"k00042") == Item(b"k00042", b"v", cas=42, rev_seqno=42, by_seqno=42)
    _put(storage, (251, b"k00042", b"new"))
    new = Item(b"k00042", b"new", cas=251, rev_seqno=251, by_seqno=251)
    assert storage.get(0, b"k00042") == new
    assert len(_docs(storage)) == 250
    storage.close()
