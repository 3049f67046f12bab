"""A bucket's data as the SQLite engine of earlier versions wrote it, read only: the source of a
conversion to RocksDB (:mod:`dcpkv.engine.migrate`), and nothing else.

Theory of operation
-------------------
The SQLite engine kept a bucket in one file, ``<folder>/<bucket>.sqlite3`` (WAL mode, so a
``-wal`` and a ``-shm`` beside it while it was open or after a crash), every vbucket in it:

===============  ==============================================================================
table            what the conversion reads from it
===============  ==============================================================================
``meta``         the format version (1) and the clean-shutdown flag
``vbstate``      per vbucket: state, failover table (JSON), persisted high seqno, snapshot, purge
                 seqno, max CAS, ``history_start`` (rollback is exact from there)
``documents``    the latest version of every key, tombstones included
``history``      replaced versions kept for rollback, each with the seqno that replaced it
``flush_points`` the high seqno of each committed flush kept: the exact rollback targets
``prepares``     pending SyncWrite prepares (level > 0) and aborts (level 0, the aborted
                 prepare's seqno in ``rev_seqno``: :func:`~dcpkv.engine.storage.abort_row`)
===============  ==============================================================================

The file is opened read-only (an SQLite URI with ``mode=ro``): nothing here writes to it, so a
damaged file, or a conversion that dies, leaves it as it was. A write-ahead log a crash left
beside it is read through, not copied back: its committed transactions are seen, a torn one is
not. (SQLite itself may create an empty ``-wal`` and the ``-shm`` index its readers share
beside the file; the conversion removes them with it.) Every SQLite error becomes a
:class:`~dcpkv.engine.storage.CorruptDatabaseError` naming the file. CAS values are stored as
signed 64-bit integers (two's complement), read back unsigned. One thread at a time.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from dcpkv.engine.item import Item, PrepareItem
from dcpkv.engine.storage import CorruptDatabaseError, VBState, item_from_row

FORMAT_VERSION = 1
SUFFIX = ".sqlite3"
SIDE_FILES = ("-wal", "-shm")  # beside the database while open, or after a crash
_COLUMNS = "key, by_seqno, cas, rev_seqno, flags, expiry, datatype, deleted, delete_time, value"
_PAGE_ROWS = 4096


def sqlite_path(folder: Path, bucket: str) -> Path:
    """Where the SQLite engine kept ``bucket``'s data in ``folder``."""
    return Path(folder) / f"{bucket}{SUFFIX}"


def _u64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


class SqliteReader:
    """A SQLite engine's bucket file, open read-only (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CorruptDatabaseError(f"{self.path}: no SQLite bucket file there")
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        with self.reading("opening"):
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            with self.reading("opening"):
                row = self._db.execute("SELECT version FROM meta WHERE id = 1").fetchone()
            if row is None or row[0] != FORMAT_VERSION:
                raise CorruptDatabaseError(f"{self.path}: unknown format version {row}")
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """SQLite errors met while ``what`` become one clear error naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise CorruptDatabaseError(
                f"{self.path}: {what} cannot read this file ({exc}); it was left untouched: "
                "restore it from a backup, or move it away to start the bucket empty"
            ) from exc

    def was_clean_shutdown(self) -> bool:
        (clean,) = self._db.execute("SELECT clean_shutdown FROM meta WHERE id = 1").fetchone()
        return bool(clean)

    def vbucket_states(self) -> dict[int, VBState]:
        rows = self._db.execute(
            "SELECT vb, state, failover, high_seqno, snap_start, snap_end, purge_seqno,"
            " max_cas, history_start FROM vbstate ORDER BY vb"
        ).fetchall()
        return {
            vb: VBState(state, failover, high, snap_start, snap_end, purge, _u64(max_cas), hist)
            for vb, state, failover, high, snap_start, snap_end, purge, max_cas, hist in rows
        }

    def count_versions(self) -> int:
        """How many versions :meth:`versions` yields over every vbucket."""
        (docs,) = self._db.execute("SELECT COUNT(*) FROM documents").fetchone()
        (hist,) = self._db.execute("SELECT COUNT(*) FROM history").fetchone()
        return int(docs) + int(hist)

    def versions(self, vb: int) -> Iterator[tuple[Item, int | None]]:
        """Every version kept of a vbucket: (item, None) for each key's latest, tombstones
        included, then (item, the seqno that replaced it) for the history; read in pages,
        from one snapshot."""
        self._db.execute("BEGIN")
        try:
            for table, extra in (("documents", "NULL"), ("history", "replaced_by")):
                cursor = self._db.execute(
                    f"SELECT {_COLUMNS}, {extra} FROM {table} WHERE vb = ?", (vb,)
                )
                while rows := cursor.fetchmany(_PAGE_ROWS):
                    for row in rows:
                        yield item_from_row(row[:-1]), row[-1]
        finally:
            self._db.execute("COMMIT")

    def flush_points(self, vb: int) -> list[int]:
        """The vbucket's flush points (its exact rollback targets), in order."""
        rows = self._db.execute(
            "SELECT seqno FROM flush_points WHERE vb = ? ORDER BY seqno", (vb,)
        ).fetchall()
        return [seqno for (seqno,) in rows]

    def prepares(self, vb: int) -> list[PrepareItem]:
        """The vbucket's stored prepares, pending (level > 0) and aborted (level 0), in seqno
        order."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS}, level FROM prepares WHERE vb = ? ORDER BY by_seqno", (vb,)
        ).fetchall()
        return [
            PrepareItem(key, bytes(value), flags, expiry, _u64(cas), rev, seqno, datatype,
                        bool(deleted), delete_time, False, level)
            for key, seqno, cas, rev, flags, expiry, datatype, deleted, delete_time, value, level
            in rows
        ]  # fmt: skip
