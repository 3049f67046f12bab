"""Helpers of the rebalance process tests: a map-following writer and reader under load, the
cluster's current map, the checks every rebalance story ends with, and a watch on the maps
the nodes give clients while vbuckets change hands.

The writer and the reader route by the map as a smart client does (the served config of any
node, refreshed on NotMyVbucket), each on its own connections, in threads: the writer cycles
over a fixed key set writing ever higher counters and notes every acknowledged value; the
reader reads keys back and notes any value lower than one it already saw for that key (a read
must never go back in time across a move).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol import dcp
from dcpkv.protocol import kv as kv_messages
from dcpkv.protocol.constants import HelloFeature, Opcode
from dcpkv.protocol.messages import decode_message
from support.dcpclient import DcpClient, all_vb_seqnos
from support.kvclient import KVClient
from support.managerproc import VBUCKETS, Cluster, ManagerProcess, client, wait_for
from support.replicacheck import contents, failover_logs, wait_equal
from support.serverproc import ServerProcess

KEYS = [f"key-{i}".encode() for i in range(160)]


def served_map(nodes: list[ServerProcess]) -> VBucketMap:
    """The newest map any of ``nodes`` serves (a node that does not answer is skipped)."""
    maps = []
    for node in nodes:
        try:
            with client(node) as kv:
                raw = kv.call(Opcode.GetClusterConfig).value
        except OSError:
            continue
        maps.append(VBucketMap.from_config(json.loads(raw)))
    return max(maps, key=lambda m: m.version)


def port_of(name: str) -> int:
    return int(name.rpartition(":")[2])


class _MapClient:
    """KV connections to every node, routed by the newest map."""

    def __init__(self, nodes: list[ServerProcess]) -> None:
        self.nodes = nodes
        self.vb_map = served_map(nodes)
        self.conns: dict[int, KVClient] = {}

    def conn(self, vb: int) -> KVClient | None:
        active = self.vb_map.chains[vb][0]
        if active == NOBODY:
            return None
        port = port_of(self.vb_map.servers[active])
        if port not in self.conns:
            kv = KVClient(port, timeout=5.0)
            assert kv.login().status == Status.Success
            self.conns[port] = kv
        return self.conns[port]

    def refresh(self, port: int | None = None) -> None:
        if port is not None:
            self.conns.pop(port, None)
        self.vb_map = served_map([n for n in self.nodes if n.proc and n.proc.poll() is None])

    def close(self) -> None:
        for kv in self.conns.values():
            kv.close()


class Load:
    """A steady writer and a reader in threads (module docstring)."""

    def __init__(self, nodes: list[ServerProcess], pause_s: float = 0.004, first: int = 0) -> None:
        self.nodes = nodes
        self.first = first  # the counter starts here (a second load writes higher values)
        self.pause_s = pause_s
        self.acked: dict[bytes, int] = {}
        self.writes = 0
        self.retries = 0
        self.went_back: list[tuple[bytes, int, int]] = []
        self.reads = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guard, args=(self._write,), daemon=True),
            threading.Thread(target=self._guard, args=(self._read,), daemon=True),
        ]
        self.errors: list[BaseException] = []

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        assert not self.errors, self.errors

    def _guard(self, work: Any) -> None:
        try:
            work()
        except Exception as exc:  # reported by stop()
            self.errors.append(exc)

    def _once(self, mc: _MapClient, key: bytes, call: Any) -> Any:
        """``call(kv, vb)`` on the key's active, following the map; None when it moved."""
        vb = vbucket_for_key(key, VBUCKETS)
        try:
            kv = mc.conn(vb)
            if kv is None:
                mc.refresh()
                return None
            answer = call(kv, vb)
        except OSError:  # a node down: drop its connection, re-read the map
            mc.refresh(port_of(mc.vb_map.servers[mc.vb_map.chains[vb][0]]))
            time.sleep(0.05)
            return None
        if answer.status == Status.NotMyVbucket:
            self.retries += 1
            time.sleep(0.02)
            mc.refresh()
            return None
        return answer

    def _write(self) -> None:
        mc = _MapClient(self.nodes)
        counter = self.first
        while not self._stop.is_set():
            key = KEYS[counter % len(KEYS)]
            value = str(counter).encode()
            answer = self._once(mc, key, lambda kv, vb, k=key, v=value: kv.set(k, v, vbucket=vb))
            if answer is None:
                continue
            assert answer.status == Status.Success, answer
            self.acked[key] = counter
            self.writes += 1
            counter += 1
            time.sleep(self.pause_s)
        mc.close()

    def _read(self) -> None:
        mc = _MapClient(self.nodes)
        seen: dict[bytes, int] = {}
        i = 0
        while not self._stop.is_set():
            key = KEYS[i % len(KEYS)]
            i += 7
            answer = self._once(mc, key, lambda kv, vb, k=key: kv.get(k, vbucket=vb))
            if answer is None or answer.status == Status.KeyEnoent:
                continue
            value = int(answer.value)
            if value < seen.get(key, -1):
                self.went_back.append((key, seen[key], value))
            seen[key] = value
            self.reads += 1
            time.sleep(self.pause_s)
        mc.close()


# -- what a consumer that followed each vbucket holds ----------------------------------------


def positions(vb_map: VBucketMap) -> dict[int, tuple[int, int]]:
    """vbucket -> (its active's newest uuid, high seqno): where a consumer that followed it
    up to now stands."""
    out = {}
    for vb, chain in enumerate(vb_map.chains):
        port = port_of(vb_map.servers[chain[0]])
        log = failover_logs(port, [vb])[vb]
        dc = DcpClient(port, open_=False)
        try:
            high = all_vb_seqnos(dc)[vb]
        finally:
            dc.close()
        out[vb] = (log[0].uuid, high)  # type: ignore[attr-defined]
    return out


def resumes_without_rollback(vb_map: VBucketMap, where: dict[int, tuple[int, int]]) -> None:
    """A consumer at ``where`` asks each vbucket's (new) active to resume: never a rollback."""
    for vb, (uuid, seqno) in where.items():
        port = port_of(vb_map.servers[vb_map.chains[vb][0]])
        dc = DcpClient(port, name="follower")
        try:
            answer = dc.stream(vb, start=seqno, uuid=uuid, snapshot=(seqno, seqno))
        finally:
            dc.close()
        assert isinstance(answer, dcp.StreamRequestOk), (vb, answer)


def check_cluster(cluster: Cluster, nodes: list[ServerProcess], load: Load) -> VBucketMap:
    """The end of every story: the map even and whole, every acknowledged write on its
    active, every replica equal to its active (contents, CAS, seqnos, failover logs)."""
    vb_map = served_map(nodes)
    assert {cluster.name(n) for n in nodes} == set(vb_map.servers)
    for chain in vb_map.chains:
        assert NOBODY not in chain
    actives = [a for a, _ in vb_map.counts().values()]
    assert max(actives) - min(actives) <= 1
    docs: dict[bytes, int] = {}
    for vb, chain in enumerate(vb_map.chains):
        port = port_of(vb_map.servers[chain[0]])
        held = contents(port, "check-acked", [vb])[vb]
        docs.update({k: int(v[2] or b"-1") for k, v in held.items()})
        for replica in chain[1:]:
            wait_equal(port, port_of(vb_map.servers[replica]), [vb])
    lost = {k: (v, docs.get(k)) for k, v in load.acked.items() if docs.get(k, -1) < v}
    assert not lost, f"acknowledged writes lost: {lost}"
    assert not load.went_back, f"reads went back in time: {load.went_back[:5]}"
    return vb_map


def rebalance(manager: ManagerProcess, **params: str) -> dict[str, Any]:
    """Start a rebalance and wait until it ends; its final progress document."""
    manager.api("POST", "/controller/rebalance", **params)
    done: dict[str, Any] = {}

    def ended() -> bool:
        done.update(manager.api("GET", "/pools/default/rebalanceProgress"))
        return done["state"] != "running"

    wait_for(ended, "the rebalance to end", timeout_s=120)
    return done


def wait_progress(manager: ManagerProcess, moved: int) -> None:
    def far_enough() -> bool:
        doc = manager.api("GET", "/pools/default/rebalanceProgress")
        return bool(doc["progress"]["vbucketsMoved"] >= moved or doc["state"] != "running")

    wait_for(far_enough, f"{moved} vbuckets moved", timeout_s=60)


def assert_consistent(nodes: list[ServerProcess]) -> None:
    """Every vbucket is held active by the node the newest map names, and by no other."""
    vb_map = served_map(nodes)
    states = {}
    for node in nodes:
        with client(node) as kv:
            rows = kv.stats(b"vbucket")
        states[f"127.0.0.1:{node.port}"] = {
            int(k[3:]): v for k, v in rows.items() if k.startswith("vb_")
        }
    for vb, chain in enumerate(vb_map.chains):
        holders = [name for name, held in states.items() if held.get(vb) == "active"]
        assert holders == [vb_map.servers[chain[0]]], (vb, holders, vb_map.servers[chain[0]])


def preload(nodes: list[ServerProcess], count: int) -> None:
    """``count`` distinct keys written through the map (before any load runs)."""
    mc = _MapClient(nodes)
    try:
        for i in range(count):
            key = f"pre-{i}".encode()
            vb = vbucket_for_key(key, VBUCKETS)
            kv = mc.conn(vb)
            assert kv is not None
            assert kv.set(key, b"1", vbucket=vb).status == Status.Success
    finally:
        mc.close()


# -- what clients are told while vbuckets change hands ---------------------------------------


class MapWatch:
    """While vbuckets move (issue 29), in threads: a prober asking every node for every
    vbucket, noting each NotMyVbucket from a node that held the vbucket active earlier in the
    phase (``phase()`` starts one) yet names itself its active: a stale map from an old active;
    and one subscriber per node (Hello Duplex + ClustermapChangeNotification) noting the
    (revEpoch, rev) of every map pushed to it."""

    def __init__(self, nodes: list[ServerProcess], num_vbuckets: int) -> None:
        self.nodes, self.num_vbuckets = nodes, num_vbuckets
        self.stale: list[tuple[int, int, int]] = []  # (node's port, vbucket, rev)
        self.probes = 0
        self.pushed: dict[int, list[tuple[int, int]]] = {n.port: [] for n in nodes}
        self._held: set[tuple[int, int]] = set()  # (port, vbucket) answered as active
        self._stop = threading.Event()
        self._subscribers = [self._subscribe(n) for n in nodes]
        self._threads = [threading.Thread(target=self._probe, daemon=True)] + [
            threading.Thread(target=self._listen, args=(n.port, kv), daemon=True)
            for n, kv in zip(nodes, self._subscribers, strict=True)
        ]
        self.errors: list[BaseException] = []

    def __enter__(self) -> MapWatch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for kv in self._subscribers:
            kv.sock.shutdown(socket.SHUT_RDWR)  # ends the listeners' reads
            kv.close()
        for t in self._threads:
            t.join(30)

    def phase(self) -> None:
        """A new rebalance: vbuckets may come back to a node that gave them away."""
        self._held = set()

    @staticmethod
    def _subscribe(node: ServerProcess) -> KVClient:
        kv = KVClient(node.port)
        kv.hello(HelloFeature.Duplex, HelloFeature.ClustermapChangeNotification)
        assert kv.login().status == Status.Success
        return kv

    def _listen(self, port: int, kv: KVClient) -> None:
        while not self._stop.is_set():
            try:
                frame = kv.recv_frame()
            except OSError:
                return
            note = decode_message(frame)
            if not isinstance(note, kv_messages.ClustermapChangeNotification):
                self.errors.append(AssertionError(f"{port} sent {note}"))
                return
            self.pushed[port].append((note.epoch, note.rev))

    def _probe(self) -> None:
        try:
            clients = [(n.port, client(n)) for n in self.nodes]
            while not self._stop.is_set():
                for port, kv in clients:
                    self._probe_node(port, kv)
                time.sleep(0.01)  # ~2k requests/s over 4 nodes: enough to meet a window
            for _, kv in clients:
                kv.close()
        except Exception as exc:  # reported by the test
            self.errors.append(exc)

    def _probe_node(self, port: int, kv: KVClient) -> None:
        for vb in range(self.num_vbuckets):
            kv.send(kv.frame(Opcode.Get, key=b"probe", vbucket=vb))
        for vb in range(self.num_vbuckets):
            answer = kv.recv_frame()
            self.probes += 1
            if answer.status != Status.NotMyVbucket:
                self._held.add((port, vb))
                continue
            vb_map = VBucketMap.from_config(json.loads(answer.value))
            active = vb_map.chains[vb][0]
            named = vb_map.servers[active] if active != NOBODY else None
            if (port, vb) in self._held and named == f"127.0.0.1:{port}":
                self.stale.append((port, vb, vb_map.rev))
