"""Real processes for the cluster tests: managed data nodes (``tests/server/serverproc.py``)
and ``dcpkv manager`` subprocesses on free ports. Every process started here is stopped by PID
at teardown (SIGTERM, then SIGKILL), whatever the test did to it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.managerproc import ManagerProcess, tracked_managers
from support.serverproc import ServerProcess, tracked_servers


@pytest.fixture
def server_factory() -> Iterator[type[ServerProcess]]:
    with tracked_servers() as factory:
        yield factory


@pytest.fixture
def manager_factory() -> Iterator[type[ManagerProcess]]:
    with tracked_managers() as factory:
        yield factory


@pytest.fixture
def sdk() -> Iterator[list[Any]]:
    """Official SDK clusters a test opened (``sdkhelp.connect``), closed at teardown."""
    opened: list[Any] = []
    yield opened
    for cluster in opened:
        cluster.close()
