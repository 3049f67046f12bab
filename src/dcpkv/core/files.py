"""Durable files: the one way the project replaces a file so that a crash cannot tear it.

Theory of operation
-------------------
A file that must survive kill -9 and power loss whole (a consumer's offsets, a table's
manifest, a backup run's manifest) is never rewritten in place: the new bytes go to a
temporary file in the same directory, are fsynced, and the temporary is renamed over the
target (``os.replace`` is atomic on POSIX). The rename itself is an entry of the directory, so
the directory is fsynced too, or a power cut could bring the old name back. A reader thus sees
the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_fully(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may be short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, tmp: Path) -> None:
    """Replace ``path`` by ``data`` through ``tmp`` (same directory), durably."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_fully(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
