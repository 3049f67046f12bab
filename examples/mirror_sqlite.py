"""Keep a SQLite table equal to a bucket's documents, through rollbacks and restarts.

    .venv/bin/python examples/mirror_sqlite.py mirror.sqlite3               # until Ctrl-C
    .venv/bin/python examples/mirror_sqlite.py mirror.sqlite3 --until-now   # stops once caught up

The table ``docs`` (key, value, vbucket) and the consumer's offsets are committed in one
SQLite transaction, twice a second and when the script stops, so a crash at any moment leaves
a table and offsets that agree: the next run resumes exactly after the last change committed.

A rollback (the server lost changes the mirror had applied: it was killed with writes not yet
on disk, or a node failed over) is undone with spec 002's mutation log, a ring buffer of the
keys changed most recently (``mirror.sqlite3.mlog``): after the Rollback event the consumer
hands over the current version of every key logged above the rollback point (a Deletion for
a key that no longer exists), then streams on from there. A vbucket whose log no longer
reaches that far gets a Rollback to 0: the mirror drops it and receives it again in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3

from example_options import parser_for, settings_of

from dcpkv.client import (
    ClientSettings,
    Consumer,
    Deletion,
    Event,
    Expiration,
    Mutation,
    MutationLog,
    Offsets,
    Rollback,
)

COMMIT_EVERY_S = 0.5


class Mirror:
    """The ``docs`` table and the offsets of the changes applied to it, in one SQLite file."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS docs (key BLOB PRIMARY KEY, value BLOB, vbucket INT)"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS offsets (id INT PRIMARY KEY, json TEXT)")
        self.db.execute("BEGIN")
        self.applied = self.committed = 0  # changes

    def offsets(self) -> Offsets:
        """Where the last commit stands: the consumer resumes right after it."""
        row = self.db.execute("SELECT json FROM offsets WHERE id = 0").fetchone()
        return Offsets.from_json(row[0]) if row else Offsets()

    def apply(self, event: Event) -> None:
        if isinstance(event, Mutation):
            self.db.execute(
                "INSERT OR REPLACE INTO docs (key, value, vbucket) VALUES (?, ?, ?)",
                (event.key, event.value, event.vbucket),
            )
            self.applied += 1
        elif isinstance(event, Deletion | Expiration):
            self.db.execute("DELETE FROM docs WHERE key = ?", (event.key,))
            self.applied += 1
        elif isinstance(event, Rollback):
            print(f"rollback vb={event.vbucket} to seqno={event.rollback_seqno}", flush=True)
            if event.rollback_seqno == 0:  # the log does not reach back: start the vbucket over
                self.db.execute("DELETE FROM docs WHERE vbucket = ?", (event.vbucket,))

    def commit(self, offsets: Offsets) -> None:
        """The changes applied so far and the offsets right after them, in one transaction."""
        self.db.execute(
            "INSERT OR REPLACE INTO offsets (id, json) VALUES (0, ?)", (offsets.to_json(),)
        )
        self.db.execute("COMMIT")
        self.db.execute("BEGIN")
        if self.applied != self.committed:
            self.committed = self.applied
            print(f"{self.applied} changes applied", flush=True)

    def close(self) -> None:
        (docs,) = self.db.execute("SELECT COUNT(*) FROM docs").fetchone()
        print(f"the mirror holds {docs} documents", flush=True)
        self.db.close()


async def commit_regularly(mirror: Mirror, consumer: Consumer) -> None:
    # Runs on the consumer's event loop, so only between two events: the offsets then stand
    # right after the last event applied.
    while True:
        await asyncio.sleep(COMMIT_EVERY_S)
        mirror.commit(consumer.offsets)


async def follow(mirror: Mirror, config: ClientSettings, log: MutationLog, end: str) -> None:
    """Apply the bucket's changes to the mirror until ``end`` ("now" or "forever")."""
    async with Consumer(config, offsets=mirror.offsets(), mutation_log=log) as consumer:
        committer = asyncio.create_task(commit_regularly(mirror, consumer))
        try:
            async for event in consumer.stream(end=end):
                mirror.apply(event)
        finally:
            committer.cancel()
            mirror.commit(consumer.offsets)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("db", help="the SQLite file of the mirror")
    parser.add_argument("--until-now", action="store_true", help="stop once caught up")
    args = parser.parse_args()

    config = ClientSettings(settings_of(args), name="example:mirror-sqlite")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill PID: as Ctrl-C
    mirror = Mirror(args.db)
    with MutationLog(args.db + ".mlog") as log, contextlib.suppress(KeyboardInterrupt):
        asyncio.run(follow(mirror, config, log, "now" if args.until_now else "forever"))
    mirror.close()


if __name__ == "__main__":
    main()
