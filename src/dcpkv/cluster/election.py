"""Leader election among managers on etcd: the I/O shell around :mod:`~dcpkv.cluster.leadership`.

Theory of operation
-------------------
Each manager holds one lease and keeps it with a keep-alive every third of its TTL. It lists
itself under ``/dcpkv/managers/NAME`` (bound to the lease: a dead manager leaves the list
when its lease expires) and, while no one leads, campaigns every :data:`POLL_S`: a
transaction creates ``/dcpkv/leader`` bound to its lease if the key is absent, else reads
it. Winning makes the key's create revision the manager's term; the ``elected`` callback
then starts the manager (it runs as a task: keep-alives go on meanwhile).

A watchdog looks at the verdict every :data:`WATCH_S`: once the lease may have run out (no
keep-alive answered in time: etcd down, its quorum lost, this process stopped for a while)
or etcd says the lease is gone, the ``deposed`` callback stops the manager at once and the
manager campaigns again as any follower. A deposed leader that has not noticed yet can still
write nothing: its store writes are fenced on its term (:mod:`~dcpkv.cluster.etcd_store`).

A manager that steps down deletes the leader key and gives up the lease that held it (revoked,
never kept alive again): it campaigns on a new one. The delete can fail (etcd electing a new
raft leader, which also extends every lease); a lease still kept alive would then keep the
key, naming a manager that no longer acts, and no manager would lead again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dcpkv.cluster.etcd_store import LEADER_KEY, MANAGERS_PREFIX, EtcdUnavailable, call
from dcpkv.cluster.leadership import Leadership, Verdict

log = logging.getLogger("dcpkv.cluster")

POLL_S = 0.5
WATCH_S = 0.1
RETRY_S = 1.0


class Elector:
    def __init__(
        self,
        client: Any,
        name: str,
        url: str,
        ttl_s: float,
        elected: Callable[[int], Coroutine[Any, Any, None]],
        deposed: Callable[[str], Awaitable[None]],
    ) -> None:
        self.client = client
        self.name, self.url = name, url
        self.state = Leadership(ttl_s=ttl_s)
        self.leader_url: str | None = None
        self._elected, self._deposed = elected, deposed
        self._acting: asyncio.Task[None] | None = None
        self._give_up_lease = False  # stepped down: the session's lease held the leader key

    @property
    def leading(self) -> bool:
        return self.state.verdict(time.monotonic()) == Verdict.ACT

    async def run(self) -> None:
        """Campaign, lead, keep the lease, forever (cancel to stop)."""
        watchdog = asyncio.get_running_loop().create_task(self._watch())
        try:
            while True:
                try:
                    await self._session()
                except EtcdUnavailable as exc:
                    log.warning("manager %s: %s; trying again", self.name, exc)
                    if self.state.role == "follower":  # who leads is unknown now
                        self.state = self.state.lost()
                        self.leader_url = None
                    await asyncio.sleep(RETRY_S)
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await self.step_down("stopping")

    async def _session(self) -> None:
        """One lease's life: listed, campaigning or leading, until etcd says it is gone."""
        ttl = max(1, round(self.state.ttl_s))
        lease = await call(self.client.lease(ttl))
        self._give_up_lease = False
        me = json.dumps({"name": self.name, "url": self.url}).encode()
        await call(self.client.put(MANAGERS_PREFIX + self.name.encode(), me, lease=lease.id))
        keepalive_at = time.monotonic() + ttl / 3
        while True:
            if self._give_up_lease:  # (its leader key goes with it: revoked, or expired)
                with contextlib.suppress(EtcdUnavailable):
                    await call(self.client.revoke_lease(lease.id))
                return
            if self.state.role == "follower":
                await self._campaign(lease.id, me)
            if time.monotonic() >= keepalive_at:
                sent = time.monotonic()
                reply = await call(self.client.refresh_lease(lease.id))
                if reply.TTL <= 0:
                    await self.step_down("etcd says the lease expired")
                    return
                self.state = self.state.refreshed(sent, reply.TTL)
                keepalive_at = sent + ttl / 3
            await asyncio.sleep(POLL_S)

    async def _campaign(self, lease_id: int, me: bytes) -> None:
        tx = self.client.transactions
        sent = time.monotonic()
        won, answers = await call(
            self.client.transaction(
                compare=[tx.create(LEADER_KEY) == 0],
                success=[tx.put(LEADER_KEY, me, lease=lease_id)],
                failure=[tx.get(LEADER_KEY)],
            )
        )
        if won:
            term = answers[0].response_put.header.revision
            self.state = self.state.won(self.name, term, sent)
            self.leader_url = self.url
            log.info("manager %s leads, term %d", self.name, term)
            self._acting = asyncio.get_running_loop().create_task(self._elected(term))
            return
        held = answers[0]
        if held:  # (the key can expire between the compare and the read: none then)
            value, meta = held[0]
            leader = json.loads(value)
            self.state = self.state.observed(leader["name"], meta.create_revision)
            self.leader_url = leader["url"]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            if self.state.verdict(time.monotonic()) == Verdict.STOP:
                await self.step_down("no keep-alive answered within the lease")

    async def step_down(self, why: str) -> None:
        """Stop acting now (idempotent); the next campaign may win again."""
        if self.state.role != "leader":
            return
        term = self.state.term
        self.state = self.state.lost()
        self.leader_url = None
        self._give_up_lease = True
        log.warning("manager %s stops leading (term %d): %s", self.name, term, why)
        if self._acting is not None and not self._acting.done():
            self._acting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._acting
        self._acting = None
        await self._deposed(why)
        with contextlib.suppress(EtcdUnavailable):  # let another take over without waiting
            tx = self.client.transactions
            await call(
                self.client.transaction(
                    compare=[tx.create(LEADER_KEY) == term],
                    success=[tx.delete(LEADER_KEY)],
                    failure=[],
                )
            )
