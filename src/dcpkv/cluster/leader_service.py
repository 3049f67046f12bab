"""``dcpkv manager --etcd``: one of several managers; the elected one drives the cluster.

Theory of operation
-------------------
Every manager serves the admin API from its start. The configuration lives in etcd
(:mod:`~dcpkv.cluster.etcd_store`); the :class:`~dcpkv.cluster.election.Elector` decides
who leads. What each does:

============  =================================================================================
role          what it does
============  =================================================================================
leader        a :class:`~dcpkv.cluster.manager.Manager` started as a restarted one would be:
              it loads the configuration from etcd (raising every map's ``revEpoch`` to its
              term), finishes a handover group left half done, syncs every node, runs a
              rebalance the last leader left running again (it finishes the job), watches
              the nodes' health and runs automatic failover. Every write is fenced on its
              term.
follower      reads (GET) are answered from the configuration in etcd, read again for each
              request; writes are forwarded to the leader's URL (503 while none leads: no
              lease is held, e.g. etcd lost its quorum, so no failover runs either)
============  =================================================================================

Losing the lease (or a write fenced off) makes the leader *resign* at once: its tasks, health
watcher, node sessions and any rebalance stop, and it campaigns again as a follower.

The first leader of an empty etcd takes the configuration from ``cluster.json`` in its data
folder when there is one (the file format is the same: a one-manager cluster moves to etcd
as it is), else makes a new one from ``--node`` seeds. ``GET /pools/default/managers`` shows
the managers, the leader, its term and etcd's health.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any

import aiohttp
from aiohttp import web

from dcpkv.cluster import config as cfg
from dcpkv.cluster.election import Elector
from dcpkv.cluster.etcd_store import (
    MANAGERS_PREFIX,
    EtcdStore,
    EtcdUnavailable,
    call,
    connect,
    parse_endpoints,
)
from dcpkv.cluster.http_api import Handler, error, make_app
from dcpkv.cluster.leadership import rev_epoch_for
from dcpkv.cluster.manager import Manager, Refused
from dcpkv.cluster.service import ManagerSettings, listen, until_signalled
from dcpkv.cluster.store import FileStore

log = logging.getLogger("dcpkv.cluster")

FORWARD_TIMEOUT_S = 60.0  # a write (a rebalance start syncs every node first)
READ_TIMEOUT_S = 5.0  # a read: past it, answered from etcd
HOP_HEADER = "X-Dcpkv-Forwarded"  # a forwarded request is never forwarded again
MANAGERS_PATH = "/pools/default/managers"


class LeaderService:
    def __init__(self, options: ManagerSettings, client: Any) -> None:
        self.options = options
        self.client = client
        self.manager = Manager(
            options.data_dir,
            options.user,
            options.password,
            link_tls=options.link_tls,
            store=EtcdStore(client),
        )
        self.elector: Elector | None = None

    # -- leadership -------------------------------------------------------------------------

    async def elected(self, term: int) -> None:
        """Act for ``term``: the manager starts from what etcd holds (migrated if empty)."""
        store = EtcdStore(self.client, term=term)
        for link in self.manager.links.values():  # a follower's links named no term
            await link.close()
        self.manager.links.clear()
        self.manager.store = store
        self.manager.rev_epoch = rev_epoch_for(term)
        self.manager.on_store_conflict = self._fenced
        if await store.load() is None:
            await self._migrate(store)
        options = self.options
        try:
            await self.manager.start(
                seeds=options.seeds,
                bucket=options.bucket,
                num_vbuckets=options.num_vbuckets,
                replicas=options.replicas,
            )
        except (Refused, cfg.ClusterConfigError, EtcdUnavailable) as exc:
            log.error("manager %s cannot act in term %d: %s", self.elector_name, term, exc)
            self._fenced()
            return
        if self.manager.rebalancer.interrupted:  # the last leader died mid-rebalance
            try:
                await self.manager.rebalance([])
                log.info("the interrupted rebalance runs again to finish the job")
            except Refused as exc:
                log.warning("the interrupted rebalance cannot run again: %s", exc)

    async def _migrate(self, store: EtcdStore) -> None:
        """An empty etcd takes this manager's files (a one-manager cluster moving over)."""
        files = FileStore(self.options.data_dir)
        local = await files.load()
        if local is not None:
            log.info("etcd holds no configuration: moving %s into it", cfg.FILE_NAME)
            users = await files.load_users()
            await store.load_users()
            if users.rev and not store.users_revision:
                await store.save_users(users)
            await store.save(local)

    def _fenced(self) -> None:
        if self.elector is not None:
            asyncio.get_running_loop().create_task(self.elector.step_down("fenced off"))

    async def deposed(self, why: str) -> None:
        await self.manager.resign()
        self.manager.store = EtcdStore(self.client)
        self.manager.on_store_conflict = None

    @property
    def elector_name(self) -> str:
        return self.elector.name if self.elector is not None else "?"

    # -- the API ----------------------------------------------------------------------------

    @web.middleware
    async def route(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The leader answers all; a follower forwards to it, and answers reads from etcd
        while none answers."""
        leading = self.elector is not None and self.elector.leading
        if leading or request.path == MANAGERS_PATH:  # (this manager's own view)
            return await handler(request)
        if request.method not in ("GET", "HEAD"):
            return await self._forward(request, FORWARD_TIMEOUT_S)
        answer = await self._forward(request, READ_TIMEOUT_S)  # it knows the nodes' health
        if answer.status != 503:
            return answer
        try:
            loaded = await EtcdStore(self.client).load()
        except EtcdUnavailable as exc:
            return error(503, f"no manager leads and {exc} (no quorum, or unreachable)")
        if loaded is not None:
            self.manager.config = loaded
        return await handler(request)

    async def _forward(self, request: web.Request, timeout_s: float) -> web.StreamResponse:
        leader = self.elector.leader_url if self.elector is not None else None
        if leader is None or HOP_HEADER in request.headers:
            return error(503, "no manager leads right now (etcd unreachable or without a quorum?)")
        headers = {
            k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type")
        }
        headers[HOP_HEADER] = self.elector_name
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.request(
                    request.method, leader + request.path_qs, data=await request.read(),
                    headers=headers, ssl=False,
                ) as answer,
            ):  # fmt: skip
                body = await answer.read()
                return web.Response(
                    status=answer.status, body=body, content_type=answer.content_type
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error(503, f"the leader at {leader} did not answer: {exc}")

    async def managers(self, request: web.Request) -> web.Response:
        return web.json_response(await self.describe())

    async def describe(self) -> dict[str, Any]:
        """The managers, the leader, its term, etcd's health."""
        assert self.elector is not None
        state = self.elector.state
        doc: dict[str, Any] = {
            "self": self.elector.name,
            "role": "leader" if self.elector.leading else "follower",
            "leader": state.leader,
            "term": state.leader_term,
            "leaseTtl": state.ttl_s,
            "managers": [],
            "etcd": {"endpoints": self.options.etcd, "healthy": False},
        }
        try:
            listed = await call(self.client.get_prefix(MANAGERS_PREFIX))
            doc["managers"] = sorted(_manager_entry(kv.value) for kv in listed)
            status = await call(self.client.status())
            doc["etcd"].update(
                healthy=True, version=status.version, raftTerm=status.raft_term,
                leader=status.leader.name,
            )  # fmt: skip
        except EtcdUnavailable as exc:
            doc["etcd"]["error"] = str(exc)
        return doc


def _manager_entry(raw: bytes) -> Any:
    entry = json.loads(raw)
    return [entry["name"], entry["url"]]


async def serve_on_etcd(options: ManagerSettings) -> None:
    assert options.etcd is not None
    client = connect(parse_endpoints(options.etcd))
    service = LeaderService(options, client)
    app = make_app(service.manager)
    app.middlewares.insert(0, service.route)
    app.router.add_get(MANAGERS_PATH, service.managers)
    runner = web.AppRunner(app, access_log=None)
    elector_task = None
    try:
        url = await listen(runner, options)
        name = options.name or f"{socket.gethostname()}:{url.rsplit(':', 1)[1]}"
        service.elector = Elector(
            client, name, url, options.lease_ttl_s, service.elected, service.deposed
        )
        elector_task = asyncio.get_running_loop().create_task(service.elector.run())
        await until_signalled()
    finally:
        if elector_task is not None:
            elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await elector_task
        await runner.cleanup()
        await service.manager.stop()
        await client.close()
