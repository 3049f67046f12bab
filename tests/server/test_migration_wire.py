"""A data folder the SQLite engine wrote, converted to RocksDB (by the server's first start, or
by ``dcpkv admin migrate``): warm-up serves the same data and a DCP consumer resumes.

The folder is one the SQLite engine itself wrote (``tests/fixtures/sqlite/server``, made by
``tests/support/sqlite_fixtures.py`` with the last commit that had the engine), with what that
engine held: the live documents, and each vbucket's uuid and high seqno (where a consumer that
had read everything resumes)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcpkv.engine.storage import BucketLock
from dcpkv.protocol import dcp
from support.dcpclient import DcpClient
from support.kvclient import Writer
from support.serverproc import ServerProcess
from support.sqlite_fixtures import SERVER, SERVER_KEYS, SERVER_VBUCKETS

EXPECTED = json.loads((SERVER / "expected.json").read_text())


def _folder(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(SERVER, data, ignore=shutil.ignore_patterns("expected.json"))
    return data


def _migrate(data: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "admin", "migrate", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=120, check=check,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["first start", "admin migrate"])
def test_a_sqlite_folder_is_converted_and_serves_the_same(
    server_factory: type[ServerProcess], tmp_path: Path, how: str
) -> None:
    data = _folder(tmp_path)
    if how == "admin migrate":
        assert "bucket 'default': converted to RocksDB" in _migrate(data).stdout
        assert not (data / "default.sqlite3").exists()
    new = server_factory(data, tmp_path / "new.log")
    new.start()
    assert (data / "default.rocksdb").is_dir() and not (data / "default.sqlite3").exists()
    expected = {key.encode(): value.encode() for key, value in EXPECTED["docs"].items()}
    with Writer(new.port) as w:
        assert w.docs(set(SERVER_KEYS)) == expected
        assert w.c.stats()["curr_items"] == str(len(expected))
        # a consumer that had read everything resumes where it was: no rollback
        resumed = DcpClient(new.port, name="test:consumer")
        for vb, held in EXPECTED["vbuckets"].items():
            high = held["high_seqno"]
            answer = resumed.stream(int(vb), start=high, uuid=held["uuid"], snapshot=(high, high))
            assert isinstance(answer, dcp.StreamRequestOk), (vb, answer)
        w.set(b"after", b"migration")
    resumed.follow(lambda: resumed.docs().get(b"after") == b"migration")
    assert set(resumed.docs()) == {b"after"}  # nothing sent again
    resumed.close()
    assert new.terminate() == 0


def test_admin_migrate_refuses_a_bucket_another_process_holds(tmp_path: Path) -> None:
    data = _folder(tmp_path)
    before = (data / "default.sqlite3").read_bytes()
    lock = BucketLock(data, "default")  # as a running server holds its buckets
    try:
        done = _migrate(data, check=False)
    finally:
        lock.release()
    assert done.returncode == 1 and "dcpkv admin migrate:" in done.stderr
    assert "in use by another process" in done.stderr
    assert (data / "default.sqlite3").read_bytes() == before
    assert not (data / "default.rocksdb").exists()


def _grow(database: Path, per_vbucket: int) -> int:
    """Add ``per_vbucket`` documents to each vbucket of the SQLite engine's file, in its own
    schema (plain SQL, above each vbucket's high seqno); returns the versions it then holds."""
    db = sqlite3.connect(database, isolation_level=None)
    db.execute("BEGIN")
    for vb, high in db.execute("SELECT vb, high_seqno FROM vbstate").fetchall():
        db.executemany(
            "INSERT INTO documents VALUES (?, ?, ?, ?, 1, 0, 0, 0, 0, 0, ?)",
            [(vb, b"k%d-%d" % (vb, i), high + i, high + i, b"v" * 100)
             for i in range(1, per_vbucket + 1)],
        )  # fmt: skip
        top = high + per_vbucket
        db.execute(
            "UPDATE vbstate SET high_seqno = ?, snap_start = ?, snap_end = ? WHERE vb = ?",
            (top, top, top, vb),
        )
    db.execute("COMMIT")
    (docs,) = db.execute("SELECT count(*) FROM documents").fetchone()
    (history,) = db.execute("SELECT count(*) FROM history").fetchone()
    db.close()
    return int(docs) + int(history)


def test_a_conversion_killed_midway_starts_again_from_the_untouched_source(
    tmp_path: Path,
) -> None:
    from dcpkv.engine.bucket import open_storage, storage_path
    from dcpkv.engine.migrate import partial_path

    data = _folder(tmp_path)
    sqlite = data / "default.sqlite3"
    versions = _grow(sqlite, 4000)  # (large enough to be killed midway)
    rocks = storage_path(data, "default")
    before = sqlite.read_bytes()
    argv = [sys.executable, "-m", "dcpkv.cli.main", "admin", "migrate", "--data-dir", str(data)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not partial_path(rocks).exists():
            time.sleep(0.005)
        proc.kill()  # as soon as the conversion writes: midway, unless it was very quick
    finally:
        proc.wait(timeout=60)
    if not rocks.exists():  # killed before the rename: the source is as it was
        assert sqlite.read_bytes() == before
        assert f"converted to RocksDB ({versions} versions)" in _migrate(data).stdout
    else:  # (killed after it: the next run, or start, only removes what is left)
        _migrate(data)
    assert not sqlite.exists() and not partial_path(rocks).exists()
    converted = open_storage(data, "default", cache_bytes=0)
    live = sum(1 for vb in range(SERVER_VBUCKETS) for _ in converted.load_items(vb))
    assert live == len(EXPECTED["docs"]) + SERVER_VBUCKETS * 4000
    converted.close()


def test_compact_converts_a_sqlite_bucket_first(tmp_path: Path) -> None:
    data = _folder(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "compact", "--data-dir", str(data),
         "--purge-before-seqno", "1000000"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    deleted = len(SERVER_KEYS) - len(EXPECTED["docs"])
    assert f"compacted {SERVER_VBUCKETS} vbucket(s) of 'default': {deleted} tombstone(s)" in (
        done.stdout
    )
    assert (data / "default.rocksdb").is_dir() and not (data / "default.sqlite3").exists()
