"""Migration from the SQLite engine to RocksDB: everything carried over, crash-safe steps,
a damaged source refused untouched (dcpkv.engine.migrate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcpkv.engine import migrate
from dcpkv.engine.bucket import migrate_storage, open_storage, storage_path
from dcpkv.engine.item import CommitItem, Item, PrepareItem
from dcpkv.engine.rocks_storage import RocksStorage
from dcpkv.engine.storage import BucketStorage, Storage, VBState, row_of_stream_row

FAILOVER = '[{"id":7,"seq":5},{"id":3,"seq":0}]'
WINDOW = 1000


def _state(high: int, vb: int) -> VBState:
    return VBState("active" if vb else "replica", FAILOVER, high, high, high, max_cas=high)


def _write_sqlite(folder: Path) -> None:
    """Two vbuckets through several flushes: updates (history), tombstones, an expiry, a
    pending prepare and a committed one, a compaction (purge seqno), an unclean shutdown."""
    storage = open_storage("sqlite", folder, "b", history_window=WINDOW, cache_bytes=0)
    for vb in (0, 3):
        seqno = 0
        for flush in range(6):
            items: list[Item] = []
            for k in range(5):
                seqno += 1
                key = b"k%d" % ((k + flush) % 7)
                deleted = (seqno % 4) == 0
                items.append(Item(key, b"" if deleted else b"v%d" % seqno, flags=k, expiry=seqno,
                                  cas=(1 << 63) + seqno, rev_seqno=flush + 1, by_seqno=seqno,
                                  datatype=flush % 2, deleted=deleted, delete_time=seqno,
                                  expired=deleted and k == 1))  # fmt: skip
            if flush == 4:
                seqno += 1
                items.append(PrepareItem(b"pending", b"p", by_seqno=seqno, cas=seqno, level=2))
                seqno += 1
                items.append(PrepareItem(b"done", b"d", by_seqno=seqno, cas=seqno, level=1))
            if flush == 5:
                seqno += 1
                items.append(CommitItem(b"done", b"d", by_seqno=seqno, cas=seqno))
            storage.persist([(vb, items, _state(seqno, vb))])
        storage.compact(vb, purge_before_seqno=5)
    storage.set_clean_shutdown(False)
    storage.close()


def _everything(storage: BucketStorage, vb: int) -> dict[str, object]:
    """What a start, a backfill and a rollback read of a vbucket."""
    rows = [row_of_stream_row(r) for r in storage.open_stream_backfill(vb, 0).read(10_000)]
    return {
        "state": storage.vbucket_state(vb),
        "rows": rows,
        "live": list(storage.load_items(vb)),
        "prepares": storage.load_prepares(vb),
        "points": storage.flush_points(vb),
        "history": sorted(storage.history(vb)),
        "get": [storage.get(vb, b"k%d" % k) for k in range(7)],
    }


def _snapshot(storage: BucketStorage) -> dict[object, object]:
    return {
        "clean": storage.was_clean_shutdown(),
        "states": storage.vbucket_states(),
        **{vb: _everything(storage, vb) for vb in (0, 3)},
    }


def _rolled_back(storage: BucketStorage, seqno: int) -> tuple[int, list[object]]:
    point = storage.rollback(0, seqno)
    return point, [row_of_stream_row(r) for r in storage.open_stream_backfill(0, 0).read(10_000)]


def test_a_sqlite_bucket_is_converted_with_everything(tmp_path: Path) -> None:
    _write_sqlite(tmp_path / "old")
    _write_sqlite(tmp_path / "new")
    old = Storage(storage_path(tmp_path / "old", "b", "sqlite"), history_window=WINDOW)
    seen: list[tuple[int, int]] = []
    written = migrate_storage(
        tmp_path / "new", "b", history_window=WINDOW, progress=lambda d, t: seen.append((d, t))
    )
    assert written == old.count_versions() > 0
    assert seen[0] == (0, written) and seen[-1] == (written, written)
    assert not storage_path(tmp_path / "new", "b", "sqlite").exists()
    assert not migrate.partial_path(storage_path(tmp_path / "new", "b", "rocksdb")).exists()
    new = open_storage("rocksdb", tmp_path / "new", "b", history_window=WINDOW, cache_bytes=0)
    assert isinstance(new, RocksStorage)
    assert _snapshot(new) == _snapshot(old)
    for seqno in (29, 17, 12):  # a flush point, between two, the oldest history can restore
        assert _rolled_back(new, seqno) == _rolled_back(old, seqno)
    new.close()
    old.close()


def test_a_conversion_that_died_starts_again(tmp_path: Path) -> None:
    _write_sqlite(tmp_path)
    target = storage_path(tmp_path, "b", "rocksdb")
    partial = migrate.partial_path(target)
    partial.mkdir()
    (partial / "CURRENT").write_text("half a conversion")
    migrate_storage(tmp_path, "b", history_window=WINDOW)
    assert not partial.exists()
    storage = open_storage("rocksdb", tmp_path, "b", history_window=WINDOW, cache_bytes=0)
    assert storage.vbucket_states()[3].high_seqno == 33
    storage.close()


def test_a_conversion_that_died_before_removing_the_source_finishes(tmp_path: Path) -> None:
    _write_sqlite(tmp_path / "a")
    source = storage_path(tmp_path / "a", "b", "sqlite")
    kept = source.read_bytes()
    migrate_storage(tmp_path / "a", "b", history_window=WINDOW)
    source.write_bytes(kept)  # as if the process died between step 3 and step 4
    assert migrate.pending(source, storage_path(tmp_path / "a", "b", "rocksdb")) == "finish"
    assert migrate_storage(tmp_path / "a", "b") == 0
    assert not source.exists()


def test_a_damaged_source_is_refused_and_left_untouched(tmp_path: Path) -> None:
    _write_sqlite(tmp_path)
    source = storage_path(tmp_path, "b", "sqlite")
    data = bytearray(source.read_bytes())
    data[4096:8192] = b"\xa5" * 4096  # a page of the database overwritten
    source.write_bytes(bytes(data))
    with pytest.raises(migrate.MigrationError, match=str(source)):
        migrate_storage(tmp_path, "b", history_window=WINDOW)
    assert source.read_bytes() == data
    target = storage_path(tmp_path, "b", "rocksdb")
    assert not target.exists() and not migrate.partial_path(target).exists()


def test_opening_a_sqlite_bucket_with_rocksdb_converts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_sqlite(tmp_path)
    caplog.set_level("INFO")
    storage = open_storage("rocksdb", tmp_path, "b", history_window=WINDOW, cache_bytes=0)
    assert isinstance(storage, RocksStorage)
    assert storage.vbucket_states()[0].high_seqno == 33 and not storage.was_clean_shutdown()
    storage.close()
    assert not storage_path(tmp_path, "b", "sqlite").exists()
    said = [r.getMessage() for r in caplog.records]
    assert any("converting, 0 of" in m for m in said) and any("converted to" in m for m in said)
