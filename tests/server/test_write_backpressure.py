"""Write backpressure on a real server: a connection that writes while its bucket's flusher
lags is not read until the flusher catches up, so acknowledged writes are never far from disk.

The flusher is held back for real: the server runs in this process (its own event loop in a
thread, real TCP sockets), and the test occupies the server's one disk thread (the executor
every flush runs in) with a task that waits, so the next flush queues behind it. (The storage
engine holds its files exclusively: no other process can take a lock that stops its writes.)
Nothing of the server is mocked.
"""

from __future__ import annotations

import asyncio
import gc
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from dcpkv.server.app import DataServer
from dcpkv.server.config import BucketSettings, ServerSettings
from support.kvclient import KVClient

VBUCKETS = 16
HOLD_S = 2.0  # the disk thread is held this long


class InProcessServer:
    """A :class:`DataServer` on a free port, its event loop in a thread of this process."""

    def __init__(self, data_dir: Path) -> None:
        self.settings = ServerSettings(
            port=0, data_dir=data_dir, buckets=(BucketSettings(num_vbuckets=VBUCKETS),)
        )
        self.loop = asyncio.new_event_loop()
        self.server = DataServer(self.settings)
        self.port = 0
        self._started = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)
        self._thread.start()
        if not self._started.wait(120) or self._failed is not None:
            raise RuntimeError(f"the server did not start: {self._failed!r}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.port = self.loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._failed = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.server.stop())
        self.loop.close()

    def hold_disk_thread(self) -> threading.Event:
        """Occupy the server's disk thread until the returned event is set."""
        release = threading.Event()
        self.server.executor.submit(release.wait, 60)
        return release

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(120)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InProcessServer]:
    srv = InProcessServer(tmp_path / "data")
    yield srv
    srv.stop()
    gc.unfreeze()  # (the server froze what it saw, this process's objects too)


def set_frame(kv: KVClient, key: bytes) -> bytes:
    extras = struct.pack(">II", 0, 0)
    vb = vbucket_for_key(key, VBUCKETS)
    return kv.frame(Opcode.Set, key=key, value=b"v-" + key, extras=extras, vbucket=vb)


def test_a_writer_is_held_while_the_flusher_lags_and_released_when_it_catches_up(
    server: InProcessServer,
) -> None:
    with KVClient(server.port) as kv:
        assert kv.login().status == Status.Success
        assert kv.set(b"warm", b"up", vbucket=vbucket_for_key(b"warm", VBUCKETS)).status == 0
        release = server.hold_disk_thread()  # the flusher cannot write from now on
        try:
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
            release.set()
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
