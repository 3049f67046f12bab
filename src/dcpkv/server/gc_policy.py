"""The server's policy for CPython's cyclic garbage collector: keep the items out of its scans.

Theory of operation
-------------------
Every resident item is a few Python objects (an :class:`~dcpkv.engine.item.Item`, its key and
value, its integers), held by the hash tables and the checkpoints; the Item is a container the
cyclic collector tracks. CPython collects its oldest generation (a *full* collection: every
tracked object in the process) whenever the objects promoted into it since the last full one
reach a quarter of it. A bucket that grows, or churns (every write makes a new Item that
lives until the key's next write), so pays a scan of all its items each time a quarter as
many new ones have come in: measured on this project's KV benchmark, a full collection took
150-340 ms at 200-430k objects (a cache miss per referenced object), about 3 us per Set
amortized, and each pause holds the GIL, so every connection and the flusher stall with it.
Yet the items never form reference cycles, and the server breaks the few cycles it makes
(a closed connection's references go at once): nearly all that work finds nothing (a Set
benchmark of 800k requests left ~1,000 objects of cyclic garbage, all caught young).

So the server *freezes* what has survived (``gc.freeze``, O(1): the tracked objects move to
a permanent generation the collector never scans):

=============================== ================================================================
when                            what
=============================== ================================================================
during warm-up                  no collection at all: each full pass would scan every item
(:meth:`warming`)               loaded so far (a 2M-item warm-up made 11 of them, 2.2 s of its
                                6.6-7.4 s of CPU; their count and size grow with the bucket)
after warm-up (:meth:`settle`)  one full collection of start-up garbage, then freeze: the items
                                loaded from disk are never scanned
every ``freeze_every_s``        freeze again: collections only ever scan what was allocated in
(:meth:`tick`)                  the last interval (young cycles are still collected meanwhile)
every ``full_every_s``          unfreeze, one full collection, freeze: cyclic garbage that was
(:meth:`tick`)                  still referenced when frozen is freed at most this late (one
                                pause of a full scan per interval, instead of one per 25% of
                                growth)
=============================== ================================================================

Why every 0.1 s. A freeze moves objects out of the collector's reach but does not reset its
count of objects promoted to the oldest generation since the last full pass, so after the
first one an oldest-generation pass comes every tenth middle-generation pass and scans what
has reached that generation since the last freeze. At 1 s that was up to a second of writes:
measured on a 200k-Set run, 13 such passes of up to 104 ms of CPU each, the event loop
stalled behind each (the live tail's p99). At 0.1 s the same run made none: what survives
the young collections is frozen before ten middle-generation passes have gone by. A freeze
is O(1) (two list splices), so the shorter period costs nothing measurable.

Frozen objects are still freed by reference counting the moment they are no longer used; only
cyclic garbage waits for the next full pass. A plain object, no I/O: the server's shell calls
:meth:`tick` from a timer; the clock is injectable for tests.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator

FREEZE_EVERY_S = 0.1
FULL_EVERY_S = 3600.0


class CollectorPolicy:
    """When to freeze and when to collect everything (see the module docstring)."""

    def __init__(
        self,
        *,
        full_every_s: float = FULL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.full_every_s = full_every_s
        self._clock = clock
        self._last_full = clock()
        self.full_collections = 0
        self.last_full_pause_s = 0.0  # how long the last full pass held the interpreter
        self.freed_by_full = 0  # unreachable objects the full passes found, in all

    @contextlib.contextmanager
    def warming(self) -> Iterator[None]:
        """Around warm-up: the collector off (warm-up makes items, not cycles), then
        :meth:`settle`; on again whatever happens."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if enabled:
                gc.enable()
        self.settle()

    def settle(self) -> None:
        """After warm-up: drop start-up garbage, then freeze everything left."""
        self._full()

    def tick(self) -> None:
        """Freeze what survived since the last tick; a full pass instead when one is due."""
        if self._clock() - self._last_full >= self.full_every_s:
            self._full()
        else:
            gc.freeze()

    def _full(self) -> None:
        started = time.perf_counter()
        gc.unfreeze()
        self.freed_by_full += gc.collect()
        gc.freeze()
        self.last_full_pause_s = time.perf_counter() - started
        self.full_collections += 1
        self._last_full = self._clock()
