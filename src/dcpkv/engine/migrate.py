"""Migration: a bucket written by the SQLite engine converted to the RocksDB engine.

Theory of operation
-------------------
Everything the SQLite engine of earlier versions kept is carried over, vbucket by vbucket
(read by :mod:`dcpkv.engine.sqlite_reader`): the vbucket states (state, failover log,
persisted snapshot, purge seqno, max CAS, history start), every kept version (each key's
latest, tombstones included, and the replaced versions a rollback needs, with the seqno that
replaced each), the flush points (the exact rollback targets), the stored SyncWrite prepares
(pending, and the aborts a SyncWrite consumer's backfill sends) and the clean-shutdown flag.
The caller holds the bucket's lock.

:func:`convert` goes in four steps, each safe to die in:

====  ==============================================  ===================================
step  what                                            a crash here leaves
====  ==============================================  ===================================
1     remove a leftover ``<target>.migrating``        the source alone: start again
2     read the source, write a new RocksDB database   the source and a partial
      at ``<target>.migrating``; close it (memtables  ``.migrating``: step 1 removes it
      flushed, synced)
3     rename ``.migrating`` to the target; sync the   the source beside a complete target
      folder
4     remove the source's files; sync the folder      the target
====  ==============================================  ===================================

:func:`pending` tells a start what is left: ``"convert"`` (steps 1-4: the source is there and
the target is not), ``"finish"`` (step 4: a target exists only once complete, so a source
beside it is a conversion that died before removing it) or ``None``.

The source is only read, opened read-only (a write-ahead log a crash left beside it is read
through, never copied back). A damaged source raises :class:`MigrationError` naming it; its
files are left as they were and the partial target is removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from dcpkv.core.files import fsync_dir
from dcpkv.engine.retention import DEFAULT_HISTORY_WINDOW
from dcpkv.engine.rocks_storage import RocksStorage
from dcpkv.engine.sqlite_reader import SIDE_FILES, SqliteReader
from dcpkv.engine.storage import StorageError

# (done, total): versions written so far, and in all.
Progress = Callable[[int, int], None]
PARTIAL_SUFFIX = ".migrating"


class MigrationError(StorageError):
    """A bucket's data could not be converted; its source files are as they were."""


def partial_path(target: Path) -> Path:
    """Where a conversion writes before it is complete."""
    return target.with_name(target.name + PARTIAL_SUFFIX)


def source_files(source: Path) -> list[Path]:
    """The SQLite database and its side files that exist."""
    candidates = [source, *(source.with_name(source.name + s) for s in SIDE_FILES)]
    return [p for p in candidates if p.exists()]


def pending(source: Path, target: Path) -> str | None:
    """What is left to do (the module docstring): "convert", "finish" or None."""
    if not source.exists():
        return None
    return "finish" if target.exists() else "convert"


def convert(
    source: Path,
    target: Path,
    *,
    history_window: int = DEFAULT_HISTORY_WINDOW,
    cache_bytes: int = 0,
    progress: Progress | None = None,
) -> int:
    """Convert ``source`` (SQLite) to ``target`` (RocksDB), or finish a conversion that died
    after step 3; returns the versions written (0 when only finished)."""
    step = pending(source, target)
    if step is None:
        return 0
    written = 0
    if step == "convert":
        partial = partial_path(target)
        if partial.exists():
            shutil.rmtree(partial)  # step 1: a conversion that died: start again
        try:
            written = _copy(source, partial, history_window, cache_bytes, progress)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        fsync_dir(partial)
        partial.rename(target)  # step 3
        fsync_dir(target.parent)
    for path in source_files(source):  # step 4
        path.unlink()
    fsync_dir(source.parent)
    return written


def _copy(
    source: Path, partial: Path, history_window: int, cache_bytes: int, progress: Progress | None
) -> int:
    try:
        src = SqliteReader(source)
    except StorageError as exc:
        raise MigrationError(f"not converted to RocksDB: {exc}; it was left untouched") from exc
    try:
        # (unsynced writes: the close flushes and syncs the tables, and a crash before is step 1's)
        dst = RocksStorage(
            partial, history_window=history_window, synchronous="NORMAL", cache_bytes=cache_bytes
        )
        try:
            with src.reading("migration"):
                written = _copy_vbuckets(src, dst, progress)
                dst.set_clean_shutdown(src.was_clean_shutdown())
        finally:
            dst.close()
    except StorageError as exc:
        raise MigrationError(f"not converted to RocksDB: {exc}") from exc
    finally:
        src.close()
    return written


def _copy_vbuckets(src: SqliteReader, dst: RocksStorage, progress: Progress | None) -> int:
    total, written = src.count_versions(), 0
    if progress is not None:
        progress(0, total)
    for vb, state in src.vbucket_states().items():
        written += dst.import_vbucket(
            vb, state, src.versions(vb), src.flush_points(vb), src.prepares(vb)
        )
        if progress is not None:
            progress(written, total)
    return written
