"""A real ``dcpkv server`` subprocess per test, on a free port, data in tmp_path.

Every process started here is stopped by PID at teardown (SIGTERM, then SIGKILL), whatever
the test did to it.
"""

from __future__ import annotations

from support.serverproc import server, server_factory

__all__ = ["server", "server_factory"]
