"""A consumer process for the kill test: applies events and offsets in one SQLite transaction.

Usage: ``sqlite_applier.py PORT DB [--until-now]``. Each received batch of events is applied
to the ``docs`` table (by key, keeping the event's seqno) and the consumer's offsets JSON is
stored in the same transaction, so a SIGKILL at any point leaves a state and offsets that
agree: restarted, the consumer resumes exactly after what was applied (exactly once).
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys

from dcpkv.client import events
from dcpkv.client.consumer import Consumer
from dcpkv.client.offsets import Offsets
from dcpkv.client.settings import ClientSettings, ConnectionSettings

COMMIT_EVERY = 50


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS docs (key BLOB PRIMARY KEY, value BLOB, seqno INT)")
    db.execute("CREATE TABLE IF NOT EXISTS state (id INT PRIMARY KEY, offsets TEXT)")
    return db


def apply(db: sqlite3.Connection, ev: events.Event) -> None:
    if isinstance(ev, events.Mutation):
        db.execute(
            "INSERT OR REPLACE INTO docs (key, value, seqno) VALUES (?, ?, ?)",
            (ev.key, ev.value, ev.seqno),
        )
    elif isinstance(ev, events.Deletion | events.Expiration):
        db.execute("DELETE FROM docs WHERE key = ?", (ev.key,))
    elif isinstance(ev, events.Rollback):
        raise SystemExit("no rollback is expected in this test")


async def main(port: int, path: str, until_now: bool) -> None:
    db = open_db(path)
    row = db.execute("SELECT offsets FROM state WHERE id = 0").fetchone()
    offsets = Offsets.from_json(row[0]) if row else Offsets()
    config = ClientSettings(
        ConnectionSettings.at(port=port), name="test:applier", noop_interval=1.0, max_backoff=0.2
    )
    async with Consumer(config, offsets=offsets) as consumer:
        pending = 0
        db.execute("BEGIN")
        async for ev in consumer.stream(start=offsets, end="now" if until_now else "forever"):
            apply(db, ev)
            pending += 1
            if pending >= COMMIT_EVERY:
                _commit(db, consumer.offsets)
                db.execute("BEGIN")
                pending = 0
        _commit(db, consumer.offsets)


def _commit(db: sqlite3.Connection, offsets: Offsets) -> None:
    db.execute("INSERT OR REPLACE INTO state (id, offsets) VALUES (0, ?)", (offsets.to_json(),))
    db.execute("COMMIT")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], "--until-now" in sys.argv[3:]))
