"""Spec 002's client mutation log: a bounded, persisted ring buffer of recent changes.

Theory of operation
-------------------
A consumer that cannot roll its own state back (a search index, a cache, a third-party
store) still has to undo the changes above a rollback point R. Spec 002 ("How clients roll
back changes when seeing a new failover ID") has it remember, per vbucket, the (seqno, key) of
its most recent changes. On a rollback to R it re-fetches the current document of every key
logged above R (deleting the ones that no longer exist), forgets those log entries, and
streams again from R: the stream then brings every change above R of the producer's history,
so the state converges on the producer's. When R is older than the oldest entry still in the
buffer, the keys changed between R and that entry are unknown: the consumer must start over
from zero (:class:`RepairPlan` with ``full_resync``).

"The ring buffer should be persisted before mutations are applied": :meth:`MutationLog.record`
commits before it returns, so a crash between logging and applying leaves a log entry for a
change that was maybe not applied (harmless: the key is re-fetched) and never the reverse.
:meth:`record_many` logs a whole batch in one commit, for a consumer that applies in batches.

Storage: SQLite, not a hand-written append-only file. It is in the standard library, its
commits are atomic and durable (WAL journal, ``synchronous=FULL``) so there is no torn-write
or compaction code to get right, and the two queries that matter (drop the oldest entries of
a vbucket, list the keys above a seqno) are range scans of the ``(vbucket, seqno)`` primary
key. An append-only file would need its own framing, checksums, recovery scan and periodic
compaction to bound its size: more code and more ways to be wrong for no gain at this size.

SQLite integers are signed 64-bit; seqnos are unsigned, so they are stored shifted by 2**63
(order-preserving) and 2**64-1 round-trips exactly.

Entries are keyed by (vbucket, seqno, key), not (vbucket, seqno): stream changes have unique
seqnos, but documents re-fetched in a repair are logged at the seqno the fetch reports, and
several missing documents all get the producer's high seqno.

The bound is per vbucket (``capacity`` entries). Evicting an entry remembers the highest seqno
evicted so far: :meth:`covers` (R) is true exactly when no evicted entry lies above R.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

DEFAULT_CAPACITY = 10_000
_SHIFT = 1 << 63

_SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    vb INTEGER NOT NULL,
    seqno INTEGER NOT NULL,
    key BLOB NOT NULL,
    PRIMARY KEY (vb, seqno, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS evicted (
    vb INTEGER PRIMARY KEY,
    high INTEGER NOT NULL
);
"""


def _enc(seqno: int) -> int:
    if not 0 <= seqno < 1 << 64:
        raise ValueError(f"seqno {seqno} is outside the unsigned 64-bit range")
    return seqno - _SHIFT


def _dec(stored: int) -> int:
    return stored + _SHIFT


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """How to undo everything above ``rollback_seqno`` in one vbucket.

    ``full_resync``: the buffer no longer reaches back that far; clear the vbucket's state and
    stream from zero. Otherwise re-fetch ``refetch_keys`` (oldest change first) and delete
    those the producer no longer has.
    """

    vbucket: int
    rollback_seqno: int
    full_resync: bool
    refetch_keys: tuple[bytes, ...] = ()


class MutationLog:
    """Spec 002's ring buffer of the keys a consumer changed most recently, per vbucket,
    persisted in one SQLite file (or ``":memory:"`` for tests).

    Give it to a consumer (``mutation_log=``) whose store cannot roll back by itself: on a
    rollback the consumer re-fetches the current version of every key logged above the
    rollback point and hands them over as events, so the store converges on the server's
    history. When the log no longer reaches back that far (``capacity`` entries per vbucket),
    the consumer asks for a full resync of the vbucket instead (a Rollback to 0).
    """

    def __init__(self, path: str | os.PathLike[str], *, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a mutation log holds at least one entry per vbucket")
        self.capacity = capacity
        # check_same_thread off: SyncConsumer uses the log from its event-loop thread (one user at
        # a time, never concurrently).
        self._db = sqlite3.connect(os.fspath(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._counts: dict[int, int] = {}
        self._reload_counts()

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> MutationLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------

    def record(self, vb: int, seqno: int, key: bytes) -> None:
        """Log one change, durably, before the application applies it."""
        self.record_many([(vb, seqno, key)])

    def record_many(self, entries: Iterable[tuple[int, int, bytes]]) -> None:
        """Log a batch in one commit."""
        with self._transaction():
            touched = set()
            for vb, seqno, key in entries:
                self._insert(vb, seqno, bytes(key))
                touched.add(vb)
            for vb in touched:
                self._evict(vb)

    def truncate_above(self, vb: int, seqno: int) -> None:
        """Forget the entries above ``seqno`` (their changes were rolled back)."""
        with self._transaction():
            self._truncate(vb, seqno)

    def repaired(
        self, vb: int, rollback_seqno: int, fetched: Iterable[tuple[bytes, int]] = ()
    ) -> None:
        """After a repair: forget the entries above ``rollback_seqno`` and log each re-fetched
        key at the seqno the fetch reported (the producer's high seqno for a document that no
        longer exists), in one commit.

        Spec 002 only forgets the entries. But a re-fetched document is newer than the
        rollback point, and if the producer later loses it too (another failover), only a log
        entry for it makes the next rollback re-fetch it again instead of keeping a value
        the producer no longer has.
        """
        with self._transaction():
            self._truncate(vb, rollback_seqno)
            for key, seqno in fetched:
                self._insert(vb, seqno, bytes(key))
            self._evict(vb)

    # -- reading --------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(self._counts.values())

    def entries(self, vb: int) -> list[tuple[int, bytes]]:
        rows = self._db.execute(
            "SELECT seqno, key FROM log WHERE vb = ? ORDER BY seqno, key", (vb,)
        ).fetchall()
        return [(_dec(s), bytes(k)) for s, k in rows]

    def evicted_high(self, vb: int) -> int | None:
        row = self._db.execute("SELECT high FROM evicted WHERE vb = ?", (vb,)).fetchone()
        return None if row is None else _dec(row[0])

    def covers(self, vb: int, seqno: int) -> bool:
        """True when every logged change above ``seqno`` is still in the buffer."""
        high = self.evicted_high(vb)
        return high is None or seqno >= high

    def keys_above(self, vb: int, seqno: int) -> list[bytes]:
        """The distinct keys changed above ``seqno``, oldest change first."""
        rows = self._db.execute(
            "SELECT key FROM log WHERE vb = ? AND seqno > ? ORDER BY seqno", (vb, _enc(seqno))
        ).fetchall()
        return list(dict.fromkeys(bytes(k) for (k,) in rows))

    def repair_plan(self, vb: int, rollback_seqno: int) -> RepairPlan:
        if not self.covers(vb, rollback_seqno):
            return RepairPlan(vb, rollback_seqno, full_resync=True)
        return RepairPlan(vb, rollback_seqno, False, tuple(self.keys_above(vb, rollback_seqno)))

    # -- internals ------------------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            self._reload_counts()  # the in-memory counts ran ahead of the aborted writes
            raise
        self._db.execute("COMMIT")

    def _reload_counts(self) -> None:
        rows = self._db.execute("SELECT vb, COUNT(*) FROM log GROUP BY vb").fetchall()
        self._counts = dict(rows)

    def _insert(self, vb: int, seqno: int, key: bytes) -> None:
        stored = _enc(seqno)
        # A replay after a crash logs the same seqno again: that must not grow the count.
        existed = self._db.execute(
            "SELECT 1 FROM log WHERE vb = ? AND seqno = ? AND key = ?", (vb, stored, key)
        ).fetchone()
        if existed is None:
            self._db.execute("INSERT INTO log (vb, seqno, key) VALUES (?, ?, ?)", (vb, stored, key))
            self._counts[vb] = self._counts.get(vb, 0) + 1

    def _truncate(self, vb: int, seqno: int) -> None:
        cur = self._db.execute("DELETE FROM log WHERE vb = ? AND seqno > ?", (vb, _enc(seqno)))
        self._counts[vb] = self._counts.get(vb, 0) - cur.rowcount
        # Evicted entries above seqno belonged to the discarded history; the ones below are
        # still missing, and seqno bounds them (conservatively) from above.
        self._db.execute("UPDATE evicted SET high = MIN(high, ?) WHERE vb = ?", (_enc(seqno), vb))

    def _evict(self, vb: int) -> None:
        excess = self._counts.get(vb, 0) - self.capacity
        if excess <= 0:
            return
        (high,) = self._db.execute(
            "SELECT MAX(seqno) FROM (SELECT seqno FROM log WHERE vb = ? ORDER BY seqno LIMIT ?)",
            (vb, excess),
        ).fetchone()
        self._db.execute("DELETE FROM log WHERE vb = ? AND seqno <= ?", (vb, high))
        self._db.execute(
            "INSERT INTO evicted (vb, high) VALUES (?, ?) "
            "ON CONFLICT (vb) DO UPDATE SET high = MAX(high, excluded.high)",
            (vb, high),
        )
        self._counts[vb] -= excess
