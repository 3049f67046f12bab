"""Rebalance: the manager moves vbuckets between live nodes (spec 002, "How ns_server performs
a partition rebalance").

Theory of operation
-------------------
A thin asyncio shell around the pure parts: the planner (:mod:`.rebalance_plan`) decides the
target map for the nodes that stay (members, minus the ones to eject, plus failed-over nodes
taken back by recovery); each vbucket whose chain changes becomes a
:class:`~dcpkv.cluster.vbucket_move.VBucketMove`. A task runs them a few at a time
(``moves_at_once``, a setting) so the cluster keeps serving. Every tick (``TICK_S``), holding
the manager's lock, it reads what the nodes of the running moves hold of their vbuckets
(``stat vbucket``, GetAllVbSeqnos, ObserveSeqno), steps each move and carries out what it
asks: CAS-ordered SetVbucket or DelVbucket through the nodes' links (one node's in order, the
nodes at once), or a map change. The map changes of one tick (moves whose active stays) are
committed together: the new chains written into the configuration (persisted first, as every
change), then pushed to every node at once.

How a node is told to take a vbucket over: map-driven, like replication. The manager sets the
new active's copy *pending*; the node streams every vbucket it holds as pending from the map's
active with the TakeOver flag (:mod:`dcpkv.server.replication`), and the two nodes do the
handoff between them. Handovers go by groups (:mod:`.handover`): the moves a tick finds built
are handed over together, in the same tick, holding the lock: the group is persisted in the
rebalance record and the map naming their new actives is pushed to their old and new actives
(each serves it from the moment its copy changes hands); then the new copies go pending, and
the manager watches just their states (GetVbucket, every ``HANDOVER_POLL_S``): whenever some
takeovers have ended, the map naming those is committed at once, pushed to every node at once
(one push for what ended together) while it is written, the next reads overlapping the
pushes. So the old and new actives serve the map naming the new active from the moment the
vbucket changes hands, and the other nodes one poll and one push later.

The manager's sync (the map's states for every node) leaves alone every vbucket a queued or
running move holds (:meth:`Rebalancer.held`): the move drives them.

Faults. A move whose node stops answering heartbeats for ``NODE_DOWN_S`` is abandoned
(:meth:`~dcpkv.cluster.vbucket_move.VBucketMove.abandon`). A move that fails is reverted (old
active back) and the rebalance stops, ``failed``, with the reason; the moves already done stay
done. When the old active itself stopped answering, so it cannot be put back, its node is
failed over to a replica (spec 002, step 5), as an operator's failover would do it. ``stop``
reverts the running moves whose map has not changed yet. A failover stops a running rebalance
first. The record in the configuration
(:class:`~dcpkv.cluster.config.RebalanceConfig`) keeps the nodes to eject and recover until a
run completes, so after a stop, a failure or a manager restart (a record found ``running`` at
start-up means the manager died mid-run: status says ``interrupted``) running ``rebalance``
again plans from the map as it now stands and finishes the job. A manager that died during
a group of handovers ends the group when it starts again (:meth:`Rebalancer.finish_handover`):
the moves whose new active took over go in the map, the others are put back.

Recovery of a failed-over node: ``full`` wipes its vbuckets (DelVbucket) before it is planned
in; ``delta`` keeps them, and the planner prefers the node for copies of the vbuckets it holds,
which become replicas of the current actives: the replica stream rolls each back where its
history left the active's (the rollback rules) and it copies only what changed since.

At the end, ejected and failed-over nodes leave the configuration and the map's server list is
compacted to the nodes its chains name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dcpkv.cluster import config as cfg
from dcpkv.cluster import topology_sync
from dcpkv.cluster.handover import Handover
from dcpkv.cluster.node_link import NodeLink, NodeLinkError
from dcpkv.cluster.rebalance_plan import (
    NamedChain,
    moves,
    named_chains,
    plan_rebalance,
    with_named_chains,
)
from dcpkv.cluster.vbucket_map import NOBODY, PlacementError, VBucketMap
from dcpkv.cluster.vbucket_move import (
    Action,
    CommitChain,
    Delete,
    NodeView,
    Phase,
    SetState,
    VBucketMove,
    Views,
)
from dcpkv.core import logs
from dcpkv.core.errors import DcpkvError
from dcpkv.core.replication_topology import topology_value
from dcpkv.core.vbucket import VBucketState

log = logging.getLogger("dcpkv.cluster")

TICK_S = 0.2
HANDOVER_POLL_S = 0.005  # how often a group's states are read while its takeovers run
MAX_MOVES_AT_ONCE = 64
NODE_DOWN_S = 5.0  # a move whose node missed heartbeats this long is abandoned


class RebalanceRefused(DcpkvError):
    """A rebalance request the manager refused; nothing was changed."""


class RebalanceHost(Protocol):
    """What a rebalance needs of the manager that runs it (:class:`dcpkv.cluster.manager.Manager`
    is one): the configuration it commits, the manager's lock, its links to the nodes and
    their health, the map push and sync, and the failover it may have to decide. The
    rebalancer knows its manager only by this (no import of the manager: an import-linter
    contract in pyproject.toml)."""

    config: cfg.ClusterConfig
    out_of_sync: set[str]  # nodes whose next sync must push everything again

    @property
    def lock(self) -> asyncio.Lock: ...

    def link(self, name: str) -> NodeLink: ...

    def pushed_config(self, bucket: cfg.BucketConfig, node: str) -> dict[str, Any]: ...

    async def commit(self, config: cfg.ClusterConfig) -> None: ...

    def commit_while(
        self, config: cfg.ClusterConfig, pushes: Sequence[Awaitable[None]]
    ) -> Awaitable[Any]: ...

    async def sync_all(self) -> None: ...

    def watch(self, name: str) -> None: ...

    async def fail_over_now(self, name: str, why: str) -> dict[str, Any]: ...

    def down_for(self, name: str) -> float: ...

    async def forget(self, name: str) -> None: ...


@dataclass
class Progress:
    """What ``status`` shows of the current (or last) run."""

    total: int = 0
    done: int = 0
    items: int = 0  # items the new copies received
    started: float = 0.0
    finished: float | None = None
    running: dict[int, str] = field(default_factory=dict)  # vbucket -> phase

    def to_json(self, now: float) -> dict[str, Any]:
        elapsed = (self.finished or now) - self.started if self.started else 0.0
        eta = None
        if self.done and self.finished is None:
            eta = round(elapsed / self.done * (self.total - self.done), 1)
        return {
            "vbucketsTotal": self.total,
            "vbucketsMoved": self.done,
            "itemsTransferred": self.items,
            "elapsed": round(elapsed, 1),
            "eta": eta,
            "moving": {str(vb): phase for vb, phase in sorted(self.running.items())},
        }


@dataclass
class _BucketRun:
    name: str
    queue: deque[tuple[int, NamedChain, NamedChain]]
    running: list[VBucketMove] = field(default_factory=list)
    holds: dict[str, set[int]] = field(default_factory=dict)  # queued moves' node -> vbuckets
    # old actives a reverted move could not put back (their node stopped answering)
    unrestored: set[str] = field(default_factory=set)


class Rebalancer:
    def __init__(self, manager: RebalanceHost) -> None:
        self.m = manager
        self.progress = Progress()
        self._runs: list[_BucketRun] = []
        self._task: asyncio.Task[None] | None = None
        self.interrupted = False  # the record said running at start-up

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def abandon(self) -> None:
        """Cancel the run where it is, writing nothing (its manager lost the lead: the next
        leader finds the record still running and finishes it)."""
        if self._task is not None:
            self._task.cancel()

    def held(self, node: str, bucket: str) -> set[int]:
        """The vbuckets of ``bucket`` on ``node`` the sync must leave alone."""
        out: set[int] = set()
        for run in self._runs:
            if run.name != bucket:
                continue
            out |= run.holds.get(node, set())
            out |= {m.vbucket for m in run.running if node in m.nodes()}
        return out

    def status(self) -> dict[str, Any]:
        record = self.m.config.rebalance
        state = "running" if self.running else record.state.value
        if self.interrupted and not self.running:
            state = "interrupted"
        return {
            **record.to_json(),
            "state": state,
            "progress": self.progress.to_json(time.monotonic()),
        }

    # -- starting ---------------------------------------------------------------------------

    async def start(self, eject: list[str]) -> dict[str, Any]:
        """Plan and start a run (the manager's lock held); :class:`RebalanceRefused` when
        it cannot, nothing changed."""
        if self.running:
            raise RebalanceRefused("a rebalance is running already (stop it first)")
        config = self.m.config
        record = config.rebalance
        ejecting = tuple(dict.fromkeys([*record.eject, *eject]))
        for name in eject:
            node = config.node(name)
            if node is None or node.state != cfg.NodeState.ACTIVE:
                raise RebalanceRefused(f"{name} is not an active node of this cluster")
        recovering = [n for n, _ in record.recover]
        nodes = [n for n in (*config.active_nodes(), *recovering) if n not in ejecting]
        if not nodes:
            raise RebalanceRefused("every node would leave: nothing would serve")
        holding = await self._holdings(record.recover)
        plans = self._plan(nodes, holding)  # may refuse: nothing is touched before it
        await self._wipe([n for n, how in record.recover if how is cfg.Recovery.FULL])
        for name in recovering:
            config = config.with_node(cfg.NodeConfig(name))
        config = replace(
            config,
            rebalance=replace(
                record, state=cfg.RebalanceState.RUNNING, eject=ejecting, recover=(), error=None
            ),
        )
        await self.m.commit(config)
        self.interrupted = False
        self._runs = [self._bucket_run(name, old, new) for name, old, new in plans]
        total = sum(len(r.queue) for r in self._runs)
        self.progress = Progress(total=total, started=time.monotonic())
        for name in recovering:
            self.m.watch(name)
        await self.m.sync_all()
        self._task = asyncio.get_running_loop().create_task(self._run())
        logs.event(log, "rebalance_start", "rebalance started: %d vbucket move(s), ejecting %s",
                   total, list(ejecting), moves=total, eject=list(ejecting))  # fmt: skip
        return {"started": True, "moves": total, "eject": list(ejecting), "nodes": nodes}

    async def _holdings(self, recover: tuple[tuple[str, cfg.Recovery], ...]) -> dict[str, set[int]]:
        """``bucket\0node`` -> the vbuckets a delta-recovered node holds."""
        holding: dict[str, set[int]] = {}
        for name, how in recover:
            if how is not cfg.Recovery.DELTA:
                continue
            for bucket in self.m.config.buckets:
                try:
                    held = await self.m.link(name).states(bucket.name)
                except NodeLinkError as exc:
                    raise RebalanceRefused(f"cannot recover {name}: {exc}") from None
                holding[f"{bucket.name}\0{name}"] = set(held)
        return holding

    async def _wipe(self, names: list[str]) -> None:
        """Full recovery: every vbucket of these nodes deleted before they are planned in."""
        for name in names:
            link = self.m.link(name)
            for bucket in self.m.config.buckets:
                try:
                    for vb in sorted(await link.states(bucket.name)):
                        await link.delete_vbucket(bucket.name, vb)
                except NodeLinkError as exc:
                    raise RebalanceRefused(f"cannot wipe {name}: {exc}") from None

    def _plan(
        self, nodes: list[str], holding: dict[str, set[int]]
    ) -> list[tuple[str, list[NamedChain], list[NamedChain]]]:
        plans = []
        for bucket in self.m.config.buckets:
            if bucket.map is None:
                continue
            current = named_chains(bucket.map)
            mine = {
                key.partition("\0")[2]: vbs
                for key, vbs in holding.items()
                if key.partition("\0")[0] == bucket.name
            }
            try:
                chains = plan_rebalance(current, nodes, bucket.num_replicas, mine)
            except PlacementError as exc:
                raise RebalanceRefused(str(exc)) from None
            target: list[NamedChain] = [tuple(nodes[i] for i in c) for c in chains]
            plans.append((bucket.name, current, target))
        return plans

    @staticmethod
    def _bucket_run(name: str, old: list[NamedChain], new: list[NamedChain]) -> _BucketRun:
        queue = deque((vb, old[vb], new[vb]) for vb in moves(old, new))
        holds: dict[str, set[int]] = {}
        for vb, a, b in queue:
            for node in {*a, *b} - {None}:
                assert node is not None
                holds.setdefault(node, set()).add(vb)
        return _BucketRun(name, queue, holds=holds)

    # -- stopping ---------------------------------------------------------------------------

    async def stop(self, why: str = "stopped by an operator") -> dict[str, Any]:
        """Stop a run (the manager's lock held): running moves not yet in the map are reverted."""
        if not self.running:
            raise RebalanceRefused("no rebalance is running")
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for run in self._runs:
            await self._stop_moves(run)
        await self._end(cfg.RebalanceState.STOPPED, why)
        return self.status()

    # -- the run ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            for run in self._runs:
                while run.queue or run.running:
                    async with self.m.lock:
                        failed, handed_over = await self._tick(run)
                    if failed is not None:
                        async with self.m.lock:
                            await self._fail(run, failed)
                        return
                    if not handed_over:  # (after a group: the next may be ready already)
                        await asyncio.sleep(TICK_S)
            async with self.m.lock:
                await self._complete()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a config error: stop, say why, keep the record
            log.exception("rebalance failed")
            async with self.m.lock:
                await self._end(cfg.RebalanceState.FAILED, f"{type(exc).__name__}: {exc}")

    async def _tick(self, run: _BucketRun) -> tuple[str | None, bool]:
        """One step of every running move, then a handover of those built: the first
        failure's reason, if any, and whether a group was handed over."""
        limit = max(1, min(MAX_MOVES_AT_ONCE, self.m.config.rebalance.moves_at_once))
        now = time.monotonic()
        while run.queue and len(run.running) < limit:
            vb, old, new = run.queue.popleft()
            run.running.append(VBucketMove(vb, old, new, now))
        views = await self._views(run)
        work = []
        for move in run.running:
            mine = views.get(move.vbucket, {})
            self.progress.items += _grown(move, mine)
            work.append((move, self._step(move, mine, now)))
        commits = await self._carry_out(run.name, work)
        if commits:
            await self._commit_chains(run, commits)
        ready = [m for m in run.running if m.phase is Phase.READY]
        if ready:
            await self._hand_over(run, ready)
        return self._retire(run), bool(ready)

    def _step(self, move: VBucketMove, views: Views, now: float) -> list[Action]:
        down = [n for n in sorted(move.nodes()) if self.m.down_for(n) >= NODE_DOWN_S]
        if down:
            return move.abandon(views, f"{down[0]} stopped answering")
        return move.step(views, now)

    # -- a group of handovers (.handover) -----------------------------------------------------

    async def _hand_over(self, run: _BucketRun, ready: list[VBucketMove]) -> None:
        """Hand ``ready`` over as one group (the module docstring; the lock held)."""
        bucket = self._bucket(run.name)
        assert bucket.map is not None
        first = Handover.of(run.name, bucket.map, [(m.vbucket, m.old, m.new) for m in ready])
        record = replace(self.m.config.rebalance, handover=first)
        await self.m.commit(replace(self.m.config, rebalance=record))
        await asyncio.gather(*(self._stage(node, first) for node in first.instructions()))
        # the takeovers' last stage: a prepare needs a majority of both chains
        await self._set_topologies(run.name, {m.vbucket: (m.old, m.new) for m in ready})
        group: Handover | None = first
        now = time.monotonic()
        await self._carry_out(run.name, [(m, m.hand_over(now)) for m in ready])
        sending: list[Awaitable[Any]] = []  # (a step's pushes overlap the next reads)
        while group is not None:
            await asyncio.sleep(HANDOVER_POLL_S)
            taking = [m for m in ready if m.phase is Phase.TAKEOVER]
            views = await self._states(run.name, taking)
            now = time.monotonic()
            work = [(m, self._step(m, views[m.vbucket], now)) for m in taking]
            await self._carry_out(run.name, work)
            ended = [m for m, _ in work if m.phase is not Phase.TAKEOVER]
            if ended:
                group, pushed = self._handed_over(group, ended)
                sending.append(pushed)
        await asyncio.gather(*sending)

    def _handed_over(
        self, group: Handover, ended: list[VBucketMove]
    ) -> tuple[Handover | None, Awaitable[Any]]:
        """Some of the group's takeovers ended: the map naming those handed over, with the
        group of the others, taken now; what it returns writes it to the configuration while
        it is pushed to every node at once, each first told the others' staged map if it is
        one of their old or new actives (.handover). Not persisted first, unlike every other
        change: under load that write took up to 0.1 s, all of it a stale-map window; the
        group's record, persisted before anything was staged, covers a manager that dies in
        between (:meth:`finish_handover` commits above any map it may have pushed)."""
        done = [m for m in ended if m.phase is Phase.MAP]
        bucket = self._bucket(group.bucket)
        assert bucket.map is not None
        vb_map, rest = group.ended(
            bucket.map, [m.vbucket for m in done], [m.vbucket for m in ended if m not in done]
        )
        bucket = replace(bucket, map=vb_map)
        config = self.m.config.with_bucket(bucket)
        told = rest.instructions() if rest is not None else {}
        docs = {  # built now: the next step changes the map
            node: [
                *([self._staged_doc(node, rest, bucket)] if rest and node in told else []),
                self.m.pushed_config(bucket, node),
            ]
            for node in config.active_nodes()
        }
        now = time.monotonic()
        for move in done:
            move.committed(now)
        pushes: list[Awaitable[None]] = [
            self._send(node, bucket.name, sent) for node, sent in docs.items()
        ]
        # the new actives' chains; a reverted move's old active is back to its one chain
        chains = {m.vbucket: (m.new if m in done else m.old,) for m in ended}
        pushes.append(self._set_topologies(bucket.name, chains))
        record = replace(config.rebalance, handover=rest)
        return rest, self.m.commit_while(replace(config, rebalance=record), pushes)

    def _staged_doc(self, node: str, group: Handover, bucket: cfg.BucketConfig) -> dict[str, Any]:
        """The group's staged map for one of its old or new actives, with the state changes
        that make it theirs (``dcpkv.adoptWhen``, :mod:`dcpkv.server.handover`)."""
        assert bucket.map is not None
        doc = self.m.pushed_config(replace(bucket, map=group.staged(bucket.map)), node)
        when = group.instructions()[node]
        doc["dcpkv"]["adoptWhen"] = {str(vb): state.label for vb, state in when.items()}
        return doc

    async def _stage(self, node: str, group: Handover) -> None:
        await self._send(
            node, group.bucket, [self._staged_doc(node, group, self._bucket(group.bucket))]
        )

    async def _send(self, node: str, bucket: str, docs: list[dict[str, Any]]) -> None:
        """Maps to one node, in order; the last one is the map (a node that does not take it
        is out of sync: the next answered heartbeat syncs it), any before staged ones (it
        serves the map naming their new actives once it is committed)."""
        for i, doc in enumerate(docs):
            try:
                await self.m.link(node).push_config(bucket, doc)
            except NodeLinkError as exc:
                log.info("rebalance: %s did not take a map: %s", node, exc)
                if i == len(docs) - 1 and "adoptWhen" not in doc["dcpkv"]:
                    self.m.out_of_sync.add(node)

    async def finish_handover(self) -> None:
        """Start-up found a group of handovers under way (the manager died during it; the
        lock held): the moves whose new active took over go in the map, the others are put
        back (:meth:`VBucketMove.stop`), as the group's end would have done."""
        group = self.m.config.rebalance.handover
        if group is None:
            return
        now = time.monotonic()
        taking = [
            VBucketMove(vb, old, new, now, phase=Phase.TAKEOVER) for vb, old, new in group.moves
        ]
        views = await self._states(group.bucket, taking)
        for move in taking:
            move.step(views[move.vbucket], now)
        stopping = [m for m in taking if m.phase is Phase.TAKEOVER]
        await self._carry_out(group.bucket, [(m, m.stop(views[m.vbucket])) for m in stopping])
        done = sum(m.phase is Phase.MAP for m in taking)
        log.warning("a group of handovers was under way: %d of %d vbucket(s) handed over",
                    done, len(taking))  # fmt: skip
        bucket = self._bucket(group.bucket)
        assert bucket.map is not None  # (written with the map the group ends on)
        self.m.config = self.m.config.with_bucket(replace(bucket, map=group.lifted(bucket.map)))
        await self._handed_over(group, taking)[1]

    def _retire(self, run: _BucketRun) -> str | None:
        failed = None
        for move in [m for m in run.running if m.finished]:
            run.running.remove(move)
            for node in {*move.old, *move.new} - {None}:
                assert node is not None
                run.holds.get(node, set()).discard(move.vbucket)
            logs.event(log, "rebalance_step", "rebalance: vbucket %d %s", move.vbucket,
                       move.phase.value, bucket=run.name, vbucket=move.vbucket,
                       result=move.phase.value, error=move.error)  # fmt: skip
            if move.phase is Phase.REVERTED:
                failed = failed or f"vbucket {move.vbucket}: {move.error}"
                old = move.old_active
                if old is not None and self.m.down_for(old) >= NODE_DOWN_S:
                    run.unrestored.add(old)
            else:
                self.progress.done += 1
                if move.error:
                    log.warning("vbucket %d moved: %s", move.vbucket, move.error)
        self.progress.running = {m.vbucket: m.phase.value for m in run.running}
        return failed

    async def _views(self, run: _BucketRun) -> dict[int, Views]:
        """vbucket -> node -> what it holds, for the running moves (None: no answer)."""
        return await self._ask(run.name, run.running, full=True)

    async def _states(self, bucket: str, running: list[VBucketMove]) -> dict[int, Views]:
        """The same, the states alone (cheaper): what a group of handovers watches."""
        return await self._ask(bucket, running, full=False)

    async def _ask(
        self, bucket: str, running: list[VBucketMove], *, full: bool
    ) -> dict[int, Views]:
        wanted: dict[str, list[int]] = {}
        for move in running:
            for node in {*move.old, *move.new} - {None}:
                assert node is not None
                wanted.setdefault(node, []).append(move.vbucket)
        out: dict[int, Views] = {m.vbucket: {} for m in running}
        asked = list(wanted.items())  # every node at once: a tick waits for the slowest only
        answers = await asyncio.gather(
            *(self._node_views(self.m.link(node), bucket, vbs, full) for node, vbs in asked)
        )
        for (node, vbs), seen in zip(asked, answers, strict=True):
            for vb in vbs:
                out[vb][node] = None if seen is None else seen[vb]
        return out

    async def _node_views(
        self, link: NodeLink, bucket: str, vbs: list[int], full: bool
    ) -> dict[int, NodeView] | None:
        if self.m.down_for(link.name) > 0:
            return None  # do not wait on a node known not to answer
        try:
            if full:
                seen = await link.vbucket_views(bucket, vbs)
                return {vb: NodeView(*seen[vb]) for vb in vbs}
            states = await link.vbucket_states(bucket, vbs)
            return {vb: NodeView(states[vb]) for vb in vbs}
        except NodeLinkError as exc:
            log.info("rebalance: %s did not answer: %s", link.name, exc)
            return None

    async def _carry_out(
        self, bucket: str, work: list[tuple[VBucketMove, list[Action]]]
    ) -> list[VBucketMove]:
        """Every move's actions: each node's in order (its state changes are CAS-ordered),
        the nodes at once; the moves that asked for their map change."""
        by_node: dict[str, list[tuple[VBucketMove, SetState | Delete]]] = {}
        commits = []
        for move, actions in work:
            for action in actions:
                if isinstance(action, CommitChain):
                    commits.append(move)
                else:
                    by_node.setdefault(action.node, []).append((move, action))
        await asyncio.gather(*(self._carry_out_on(bucket, n, todo) for n, todo in by_node.items()))
        return commits

    async def _carry_out_on(
        self, bucket: str, node: str, todo: list[tuple[VBucketMove, SetState | Delete]]
    ) -> None:
        link = self.m.link(node)
        for move, action in todo:
            try:
                if isinstance(action, SetState):
                    # a takeover's new copy goes pending with the chain it serves as active
                    pending = action.state == VBucketState.PENDING
                    topology = topology_value(move.new) if pending else b""
                    await link.set_state(bucket, action.vbucket, action.state, {}, topology)
                else:
                    await link.delete_vbucket(bucket, action.vbucket)
            except NodeLinkError as exc:  # the move sees the state unchanged and asks again
                log.info("rebalance: vbucket %d: %s", move.vbucket, exc)

    async def _commit_chains(self, run: _BucketRun, done: list[VBucketMove]) -> None:
        """Put the new chains of ``done`` in the map: persisted, then pushed to every node."""
        bucket = self._bucket(run.name)
        assert bucket.map is not None
        vb_map = with_named_chains(bucket.map, {m.vbucket: m.new for m in done})
        await self.m.commit(self.m.config.with_bucket(replace(bucket, map=vb_map)))
        now = time.monotonic()
        for move in done:
            move.committed(now)
        await self._push_map(run.name)
        await self._set_topologies(run.name, {m.vbucket: (m.new,) for m in done})

    async def _set_topologies(
        self, bucket: str, chains: Mapping[int, topology_sync.Chains]
    ) -> None:
        """Each vbucket's replication topology to its first chain's active, the nodes at once
        (:mod:`.topology_sync`). A node that does not take it keeps its old one until the
        manager's next sync of it (the rebalance's end syncs every node)."""

        async def send(node: str, values: dict[int, bytes]) -> None:
            try:
                await self.m.link(node).set_topologies(bucket, values, {})
            except NodeLinkError as exc:
                log.info("rebalance: %s did not take %d topologies: %s", node, len(values), exc)

        todo = topology_sync.by_active(chains)
        await asyncio.gather(*(send(node, values) for node, values in todo.items()))

    async def _push_map(self, name: str) -> None:
        """The bucket's map to every node at once."""
        await asyncio.gather(*(self._push_to(n, name) for n in self.m.config.active_nodes()))

    async def _push_to(self, node: str, name: str) -> None:
        """Only the map: the states of the moved vbuckets are the moves' own business."""
        await self._send(node, name, [self.m.pushed_config(self._bucket(name), node)])

    def _bucket(self, name: str) -> cfg.BucketConfig:
        return next(b for b in self.m.config.buckets if b.name == name)

    async def _stop_moves(self, run: _BucketRun) -> None:
        """Revert the running moves not in the map yet; commit those handed over already."""
        views = await self._views(run)
        await self._carry_out(
            run.name, [(m, m.stop(views.get(m.vbucket, {}))) for m in run.running]
        )
        committed = [m for m in run.running if m.phase is Phase.MAP]
        if committed:  # handed over already: the map must follow
            await self._commit_chains(run, committed)

    # -- the end ----------------------------------------------------------------------------

    async def _fail(self, run: _BucketRun, why: str) -> None:
        """A move failed (and was reverted): stop the others too, keep the record."""
        await self._stop_moves(run)
        await self._end(cfg.RebalanceState.FAILED, why)
        for node in sorted(run.unrestored):
            # Spec 002, rebalance step 5: the old active cannot be told to go back to active,
            # so its node is failed over to a replica. In a task of its own: the failover
            # takes the manager's lock, which this run's task holds until it returns.
            asyncio.get_running_loop().create_task(self._fail_over_unrestored(node))

    async def _fail_over_unrestored(self, node: str) -> None:
        async with self.m.lock:
            try:
                await self.m.fail_over_now(node, "the rebalance could not put its vbuckets back")
            except Exception as exc:  # refused (its last replica...): the operator decides
                log.warning("cannot fail %s over after the failed rebalance: %s", node, exc)

    async def _end(self, state: cfg.RebalanceState, why: str | None) -> None:
        self.progress.finished = time.monotonic()
        self.progress.running = {}
        self._runs = []
        record = replace(self.m.config.rebalance, state=state, error=why)
        await self.m.commit(replace(self.m.config, rebalance=record))
        await self.m.sync_all()
        logs.event(
            log,
            "rebalance_end",
            "rebalance %s: %s",
            state.value,
            why,
            level=logging.WARNING,
            result=state.value,
            error=why,
        )

    async def _complete(self) -> None:
        """Every move done: ejected and failed-over nodes leave, the server list compacts."""
        config = self.m.config
        leaving = set(config.rebalance.eject) | {
            n.name for n in config.nodes if n.state == cfg.NodeState.FAILED
        }
        for bucket in config.buckets:
            if bucket.map is not None:
                config = config.with_bucket(replace(bucket, map=_compact(bucket.map)))
        config = replace(
            config,
            nodes=tuple(n for n in config.nodes if n.name not in leaving),
            rebalance=replace(
                config.rebalance, state=cfg.RebalanceState.IDLE, eject=(), error=None
            ),
        )
        await self.m.commit(config)
        for name in leaving:
            await self.m.forget(name)
        await self.m.sync_all()
        self.progress.finished = time.monotonic()
        self.progress.running = {}
        self._runs = []
        moved = self.progress.done
        logs.event(
            log,
            "rebalance_end",
            "rebalance done: %d vbucket(s) moved; %s left",
            moved,
            sorted(leaving),
            result="done",
            moved=moved,
            left=sorted(leaving),
        )


def _grown(move: VBucketMove, views: Views) -> int:
    """Items the move's new copies received since the last tick."""
    before = move.transferred_seen
    move.transferred_seen = move.transferred(views)
    return max(0, move.transferred_seen - before)


def _compact(vb_map: VBucketMap) -> VBucketMap:
    """The same map naming only the servers its chains use (a failover or an ejection may
    leave others in the list)."""
    used = sorted({i for chain in vb_map.chains for i in chain if i != NOBODY})
    if used == list(range(len(vb_map.servers))):
        return vb_map
    index = {old: new for new, old in enumerate(used)}
    servers = [vb_map.servers[i] for i in used]
    chains = [[index.get(i, NOBODY) for i in chain] for chain in vb_map.chains]
    return vb_map.with_chains(servers, chains)
