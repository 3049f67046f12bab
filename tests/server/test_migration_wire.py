"""A data folder the SQLite engine wrote, converted to RocksDB (by the server's first start, or
by ``dcpkv admin migrate``): warm-up serves the same data and a DCP consumer resumes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol import dcp
from support.dcpclient import DcpClient, all_vb_seqnos
from support.kvclient import Writer
from support.serverproc import ServerProcess

KEYS = {b"doc-%d" % i for i in range(120)}
DELETED = {b"doc-%d" % i for i in range(0, 120, 7)}


def _migrate(data: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "admin", "migrate", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize("how", ["first start", "admin migrate"])
def test_a_sqlite_folder_is_converted_and_serves_the_same(
    server_factory: type[ServerProcess], tmp_path: Path, how: str
) -> None:
    data = tmp_path / "data"
    old = server_factory(data, tmp_path / "old.log", "--storage", "sqlite")
    old.start()
    with Writer(old.port) as w:
        for round_ in range(3):  # several flushes: history and flush points to carry over
            for key in sorted(KEYS):
                w.set(key, b"%s-v%d" % (key, round_))
        for key in DELETED:
            w.delete(key)
        expected = w.docs(KEYS)
    consumer = DcpClient(old.port)
    for vb in range(16):
        assert isinstance(consumer.stream(vb), dcp.StreamRequestOk)
    seqnos = all_vb_seqnos(consumer)
    consumer.follow_to(seqnos)
    consumer.close()
    assert old.terminate() == 0
    assert (data / "default.sqlite3").exists()

    if how == "admin migrate":
        assert "bucket 'default': converted to RocksDB" in _migrate(data)
        assert not (data / "default.sqlite3").exists()
    new = server_factory(data, tmp_path / "new.log")  # the default engine: rocksdb
    new.start()
    assert (data / "default.rocksdb").is_dir() and not (data / "default.sqlite3").exists()
    with Writer(new.port) as w:
        assert w.docs(KEYS) == expected
        assert w.c.stats()["curr_items"] == str(len(KEYS - DELETED))
        # the consumer resumes where it was: no rollback, and it sees what comes next
        resumed = DcpClient(new.port, name="test:consumer")
        resumed.vbs = consumer.vbs
        for vb in range(16):
            assert isinstance(resumed.stream(vb), dcp.StreamRequestOk), vb
        assert all_vb_seqnos(resumed) == seqnos
        w.set(b"after", b"migration")
    resumed.follow(lambda: resumed.docs().get(b"after") == b"migration")
    assert {k: v for k, v in resumed.docs().items() if k != b"after"} == expected
    resumed.close()
    assert new.terminate() == 0


def test_admin_migrate_refuses_a_bucket_a_server_holds(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    srv = server_factory(data, tmp_path / "server.log", "--storage", "sqlite")
    srv.start()
    done = subprocess.run(
        [sys.executable, "-m", "dcpkv.cli.main", "admin", "migrate", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "dcpkv admin migrate:" in done.stderr
    assert (data / "default.sqlite3").exists() and not (data / "default.rocksdb").exists()
    with Writer(srv.port) as w:  # the server still serves
        w.set(b"k", b"v")
        assert w.c.get(b"k", vbucket=w.vb_of(b"k")).status == Status.Success
    assert srv.terminate() == 0


def test_a_conversion_killed_midway_starts_again_from_the_untouched_source(
    tmp_path: Path,
) -> None:
    from dcpkv.engine.bucket import open_storage, storage_path
    from dcpkv.engine.item import Item
    from dcpkv.engine.migrate import partial_path
    from dcpkv.engine.storage import VBState

    data = tmp_path / "data"
    source = open_storage("sqlite", data, "default", synchronous="NORMAL", cache_bytes=0)
    for vb in range(16):
        items = [Item(b"k%d-%d" % (vb, i), b"v" * 100, by_seqno=i + 1, cas=i + 1)
                 for i in range(4000)]  # fmt: skip
        source.persist([(vb, items, VBState("active", "[]", 4000, 4000, 4000))])
    source.close()
    sqlite = storage_path(data, "default", "sqlite")
    rocks = storage_path(data, "default", "rocksdb")
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
        assert "converted to RocksDB (64000 versions)" in _migrate(data)
    else:  # (killed after it: the next run, or start, only removes what is left)
        _migrate(data)
    assert not sqlite.exists() and not partial_path(rocks).exists()
    converted = open_storage("rocksdb", data, "default", cache_bytes=0)
    assert sum(1 for vb in range(16) for _ in converted.load_items(vb)) == 64000
    converted.close()
