"""The console's figures: the manager's own state, and what the nodes' stats say.

Theory of operation
-------------------
Two documents, each gathered at most once per interval whoever asks (:class:`.sampling.
Cached`): the overview every second, the DCP panel every five.

``overview``
    From the manager, with no node asked: every node's membership, health and share of the
    map (actives, replicas), the buckets, the rebalance (:meth:`Rebalancer.status`: vbuckets
    moved of total, items, elapsed and estimated seconds), automatic failover (settings,
    events, nodes held) and the failed-over nodes. From each member node that answers its
    heartbeats, per bucket: the default ``stat`` group (items, memory, persistence lag, disk
    fault) and its actives' high seqnos (GetAllVbSeqnos), which make the bucket's mutations
    and their rate (:class:`.sampling.Mutations`).
``dcp``
    For each member node and bucket: ``stat dcp`` and every non-dead vbucket's high seqno,
    made into connections and their backlog (:mod:`.dcp_backlog`).

The questions go through links of the console's own (:class:`~dcpkv.cluster.node_link.
NodeLink`, one per node), never the manager's: a node too slow for the console's deadline
(``ASK_TIMEOUT_S``) has its console session closed, not the one a rebalance is using. A node
that does not answer in time is shown as not answering; the rest are gathered all at once.
Nodes that left the cluster have their links closed at the next gathering.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from dcpkv.cluster import config as cfg
from dcpkv.cluster.console.dcp_backlog import parse
from dcpkv.cluster.console.sampling import Cached, Mutations, as_count
from dcpkv.cluster.node_link import Counters, NodeLink, NodeLinkError
from dcpkv.core.deadline import within
from dcpkv.core.vbucket import VBucketState

if TYPE_CHECKING:
    from dcpkv.cluster.manager import Manager

ASK_TIMEOUT_S = 2.0
TTL_S = 1.0
# The DCP panel (thousands of stat rows a node with 1,024 vbuckets): at most every 5 s, which
# is how often the page asks for it
DCP_TTL_S = 5.0


class Gatherer:
    def __init__(self, manager: Manager) -> None:
        self.m = manager
        self._links: dict[str, NodeLink] = {}
        self._counters = Counters()  # (the console's links change nothing: never counted)
        self._mutations: dict[str, Mutations] = {}
        self.overview: Cached[dict[str, Any]] = Cached(self._overview, TTL_S)
        self.dcp: Cached[dict[str, Any]] = Cached(self._dcp, DCP_TTL_S)

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()

    # -- overview ---------------------------------------------------------------------------

    async def _overview(self) -> dict[str, Any]:
        config = self.m.config
        asked = await self._asked(config)
        answers = await asyncio.gather(*(self._node_figures(b, n) for b, n in asked))
        figures = dict(zip(asked, answers, strict=True))
        now = time.monotonic()
        return {
            "at": time.time(),
            "managers": None,  # several managers (one leader) fill this in
            "nodes": [self._node_row(config, node, figures) for node in config.nodes],
            "buckets": [self._bucket_row(b, figures, now) for b in config.buckets],
            "rebalance": self.m.rebalancer.status(),
            "failover": {
                **config.settings.to_json(),
                "events": [e.to_json() for e in config.events],
                "held": dict(self.m.auto_held),
                "failedOver": [n.name for n in config.nodes if n.state == cfg.NodeState.FAILED],
                "recovery": {n: how.value for n, how in config.rebalance.recover},
            },
        }

    async def _node_figures(self, bucket: str, node: str) -> dict[str, Any] | None:
        link = self._link(node)
        try:
            stats = dict(await within(link.stat_group(bucket), ASK_TIMEOUT_S))
            highs = await within(link.high_seqnos(bucket, VBucketState.ACTIVE), ASK_TIMEOUT_S)
        except (NodeLinkError, TimeoutError):
            return None
        return {
            "items": as_count(stats.get("curr_items")),
            "memUsed": as_count(stats.get("mem_used")),
            "persistenceLagMs": as_count(stats.get("ep_persistence_lag_ms")),
            "diskError": stats.get("ep_disk_error") or None,
            "version": stats.get("version"),
            "uptime": as_count(stats.get("uptime")),
            "highSeqnos": highs,
        }

    def _node_row(
        self,
        config: cfg.ClusterConfig,
        node: cfg.NodeConfig,
        figures: dict[tuple[str, str], dict[str, Any] | None],
    ) -> dict[str, Any]:
        actives = replicas = 0
        for bucket in config.buckets:
            if bucket.map is not None:
                a, r = bucket.map.counts().get(node.name, (0, 0))
                actives, replicas = actives + a, replicas + r
        mine = [f for (_, n), f in figures.items() if n == node.name]
        answered = [f for f in mine if f is not None]
        return {
            "hostname": node.name,
            "clusterMembership": node.state.value,
            "status": self._health(node),
            "inSync": node.name not in self.m.out_of_sync,
            "actives": actives,
            "replicas": replicas,
            "answered": bool(mine) and len(answered) == len(mine),
            "items": sum(f["items"] for f in answered),
            "memUsed": sum(f["memUsed"] for f in answered),
            "persistenceLagMs": max((f["persistenceLagMs"] for f in answered), default=None),
            "diskError": next((f["diskError"] for f in answered if f["diskError"]), None),
            "version": next((f["version"] for f in answered), None),
            "uptime": next((f["uptime"] for f in answered), None),
        }

    def _bucket_row(
        self,
        bucket: cfg.BucketConfig,
        figures: dict[tuple[str, str], dict[str, Any] | None],
        now: float,
    ) -> dict[str, Any]:
        mine = [f for (b, _), f in figures.items() if b == bucket.name and f is not None]
        counter = self._mutations.setdefault(bucket.name, Mutations())
        mutations, per_sec = counter.update(now, (f["highSeqnos"] for f in mine))
        return {
            "name": bucket.name,
            "numVBuckets": bucket.num_vbuckets,
            "numReplicas": bucket.num_replicas,
            "placed": bucket.map is not None,
            "rev": None if bucket.map is None else bucket.map.rev,
            "items": sum(f["items"] for f in mine),
            "memUsed": sum(f["memUsed"] for f in mine),
            "mutations": mutations,
            "mutationsPerSec": per_sec,
        }

    def _health(self, node: cfg.NodeConfig) -> str:
        if node.state == cfg.NodeState.FAILED:
            return "failedOver"
        watcher = self.m.health
        health = watcher.health.get(node.name) if watcher is not None else None
        return health.status if health is not None else "unknown"

    # -- DCP --------------------------------------------------------------------------------

    async def _dcp(self) -> dict[str, Any]:
        asked = await self._asked(self.m.config)
        answers = await asyncio.gather(*(self._node_dcp(b, n) for b, n in asked))
        return {
            "at": time.time(),
            "nodes": [
                {"node": n, "bucket": b, "answered": c is not None, "connections": c or []}
                for (b, n), c in zip(asked, answers, strict=True)
            ],
        }

    async def _node_dcp(self, bucket: str, node: str) -> list[dict[str, Any]] | None:
        link = self._link(node)
        try:
            rows = await within(link.stat_group(bucket, "dcp"), ASK_TIMEOUT_S)
            highs = await within(link.high_seqnos(bucket, None), ASK_TIMEOUT_S)
        except (NodeLinkError, TimeoutError):
            return None
        return [c.summary(highs) for c in parse(rows)]

    # -- links ------------------------------------------------------------------------------

    async def _asked(self, config: cfg.ClusterConfig) -> list[tuple[str, str]]:
        """(bucket, node) to ask: the placed buckets on the member nodes not known to miss
        heartbeats; the links of nodes that left are closed."""
        members = config.active_nodes()
        for name in [n for n in self._links if n not in members]:
            await self._links.pop(name).close()
        nodes = [n for n in members if self.m.down_for(n) == 0]
        return [(b.name, n) for b in config.buckets if b.map is not None for n in nodes]

    def _link(self, name: str) -> NodeLink:
        link = self._links.get(name)
        if link is None:
            m = self.m
            link = self._links[name] = NodeLink(
                name, m.user, m.password, self._counters, m.link_tls
            )
        return link
