"""The driver JVM's class-data archive: only a whole archive is ever used (HotSpot maps it, and
a truncated one crashes the JVM), a finished dump is adopted, an interrupted one deleted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dcpkv.pipelines import class_archive
from dcpkv.pipelines.class_archive import ARCHIVE_MAGIC, STALE_DUMP_S, adopt_dumps, java_options

NAME = "spark-0123456789abcdef.jsa"


def dump(directory: Path, pid: int, *, complete: bool, age_s: float = 0.0) -> Path:
    """A dump as HotSpot leaves it: the header (magic first) is written last."""
    path = directory / f"{NAME}.{pid}.tmp"
    header = ARCHIVE_MAGIC if complete else bytes(len(ARCHIVE_MAGIC))
    path.write_bytes(header + b"\x01" * 4096)
    then = path.stat().st_mtime - age_s
    os.utime(path, (then, then))
    return path


def test_a_finished_dump_is_adopted_and_the_others_deleted(tmp_path: Path) -> None:
    unfinished = dump(tmp_path, 11, complete=False)
    finished = dump(tmp_path, 12, complete=True)
    adopt_dumps(tmp_path, NAME, now=finished.stat().st_mtime)
    assert (tmp_path / NAME).read_bytes().startswith(ARCHIVE_MAGIC)
    assert not finished.exists()
    assert not unfinished.exists(), "the archive is there: a dump still being written is moot"


def test_a_dump_without_its_header_is_never_adopted(tmp_path: Path) -> None:
    writing = dump(tmp_path, 11, complete=False)
    adopt_dumps(tmp_path, NAME, now=writing.stat().st_mtime + 1)
    assert not (tmp_path / NAME).exists()
    assert writing.exists(), "a JVM may still be writing it"


def test_an_interrupted_dump_is_deleted_once_stale(tmp_path: Path) -> None:
    stale = dump(tmp_path, 11, complete=False, age_s=STALE_DUMP_S + 60)
    adopt_dumps(tmp_path, NAME, now=stale.stat().st_mtime + STALE_DUMP_S + 60)
    assert not stale.exists()
    assert not (tmp_path / NAME).exists()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DCPKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DCPKV_SPARK_CDS", raising=False)
    monkeypatch.setattr(class_archive, "archive_key", lambda: "0123456789abcdef")
    return tmp_path / "cache"


def test_without_an_archive_the_jvm_writes_one_at_exit_under_a_name_of_its_own(
    cache: Path,
) -> None:
    opts = java_options()
    assert f"-XX:ArchiveClassesAtExit={cache / NAME}.{os.getpid()}.tmp" in opts
    assert "SharedArchiveFile" not in opts


def test_with_a_whole_archive_the_jvm_maps_it(cache: Path) -> None:
    cache.mkdir()
    dump(cache, 12, complete=True)
    assert f"-XX:SharedArchiveFile={cache / NAME}" in java_options()


def test_switched_off(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DCPKV_SPARK_CDS", "0")
    assert java_options() == ""
    assert not cache.exists()
