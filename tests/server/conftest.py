"""A real ``dcpkv server`` subprocess per test, on a free port, data in tmp_path.

Every process started here is stopped by PID at teardown (SIGTERM, then SIGKILL), whatever
the test did to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serverproc import ServerProcess


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[type[ServerProcess]]:
    started: list[ServerProcess] = []

    class Tracked(ServerProcess):
        def start(self) -> int:
            started.append(self)
            return super().start()

    yield Tracked
    for proc in started:
        proc.reap()


@pytest.fixture
def server(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log")
    srv.start()
    return srv
