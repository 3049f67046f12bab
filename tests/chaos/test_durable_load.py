"""The SyncWrite checker's own rule (``durable_load.py``): which restarts a write is held to."""

from __future__ import annotations

import random
import threading
from typing import Any

from couchbase.durability import DurabilityLevel
from durable_load import DurableLoad, Write, promised


class World:
    """The chaos world as the load sees it: a stop flag, the restarts, a log."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.restarts = 0
        self.lines: list[str] = []

    def log(self, what: str) -> None:
        self.lines.append(what)

    def details(self, key: str) -> str:
        return ""


class KilledWhileInFlight:
    """An SDK collection whose one upsert is answered Success just as a kill -9 and restart
    of its node begins (before the writer's thread notes the answer)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def upsert(self, key: str, value: Any, options: Any) -> None:
        self.world.restarts += 1
        self.world.stop.set()


def test_a_write_answered_as_a_kill_begins_is_held_to_the_restarts_before_it_was_sent() -> None:
    world = World()
    load = DurableLoad(world, KilledWhileInFlight(world), random.Random(1))  # type: ignore[arg-type]
    load._write()
    [(_, write)] = load.acked.values()
    assert write.restarts == 0 and world.restarts == 1
    # at Majority the restart may have undone it: not a loss
    assert not promised(Write(DurabilityLevel.MAJORITY, write.restarts), world.restarts)
    assert promised(Write(DurabilityLevel.PERSIST_TO_MAJORITY, write.restarts), world.restarts)
