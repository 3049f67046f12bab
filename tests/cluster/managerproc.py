"""A real ``dcpkv manager`` subprocess on a free port (``--port 0`` and a port file)."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from serverproc import ServerProcess, tracked_servers

from dcpkv.cluster.admin_client import admin_request
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER


class ManagerProcess(ServerProcess):
    """Started like a server (and stopped the same way, by PID), with the manager's flags."""

    def command(self, port: str, port_file: Path) -> list[str]:
        return [
            sys.executable, "-m", "dcpkv.cli.main", "manager", "--port", port,
            "--data-dir", str(self.data_dir), "--port-file", str(port_file), *self.extra,
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, method: str, path: str, **params: str) -> dict[str, Any]:
        return admin_request(
            self.url,
            method,
            path,
            user=DEFAULT_USER,
            password=DEFAULT_PASSWORD,
            params=params or None,
        )


def tracked_managers() -> AbstractContextManager[type[ManagerProcess]]:
    """Managers reaped by PID on exit, as ``tracked_servers`` reaps servers."""
    return tracked_servers(ManagerProcess)
