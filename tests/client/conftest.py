"""Real-server fixtures for the client's wire tests (the helpers live in ``tests/server``).

Every server started here is stopped by PID at teardown, whatever the test did to it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from kvclient import KVClient
from serverproc import ServerProcess, tracked_servers

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode

VBUCKETS = 16  # serverproc starts every server with --vbuckets 16


@pytest.fixture
def server_factory() -> Iterator[type[ServerProcess]]:
    with tracked_servers() as factory:
        yield factory


@pytest.fixture
def server(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log")
    srv.start()
    return srv


def vb_of(key: bytes) -> int:
    return vbucket_for_key(key, VBUCKETS)


class Writer:
    """A blocking KV writer for the tests, every key sent to its vbucket."""

    def __init__(self, port: int) -> None:
        self.c = KVClient(port)
        assert self.c.login().status == Status.Success

    def close(self) -> None:
        self.c.close()

    def set(self, key: bytes, value: bytes, expiry: int = 0) -> None:
        assert self.c.set(key, value, vbucket=vb_of(key), expiry=expiry).status == Status.Success

    def delete(self, key: bytes) -> None:
        self.c.send(self.c.frame(Opcode.Delete, key=key, vbucket=vb_of(key)))
        assert self.c.recv_frame().status in (Status.Success, Status.KeyEnoent)

    def docs(self, keys: set[bytes]) -> dict[bytes, bytes]:
        out = {}
        for key in keys:
            frame = self.c.get(key, vbucket=vb_of(key))
            if frame.status == Status.Success:
                out[key] = bytes(frame.value)
            else:
                assert frame.status == Status.KeyEnoent
        return out
