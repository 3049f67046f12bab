"""The durable atomic replacement of a file."""

from __future__ import annotations

from pathlib import Path

from dcpkv.core.files import atomic_write


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target, tmp = tmp_path / "f.json", tmp_path / ".f.json.tmp"
    target.write_bytes(b"old")
    atomic_write(target, b"new" * 100_000, tmp)
    assert target.read_bytes() == b"new" * 100_000
    assert not tmp.exists()
