"""Write backpressure on a real server: a connection that writes while its bucket's flusher
lags is not read until the flusher catches up, so acknowledged writes are never far from disk.

The flusher is held back for real: the test takes SQLite's write lock on the bucket's file from
its own connection (``BEGIN IMMEDIATE``), so the server's next flush waits for it (up to
SQLite's 5 s busy timeout, longer than the test holds it). Nothing of the server is mocked; the
server runs the SQLite storage engine (which has a lock another process can take).
"""

from __future__ import annotations

import sqlite3
import struct
import time
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient
from support.serverproc import ServerProcess

VBUCKETS = 16
HOLD_S = 2.0  # the write lock is held this long (under SQLite's 5 s busy timeout)


@pytest.fixture
def server(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--storage", "sqlite")
    srv.start()
    return srv


def set_frame(kv: KVClient, key: bytes) -> bytes:
    extras = struct.pack(">II", 0, 0)
    vb = vbucket_for_key(key, VBUCKETS)
    return kv.frame(Opcode.Set, key=key, value=b"v-" + key, extras=extras, vbucket=vb)


def test_a_writer_is_held_while_the_flusher_lags_and_released_when_it_catches_up(
    server: ServerProcess,
) -> None:
    database = next(Path(server.data_dir).rglob("*.sqlite3"))
    with KVClient(server.port) as kv:
        assert kv.login().status == Status.Success
        assert kv.set(b"warm", b"up", vbucket=vbucket_for_key(b"warm", VBUCKETS)).status == 0
        lock = sqlite3.connect(database, isolation_level=None, timeout=10)
        try:
            lock.execute("BEGIN IMMEDIATE")  # the flusher cannot write from now on
            first = kv.call(Opcode.Set, **_set_args(b"first"))
            assert first.status == Status.Success
            time.sleep(0.6)  # the first write waits unpersisted: lag over 0.25 s
            # This chunk is read and answered, then the connection is held...
            assert kv.call(Opcode.Set, **_set_args(b"second")).status == Status.Success
            # ...so the next request stays unread while the flusher cannot write.
            kv.send(set_frame(kv, b"third"))
            kv.sock.settimeout(HOLD_S - 0.8)
            try:
                early = kv.recv_frame()
            except TimeoutError:
                early = None
            assert early is None, "a write was read while the flusher lagged"
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        kv.sock.settimeout(30)
        assert kv.recv_frame().status == Status.Success  # released once the flush went through
        stats = kv.stats()
        assert int(stats["ep_total_persisted"]) >= 3
        assert int(stats["write_holds"]) >= 1


def _set_args(key: bytes) -> dict[str, object]:
    return {
        "key": key,
        "value": b"v-" + key,
        "extras": struct.pack(">II", 0, 0),
        "vbucket": vbucket_for_key(key, VBUCKETS),
    }
