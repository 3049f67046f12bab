"""Real-server fixtures for the examples' tests (the server helpers live in ``tests/server``).

Every server started here is stopped by PID at teardown, whatever the test did to it.
"""

from __future__ import annotations

from support.serverproc import server, server_factory

__all__ = ["server", "server_factory"]
