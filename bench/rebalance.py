"""Rebalance: the time to move a bucket from 2 to 3 nodes, and what writes see meanwhile.

Theory of operation
-------------------
A real cluster on this machine: two ``dcpkv server --managed`` nodes (1024 vbuckets, room for
every item in memory) and ``dcpkv manager`` placing them (one replica). The bucket is loaded
with ``--count`` items (16-byte keys, 100-byte values) through the network, pipelined and
routed by the map, and the replicas are let catch up.

1. **Before**: a closed-loop writer (one Set at a time, routed by the map, as a smart client
   does) runs ``--seconds``: writes/s and the p50/p99 of a write's latency.
2. **Rebalance**: a third node is added and ``/controller/rebalance`` started with the same
   writer running; the clock stops when the manager reports the rebalance done. The writer's
   figures during the rebalance are set against the ones before. A write that meets a moving
   vbucket (NotMyVbucket while the handoff runs) re-reads the map and is sent again: its
   latency counts the whole wait, as a client would see it.
3. **Stale-map window**: for every vbucket whose active moved, the time from its old active's
   copy going dead (from then on that node answers NotMyVbucket for it) to the moment the last
   node started serving a map that names the new active, from every node's ``stat handover``
   (monotonic clock, one for the host's processes): p50, p99 and max. A vbucket handed over
   in a group may be named before its own copy goes dead (another of the group's went first):
   no stale window (0), but clients meet its pending copy meanwhile; those are counted, with
   the longest lead.

``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

import _placement
from _report import bench_main, window, write_json
from _server import bench_server
from dcpkv.client.blocking import BlockingKV, KVRequest
from dcpkv.cluster.admin_client import admin_request
from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap
from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from latency import _quantile_ms

VBUCKETS = 1024
VALUE = b"v" * 100
EXTRAS = b"\0" * 8  # flags, expiry
NODE_ARGS = ("--managed", "--memory-quota-mb", "4096")
BATCH = 2000
RETRY_TIMEOUT_S = 60.0  # a Set refused (Etmpfail) this long stops the load


def _session(port: int) -> BlockingKV:
    kv = BlockingKV("127.0.0.1", port, timeout=120)
    kv.login("Administrator", "password", "default")
    return kv


def _key(i: int) -> bytes:
    return f"key-{i:012d}".encode()


class Router:
    """Sessions to every node the map names, routed by the newest map."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.sessions: dict[int, BlockingKV] = {}
        self.vb_map = self.refresh()

    def refresh(self) -> VBucketMap:
        maps = []
        for port in self.ports:
            frame = self.session(port).call(Opcode.GetClusterConfig)
            maps.append(VBucketMap.from_config(json.loads(frame.value)))
        self.vb_map = max(maps, key=lambda m: m.version)
        return self.vb_map

    def session(self, port: int) -> BlockingKV:
        if port not in self.sessions:
            self.sessions[port] = _session(port)
        return self.sessions[port]

    def port_of(self, vb: int) -> int:
        active = self.vb_map.chains[vb][0]
        assert active != NOBODY
        return int(self.vb_map.servers[active].rpartition(":")[2])

    def close(self) -> None:
        for kv in self.sessions.values():
            kv.close()


def load(ports: list[int], count: int) -> float:
    """``count`` items through the network, pipelined per node, routed by the map."""
    router = Router(ports)
    start = time.perf_counter()
    try:
        for first in range(0, count, BATCH):
            by_port: dict[int, list[KVRequest]] = {}
            for i in range(first, min(count, first + BATCH)):
                key = _key(i)
                vb = vbucket_for_key(key, VBUCKETS)
                request = KVRequest(Opcode.Set, key, VALUE, EXTRAS, vb)
                by_port.setdefault(router.port_of(vb), []).append(request)
            for port, requests in by_port.items():
                _store(router.session(port), requests)
    finally:
        router.close()
    return time.perf_counter() - start


def _store(session: BlockingKV, requests: list[KVRequest]) -> None:
    """Pipeline ``requests``; write again, after a pause, those refused with Etmpfail (a node's
    flusher behind: what an SDK does) for up to ``RETRY_TIMEOUT_S``; any other failure stops."""
    deadline = time.monotonic() + RETRY_TIMEOUT_S
    while requests:
        answers = session.pipeline(requests)
        failed = {a.status for a in answers} - {Status.Success, Status.Etmpfail}
        if failed or len(answers) != len(requests):
            raise RuntimeError(f"Sets failed: {sorted(failed)}")
        requests = [
            r for r, a in zip(requests, answers, strict=True) if a.status == Status.Etmpfail
        ]
        if requests and time.monotonic() > deadline:
            raise RuntimeError(f"Sets refused for {RETRY_TIMEOUT_S:.0f} s")
        if requests:
            time.sleep(0.05)


class Writer(threading.Thread):
    """A closed-loop writer: (start time, latency) of every write, until stopped."""

    def __init__(self, ports: list[int], count: int) -> None:
        super().__init__(daemon=True)
        self.router = Router(ports)
        self.count = count
        self.samples: list[tuple[float, float]] = []
        self.retries = 0
        self.stop_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def _loop(self) -> None:
        i = 0
        while self.stop_at is None or time.perf_counter() < self.stop_at:
            key = _key(i % self.count)
            vb = vbucket_for_key(key, VBUCKETS)
            began = time.perf_counter()
            while True:
                kv = self.router.session(self.router.port_of(vb))
                opaque = kv.send(Opcode.Set, key=key, value=VALUE, extras=EXTRAS, vbucket=vb)
                status = kv.answer(opaque).status
                if status == Status.Success:
                    break
                self.retries += 1
                time.sleep(0.005)
                self.router.refresh()
            self.samples.append((began, time.perf_counter() - began))
            i += 1

    def window(self, start: float, end: float) -> dict[str, float]:
        lat = sorted(d for t, d in self.samples if start <= t < end)
        return {
            "writes_per_s": len(lat) / (end - start),
            "p50_ms": _quantile_ms(lat, 0.5),
            "p99_ms": _quantile_ms(lat, 0.99),
        }


class Manager:
    def __init__(self, tmp: Path, ports: list[int], vbuckets: int = VBUCKETS) -> None:
        port_file = tmp / "manager.port"
        seeds = [arg for p in ports for arg in ("--node", f"127.0.0.1:{p}")]
        cmd = [
            sys.executable, "-m", "dcpkv.cli.main", "manager", "--port", "0",
            "--data-dir", str(tmp / "manager"), "--port-file", str(port_file),
            "--replicas", "1", "--vbuckets", str(vbuckets), *seeds,
        ]  # fmt: skip
        self.log = open(tmp / "manager.log", "wb")  # noqa: SIM115 (lives as long as the manager)
        with _placement.servers():
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise SystemExit(f"the manager exited: {tmp / 'manager.log'}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"

    def api(self, method: str, path: str, **params: str) -> dict[str, Any]:
        return admin_request(
            self.url, method, path, user="Administrator", password="password",
            params=params or None,
        )  # fmt: skip

    def wait_caught_up(self) -> None:
        while any(n["replicationLag"] != 0 for n in self.api("GET", "/pools/default")["nodes"]):
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.log.close()


def main(
    count: Annotated[int, typer.Option(help="items in the bucket before the rebalance")] = (
        1_000_000
    ),
    seconds: Annotated[float, typer.Option(help="seconds of the writer before")] = 10.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dcpkv-bench-rebalance-"))
    manager = None
    try:
        print(f"rebalance bench: {count:,} items, {VBUCKETS} vbuckets, 2 -> 3 managed nodes")
        with bench_server(VBUCKETS, *NODE_ARGS, label="rb-a") as a, \
                bench_server(VBUCKETS, *NODE_ARGS, label="rb-b") as b, \
                bench_server(VBUCKETS, *NODE_ARGS, label="rb-c") as c:  # fmt: skip
            manager = Manager(tmp, [a, b])
            loaded = load([a, b], count)
            rate = count / loaded
            print(f"  load through the network       {loaded:8.2f} s  {rate:>10,.0f} items/s")
            manager.wait_caught_up()
            # one window around the writer's whole life: a sample beside a running writer
            # would time the writer's load, not the machine. The writer waits for each
            # write's answer: its rates are bound by wake-ups, the move's by the cpu
            with (
                window("bucket_items_per_s"),
                window("before_writes_per_s", "during_writes_per_s", bound="latency"),
            ):
                figures = run(manager, [a, b, c], count, seconds)
        print(f"  rebalance 2 -> 3 nodes          {figures['rebalance_s']:8.2f} s  "
              f"({figures['vbuckets_moved']:.0f} vbuckets, "
              f"{figures['items_transferred']:,.0f} items)")  # fmt: skip
        print(f"  stale-map window ({figures['stale_map_vbuckets']:.0f} active moves)   "
              f"p50 {figures['stale_map_p50_ms']:.1f} ms  p99 {figures['stale_map_p99_ms']:.1f} ms"
              f"  max {figures['stale_map_max_ms']:.1f} ms; named before their handover: "
              f"{figures['named_early_vbuckets']:.0f}, at most "
              f"{figures['named_early_max_ms']:.1f} ms ahead")  # fmt: skip
        for phase in ("before", "during"):
            print(f"  writes {phase:<7} {figures[f'{phase}_writes_per_s']:>9,.0f} /s   "
                  f"p50 {figures[f'{phase}_p50_ms']:.2f} ms  "
                  f"p99 {figures[f'{phase}_p99_ms']:.2f} ms")  # fmt: skip
        write_json(json_out, "rebalance", figures, items=count)
    finally:
        if manager is not None:
            manager.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(manager: Manager, ports: list[int], count: int, seconds: float) -> dict[str, float]:
    a, b, c = ports
    writer = Writer([a, b], count)
    writer.start()
    begin = time.perf_counter()
    time.sleep(seconds)
    before = writer.window(begin, time.perf_counter())
    manager.api("POST", "/controller/addNode", hostname=f"127.0.0.1:{c}")
    writer.router.ports.append(c)
    old_map = Router(ports).refresh()
    started = time.perf_counter()
    manager.api("POST", "/controller/rebalance")
    while (doc := manager.api("GET", "/pools/default/rebalanceProgress"))["state"] == "running":
        time.sleep(0.1)
    took = time.perf_counter() - started
    writer.stop_at = time.perf_counter()
    writer.join(60)
    if writer.error is not None:
        raise writer.error
    if doc["state"] != "idle":
        raise SystemExit(f"the rebalance ended {doc['state']}: {doc.get('error')}")
    during = writer.window(started, started + took)
    signed = stale_map_windows(old_map, Router(ports).refresh(), ports)
    windows = sorted(max(0.0, w) for w in signed)
    early = [-w for w in signed if w < 0]
    return {
        "rebalance_s": took,
        "vbuckets_moved": doc["progress"]["vbucketsMoved"],
        "items_transferred": doc["progress"]["itemsTransferred"],
        "bucket_items_per_s": count / took,
        **{f"before_{k}": v for k, v in before.items()},
        **{f"during_{k}": v for k, v in during.items()},
        "retried_writes": writer.retries,
        "stale_map_vbuckets": len(windows),
        "stale_map_p50_ms": _quantile_ms(windows, 0.5),
        "stale_map_p99_ms": _quantile_ms(windows, 0.99),
        "stale_map_max_ms": windows[-1] * 1e3 if windows else float("nan"),
        "named_early_vbuckets": len(early),
        "named_early_max_ms": max(early, default=0.0) * 1e3,
    }


def stale_map_windows(before: VBucketMap, after: VBucketMap, ports: list[int]) -> list[float]:
    """Per vbucket whose active moved: seconds from the old active's copy going dead to the
    last node serving a map that names the new active (module docstring, 3; negative: every
    node named it before)."""
    times: dict[str, dict[str, str]] = {}
    for port in ports:
        with _session(port) as kv:
            times[f"127.0.0.1:{port}"] = dict(kv.stats("handover"))
    windows = []
    for vb, (old, new) in enumerate(zip(before.chains, after.chains, strict=True)):
        gone = before.servers[old[0]] if old[0] != NOBODY else None
        if gone is None or gone == after.servers[new[0]]:
            continue
        served = max(float(rows[f"vb_{vb}:new_active_served_at"]) for rows in times.values())
        windows.append(served - float(times[gone][f"vb_{vb}:dead_at"]))
    return windows


if __name__ == "__main__":
    bench_main(main)
