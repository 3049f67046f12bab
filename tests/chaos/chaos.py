"""The fault-injection suite (issue 17, item 5): a seeded, bounded, randomized run over a local
cluster under load, then the checks that nothing the README promises was lost.

    python tests/chaos/chaos.py --seed 7 --duration 120      # make chaos runs 30 minutes

What runs
    A manager and ``--nodes`` data nodes (real processes, free ports, ``--replicas``), each
    node behind a small TCP proxy (``linkproxy.py``) whose address is the node's name in the
    cluster, so every link to it (clients, replication, the manager) can be cut or slowed;
    automatic failover on (3 s). A *writer* (the official SDK, which follows the map) upserts
    a few hundred keys, each with a value that only grows (``{"v": n}``). A *confirmer* asks
    the nodes (ObserveSeqno, same vbucket uuid) which acknowledged writes were persisted on
    the active *and* on a replica: those are the writes the README says survive a kill -9 of
    any one node (persisted on the active: its restart keeps them) and a failover (persisted
    on a replica: the promoted one has them). A *reader* (the SDK) reads keys back and notes a
    value going backwards.

Faults, one every 1-3 s, chosen by the seeded RNG (the history is printed with the seed, so
a failure can be replayed):

    kill      kill -9 a node, restart it on its port before the failover timeout
    pause     SIGSTOP a node (a hung node) for 0.3-1.5 s, then SIGCONT
    cut       close every connection to a node at its proxy: clients, replication links and
              the manager's links all reconnect
    delay     hold every chunk to and from a node 50-300 ms at its proxy, for 1-3 s (a slow
              link)
    manager   kill -9 the manager and restart it (nodes keep serving meanwhile)
    failover  kill -9 a node and leave it down: the manager fails it over by itself (one
              node at a time: the cluster keeps a replica per vbucket)
    recover   a failed-over node comes back: restarted, delta recovery, a rebalance; the
              auto-failover count is acknowledged so the next failover may happen
    swap      a rebalance out of a node (its vbuckets move away with takeover streams), then
              the node is added back and rebalanced in

With ``--etcd`` (``make chaos CHAOS_ARGS=--etcd``): three etcd members and a manager per node
(``etcd_mode.py``, lease 3 s), the API asked of the leader; ``manager`` kills any of them, and

    leader            kill -9 the leading manager, restart it
    stall             SIGSTOP the leading manager past its lease, then SIGCONT (it wakes up
                      deposed)
    follower-stall    SIGSTOP a manager that does not lead, 0.5 s to past its lease, then
                      SIGCONT (the leader leads on: the history says whether it did)
    etcd-cut          cut the leading manager off from etcd past its lease, the nodes still
                      in its reach: its own proxies to the etcd members (``etcd_mode.py``)
                      hold every byte (a partition that drops packets) or reset every
                      connection (a firewall that rejects), then heal; it must stop acting
                      before another manager wins the next term (their logs' times)
    etcd              kill -9 an etcd member, restart it 0.5-3 s later
    leader-failover   kill -9 a node and leave it down, then the leader 0.2-2.5 s later: the
                      next leader fails the node over (the time is reported)
    leader-rebalance  a rebalance out of a node, the leader killed 0-0.5 s into it: the next
                      leader runs it to its end; then the node is added back

Checks at the end (faults stopped, the cluster settled)
    lost       a write a replica persisted whose key now reads an older value, or nothing
    divergent  a replica whose documents, seqnos, CAS or failover log differ from its active's
    backwards  a reader saw a key's value go back: allowed only across a kill -9 or a
               failover, or within the failover timeout after a kill (a node restarted as the
               timeout ran out is failed over a moment later); each may drop writes
               acknowledged from memory only; counted either way
    durable    the SyncWrite load's (``durable_load.py``, off with ``--no-sync-writes``): no
               write acknowledged at Majority lost without a kill -9 and restart since, none
               at PersistToMajority lost at all, no dirty read, every ambiguous answer
               resolved by a read
    --etcd     every failover and rebalance a killed leader left is finished by the next;
               a manager leads at the end; no term won by two managers (their logs); a
               leader cut off from etcd stopped acting before the next term was won (the
               margin is reported); the commands of a stale term the nodes refused are
               counted (a fence at work: a stopped leader's late commands)

Before the checks a node left failed over is taken back in (delta recovery, a rebalance), so
every vbucket has its replica again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run as a script (make chaos): its own folder and tests/ (for the support package)
sys.path[:0] = [str(HERE), str(HERE.parent)]

import etcd_mode  # noqa: E402
from couchbase.cluster import Cluster as SdkCluster  # noqa: E402
from couchbase.exceptions import CouchbaseException  # noqa: E402
from durable_load import DurableLoad, DurableReport  # noqa: E402
from load_threads import LoadThreads  # noqa: E402

from dcpkv.cluster.admin_client import AdminError  # noqa: E402
from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap  # noqa: E402
from dcpkv.core.status import Status  # noqa: E402
from dcpkv.core.vbucket import vbucket_for_key  # noqa: E402
from dcpkv.protocol.constants import Opcode  # noqa: E402
from support import sdkhelp  # noqa: E402
from support.etcdproc import EtcdCluster, etcd_cluster  # noqa: E402
from support.kvclient import KVClient  # noqa: E402
from support.linkproxy import LinkProxy, Proxies  # noqa: E402
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, tracked_managers  # noqa: E402
from support.rebalancecheck import rebalance as run_rebalance  # noqa: E402
from support.replicacheck import wait_equal  # noqa: E402
from support.serverproc import ServerProcess, tracked_servers  # noqa: E402

KEYS = 300
FAILOVER_TIMEOUT_S = 3
FAULTS = ("kill", "pause", "cut", "delay", "manager", "failover", "recover", "swap")
# --etcd: the leader killed or stopped past its lease, an etcd member killed, the leader
# killed while a failover or a rebalance is due, a follower stopped, the leader cut off
# from etcd
ETCD_FAULTS = (
    "leader-failover", "stall", "etcd", "leader-rebalance", "leader", "follower-stall",
    "etcd-cut",
)  # fmt: skip


@dataclass
class Report:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    acknowledged: int = 0
    confirmed: int = 0
    lost: list[str] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    backwards: int = 0
    backwards_without_crash: list[str] = field(default_factory=list)
    durable: DurableReport | None = None  # the SyncWrite load's (durable_load.py)
    # --etcd: a failover or rebalance a killed leader left that the next did not finish,
    # a term two managers say they won; the stale-term commands the nodes refused (fine)
    unfinished: list[str] = field(default_factory=list)
    shared_terms: list[str] = field(default_factory=list)
    stale_refused: int | None = None
    # a leader cut off from etcd: (its name, its term) as cut; how long before the next
    # term's win it stopped acting; one that acted past it
    cut_leaders: list[tuple[str, int]] = field(default_factory=list)
    cut_margins: list[float] = field(default_factory=list)
    acted_past_successor: list[str] = field(default_factory=list)
    failover_times: list[float] = field(default_factory=list)  # a node's kill to its failover
    # the leader's kill (after the node's) to the node's failover, against the failover
    # timeout plus one lease TTL: a figure, not a check (this machine's speed swings)
    after_leader_times: list[float] = field(default_factory=list)
    history: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def problems(self) -> list[str]:
        durable = [] if self.durable is None else [*self.durable.lost, *self.durable.dirty]
        return [
            *self.lost, *self.divergent, *self.backwards_without_crash, *durable,
            *self.unfinished, *self.shared_terms, *self.acted_past_successor,
        ]  # fmt: skip

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"seed {self.seed}: faults {faults}; writes acknowledged {self.acknowledged}, "
            f"persisted on the active and a replica {self.confirmed}; lost {len(self.lost)}, "
            f"divergent {len(self.divergent)}, reads backwards {self.backwards} "
            f"({len(self.backwards_without_crash)} without a kill or failover)"
            + ("" if self.durable is None else f"; {self.durable.summary()}")
            + ("" if self.stale_refused is None else self._managers())
        )

    def _managers(self) -> str:
        times = sorted(self.failover_times)
        bound = FAILOVER_TIMEOUT_S + etcd_mode.LEASE_TTL_S
        past = sum(t > bound for t in self.after_leader_times)
        failovers = (
            f", nodes failed over by the next leader {times[len(times) // 2]:.1f} s (median) "
            f"and at most {times[-1]:.1f} s after their kill, {past} of "
            f"{len(self.after_leader_times)} later than the failover timeout + one lease TTL "
            f"({bound} s) after the leader's"
            if times
            else ""
        )
        margins = sorted(self.cut_margins)
        cuts = (
            f", leaders cut off from etcd stopped acting at least {margins[0]:.2f} s "
            f"(median {margins[len(margins) // 2]:.2f} s) before the next term was won"
            if margins
            else ""
        )
        return (
            f"; managers on etcd: {len(self.unfinished)} failovers or rebalances left "
            f"unfinished by a new leader, {len(self.shared_terms)} terms led by two managers, "
            f"{len(self.acted_past_successor)} leaders cut off from etcd acting past their "
            f"successor's win, {self.stale_refused} stale-term commands refused by nodes"
            f"{failovers}{cuts}"
        )


# -- the cluster ------------------------------------------------------------------------------


class ProxiedCluster(Cluster):
    """A cluster whose nodes are known by their proxies' addresses; one manager, or several
    over etcd (``--etcd``: ``etcd_mode.py``), of which the API goes to the leader."""

    def __init__(
        self, nodes: list[ServerProcess], managers: list[ManagerProcess], proxies: Proxies,
        etcd: EtcdCluster | None = None, etcd_links: dict[str, list[LinkProxy]] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(nodes, managers[0])
        self.managers = managers
        self.proxies = proxies
        self.etcd = etcd
        self.etcd_links = etcd_links or {}  # a manager's name -> its proxies to etcd
        self.stopped: set[str] = set()  # managers under SIGSTOP: not asked anything

    def leader(self, timeout_s: float = 20.0) -> ManagerProcess:
        """The manager to ask: the one, or the one leading (waited for; AdminError when
        none leads by ``timeout_s``)."""
        if self.etcd is None:
            return self.manager
        deadline = time.monotonic() + timeout_s
        while True:
            found = etcd_mode.leader_of(self.managers, self.stopped)
            if found is not None:
                return found[0]
            if time.monotonic() > deadline:
                raise AdminError(f"no manager leads after {timeout_s:.0f} s")
            time.sleep(0.2)

    def status(self) -> dict[str, Any]:
        return self.leader().api("GET", "/pools/default")

    def proxy(self, node: ServerProcess) -> LinkProxy:
        return self.proxies.by_port[node.port]

    def name(self, node: ServerProcess) -> str:
        return f"127.0.0.1:{self.proxy(node).port}"


def start_proxied(
    servers: type[ServerProcess], managers: type[ManagerProcess], workdir: Path,
    nodes: int, replicas: int, proxies: Proxies, etcd: EtcdCluster | None = None,
) -> ProxiedCluster:  # fmt: skip
    started = []
    for i in range(nodes):
        node = servers(
            workdir / f"n{i}", workdir / f"n{i}.log", "--managed", "--vbuckets", str(VBUCKETS)
        )
        node.start()
        proxies.add(node.port)
        started.append(node)
    seeds = [f"127.0.0.1:{proxies.by_port[n.port].port}" for n in started]
    if etcd is not None:
        on_etcd, links = etcd_mode.start_managers(managers, workdir, seeds, replicas, etcd, proxies)
        return ProxiedCluster(started, on_etcd, proxies, etcd, links)
    manager = managers(
        workdir / "manager", workdir / "manager.log", "--replicas", str(replicas),
        "--vbuckets", str(VBUCKETS), *(arg for seed in seeds for arg in ("--node", seed)),
    )  # fmt: skip
    manager.start()
    return ProxiedCluster(started, [manager], proxies)


class World:
    """The processes, what the load saw, and the history of what was done to them."""

    def __init__(self, cluster: ProxiedCluster, report: Report) -> None:
        self.cluster = cluster
        self.report = report
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.down: set[str] = set()  # nodes killed and not (yet) back
        self.failovers = 0  # nodes failed over
        self.crashes = 0  # kill -9s so far: each may drop writes acknowledged from memory
        self.crash_times: list[float] = []  # when each was done (seconds since the start)
        self.restarts = 0  # the kill -9s restarted before a failover (may undo Majority writes)
        self.stop = threading.Event()

    def log(self, what: str) -> None:
        line = f"{time.monotonic() - self.started:7.2f}s {what}"
        with self.lock:
            self.report.history.append(line)

    def crashed_around(self, crashes_then: int, since: float, until: float) -> bool:
        """Whether a kill -9 or a failover may explain a value read at ``since`` going back
        by ``until``: one done between the two reads, or one done shortly before the first
        (a kill whose node came back as the failover timeout ran out is failed over a moment
        later, taking the writes its restarted copy acknowledged from memory)."""
        if self.crashes != crashes_then:
            return True
        # (after the last fault the cluster settles: a late failover is seen no later than
        # the timeout plus two heartbeats)
        window = FAILOVER_TIMEOUT_S + 2.0
        return any(since - window <= t <= until for t in self.crash_times)

    def live(self) -> list[ServerProcess]:
        return [n for n in self.cluster.nodes if self.cluster.name(n) not in self.down]

    def details(self, key: str) -> str:
        """What every live node holds of ``key``'s vbucket (its ``vbucket-details`` stats):
        why a key cannot be read, in the report."""
        vb_map = self.current_map()
        if vb_map is None:
            return "no map"
        vb = vbucket_for_key(key.encode(), vb_map.num_vbuckets)
        found = []
        for node in self.live():
            try:
                with KVClient(node.port, timeout=2) as kv:
                    kv.login()
                    stats = kv.stats(b"vbucket-details %d" % vb)
            except (OSError, AssertionError) as exc:
                stats = {"error": repr(exc)}
            fields = ", ".join(f"{k.split(':', 1)[-1]}={v}" for k, v in stats.items())
            found.append(f"{self.cluster.name(node)}: {fields}")
        return f"vbucket {vb}: " + "; ".join(found)

    def current_map(self) -> VBucketMap | None:
        best = None
        for node in self.live():
            try:
                with KVClient(node.port, timeout=2) as kv:
                    kv.login()
                    raw = kv.call(Opcode.GetClusterConfig).value
                found = VBucketMap.from_config(json.loads(raw))
            except (OSError, ValueError, KeyError):
                continue
            if best is None or found.version > best.version:
                best = found
        return best


# -- the load ---------------------------------------------------------------------------------


@dataclass
class Token:
    key: str
    value: int
    vb: int
    uuid: int
    seqno: int


def connect_sdk(world: World) -> SdkCluster:
    seeds = ",".join(world.cluster.name(n) for n in world.cluster.nodes)
    return SdkCluster(f"couchbase://{seeds}", sdkhelp.options())


class Load:
    """The writer, the confirmer and a reader, each a thread."""

    def __init__(self, world: World, rng: random.Random, *, sync_writes: bool) -> None:
        self.world = world
        self.rng = random.Random(rng.random())
        self.sdk = connect_sdk(world)
        self.coll = self.sdk.bucket("default").default_collection()
        self.durable = DurableLoad(world, self.coll, rng) if sync_writes else None
        self.acked: dict[str, int] = {}  # key -> highest value acknowledged
        self.confirmed: dict[str, int] = {}  # key -> highest value persisted on a replica
        self.pending: list[Token] = []
        # key -> (highest value read, crashes then, when)
        self.seen: dict[str, tuple[int, int, float]] = {}
        self.lock = threading.Lock()
        self.threads = LoadThreads(world.log, "load thread", self._write, self._confirm, self._read)

    def start(self) -> None:
        self.threads.start()
        if self.durable is not None:
            self.durable.start()

    def join(self) -> None:
        self.threads.join()
        if self.durable is not None:
            self.durable.join()

    def _write(self) -> None:
        n = 0
        while not self.world.stop.is_set():
            n += 1
            key = f"key-{self.rng.randrange(KEYS)}"
            try:
                token = self.coll.upsert(key, {"v": n}).mutation_token()
            except CouchbaseException:
                time.sleep(0.01)
                continue
            assert token is not None
            with self.lock:
                self.acked[key] = max(self.acked.get(key, 0), n)
                self.pending.append(
                    Token(key, n, token.partition_id, token.partition_uuid, token.sequence_number)
                )
            self.world.report.acknowledged += 1

    def _confirm(self) -> None:
        """Ask the replicas, every 0.1 s, which acknowledged writes they persisted; after the
        stop, 10 s more for the last ones, then what is left stays unconfirmed."""
        give_up: float | None = None
        while True:
            if self.world.stop.is_set():
                give_up = give_up or time.monotonic() + 10
                if not self.pending or time.monotonic() > give_up:
                    return
            time.sleep(0.1)
            vb_map = self.world.current_map()
            if vb_map is not None:
                self._confirm_round(vb_map)

    def _confirm_round(self, vb_map: VBucketMap) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        by_vb: dict[int, list[Token]] = {}
        for t in pending:
            by_vb.setdefault(t.vb, []).append(t)
        keep: list[Token] = []
        for vb, tokens in by_vb.items():
            uuids = {t.uuid for t in tokens}
            on_active = self._persisted(vb_map, vb, uuids, vb_map.chains[vb][:1])
            on_replica = self._persisted(vb_map, vb, uuids, vb_map.chains[vb][1:])
            for t in tokens:
                if min(on_active.get(t.uuid, -1), on_replica.get(t.uuid, -1)) >= t.seqno:
                    with self.lock:
                        self.confirmed[t.key] = max(self.confirmed.get(t.key, 0), t.value)
                    self.world.report.confirmed += 1
                else:
                    keep.append(t)  # not yet (or never: a failover; dropped at the end)
        with self.lock:
            self.pending.extend(keep)

    def _persisted(
        self, vb_map: VBucketMap, vb: int, uuids: set[int], chain: Sequence[int]
    ) -> dict[int, int]:
        """uuid -> the highest seqno one of the ``chain`` nodes persisted on that branch."""
        found: dict[int, int] = {}
        for index in chain:
            if index == NOBODY:
                continue
            try:
                port = self.world.cluster.node(vb_map.servers[index]).port
                with KVClient(port, timeout=2) as kv:
                    kv.login()
                    for uuid in uuids:
                        value = struct.pack(">Q", uuid)
                        answer = kv.call(Opcode.ObserveSeqno, vbucket=vb, value=value)
                        if answer.status != Status.Success:
                            continue
                        fmt, _, got, persisted, _ = struct.unpack_from(">BHQQQ", answer.value)
                        if fmt == 0 and got == uuid:  # no failover since: the same history
                            found[uuid] = max(found.get(uuid, 0), persisted)
            except (OSError, StopIteration, struct.error):
                continue
        return found

    def _read(self) -> None:
        while not self.world.stop.is_set():
            key = f"key-{self.rng.randrange(KEYS)}"
            # Counted before the read: a kill that starts while a read is in flight may come
            # after the node answered, so it can undo what this read saw.
            crashes = self.world.crashes
            try:
                value = self.coll.get(key).content_as[dict]["v"]
            except CouchbaseException:
                time.sleep(0.01)
                continue
            now = time.monotonic() - self.world.started
            before, crashes_then, when = self.seen.get(key, (0, 0, 0.0))
            if value < before:
                self.world.report.backwards += 1
                if not self.world.crashed_around(crashes_then, when, now):
                    self.world.report.backwards_without_crash.append(
                        f"{key} (vb {vbucket_for_key(key.encode(), VBUCKETS)}): read {value} at "
                        f"{now:.2f}s after {before} at {when:.2f}s"
                    )
            # (after a backwards read the new history is the baseline: one problem, one line)
            self.seen[key] = (value, crashes, now) if value != before else (before, crashes, when)


# -- the faults -------------------------------------------------------------------------------


def inject(world: World, rng: random.Random, kind: str) -> bool:
    """Do ``kind`` to the cluster; False when it does not apply now (skipped)."""
    cluster = world.cluster
    if kind == "manager" and cluster.etcd is not None:  # any of them, the leader or not
        manager = rng.choice(etcd_mode.running(cluster.managers, cluster.stopped))
        kill_and_restart(world, rng, manager, f"manager {etcd_mode.name_of(manager)}")
        return True
    if kind == "manager":
        world.log("manager: kill -9, restart")
        cluster.manager.kill9()
        cluster.manager.start(same_port=True)
        return True
    if kind == "recover":
        return recover(world)
    if kind in CLUSTER_FAULTS:
        return CLUSTER_FAULTS[kind](world, rng)
    members = [n for n in world.live() if cluster.name(n) in member_names(world)]
    one_down = ("failover", "swap", "leader-failover", "leader-rebalance")
    if len(members) < 2 or (kind in one_down and (world.failovers or world.down)):
        return False
    return NODE_FAULTS[kind](world, rng, rng.choice(members))


def kill(world: World, rng: random.Random, node: ServerProcess) -> bool:
    name = world.cluster.name(node)
    world.crashes += 1
    world.crash_times.append(time.monotonic() - world.started)
    world.restarts += 1
    kill_and_restart(world, rng, node, name)
    return True


def kill_and_restart(world: World, rng: random.Random, proc: ServerProcess, name: str) -> None:
    """kill -9 ``proc`` (a node or a manager), start it again on its port 0.2-1 s later."""
    world.log(f"kill -9 {name}")
    proc.kill9()
    time.sleep(rng.uniform(0.2, 1.0))
    proc.start(same_port=True)
    world.log(f"{name} restarted")


def pause(world: World, rng: random.Random, node: ServerProcess) -> bool:
    assert node.proc is not None
    length = rng.uniform(0.3, 1.5)
    world.log(f"SIGSTOP {world.cluster.name(node)} for {length:.1f}s")
    os.kill(node.proc.pid, signal.SIGSTOP)
    time.sleep(length)
    os.kill(node.proc.pid, signal.SIGCONT)
    return True


def cut(world: World, rng: random.Random, node: ServerProcess) -> bool:
    world.log(f"cut every connection to {world.cluster.name(node)}")
    world.cluster.proxy(node).cut()
    return True


def delay(world: World, rng: random.Random, node: ServerProcess) -> bool:
    held, length = rng.uniform(0.05, 0.3), rng.uniform(1.0, 3.0)
    name = world.cluster.name(node)
    world.log(f"delay the links of {name} by {held * 1000:.0f} ms for {length:.1f}s")
    world.cluster.proxy(node).delay(held)
    time.sleep(length)
    world.cluster.proxy(node).delay(0.0)
    return True


def failover(world: World, rng: random.Random, node: ServerProcess) -> bool:
    name = leave_down(world, node, "automatic failover")
    wait_failed_over(world, node, name)
    return True


def leave_down(world: World, node: ServerProcess, why: str) -> str:
    name = world.cluster.name(node)
    world.crashes += 1
    world.crash_times.append(time.monotonic() - world.started)
    world.log(f"kill -9 {name}, left down: {why}")
    world.down.add(name)
    node.kill9()
    return name


def wait_failed_over(world: World, node: ServerProcess, name: str) -> bool:
    """Whether the manager failed ``name`` over (within 30 s); when it did not, why, and
    the node is started again as the kill fault would."""
    if wait_until(lambda: name not in member_names(world), 30):
        world.log(f"{name} failed over")
        return True
    # Held (the auto-failover quota is used by a kill that outlasted the timeout, say):
    # bring it back as the kill fault would
    held = auto_held(world).get(name)
    world.log(f"{name} not failed over (held: {held}); restarting it")
    if held is None and world.cluster.etcd is not None:
        world.report.unfinished.append(f"{name} killed: not failed over in 30 s, nor held")
    node.start(same_port=True)
    world.down.discard(name)
    return False


# -- the faults of managers on etcd (--etcd) --------------------------------------------------


def leader(world: World, rng: random.Random) -> bool:
    """kill -9 the leading manager, restart it: another takes the lead a lease later."""
    manager = world.cluster.leader()
    kill_and_restart(world, rng, manager, f"the leader {etcd_mode.name_of(manager)}")
    return True


def stall(world: World, rng: random.Random) -> bool:
    """SIGSTOP the leading manager past its lease, then SIGCONT: it wakes up deposed."""
    manager = world.cluster.leader()
    name = etcd_mode.name_of(manager)
    assert manager.proc is not None
    length = etcd_mode.LEASE_TTL_S + rng.uniform(0.5, 2.0)
    world.log(f"SIGSTOP the leader {name} for {length:.1f}s")
    stopped_for(world, manager, length)
    return True


def stopped_for(world: World, manager: ManagerProcess, length: float) -> None:
    """SIGSTOP ``manager`` for ``length`` seconds, then SIGCONT; not asked anything meanwhile."""
    assert manager.proc is not None
    name = etcd_mode.name_of(manager)
    world.cluster.stopped.add(name)
    os.kill(manager.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(length)
    finally:
        os.kill(manager.proc.pid, signal.SIGCONT)
        world.cluster.stopped.discard(name)


def follower_stall(world: World, rng: random.Random) -> bool:
    """SIGSTOP a manager that does not lead, 0.5 s to past its lease, then SIGCONT: the
    leader leads on (whether it did is in the history: a slow etcd may depose it too)."""
    cluster = world.cluster
    found = etcd_mode.leader_of(cluster.managers, cluster.stopped)
    if found is None:
        return False
    followers = [
        m for m in etcd_mode.running(cluster.managers, cluster.stopped) if m is not found[0]
    ]
    if not followers:
        return False
    manager = rng.choice(followers)
    name = etcd_mode.name_of(manager)
    length = rng.uniform(0.5, etcd_mode.LEASE_TTL_S + 2.0)
    world.log(f"SIGSTOP the follower {name} for {length:.1f}s")
    stopped_for(world, manager, length)
    after = etcd_mode.leader_of(cluster.managers, cluster.stopped)
    leads_on = after is not None and after[1] == found[1]
    world.log(
        f"SIGCONT {name}: the leader {etcd_mode.name_of(found[0])} (term {found[1]}) "
        + ("leads on" if leads_on else f"no longer leads (now {_leader_text(after)})")
    )
    return True


def etcd_cut(world: World, rng: random.Random) -> bool:
    """Cut the leading manager off from every etcd member past its lease, its links to the
    nodes intact; then heal. Its lease runs out while it runs on: it must stop acting before
    another wins the next term (checked at the end, from their logs)."""
    found = etcd_mode.leader_of(world.cluster.managers, world.cluster.stopped)
    if found is None:
        return False
    manager, term = found
    name = etcd_mode.name_of(manager)
    refused = rng.random() < 0.5
    length = etcd_mode.LEASE_TTL_S + rng.uniform(1.0, 3.0)
    how = "every connection refused" if refused else "silently: every byte held"
    world.log(f"cut the leader {name} (term {term}) off from etcd for {length:.1f}s ({how})")
    links = world.cluster.etcd_links[name]
    for link in links:
        link.partition(refused=refused)
    world.report.cut_leaders.append((name, term))
    try:
        time.sleep(length)
    finally:
        for link in links:
            link.heal()
    after = etcd_mode.leader_of(world.cluster.managers, world.cluster.stopped)
    world.log(f"{name}'s links to etcd healed; the leader now: {_leader_text(after)}")
    return True


def _leader_text(found: tuple[ManagerProcess, int] | None) -> str:
    return "none" if found is None else f"{etcd_mode.name_of(found[0])}, term {found[1]}"


def etcd_member(world: World, rng: random.Random) -> bool:
    """kill -9 one etcd member, restart it 0.5-3 s later (the other two keep the quorum)."""
    etcd = world.cluster.etcd
    assert etcd is not None
    member = rng.choice(etcd.members)
    world.log(f"kill -9 etcd member {member.name}")
    proc = etcd.procs[member.name]
    proc.kill()
    proc.wait(timeout=30)
    time.sleep(rng.uniform(0.5, 3.0))
    etcd.start(member)
    healthy = wait_until(lambda: etcd.healthy(member), 30)
    world.log(f"etcd member {member.name} restarted ({'healthy' if healthy else 'NOT healthy'})")
    return True


def leader_failover(world: World, rng: random.Random, node: ServerProcess) -> bool:
    """A node killed and left down, then the leader killed before it failed the node over:
    the next leader does (within the failover timeout plus a lease, and some slack)."""
    name = leave_down(world, node, "automatic failover by the next leader")
    killed = time.monotonic()
    time.sleep(rng.uniform(0.2, FAILOVER_TIMEOUT_S - 0.5))
    leader_killed = time.monotonic()  # (a moment before: it is found first)
    leader(world, rng)
    if wait_failed_over(world, node, name):  # (the time includes up to 0.1 s of polling)
        world.report.failover_times.append(time.monotonic() - killed)
        world.report.after_leader_times.append(time.monotonic() - leader_killed)
    return True


def leader_rebalance(world: World, rng: random.Random, node: ServerProcess) -> bool:
    """A rebalance out of a node, the leader killed mid-way: the next leader finishes it;
    then the node is added back and rebalanced in."""
    name = world.cluster.name(node)
    try:
        world.cluster.leader().api("POST", "/controller/rebalance", ejectedNodes=name)
    except AdminError as exc:  # e.g. too few nodes left for the replicas: skipped
        world.log(f"rebalance {name} out refused: {exc}")
        return False
    time.sleep(rng.uniform(0.0, 0.5))
    try:
        then = world.cluster.leader().api("GET", "/pools/default/rebalanceProgress")["state"]
    except AdminError as exc:
        then = repr(exc)
    world.log(f"rebalance {name} out started ({then} at the leader's kill)")
    leader(world, rng)
    state = wait_rebalanced(world)
    if state in ("failed", "stopped"):  # a move that failed: the record still ejects it
        world.log(f"the rebalance of {name} out ended {state}; running it again")
        state = rebalance(world)
    if state != "idle" or name in (nodes_in(world, "active") or {name}):
        world.report.unfinished.append(
            f"rebalance of {name} out, its leader killed: {state}, {name} "
            f"{'still active' if name in (nodes_in(world, 'active') or ()) else 'out'}"
        )
        return True
    world.log(f"rebalanced {name} out under the next leader; adding it back")
    world.cluster.leader().api("POST", "/controller/addNode", hostname=name)
    world.log(f"{name} back in (rebalance {rebalance(world)})")
    return True


CLUSTER_FAULTS: dict[str, Callable[[World, random.Random], bool]] = {
    "leader": leader, "stall": stall, "etcd": etcd_member, "follower-stall": follower_stall,
    "etcd-cut": etcd_cut,
}  # fmt: skip


def auto_held(world: World) -> dict[str, str]:
    status = cluster_status(world)
    return {} if status is None else dict(status["autoFailover"]["held"])


def rebalance(world: World, **params: str) -> str:
    """Run a rebalance to its end (bounded); its final state."""
    if world.cluster.etcd is None:  # (the cluster tests' helper)
        return str(run_rebalance(world.cluster.manager, **params)["state"])
    world.cluster.leader().api("POST", "/controller/rebalance", **params)
    return wait_rebalanced(world)


def wait_rebalanced(world: World, timeout_s: float = 180.0) -> str:
    """Until the leader's rebalance is no longer running (nor interrupted: a new leader
    runs it again), whoever leads meanwhile; its state then ("timed out": never)."""
    seen = {"state": "timed out"}

    def ended() -> bool:
        try:
            doc = world.cluster.leader().api("GET", "/pools/default/rebalanceProgress")
        except AdminError:
            return False
        seen["state"] = str(doc["state"])
        return seen["state"] not in ("running", "interrupted")

    if not wait_until(ended, timeout_s):
        return "timed out"
    return seen["state"]


def recover(world: World) -> bool:
    """Bring a failed-over node back with delta recovery and a rebalance (a node left down
    by the failover fault, or one the manager failed over while a kill kept it down)."""
    failed = failed_over(world)
    if not failed:
        return False
    name = failed[0]
    node = world.cluster.node(name)
    world.log(f"{name}: restarted, delta recovery, rebalance")
    if node.proc is None or node.proc.poll() is not None:
        node.start(same_port=True)
    manager = world.cluster.leader()
    manager.api("POST", "/controller/setRecoveryType", otpNode=name, recoveryType="delta")
    state = rebalance(world)
    world.down.discard(name)
    world.cluster.leader().api("POST", "/settings/autoFailover/resetCount")
    world.log(f"{name} recovered (rebalance {state})")
    return True


def failed_over(world: World) -> list[str]:
    return sorted(nodes_in(world, "failed") or ())


def swap(world: World, rng: random.Random, node: ServerProcess) -> bool:
    name = world.cluster.name(node)
    try:
        state = rebalance(world, ejectedNodes=name)
    except AdminError as exc:  # e.g. too few nodes left for the replicas: skipped
        world.log(f"rebalance {name} out refused: {exc}")
        return False
    world.log(f"rebalanced {name} out ({state}); adding it back")
    world.cluster.leader().api("POST", "/controller/addNode", hostname=name)
    world.log(f"{name} back in (rebalance {rebalance(world)})")
    return True


NODE_FAULTS: dict[str, Callable[[World, random.Random, ServerProcess], bool]] = {
    "kill": kill, "pause": pause, "cut": cut, "delay": delay, "failover": failover, "swap": swap,
    "leader-failover": leader_failover, "leader-rebalance": leader_rebalance,
}  # fmt: skip


def cluster_status(world: World) -> dict[str, Any] | None:
    """The manager's status; None while it does not answer (a manager restarting)."""
    try:
        return world.cluster.status()
    except Exception:
        return None


def nodes_in(world: World, membership: str) -> set[str] | None:
    """The nodes with this membership ("active", "failed"); None: the manager is away."""
    status = cluster_status(world)
    if status is None:
        return None
    return {n["hostname"] for n in status["nodes"] if n["clusterMembership"] == membership}


def count_failovers(world: World) -> None:
    """Nodes the manager failed over (a kill that lasted past the timeout counts too)."""
    failed = nodes_in(world, "failed")
    if failed is not None:
        world.failovers = len(failed)


def member_names(world: World) -> set[str]:
    members = nodes_in(world, "active")
    return {world.cluster.name(n) for n in world.live()} if members is None else members


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


# -- the checks -------------------------------------------------------------------------------


def check(world: World, load: Load) -> None:
    report = world.report
    vb_map = world.current_map()
    assert vb_map is not None, "no node answers"
    for key, value in sorted(load.confirmed.items()):
        try:
            got = load.coll.get(key).content_as[dict]["v"]
        except CouchbaseException as exc:
            report.lost.append(f"{key}: persisted {value} on a replica, now unreadable ({exc})")
            continue
        if got < value:
            report.lost.append(f"{key}: persisted {value} on a replica, now {got}")
    pairs: dict[tuple[str, str], list[int]] = {}
    for vb, chain in enumerate(vb_map.chains):
        for index in chain[1:]:
            if index != NOBODY:
                pairs.setdefault((vb_map.servers[chain[0]], vb_map.servers[index]), []).append(vb)
    for (active, replica), vbs in sorted(pairs.items()):
        try:
            wait_equal(world.cluster.node(active).port, world.cluster.node(replica).port, vbs)
        except AssertionError as exc:
            report.divergent.append(f"{replica} vs {active}: {exc}")
    if load.durable is not None:
        report.durable = load.durable.check()


# -- the run ----------------------------------------------------------------------------------


def run(
    seed: int, duration_s: float, workdir: Path, *, nodes: int = 3, replicas: int = 1,
    report: Report | None = None, sync_writes: bool = True, etcd: bool = False,
    faults: tuple[str, ...] | None = None,
) -> Report:  # fmt: skip
    """The whole run; ``report`` (given) fills in as it goes, for a caller that must print
    the history even when the run itself fails. ``etcd``: three etcd members and a manager
    per node (``etcd_mode.py``), and the faults of managers and etcd too. ``faults``: these
    kinds in turn, in this order, instead of a random pick (a short test covers each)."""
    rng = random.Random(seed)
    report = report or Report(seed)
    proxies = Proxies()
    with contextlib.ExitStack() as stack:
        members = stack.enter_context(etcd_cluster(workdir, 3)) if etcd else None
        servers = stack.enter_context(tracked_servers())
        managers = stack.enter_context(tracked_managers())
        stack.enter_context(_closing(proxies))
        cluster = start_proxied(servers, managers, workdir, nodes, replicas, proxies, members)
        world = World(cluster, report)
        if not wait_until(lambda: placed(world), 120):
            raise RuntimeError("the bucket was not placed in 120 s: see the managers' logs")
        cluster.leader().api(
            "POST", "/settings/autoFailover", enabled="true", timeout=str(FAILOVER_TIMEOUT_S)
        )
        world.log(f"cluster up: {[cluster.name(n) for n in cluster.nodes]}, seed {seed}")
        load = Load(world, rng, sync_writes=sync_writes)
        load.start()
        kinds = faults or FAULTS + (ETCD_FAULTS if etcd else ())
        inject_faults(world, rng, duration_s, kinds, in_turn=faults is not None)
        world.log("faults stopped; letting the cluster settle")
        settle(world)
        time.sleep(2)
        world.stop.set()
        load.join()
        world.log("load stopped; checking")
        try:
            check(world, load)
        finally:
            load.sdk.close()
        if etcd:
            check_managers(world)
        return report


def inject_faults(
    world: World, rng: random.Random, duration_s: float, faults: tuple[str, ...],
    *, in_turn: bool = False,
) -> None:  # fmt: skip
    """A fault of ``faults`` (a random one, or each in turn) every 1-3 s, for ``duration_s``."""
    deadline = time.monotonic() + duration_s
    done = 0
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(1.0, 3.0))
        kind = faults[done % len(faults)] if in_turn else rng.choice(faults)
        done += 1
        try:
            if inject(world, rng, kind):
                world.report.faults[kind] += 1
        except AdminError as exc:  # a refusal of the manager's: said, and the run goes on
            world.log(f"{kind}: the manager refused: {exc}")
        count_failovers(world)


def settle(world: World) -> None:
    """Until every member is healthy and in sync, a node left failed over taken back in
    first (its vbuckets have no replica until then: the end's checks would leave them out,
    and a prepare read back at a restart cannot commit). A rebalance that failed (a node
    restarted as it began, say) leaves the recovered node a member while vbuckets still lack
    their replica on it: the rebalance runs again until every vbucket has one."""
    for _ in range(4):
        try:
            if recover(world):
                continue
            missing = without_replica(world)
            if not missing:
                break
            world.log(f"vbuckets {missing} have no replica at the end: rebalance again")
            world.log(f"rebalance at the end: {rebalance(world)}")
        except AdminError as exc:
            world.log(f"recover at the end: the manager refused: {exc}")
    wait_until(lambda: all_healthy(world), 60)


def without_replica(world: World) -> list[int]:
    """The vbuckets whose chain in the map the nodes serve lacks a replica, while the
    members are enough to hold one."""
    vb_map, members = world.current_map(), nodes_in(world, "active")
    if vb_map is None or members is None or len(members) < 2:
        return []
    return [vb for vb, chain in enumerate(vb_map.chains) if NOBODY in chain[1:]]


def placed(world: World) -> bool:
    """The manager (the leader) placed the bucket: the nodes serve its map."""
    status = cluster_status(world)
    return status is not None and bool(status["buckets"]) and status["buckets"][0]["placed"]


def check_managers(world: World) -> None:
    """--etcd: a manager leads once the faults stopped; no term won by two managers; the
    stale-term commands the nodes refused."""
    try:
        world.cluster.leader(timeout_s=30)
    except AdminError as exc:
        world.report.unfinished.append(f"once the faults stopped: {exc}")
    for term, names in sorted(etcd_mode.terms_led(world.cluster.managers).items()):
        if len(names) > 1:
            world.report.shared_terms.append(f"term {term} led by {sorted(names)}")
    check_cut_leaders(world)
    refused = 0
    for node in world.cluster.nodes:
        text = node.log()
        refused += text.count("is older than term") + text.count("of an older manager term")
    world.report.stale_refused = refused


def check_cut_leaders(world: World) -> None:
    """Each leader cut off from etcd stopped acting (its "stops leading" line) before the
    next term was won (the winner's "leads" line): the margin, or a problem."""
    report = world.report
    won = etcd_mode.won_at(world.cluster.managers)
    for name, term in report.cut_leaders:
        manager = next(m for m in world.cluster.managers if etcd_mode.name_of(m) == name)
        stopped = etcd_mode.stopped_at(manager, term)
        later = [t for t in won if t > term]
        if not later:  # (no successor: nothing acted beside it)
            world.log(f"cut leader {name}, term {term}: no later term was won")
            continue
        successor, won_then = won[min(later)]
        if stopped is None:
            report.acted_past_successor.append(
                f"{name} cut off from etcd in term {term} never said it stopped acting; "
                f"{successor} won term {min(later)} at {won_then}"
            )
            continue
        margin = (won_then - stopped).total_seconds()
        report.cut_margins.append(margin)
        if margin < 0:
            report.acted_past_successor.append(
                f"{name} cut off from etcd in term {term} stopped acting at {stopped}, "
                f"{-margin:.3f} s after {successor} won term {min(later)} at {won_then}"
            )


@contextlib.contextmanager
def _closing(proxies: Proxies) -> Iterator[None]:
    try:
        yield
    finally:
        proxies.close()


def all_healthy(world: World) -> bool:
    status = cluster_status(world)
    return status is not None and all(
        n["status"] == "healthy" and n["inSync"]
        for n in status["nodes"]
        if n["clusterMembership"] == "active"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here")
    parser.add_argument(
        "--no-sync-writes",
        dest="sync_writes",
        action="store_false",
        help="without the SyncWrite load (durable_load.py)",
    )
    parser.add_argument(
        "--etcd",
        action="store_true",
        help="3 etcd members and a manager per node; faults of the leader and of etcd too",
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dcpkv-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {seed}, {args.duration:.0f}s of faults, logs in {workdir}", flush=True)
    report = Report(seed)
    try:
        run(
            seed, args.duration, workdir, nodes=args.nodes, replicas=args.replicas,
            report=report, sync_writes=args.sync_writes, etcd=args.etcd,
        )  # fmt: skip
    finally:
        print("\n".join(report.history), flush=True)
    for line in report.problems:
        print("PROBLEM", line)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
