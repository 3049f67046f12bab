"""How the console samples the cluster: at most once per interval whoever asks, and per-second
rates from successive samples.

Theory of operation
-------------------
:class:`Cached` holds the last gathered value and the time it was gathered. A caller within
``ttl_s`` of it gets it as it is; the first caller after that starts one gathering, and every
caller arriving while it runs awaits that same one (single flight), so ten open consoles cost
the nodes what one does, and the manager's event loop does one gathering's work per interval.
A gathering that fails fails its waiters and is not kept: the next caller starts a new one. A
caller that goes away (its browser closed) does not cancel a gathering others wait on.

:class:`Rate` turns a counter into a per-second rate: ``(total - previous total) / (now -
previous now)``. There is none from the first sample, and a step where the counter went down
(a rollback, a node restarted, a vbucket that was counted on no node for a moment) counts as
0 rather than as a negative rate.

:class:`Mutations` counts a bucket's mutations from its vbuckets' high seqnos as the nodes
report them: for each vbucket the highest seqno ever seen, kept across samples, summed. A
vbucket reported by no node in one sample (between owners in a rebalance's handover, its node
not answering) keeps its last seqno instead of reading as a drop and then a burst; one
reported by two nodes (both active for a moment) counts once. A sample that brings vbuckets
never seen before (the first one, a node answering again) starts the rate afresh: their whole
history is not a burst of writes. After a failover a promoted replica may stand below the
old active's seqno: the count waits until it passes it (an undercount for that while).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class Cached(Generic[T]):
    def __init__(
        self,
        gather: Callable[[], Awaitable[T]],
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gather = gather
        self._ttl_s = ttl_s
        self._clock = clock
        self._kept: tuple[float, T] | None = None
        self._pending: asyncio.Future[T] | None = None

    async def get(self) -> T:
        if self._kept is not None and self._clock() - self._kept[0] < self._ttl_s:
            return self._kept[1]
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._pending)

    async def _run(self) -> T:
        try:
            value = await self._gather()
            self._kept = (self._clock(), value)
            return value
        finally:
            self._pending = None


@dataclass
class Rate:
    """A counter's per-second rate between its last two samples."""

    last: tuple[float, int] | None = None

    def update(self, now: float, total: int) -> float | None:
        previous, self.last = self.last, (now, total)
        if previous is None or now <= previous[0]:
            return None
        return max(0, total - previous[1]) / (now - previous[0])


@dataclass
class Mutations:
    """A bucket's mutations and their rate, from its vbuckets' high seqnos (module docstring)."""

    highest: dict[int, int] = field(default_factory=dict)
    rate: Rate = field(default_factory=Rate)

    def update(self, now: float, reports: Iterable[dict[int, int]]) -> tuple[int, float | None]:
        """Take the nodes' reports (vbucket -> high seqno); the count and mutations/s."""
        grew = False
        for seqnos in reports:
            for vb, seqno in seqnos.items():
                kept = self.highest.get(vb)
                grew = grew or kept is None
                if kept is None or seqno > kept:
                    self.highest[vb] = seqno
        total = sum(self.highest.values())
        if grew:
            self.rate = Rate()
        return total, self.rate.update(now, total)


def as_count(text: str | None) -> int:
    """A node's stat value as a number; one we cannot read counts as nothing (a figure on a
    console, never a decision)."""
    try:
        return int(text or 0)
    except ValueError:
        return 0
