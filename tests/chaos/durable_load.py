"""The chaos suite's SyncWrite load: the official SDK writing with a durability level, and the
checks of what each level promises (issue 28, item 6).

What runs beside the plain load (``chaos.py``), on a key space of its own (``sync-<n>``):

    writer   upserts ``{"v": n}`` (n only grows) with ``ServerDurability`` at Majority or
             PersistToMajority, chosen per write by the seeded RNG; notes each write's level
             and, when answered Success, the acknowledged value and the kill count then
    reader   reads the keys back and notes each value it saw

What each level promises (PROTOCOL.md, "SyncWrites"), and so what the checks count:

    ================================ ============================================================
    observation                      verdict
    ================================ ============================================================
    a key reads below a value        *lost* (a problem) when that value was written at
    acknowledged Success             PersistToMajority (persisted on a majority before the
                                     answer: no single kill or failover undoes it), or at
                                     Majority with no kill -9 and restart since its
                                     acknowledgement (a majority held it: any single failover
                                     keeps it); otherwise counted as undone by a restart
    a reader saw a value, a later    *dirty* (a problem) under the same rule: readers see
    read shows a lower one           committed values only, and a committed value is kept
                                     as its level promises
    an answer was ambiguous          counted, and resolved by the final read: committed when
    (SyncWriteAmbiguous, a timeout)  the key reads at least that value, aborted otherwise
    ================================ ============================================================
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from couchbase.collection import Collection
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import (
    AmbiguousTimeoutException,
    CouchbaseException,
    DocumentNotFoundException,
    DurabilitySyncWriteAmbiguousException,
)
from couchbase.options import UpsertOptions
from load_threads import LoadThreads

KEYS = 200
LEVELS = (DurabilityLevel.MAJORITY, DurabilityLevel.PERSIST_TO_MAJORITY)
DURABLE_TIMEOUT = timedelta(seconds=5)
AMBIGUOUS = (DurabilitySyncWriteAmbiguousException, AmbiguousTimeoutException)


class Clock(Protocol):
    """What the load needs from the chaos world: a stop flag, the count of kill -9s that
    were followed by a restart (each may undo Majority writes), and its log."""

    stop: threading.Event
    restarts: int

    def log(self, what: str) -> None: ...

    def details(self, key: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Write:
    level: DurabilityLevel
    restarts: int  # kill -9 and restart faults when it was sent (or read)


@dataclass
class DurableReport:
    acknowledged: dict[str, int] = field(default_factory=dict)  # level name -> Success answers
    ambiguous: int = 0
    ambiguous_committed: int = 0
    ambiguous_aborted: int = 0
    refused: int = 0  # other errors: not acknowledged, so nothing promised
    undone_by_restart: int = 0  # Majority writes a kill -9 and restart undid (allowed)
    lost: list[str] = field(default_factory=list)
    dirty: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.dirty)

    def summary(self) -> str:
        acked = ", ".join(f"{k} {v}" for k, v in sorted(self.acknowledged.items())) or "none"
        return (
            f"SyncWrites acknowledged: {acked}; ambiguous {self.ambiguous} (committed "
            f"{self.ambiguous_committed}, aborted {self.ambiguous_aborted}); refused "
            f"{self.refused}; Majority writes undone by a restart {self.undone_by_restart}; "
            f"lost {len(self.lost)}, dirty reads {len(self.dirty)}"
        )


def promised(write: Write, restarts_now: int) -> bool:
    """Whether ``write`` must still be there now (see the table above)."""
    if write.level == DurabilityLevel.PERSIST_TO_MAJORITY:
        return True
    return write.restarts == restarts_now


class DurableLoad:
    """The SyncWrite writer and reader, each a thread."""

    def __init__(self, world: Clock, coll: Collection, rng: random.Random) -> None:
        self.world = world
        self.coll = coll
        self.rng = random.Random(rng.random())
        self.report = DurableReport()
        self.levels: dict[tuple[str, int], DurabilityLevel] = {}  # every write tried
        self.acked: dict[str, tuple[int, Write]] = {}  # key -> highest value answered Success
        self.maybe: list[tuple[str, int]] = []  # ambiguous answers, resolved at the end
        self.seen: dict[str, tuple[int, int]] = {}  # key -> (highest value read, restarts)
        self.lock = threading.Lock()
        self.threads = LoadThreads(world.log, "durable load", self._write, self._read)

    def start(self) -> None:
        self.threads.start()

    def join(self) -> None:
        self.threads.join()

    def _write(self) -> None:
        n = 0
        while not self.world.stop.is_set():
            n += 1
            key, level = f"sync-{self.rng.randrange(KEYS)}", self.rng.choice(LEVELS)
            with self.lock:
                self.levels[(key, n)] = level
            options = UpsertOptions(durability=ServerDurability(level), timeout=DURABLE_TIMEOUT)
            # before the request, as the reader does: a kill -9 while the write is in flight
            # (or before this thread, descheduled, notes its answer) may undo a Majority write
            restarts = self.world.restarts
            try:
                self.coll.upsert(key, {"v": n}, options)
            except AMBIGUOUS:
                self.report.ambiguous += 1
                with self.lock:
                    self.maybe.append((key, n))
                continue
            except CouchbaseException as exc:
                self.report.refused += 1
                if self.report.refused % 100 == 1:  # the first, then one in a hundred
                    self.world.log(f"durable write refused: {exc!r}"[:300])
                time.sleep(0.01)
                continue
            name = level.name
            self.report.acknowledged[name] = self.report.acknowledged.get(name, 0) + 1
            with self.lock:
                self.acked[key] = (n, Write(level, restarts))

    def _read(self) -> None:
        while not self.world.stop.is_set():
            key = f"sync-{self.rng.randrange(KEYS)}"
            restarts = self.world.restarts  # before the read: see chaos.Load._read
            value = self._value(key)
            if value is None:
                time.sleep(0.01)
                continue
            self._saw(key, value, restarts)

    def _value(self, key: str) -> int | None:
        try:
            content: dict[str, Any] = self.coll.get(key).content_as[dict]
        except CouchbaseException:
            return None
        return int(content["v"])

    def _saw(self, key: str, value: int, restarts: int) -> None:
        before, restarts_then = self.seen.get(key, (0, restarts))
        if value < before:
            with self.lock:
                level = self.levels[(key, before)]
            if promised(Write(level, restarts_then), self.world.restarts):
                self.report.dirty.append(
                    f"{key}: read {before} ({level.name}), later {value}, no restart between"
                )
            self.seen[key] = (value, restarts)
        elif value > before:
            self.seen[key] = (value, restarts)

    def check(self) -> DurableReport:
        """After the load stopped and the cluster settled: what each level promised holds."""
        report, restarts_now = self.report, self.world.restarts
        finals: dict[str, int] = {}
        for key, (value, write) in sorted(self.acked.items()):
            got = self._final(key)
            finals[key] = got
            if got >= value:
                continue
            if promised(write, restarts_now):
                report.lost.append(
                    f"{key}: {value} acknowledged at {write.level.name}, now {got or 'absent'}"
                )
            else:
                report.undone_by_restart += 1
        for key, value in self.maybe:
            got = finals[key] if key in finals else self._final(key)
            if got >= value:
                report.ambiguous_committed += 1
            else:
                report.ambiguous_aborted += 1
        return report

    def _final(self, key: str) -> int:
        error: CouchbaseException | None = None
        for _ in range(50):  # the cluster settled, but a map may still be on its way
            try:
                return int(self.coll.get(key).content_as[dict]["v"])
            except DocumentNotFoundException:
                return 0
            except CouchbaseException as exc:
                error = exc
                time.sleep(0.2)
        self.world.log(f"{key} unreadable at the end: {error!r}"[:300])
        self.world.log(self.world.details(key))
        return 0
