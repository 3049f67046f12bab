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
from support.kvclient import KVClient  # noqa: E402
from support.linkproxy import LinkProxy, Proxies  # noqa: E402
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, tracked_managers  # noqa: E402
from support.rebalancecheck import rebalance as run_rebalance  # noqa: E402
from support.replicacheck import wait_equal  # noqa: E402
from support.serverproc import ServerProcess, tracked_servers  # noqa: E402

KEYS = 300
FAILOVER_TIMEOUT_S = 3
FAULTS = ("kill", "pause", "cut", "delay", "manager", "failover", "recover", "swap")


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
    history: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        durable_ok = self.durable is None or self.durable.ok
        return durable_ok and not (self.lost or self.divergent or self.backwards_without_crash)

    @property
    def problems(self) -> list[str]:
        durable = [] if self.durable is None else [*self.durable.lost, *self.durable.dirty]
        return [*self.lost, *self.divergent, *self.backwards_without_crash, *durable]

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"seed {self.seed}: faults {faults}; writes acknowledged {self.acknowledged}, "
            f"persisted on the active and a replica {self.confirmed}; lost {len(self.lost)}, "
            f"divergent {len(self.divergent)}, reads backwards {self.backwards} "
            f"({len(self.backwards_without_crash)} without a kill or failover)"
            + ("" if self.durable is None else f"; {self.durable.summary()}")
        )


# -- the cluster ------------------------------------------------------------------------------


class ProxiedCluster(Cluster):
    """A cluster whose nodes are known by their proxies' addresses."""

    def __init__(self, nodes: list[ServerProcess], manager: ManagerProcess, proxies: Proxies):
        super().__init__(nodes, manager)
        self.proxies = proxies

    def proxy(self, node: ServerProcess) -> LinkProxy:
        return self.proxies.by_port[node.port]

    def name(self, node: ServerProcess) -> str:
        return f"127.0.0.1:{self.proxy(node).port}"


def start_proxied(
    servers: type[ServerProcess], managers: type[ManagerProcess], workdir: Path,
    nodes: int, replicas: int, proxies: Proxies,
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
    manager = managers(
        workdir / "manager", workdir / "manager.log", "--replicas", str(replicas),
        "--vbuckets", str(VBUCKETS), *(arg for seed in seeds for arg in ("--node", seed)),
    )  # fmt: skip
    manager.start()
    return ProxiedCluster(started, manager, proxies)


class World:
    """The processes, what the load saw, and the history of what was done to them."""

    def __init__(self, cluster: Cluster, report: Report) -> None:
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
    if kind == "manager":
        world.log("manager: kill -9, restart")
        cluster.manager.kill9()
        cluster.manager.start(same_port=True)
        return True
    if kind == "recover":
        return recover(world)
    members = [n for n in world.live() if cluster.name(n) in member_names(world)]
    if len(members) < 2 or (kind in ("failover", "swap") and (world.failovers or world.down)):
        return False
    return NODE_FAULTS[kind](world, rng, rng.choice(members))


def kill(world: World, rng: random.Random, node: ServerProcess) -> bool:
    name = world.cluster.name(node)
    world.crashes += 1
    world.crash_times.append(time.monotonic() - world.started)
    world.restarts += 1
    world.log(f"kill -9 {name}")
    node.kill9()
    time.sleep(rng.uniform(0.2, 1.0))
    node.start(same_port=True)
    world.log(f"{name} restarted")
    return True


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
    name = world.cluster.name(node)
    world.crashes += 1
    world.crash_times.append(time.monotonic() - world.started)
    world.log(f"kill -9 {name}, left down: automatic failover")
    world.down.add(name)
    node.kill9()
    if wait_until(lambda: name not in member_names(world), 30):
        world.log(f"{name} failed over")
        return True
    # Held (the auto-failover quota is used by a kill that outlasted the timeout, say):
    # bring it back as the kill fault would
    world.log(f"{name} not failed over (held: {auto_held(world).get(name)}); restarting it")
    node.start(same_port=True)
    world.down.discard(name)
    return True


def auto_held(world: World) -> dict[str, str]:
    status = cluster_status(world)
    return {} if status is None else dict(status["autoFailover"]["held"])


def rebalance(world: World, **params: str) -> str:
    """Run a rebalance to its end (the cluster tests' helper, bounded); its final state."""
    return str(run_rebalance(world.cluster.manager, **params)["state"])


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
    manager = world.cluster.manager
    manager.api("POST", "/controller/setRecoveryType", otpNode=name, recoveryType="delta")
    state = rebalance(world)
    world.down.discard(name)
    manager.api("POST", "/settings/autoFailover/resetCount")
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
    world.cluster.manager.api("POST", "/controller/addNode", hostname=name)
    world.log(f"{name} back in (rebalance {rebalance(world)})")
    return True


NODE_FAULTS: dict[str, Callable[[World, random.Random, ServerProcess], bool]] = {
    "kill": kill, "pause": pause, "cut": cut, "delay": delay, "failover": failover, "swap": swap,
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
    report: Report | None = None, sync_writes: bool = True,
) -> Report:  # fmt: skip
    """The whole run; ``report`` (given) fills in as it goes, for a caller that must print
    the history even when the run itself fails."""
    rng = random.Random(seed)
    report = report or Report(seed)
    proxies = Proxies()
    with tracked_servers() as servers, tracked_managers() as managers, _closing(proxies):
        cluster = start_proxied(servers, managers, workdir, nodes, replicas, proxies)
        cluster.manager.api(
            "POST", "/settings/autoFailover", enabled="true", timeout=str(FAILOVER_TIMEOUT_S)
        )
        world = World(cluster, report)
        world.log(f"cluster up: {[cluster.name(n) for n in cluster.nodes]}, seed {seed}")
        load = Load(world, rng, sync_writes=sync_writes)
        load.start()
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 3.0))
            kind = rng.choice(FAULTS)
            try:
                if inject(world, rng, kind):
                    report.faults[kind] += 1
            except AdminError as exc:  # a refusal of the manager's: said, and the run goes on
                world.log(f"{kind}: the manager refused: {exc}")
            count_failovers(world)
        world.log("faults stopped; letting the cluster settle")
        wait_until(lambda: all_healthy(world), 60)
        time.sleep(2)
        world.stop.set()
        load.join()
        world.log("load stopped; checking")
        try:
            check(world, load)
        finally:
            load.sdk.close()
        return report


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
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dcpkv-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {seed}, {args.duration:.0f}s of faults, logs in {workdir}", flush=True)
    report = Report(seed)
    try:
        run(
            seed, args.duration, workdir, nodes=args.nodes, replicas=args.replicas,
            report=report, sync_writes=args.sync_writes,
        )  # fmt: skip
    finally:
        print("\n".join(report.history), flush=True)
    for line in report.problems:
        print("PROBLEM", line)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
