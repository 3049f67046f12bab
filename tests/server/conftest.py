"""A real ``dcpkv server`` subprocess per test, on a free port, data in tmp_path.

Every process started here is stopped by PID at teardown (SIGTERM, then SIGKILL), whatever
the test did to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serverproc import ServerProcess, tracked_servers


@pytest.fixture
def server_factory() -> Iterator[type[ServerProcess]]:
    with tracked_servers() as factory:
        yield factory


@pytest.fixture
def server(server_factory: type[ServerProcess], tmp_path: Path) -> ServerProcess:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log")
    srv.start()
    return srv
