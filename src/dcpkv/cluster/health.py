"""Node health: a heartbeat over the memcached protocol, one per node, every second.

Theory of operation
-------------------
For every node it is told to watch, :class:`HealthWatcher` runs one task that sends a Noop
(through the node's :class:`~dcpkv.cluster.node_link.NodeLink`, so a dead session is reopened
on the next beat) and waits at most one interval for the answer. A node answering is
``healthy``; one that does not is ``unhealthy`` from its first missed beat, and
:meth:`HealthWatcher.unhealthy_for` says for how long: automatic failover (the next step)
reads exactly that against its timeout. Every beat ends with ``on_beat(node, healthy)``: the
manager notes a node that missed one as out of sync and re-drives it once it answers again
(it may have restarted, with a new state CAS and no map). Until its first beat a node is
``unknown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dcpkv.cluster.node_link import NodeLink, NodeLinkError
from dcpkv.core.deadline import within

log = logging.getLogger("dcpkv.cluster")

OnBeat = Callable[[str, bool], Awaitable[None]]


@dataclass
class Health:
    status: str = "unknown"  # healthy | unhealthy | unknown
    since: float = 0.0  # monotonic time of the last transition
    last_seen: float | None = None  # monotonic time of the last answered beat


class HealthWatcher:
    def __init__(self, bucket: str, on_beat: OnBeat, interval_s: float = 1.0) -> None:
        self.bucket = bucket
        self.interval_s = interval_s
        self._on_beat = on_beat
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.health: dict[str, Health] = {}

    def watch(self, link: NodeLink) -> None:
        if link.name in self._tasks:
            return
        self.health[link.name] = Health(since=time.monotonic())
        self._tasks[link.name] = asyncio.get_running_loop().create_task(self._beat(link))

    async def forget(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        self.health.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        for name in list(self._tasks):
            await self.forget(name)

    def unhealthy_for(self, name: str) -> float:
        """Seconds since the node stopped answering; 0 while it answers."""
        health = self.health.get(name)
        if health is None or health.status != "unhealthy":
            return 0.0
        return time.monotonic() - health.since

    async def _beat(self, link: NodeLink) -> None:
        while True:
            started = time.monotonic()
            try:
                await within(link.noop(self.bucket), self.interval_s)
                healthy = True
            except (NodeLinkError, TimeoutError, OSError):
                healthy = False
            await self._record(link.name, healthy)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def _record(self, name: str, healthy: bool) -> None:
        health = self.health[name]
        now = time.monotonic()
        if healthy:
            health.last_seen = now
        status = "healthy" if healthy else "unhealthy"
        if status != health.status:
            health.status, health.since = status, now
            log.info("node %s is %s", name, status)
        try:
            await self._on_beat(name, healthy)
        except Exception:  # the watcher must outlive a failed reaction; the next beat retries
            log.exception("reacting to a beat of %s failed", name)
