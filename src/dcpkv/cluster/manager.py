"""The cluster manager (ns_server's role): it owns the configuration and drives the nodes to it.

Theory of operation
-------------------
A thin asyncio shell around the sans-I/O parts: the configuration
(:mod:`~dcpkv.cluster.config`), placement (:mod:`~dcpkv.cluster.vbucket_map`) and the
failover decision (:mod:`~dcpkv.cluster.failover`). Every change follows one order:

1. decide the next :class:`~dcpkv.cluster.config.ClusterConfig` in memory, refusing bad input
   before anything is touched (nothing changes on a refusal);
2. persist it atomically;
3. *sync* each node it concerns: read the states it holds (``stat vbucket``), send a
   CAS-ordered SetVbucket for each vbucket whose state differs from the map (vbuckets the map
   no longer gives the node go dead: their data stays until rebalance deletes it), then push
   the map (SetClusterConfig, its own copy with ``thisNode``).

Because syncing only sends differences, a restarted manager that loads the file and syncs
every node sends no SetVbucket at all when nothing changed, and one killed between steps 2
and 3 finishes the job on restart. Changes are serialized by one lock. A node that cannot be
reached while syncing is left out of sync; the health watcher's next answered beat syncs it.

Data nodes never depend on the manager at run time: with it down they keep serving the last
states and map they were given.

Automatic failover: every heartbeat interval a loop takes the lock, feeds the pure decision
(:func:`~dcpkv.cluster.auto_failover.decide`) the health watcher's durations, the settings and
the maps, and carries it out: a chosen node is failed over exactly as by an operator, and the
count grows in the same configuration write (a manager restart never grants a second one).
What it did (node, reason, time; kept in the configuration file) and why it holds any other
unresponsive node are logged and shown in ``status``.

Users and roles (:mod:`dcpkv.core.rbac`): the manager keeps the users document in its store
(``users.json`` in its dir, or etcd; verifiers only) and pushes it whole to every node with
RbacRefresh, kv_engine's "reload the RBAC database" opcode, carrying the document since the
nodes are remote: after each change, and in every sync (a node that was down, or added later,
gets it on its next sync; a node keeps a document only when its revision is newer, so
re-sending is harmless). A dedicated admin-only opcode rather than a key in the pushed map:
the map goes to clients byte for byte, and verifiers must not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dcpkv.cluster import config as cfg
from dcpkv.cluster import topology_sync
from dcpkv.cluster.auto_failover import Policy, decide
from dcpkv.cluster.failover import (
    FailoverRefused,
    ReplicaSeqnos,
    plan_failover,
    vbuckets_to_promote,
)
from dcpkv.cluster.health import HealthWatcher
from dcpkv.cluster.leadership import stamped
from dcpkv.cluster.node_link import Counters, LinkTls, NodeLink, NodeLinkError
from dcpkv.cluster.rebalance import MAX_MOVES_AT_ONCE, Rebalancer, RebalanceRefused
from dcpkv.cluster.store import ClusterStore, FileStore, StoreConflict
from dcpkv.cluster.vbucket_map import PlacementError, VBucketMap, check_placeable, plan_initial
from dcpkv.core import logs
from dcpkv.core.errors import DcpkvError
from dcpkv.core.rbac import RbacError, Role, UserRecord, UsersDoc
from dcpkv.core.vbucket import VBucketState

log = logging.getLogger("dcpkv.cluster")


class Refused(DcpkvError):
    """An admin request the manager refused; nothing was changed."""


class Manager:
    def __init__(
        self,
        data_dir: Path,
        user: str,
        password: str,
        *,
        heartbeat_s: float = 1.0,
        link_tls: LinkTls | None = None,
        store: ClusterStore | None = None,
        rev_epoch: int = 0,
    ) -> None:
        self.data_dir = data_dir
        # where the configuration lives (cluster/store.py): cluster.json, or etcd for one of
        # several managers, whose leadership term is the revEpoch of every map it writes
        self.store: ClusterStore = store or FileStore(data_dir)
        self.rev_epoch = rev_epoch
        self.on_store_conflict: Any = None  # called when a write is fenced off (deposed)
        self.link_tls = link_tls
        self.user, self.password = user, password
        self.config = cfg.ClusterConfig()
        self.counters = Counters()
        self.links: dict[str, NodeLink] = {}
        self.out_of_sync: set[str] = set()
        self._lock = asyncio.Lock()
        self._heartbeat_s = heartbeat_s
        self.health: HealthWatcher | None = None
        self._syncing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.auto_held: dict[str, str] = {}  # unresponsive node -> why it is not failed over
        self.users = UsersDoc()
        self.rebalancer = Rebalancer(self)

    # -- life -------------------------------------------------------------------------------

    async def start(
        self, *, seeds: list[str], bucket: str, num_vbuckets: int, replicas: int
    ) -> None:
        """Load the configuration (or make a new one from the seeds), sync every node, watch
        their health. Raises :class:`Refused` or a config error when it cannot start."""
        try:
            self.users = await self.store.load_users()
        except RbacError as exc:
            raise Refused(str(exc)) from None
        loaded = await self.store.load()
        if loaded is None:
            try:
                check_placeable(max(replicas + 1, 1), replicas, num_vbuckets)
            except PlacementError as exc:
                raise Refused(str(exc)) from None
            self.config = cfg.ClusterConfig(
                buckets=(cfg.new_bucket(bucket, num_vbuckets, replicas),)
            )
            async with self._lock:
                await self._admit(seeds)
        else:
            self.config = loaded
            if seeds:
                log.info("a configuration exists: the --node seeds are ignored")
            # a record still running: this manager died mid-rebalance (a re-run finishes it)
            self.rebalancer.interrupted = loaded.rebalance.state == cfg.RebalanceState.RUNNING
            async with self._lock:
                if stamped(loaded, self.rev_epoch) != loaded:  # a new leader's term
                    await self._commit(loaded)
                # before the sync, which would drive a vbucket handed over back to the old map
                await self.rebalancer.finish_handover()
                await self._sync_all()
        self.health = HealthWatcher(self.config.buckets[0].name, self._on_beat, self._heartbeat_s)
        for name in self.config.active_nodes():
            self.health.watch(self._link(name))
        self._spawn(self._auto_failover_loop())

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        if self.health is not None:
            await self.health.stop()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for link in self.links.values():
            await link.close()

    async def resign(self) -> None:
        """Stop acting at once (a leader whose lease is gone): everything :meth:`stop`
        stops, and a running rebalance; the run-time state goes, so a later :meth:`start`
        begins as a new process would, from the store."""
        self.rebalancer.abandon()
        await self.stop()
        self.links.clear()
        self.out_of_sync.clear()
        self.health = None
        self.auto_held = {}
        self.rebalancer = Rebalancer(self)

    def _link(self, name: str) -> NodeLink:
        link = self.links.get(name)
        if link is None:
            link = self.links[name] = NodeLink(
                name, self.user, self.password, self.counters, self.link_tls, self.rev_epoch
            )
        return link

    # -- syncing nodes ----------------------------------------------------------------------

    async def _sync_all(self) -> None:
        for name in self.config.active_nodes():
            await self._sync_node(name)

    async def _sync_node(self, name: str) -> bool:
        """Drive one node to the configuration; False (and out of sync) when unreachable."""
        link = self._link(name)
        link.reconnected = False  # this sync covers a restart the link noticed
        try:
            if self.users.rev:
                await link.push_users(self.config.buckets[0].name, self.users.encode())
            for bucket in self.config.buckets:
                if bucket.map is None:
                    continue
                await self._sync_states(link, bucket.name, bucket.map)
                await link.push_config(bucket.name, self._pushed_config(bucket, name))
        except NodeLinkError as exc:
            log.warning("node %s is out of sync: %s", name, exc)
            self.out_of_sync.add(name)
            return False
        self.out_of_sync.discard(name)
        return True

    def _pushed_config(self, bucket: cfg.BucketConfig, node: str) -> dict[str, Any]:
        """The map a node is pushed: its own copy (``thisNode``), plus the settings nodes act
        on in a ``dcpkv`` section (clients ignore keys they do not know)."""
        assert bucket.map is not None
        doc = bucket.map.to_config(bucket.name, bucket.uuid, this_node=node)
        doc["dcpkv"] = {"repairOnRollback": self.config.settings.repair_on_rollback}
        if self.link_tls is not None:
            # The nodes speak TLS where the links reach them: advertised as kvSSL, what an
            # SDK given couchbases:// connects to.
            for entry in doc["nodesExt"]:
                services = entry["services"]
                services["kvSSL"] = services["kv"] + self.link_tls.port_offset
        return doc

    async def _sync_states(self, link: NodeLink, bucket: str, vb_map: VBucketMap) -> None:
        """The map's states, then the replication topology of each vbucket active on the node
        (:mod:`~dcpkv.cluster.topology_sync`): a vbucket made active takes it in the same
        SetVbucket; the others that lack it or hold another get it in one pipelined batch."""
        held = await link.states(bucket)
        wanted = vb_map.states_of(link.name)
        moving = self.rebalancer.held(link.name, bucket)  # a vbucket move drives these
        topologies = topology_sync.to_send(
            topology_sync.wanted(vb_map, link.name, skip=moving),
            {vb: topology_sync.held_chains(v) for vb, v in (await link.topologies(bucket)).items()},
        )
        for vb in sorted((set(held) | set(wanted)) - moving):
            state = wanted.get(vb, VBucketState.DEAD)
            if held.get(vb, VBucketState.DEAD) != state:
                await link.set_state(bucket, vb, state, held, topologies.pop(vb, b""))
                held[vb] = state
        await link.set_topologies(bucket, topologies, held)

    async def _on_beat(self, name: str, healthy: bool) -> None:
        if not healthy:
            self.out_of_sync.add(name)
        elif name not in self._syncing and (name in self.out_of_sync or self._reconnected(name)):
            # a node back, or one that may have restarted between two beats (a new session):
            # it may have lost its map's states' topologies (durable writes refused)
            self._spawn(self._resync(name))

    def _reconnected(self, name: str) -> bool:
        link = self.links.get(name)
        return link is not None and link.reconnected

    async def _resync(self, name: str) -> None:
        self._syncing.add(name)
        try:
            async with self._lock:
                node = self.config.node(name)
                member = node is not None and node.state == cfg.NodeState.ACTIVE
                if member and await self._sync_node(name):
                    log.info("node %s is back and in sync", name)
        finally:
            self._syncing.discard(name)

    async def _commit(self, config: cfg.ClusterConfig) -> None:
        config = stamped(config, self.rev_epoch)
        try:
            await self.store.save(config)
        except StoreConflict as exc:
            if self.on_store_conflict is not None:
                self.on_store_conflict()
            raise Refused(str(exc)) from None
        self.config = config

    # -- users ------------------------------------------------------------------------------

    def list_users(self) -> list[dict[str, Any]]:
        return [{"id": n, "roles": [str(r) for r in u.roles]} for n, u in self.users.users.items()]

    async def set_user(
        self, name: str, password: str | None, roles: tuple[Role, ...] | None
    ) -> dict[str, Any]:
        """Add a user (password and roles needed) or change one (either may be kept)."""
        async with self._lock:
            held = self.users.users.get(name)
            if held is None and (password is None or roles is None):
                raise Refused(f"no user named {name!r}: a new user needs a password and roles")
            if name == self.user:
                raise Refused(f"{name!r} is the cluster admin, not a user of the users database")
            if password is None:
                assert held is not None
                record = UserRecord(name, roles or held.roles, held.verifiers)
            else:
                record = UserRecord.create(name, password, roles or (held.roles if held else ()))
            await self._commit_users(self.users.with_user(record))
        return {"id": name, "roles": [str(r) for r in record.roles], "rev": self.users.rev}

    async def remove_user(self, name: str) -> dict[str, Any]:
        async with self._lock:
            await self._commit_users(self.users.without(name))
        return {"removed": name, "rev": self.users.rev}

    async def _commit_users(self, doc: UsersDoc) -> None:
        try:
            await self.store.save_users(doc)
        except StoreConflict as exc:
            if self.on_store_conflict is not None:
                self.on_store_conflict()
            raise Refused(str(exc)) from None
        self.users = doc
        for name in self.config.active_nodes():
            try:
                await self._link(name).push_users(self.config.buckets[0].name, doc.encode())
            except NodeLinkError as exc:  # its next sync pushes it
                log.warning("node %s did not take the users: %s", name, exc)
                self.out_of_sync.add(name)

    # -- add-node ---------------------------------------------------------------------------

    async def add_node(self, name: str) -> dict[str, Any]:
        async with self._lock:
            await self._admit([name])
        if self.health is not None:
            self.health.watch(self._link(name))
        return {"added": name, "placed": self._placed()}

    async def _admit(self, names: list[str]) -> None:
        """Validate every node, then commit them all, placing the map of a fresh bucket once
        enough nodes joined, then sync."""
        for name in names:
            await self._validate(name)
        config = self.config
        for name in names:
            config = config.with_node(cfg.NodeConfig(name))
        active = config.active_nodes()
        for bucket in config.buckets:
            if bucket.map is None and len(active) > bucket.num_replicas:
                chains = plan_initial(len(active), bucket.num_replicas, bucket.num_vbuckets)
                vb_map = VBucketMap(tuple(active), tuple(chains), bucket.num_replicas)
                config = config.with_bucket(replace(bucket, map=vb_map))
        await self._commit(config)
        await self._sync_all()

    def _placed(self) -> bool:
        return all(b.map is not None for b in self.config.buckets)

    async def _validate(self, name: str) -> None:
        _check_address(name)
        known = self.config.node(name)
        if known is not None:
            what = "already a member" if known.state == cfg.NodeState.ACTIVE else "failed over"
            raise Refused(f"{name} is {what} of this cluster")
        link = NodeLink(name, self.user, self.password, self.counters)
        try:
            for bucket in self.config.buckets:
                await self._validate_bucket(link, bucket)
        except NodeLinkError as exc:
            raise Refused(str(exc)) from None
        finally:
            await link.close()

    async def _validate_bucket(self, link: NodeLink, bucket: cfg.BucketConfig) -> None:
        served = await link.served_config(bucket.name)
        width = len(served.get("vBucketServerMap", {}).get("vBucketMap", []))
        if width != bucket.num_vbuckets:
            raise Refused(
                f"{link.name} has {width} vbuckets in bucket {bucket.name!r}, the cluster "
                f"{bucket.num_vbuckets}: start it with --vbuckets {bucket.num_vbuckets}"
            )
        held = await link.states(bucket.name)
        if held and served.get("uuid") != bucket.uuid:
            raise Refused(
                f"{link.name} already holds {len(held)} vbucket(s) of bucket {bucket.name!r} "
                "that this cluster did not give it (another cluster's data, a node not "
                "started with --managed, or one this cluster dropped at a rebalance): refusing "
                "to take it over; stop it and empty its data folder to add it as a new node "
                "(a failed-over node keeps its data if recovered before the next rebalance)"
            )

    # -- failover ---------------------------------------------------------------------------

    async def failover(self, name: str) -> dict[str, Any]:
        async with self._lock:
            return await self._fail_over(name, auto_reason=None)

    async def _fail_over(self, name: str, auto_reason: str | None) -> dict[str, Any]:
        """Fail ``name`` over (the lock held); ``auto_reason`` set: automatically, counted."""
        node = self.config.node(name)
        if node is None or node.state != cfg.NodeState.ACTIVE:
            raise Refused(f"{name} is not an active node of this cluster")
        survivors = [n for n in self.config.active_nodes() if n != name]
        if not survivors:
            raise Refused(f"{name} is the last node of the cluster: nothing would serve")
        if self.rebalancer.running:  # as ns_server: a failover stops a rebalance first
            await self.rebalancer.stop(f"stopped by the failover of {name}")
        config = self.config.with_node(replace(node, state=cfg.NodeState.FAILED))
        promoted = 0
        for bucket in self.config.buckets:
            if bucket.map is None or name not in bucket.map.servers:
                continue
            reported = await self._replica_seqnos(bucket, name)
            try:
                plan = plan_failover(bucket.map, name, reported)
            except FailoverRefused as exc:
                raise Refused(str(exc)) from None
            config = config.with_bucket(replace(bucket, map=plan.new_map))
            promoted += len(plan.promotions)
        if auto_reason is not None:  # counted and shown in the write that changes membership
            count = config.settings.auto_failover_count + 1
            config = replace(config, settings=replace(config.settings, auto_failover_count=count))
            config = config.with_event(cfg.FailoverEvent(name, auto_reason, time.time()))
        await self._commit(config)
        self.auto_held.pop(name, None)
        await self.forget(name)
        await self._sync_all()
        how = "manually" if auto_reason is None else f"automatically ({auto_reason})"
        logs.event(log, "failover", "failed over %s %s: %d vbucket(s) promoted", name, how,
                   promoted, level=logging.WARNING, node=name, automatic=auto_reason is not None,
                   reason=auto_reason, promoted=promoted)  # fmt: skip
        return {"failedOver": name, "promoted": promoted, "rev": self._rev()}

    # -- automatic failover -----------------------------------------------------------------

    async def _auto_failover_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                async with self._lock:
                    await self._auto_failover_step()
            except Exception:  # the loop must outlive one failed attempt; the next one retries
                log.exception("automatic failover failed")

    async def _auto_failover_step(self) -> None:
        if self.health is None:
            return
        settings = self.config.settings
        policy = Policy(
            settings.auto_failover_enabled,
            settings.auto_failover_timeout_s,
            settings.auto_failover_count,
        )
        down_for = {n: self.health.unhealthy_for(n) for n in self.config.active_nodes()}
        maps = [b.map for b in self.config.buckets if b.map is not None]
        decision = decide(down_for, policy, maps)
        held = dict(decision.held)
        if decision.node is not None:
            try:
                await self._fail_over(decision.node, auto_reason=decision.reason)
            except Refused as exc:
                held[decision.node] = f"failover refused: {exc}"
        for node, why in held.items():
            if self.auto_held.get(node) != why:
                log.warning("not failing %s over automatically: %s", node, why)
        self.auto_held = held

    async def reset_auto_failover_count(self) -> dict[str, Any]:
        async with self._lock:
            settings = replace(self.config.settings, auto_failover_count=0)
            await self._commit(replace(self.config, settings=settings))
        log.info("the auto-failover count was reset")
        return settings.to_json()

    async def _replica_seqnos(
        self, bucket: cfg.BucketConfig, failed: str
    ) -> dict[int, dict[str, ReplicaSeqnos]]:
        """vbucket -> {replica: its seqnos} for the vbuckets ``failed`` holds active; a
        replica that cannot be asked is left out (it cannot be promoted)."""
        assert bucket.map is not None
        wanted = vbuckets_to_promote(bucket.map, failed)
        by_replica: dict[str, list[int]] = {}
        for vb, replicas in wanted.items():
            for server in replicas:
                by_replica.setdefault(server, []).append(vb)
        reported: dict[int, dict[str, ReplicaSeqnos]] = {vb: {} for vb in wanted}
        for server, vbs in by_replica.items():
            try:
                seqnos = await self._link(server).replica_seqnos(bucket.name, vbs)
            except NodeLinkError as exc:
                log.warning("cannot ask %s for its seqnos: %s", server, exc)
                continue
            for vb, seqno in seqnos.items():
                reported[vb][server] = seqno
        return reported

    def _rev(self) -> int | None:
        maps = [b.map for b in self.config.buckets if b.map is not None]
        return maps[0].rev if maps else None

    # -- settings and status ----------------------------------------------------------------

    async def set_auto_failover(self, enabled: bool, timeout_s: int) -> dict[str, Any]:
        low, high = cfg.MIN_AUTO_FAILOVER_TIMEOUT_S, cfg.MAX_AUTO_FAILOVER_TIMEOUT_S
        if not low <= timeout_s <= high:
            raise Refused(
                f"the auto-failover timeout must be {low}..{high} seconds, not {timeout_s}"
            )
        async with self._lock:
            settings = replace(
                self.config.settings,
                auto_failover_enabled=enabled,
                auto_failover_timeout_s=timeout_s,
            )
            await self._commit(replace(self.config, settings=settings))
        return settings.to_json()

    async def set_repair_on_rollback(self, enabled: bool) -> dict[str, Any]:
        """Switch the repair; every node learns it from its map, pushed again one rev up."""
        async with self._lock:
            config = replace(
                self.config, settings=replace(self.config.settings, repair_on_rollback=enabled)
            )
            for bucket in config.buckets:
                if bucket.map is not None:  # same placement; a node keeps only a newer rev
                    same = bucket.map.with_chains(bucket.map.servers, bucket.map.chains)
                    config = config.with_bucket(replace(bucket, map=same))
            await self._commit(config)
            await self._sync_all()
        return {"repairOnRollback": enabled}

    async def status(self) -> dict[str, Any]:
        lags = await self._replication_lags()
        nodes = []
        for node in self.config.nodes:
            actives = replicas = 0
            for bucket in self.config.buckets:
                if bucket.map is not None:
                    a, r = bucket.map.counts().get(node.name, (0, 0))
                    actives, replicas = actives + a, replicas + r
            nodes.append(
                {
                    "hostname": node.name,
                    "clusterMembership": node.state.value,
                    "status": self._health_of(node),
                    "inSync": node.name not in self.out_of_sync,
                    "actives": actives,
                    "replicas": replicas,
                    "replicationLag": lags.get(node.name),
                }
            )
        return {
            "nodes": nodes,
            "buckets": [
                {
                    "name": b.name,
                    "uuid": b.uuid,
                    "numVBuckets": b.num_vbuckets,
                    "numReplicas": b.num_replicas,
                    "rev": None if b.map is None else b.map.rev,
                    "placed": b.map is not None,
                }
                for b in self.config.buckets
            ],
            "autoFailover": {
                **self.config.settings.to_json(),
                "events": [e.to_json() for e in self.config.events[-10:]],
                "held": self.auto_held,
            },
            "counters": self.counters.to_json(),
            "rebalance": self.rebalancer.status(),
        }

    def _health_of(self, node: cfg.NodeConfig) -> str:
        if node.state == cfg.NodeState.FAILED:
            return "failedOver"
        health = self.health.health.get(node.name) if self.health else None
        return health.status if health else "unknown"

    async def _replication_lags(self) -> dict[str, int | None]:
        """node -> items its replica vbuckets are behind their actives (None: unknown)."""
        lags: dict[str, int | None] = {}
        for bucket in self.config.buckets:
            if bucket.map is None:
                continue
            actives: dict[int, int] = {}
            replicas: dict[str, dict[int, int] | None] = {}
            for name in bucket.map.servers:
                if self.health is not None and self.health.unhealthy_for(name) > 0:
                    replicas[name] = None  # do not wait on a node known not to answer
                    continue
                try:
                    link = self._link(name)
                    actives.update(await link.high_seqnos(bucket.name, VBucketState.ACTIVE))
                    replicas[name] = await link.high_seqnos(bucket.name, VBucketState.REPLICA)
                except NodeLinkError:
                    replicas[name] = None
            for name, seqnos in replicas.items():
                if seqnos is None:
                    lags[name] = None
                elif lags.get(name, 0) is not None:
                    behind = sum(max(0, actives.get(vb, 0) - s) for vb, s in seqnos.items())
                    lags[name] = (lags.get(name) or 0) + behind
        return lags

    # -- rebalance (cluster/rebalance.py drives it; these are what it uses) -------------------

    async def rebalance(self, eject: list[str]) -> dict[str, Any]:
        async with self._lock:
            try:
                return await self.rebalancer.start(eject)
            except RebalanceRefused as exc:
                raise Refused(str(exc)) from None

    async def stop_rebalance(self) -> dict[str, Any]:
        async with self._lock:
            try:
                return await self.rebalancer.stop()
            except RebalanceRefused as exc:
                raise Refused(str(exc)) from None

    async def set_recovery(self, name: str, how: cfg.Recovery) -> dict[str, Any]:
        """Mark a failed-over node to be taken back in by the next rebalance."""
        async with self._lock:
            node = self.config.node(name)
            if node is None or node.state != cfg.NodeState.FAILED:
                raise Refused(f"{name} is not a failed-over node of this cluster")
            record = self.config.rebalance
            recover = (*(r for r in record.recover if r[0] != name), (name, how))
            await self._commit(replace(self.config, rebalance=replace(record, recover=recover)))
        return {"node": name, "recoveryType": how.value}

    async def set_rebalance_moves(self, moves: int) -> dict[str, Any]:
        if not 1 <= moves <= MAX_MOVES_AT_ONCE:
            raise Refused(f"moves at once must be 1..{MAX_MOVES_AT_ONCE}, not {moves}")
        async with self._lock:
            record = replace(self.config.rebalance, moves_at_once=moves)
            await self._commit(replace(self.config, rebalance=record))
        return record.to_json()

    @property
    def lock(self) -> asyncio.Lock:
        return self._lock

    def link(self, name: str) -> NodeLink:
        return self._link(name)

    def pushed_config(self, bucket: cfg.BucketConfig, node: str) -> dict[str, Any]:
        return self._pushed_config(bucket, node)

    async def commit(self, config: cfg.ClusterConfig) -> None:
        await self._commit(config)

    def commit_while(
        self, config: cfg.ClusterConfig, pushes: Sequence[Awaitable[None]]
    ) -> Awaitable[Any]:
        """Take ``config`` now; what it returns writes it while ``pushes`` run. For a
        handover's map only, whose group record, written before, covers a crash in between
        (rebalance.py). Writes go in order, in one thread of their own."""
        self.config = config
        return asyncio.gather(self.store.save(config), *pushes)

    async def sync_all(self) -> None:
        await self._sync_all()

    def watch(self, name: str) -> None:
        if self.health is not None:
            self.health.watch(self._link(name))

    async def fail_over_now(self, name: str, why: str) -> dict[str, Any]:
        """A failover the manager decides itself outside automatic failover (the lock held):
        logged with ``why``; the usual refusals apply."""
        log.warning("failing %s over: %s", name, why)
        return await self._fail_over(name, auto_reason=None)

    def down_for(self, name: str) -> float:
        """Seconds ``name`` has not answered heartbeats (0: it answers)."""
        return self.health.unhealthy_for(name) if self.health is not None else 0.0

    async def forget(self, name: str) -> None:
        """Stop watching and driving a node that left."""
        if self.health is not None:
            await self.health.forget(name)
        link = self.links.pop(name, None)
        if link is not None:
            await link.close()
        self.out_of_sync.discard(name)


def _check_address(name: str) -> None:
    host, sep, port = name.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(f"{name!r} is not a node address (host:port of its memcached port)")
