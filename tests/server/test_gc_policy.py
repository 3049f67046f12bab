"""The collector policy: what survives is frozen (never scanned), a full pass frees cycles.

Counted, not timed: ``gc.get_freeze_count`` says what the collector no longer scans, a weak
reference says whether a cycle was freed.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dcpkv.server.gc_policy import CollectorPolicy


class Node:
    """A container the collector tracks; two of them make a cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Every test starts and ends with nothing frozen (the rest of the suite expects that)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_a_tick_freezes_what_survived() -> None:
    policy = CollectorPolicy(full_every_s=60, clock=Clock())
    kept = [Node() for _ in range(1000)]
    policy.tick()
    assert gc.get_freeze_count() >= len(kept)
    assert policy.full_collections == 0


def test_settle_collects_start_up_garbage_then_freezes() -> None:
    garbage = weakref.ref(cycle())
    policy = CollectorPolicy(clock=Clock())
    policy.settle()
    assert garbage() is None and policy.freed_by_full >= 2
    assert gc.get_freeze_count() > 0


# (seconds between the freeze and the next tick, whether the frozen cycle is freed by then)
CASES = [(59.0, False), (60.0, True), (61.0, True)]


@pytest.mark.parametrize(("later", "freed"), CASES)
def test_a_frozen_cycle_waits_for_the_next_full_pass(later: float, freed: bool) -> None:
    clock = Clock()
    policy = CollectorPolicy(full_every_s=60, clock=clock)
    node = cycle()
    garbage = weakref.ref(node)
    policy.tick()  # frozen while in use
    del node  # now cyclic garbage
    gc.collect()  # an ordinary collection never looks at what is frozen
    assert garbage() is not None
    clock.now = later
    policy.tick()
    assert (garbage() is None) == freed
    assert policy.full_collections == (1 if freed else 0)
    assert gc.get_freeze_count() > 0  # a full pass freezes again after it


def test_warming_collects_nothing_then_settles() -> None:
    """Warm-up's items are never scanned: no collection while it loads, then the garbage it
    left is collected once and the rest frozen; the collector is on again after."""
    policy = CollectorPolicy(clock=Clock())
    with policy.warming():
        assert not gc.isenabled()
        garbage = weakref.ref(cycle())
        loaded = [Node() for _ in range(10_000)]  # (enough to start young collections)
        assert garbage() is not None  # none ran
    assert gc.isenabled()
    assert garbage() is None and policy.full_collections == 1
    assert gc.get_freeze_count() >= len(loaded)


def test_a_failed_warm_up_turns_the_collector_back_on() -> None:
    policy = CollectorPolicy(clock=Clock())
    with pytest.raises(OSError), policy.warming():
        raise OSError("disk")
    assert gc.isenabled()
