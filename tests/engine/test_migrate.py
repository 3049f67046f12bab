"""Migration from the SQLite engine to RocksDB: everything carried over, crash-safe steps,
a damaged source refused untouched (dcpkv.engine.migrate, dcpkv.engine.sqlite_reader).

Every source here is a folder the SQLite engine itself wrote (``tests/fixtures/sqlite/``, made
by ``tests/support/sqlite_fixtures.py`` with the last commit that had the engine), and the
converted bucket is compared with what that engine read back from it (``expected.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dcpkv.engine import migrate
from dcpkv.engine.bucket import migrate_storage, open_storage, storage_path
from dcpkv.engine.rocks_storage import RocksStorage
from dcpkv.engine.sqlite_reader import SqliteReader, sqlite_path
from support.sqlite_fixtures import STORAGE, WINDOW, rolled_back, snapshot

CRASHED = STORAGE.parent / "crashed"


def _expected() -> Any:
    return json.loads((STORAGE / "expected.json").read_text())


def _copy(fixture: Path, folder: Path) -> Path:
    """The fixture's SQLite files in ``folder``; returns the database's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in fixture.glob("b.sqlite3*"):
        shutil.copy(path, folder / path.name)
    return sqlite_path(folder, "b")


def _highs(folder: Path) -> dict[int, int]:
    storage = open_storage(folder, "b", history_window=WINDOW, cache_bytes=0)
    try:
        return {vb: s.high_seqno for vb, s in storage.vbucket_states().items()}
    finally:
        storage.close()


def _expected_highs() -> dict[int, int]:
    states = dict(dict(_expected()["snapshot"])["states"])  # (plain: dicts as pairs)
    return {vb: state["high_seqno"] for vb, state in states.items()}


@pytest.mark.parametrize("fixture", [STORAGE, CRASHED], ids=["closed", "killed with its WAL"])
def test_a_sqlite_bucket_is_converted_with_everything(tmp_path: Path, fixture: Path) -> None:
    """Documents, tombstones, the history and flush points (rollback lands where the old
    engine's did, on the same documents), prepares pending and aborted, vbucket states,
    failover logs, purge seqnos, the unclean-shutdown flag."""
    source = _copy(fixture, tmp_path)
    expected = _expected()
    seen: list[tuple[int, int]] = []
    written = migrate_storage(
        tmp_path, "b", history_window=WINDOW, progress=lambda d, t: seen.append((d, t))
    )
    assert written == expected["versions"] > 0
    assert seen[0] == (0, written) and seen[-1] == (written, written)
    assert not migrate.source_files(source)
    assert not migrate.partial_path(storage_path(tmp_path, "b")).exists()
    new = open_storage(tmp_path, "b", history_window=WINDOW, cache_bytes=0)
    assert isinstance(new, RocksStorage)
    try:
        assert snapshot(new) == expected["snapshot"]
        assert rolled_back(new) == expected["rollbacks"]
    finally:
        new.close()


def test_the_source_is_only_read(tmp_path: Path) -> None:
    """Opened read-only: reading every version of a file a kill -9 left (its flushes all in
    the write-ahead log) changes neither the database nor the log."""
    source = _copy(CRASHED, tmp_path)
    wal = source.with_name(source.name + "-wal")
    before = (source.read_bytes(), wal.read_bytes())
    reader = SqliteReader(source)
    read = sum(1 for vb in reader.vbucket_states() for _ in reader.versions(vb))
    reader.close()
    assert read == _expected()["versions"]
    assert (source.read_bytes(), wal.read_bytes()) == before


def test_a_conversion_that_died_starts_again(tmp_path: Path) -> None:
    _copy(STORAGE, tmp_path)
    partial = migrate.partial_path(storage_path(tmp_path, "b"))
    partial.mkdir()
    (partial / "CURRENT").write_text("half a conversion")
    migrate_storage(tmp_path, "b", history_window=WINDOW)
    assert not partial.exists()
    assert _highs(tmp_path) == _expected_highs()


def test_a_conversion_that_died_before_removing_the_source_finishes(tmp_path: Path) -> None:
    source = _copy(STORAGE, tmp_path)
    kept = source.read_bytes()
    migrate_storage(tmp_path, "b", history_window=WINDOW)
    source.write_bytes(kept)  # as if the process died between step 3 and step 4
    assert migrate.pending(source, storage_path(tmp_path, "b")) == "finish"
    assert migrate_storage(tmp_path, "b") == 0
    assert not source.exists()
    assert _highs(tmp_path) == _expected_highs()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:4096] + b"\xa5" * 4096 + data[8192:],  # a page overwritten
        lambda data: b"this is not a database" * 100,
    ],
    ids=["a page overwritten", "not a database"],
)
def test_a_damaged_source_is_refused_and_left_untouched(tmp_path: Path, damage: Any) -> None:
    source = _copy(STORAGE, tmp_path)
    source.write_bytes(data := damage(source.read_bytes()))
    with pytest.raises(migrate.MigrationError, match=str(source)):
        migrate_storage(tmp_path, "b", history_window=WINDOW)
    assert source.read_bytes() == data
    target = storage_path(tmp_path, "b")
    assert not target.exists() and not migrate.partial_path(target).exists()


def test_opening_a_sqlite_bucket_converts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _copy(STORAGE, tmp_path)
    caplog.set_level("INFO")
    storage = open_storage(tmp_path, "b", history_window=WINDOW, cache_bytes=0)
    assert isinstance(storage, RocksStorage)
    assert {vb: s.high_seqno for vb, s in storage.vbucket_states().items()} == _expected_highs()
    assert not storage.was_clean_shutdown()
    storage.close()
    assert not source.exists()
    said = [r.getMessage() for r in caplog.records]
    assert any("converting, 0 of" in m for m in said) and any("converted to" in m for m in said)
