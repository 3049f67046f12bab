"""Durable writes: SyncWrite latency per level against client durability and plain writes.

Theory of operation
-------------------
One bucket (1024 vbuckets), on a local cluster (``--nodes 3``: three managed nodes and the
manager, one replica, started as ``bench/rebalance.py`` starts its nodes; the manager sets
each vbucket's replication topology) or on one node (``--nodes 1``: every vbucket is given
the single-node topology, a majority of one, with SetVbucket, as the manager would set it on
a one-node cluster; SyncWrites are then bounded by the active alone).

Five ways to write, all through the client library's :class:`~dcpkv.client.cluster.ClusterKV`
(routed by the map, one connection per node, as an SDK):

* ``plain``: an upsert acknowledged from memory;
* ``majority``, ``persist_active``, ``persist_majority``: an upsert with the server's
  durability at each level (a SyncWrite, answered once its prepare commits);
* ``polling``: client durability, an upsert then ObserveSeqno polling until the write is
  persisted on ``persist_to`` nodes (the active alone on one node; the active and a replica on
  a cluster: what a client had to do before SyncWrites).

Each runs with 1, 16 and 256 writes in flight (that many closed-loop writers, each writing
its own keys, one write at a time). Within one in-flight level the five are interleaved in
``--rounds`` rounds of ``--seconds / rounds`` each (the machine's speed swings: only figures
of one moment compare), and their latencies pooled: p50 and p99 per write, writes/s, and
each level's p50 against polling's (``..._p50_vs_polling``: below 1 is faster).
A rate's yardstick (``bench/_report.py``): 256 in flight keep the nodes' CPUs busy (cpu); with
1 and 16, a write that waits for a persistence (``persist_active``, ``persist_majority``,
``polling``) is set by the flusher's interval (timer: no yardstick), the others by round trips
(latency).
``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

import _placement
from _report import TIMER, bench_main, window, write_json
from _server import bench_server
from dcpkv.client.blocking import BlockingKV, KVRequest
from dcpkv.client.cluster import ClusterKV
from dcpkv.client.durability import Durability, ServerDurability, SyncWriteImpossibleError
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.cluster.local import LocalCluster
from dcpkv.core.status import Status
from dcpkv.protocol.constants import Opcode
from latency import _quantile_ms

VBUCKETS = 1024
VALUE = b"v" * 100
IN_FLIGHT = (1, 16, 256)
ACTIVE = 1
READY_TIMEOUT_S = 120.0

Write = Callable[[ClusterKV, bytes], Awaitable[object]]


def _modes(persist_to: int) -> dict[str, Write]:
    def durable(level: Durability) -> Write:
        required = ServerDurability(level)
        return lambda kv, key: kv.upsert(key, VALUE, durability=required)

    return {
        "plain": lambda kv, key: kv.upsert(key, VALUE),
        "majority": durable(Durability.MAJORITY),
        "persist_active": durable(Durability.MAJORITY_AND_PERSIST_TO_ACTIVE),
        "persist_majority": durable(Durability.PERSIST_TO_MAJORITY),
        "polling": lambda kv, key: kv.upsert(key, VALUE, persist_to=persist_to, timeout=30.0),
    }


async def _writers(kv: ClusterKV, write: Write, n: int, seconds: float, tag: str) -> list[float]:
    """``n`` closed-loop writers for ``seconds``: every write's latency (s)."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def writer(w: int) -> None:
        i = 0
        while time.perf_counter() < stop_at:
            key = b"%s-%03d-%04d" % (tag.encode(), w, i % 1000)
            start = time.perf_counter()
            await write(kv, key)
            latencies.append(time.perf_counter() - start)
            i += 1

    await asyncio.gather(*(writer(w) for w in range(n)))
    return latencies


async def _measure(
    conn: ConnectionSettings, persist_to: int, seconds: float, rounds: int
) -> dict[str, float]:
    modes = _modes(persist_to)
    config = ClientSettings(conn, request_timeout=30.0)
    figures: dict[str, float] = {}
    async with await ClusterKV.open(config) as kv:
        try:  # a SyncWrite needs topologies: say so plainly when there are none
            await modes["majority"](kv, b"probe")
        except SyncWriteImpossibleError:
            raise SystemExit(
                "durable writes are refused (DurabilityImpossible): the vbuckets have no "
                "replication topology (on a cluster the manager sets them)"
            ) from None
        for n in IN_FLIGHT:
            pooled: dict[str, list[float]] = {m: [] for m in modes}
            took: dict[str, float] = dict.fromkeys(modes, 0.0)
            with _windows(list(modes), n):
                for r in range(rounds):
                    for name, write in modes.items():
                        start = time.perf_counter()
                        pooled[name] += await _writers(kv, write, n, seconds / rounds, f"{name}{r}")
                        took[name] += time.perf_counter() - start
            for name, samples in pooled.items():
                samples.sort()
                figures[f"{name}_p50_ms_{n}"] = _quantile_ms(samples, 0.50)
                figures[f"{name}_p99_ms_{n}"] = _quantile_ms(samples, 0.99)
                figures[f"{name}_writes_per_s_{n}"] = len(samples) / took[name]
            polling = figures[f"polling_p50_ms_{n}"]
            for name in ("majority", "persist_active", "persist_majority"):
                figures[f"{name}_p50_vs_polling_{n}"] = figures[f"{name}_p50_ms_{n}"] / polling
            _print(figures, n, list(modes))
    return figures


# the ways of writing that wait for the flusher's next pass (bench/_report.py's TIMER)
_FLUSHED = ("persist_active", "persist_majority", "polling")


@contextmanager
def _windows(modes: list[str], n: int) -> Iterator[None]:
    """The yardstick windows of ``n`` in flight (module docstring)."""
    names = {mode: f"{mode}_writes_per_s_{n}" for mode in modes}
    if n > 16:
        with window(*names.values(), bound="cpu"):
            yield
        return
    flushed = [names[m] for m in modes if m in _FLUSHED]
    others = [names[m] for m in modes if m not in _FLUSHED]
    with window(*others, bound="latency"), window(*flushed, bound=TIMER):
        yield


def _print(figures: dict[str, float], n: int, modes: list[str]) -> None:
    print(f"  {n} in flight:")
    for name in modes:
        print(
            f"    {name:<17} p50 {figures[f'{name}_p50_ms_{n}']:8.2f} ms  p99 "
            f"{figures[f'{name}_p99_ms_{n}']:8.2f} ms  {figures[f'{name}_writes_per_s_{n}']:9.0f}"
            " writes/s",
            flush=True,
        )


def set_single_node_topologies(port: int) -> None:
    """Every vbucket of the node at ``port`` active with the chain of that node alone."""
    value = json.dumps({"topology": [[f"127.0.0.1:{port}"]]}).encode()
    with BlockingKV.connect(ConnectionSettings.at(port=port)) as kv:
        answers = kv.pipeline(
            [
                KVRequest(Opcode.SetVbucket, value=value, extras=bytes((ACTIVE,)), vbucket=vb)
                for vb in range(VBUCKETS)
            ]
        )
    refused = [a.status for a in answers if a.status != Status.Success]
    if refused or len(answers) != VBUCKETS:
        raise SystemExit(f"SetVbucket with a topology refused: {refused[:3]}")


@contextmanager
def one_node() -> Iterator[ConnectionSettings]:
    with bench_server(VBUCKETS, label="durability") as port:
        set_single_node_topologies(port)
        yield ConnectionSettings.at(port=port)


@contextmanager
def cluster(nodes: int) -> Iterator[ConnectionSettings]:
    with tempfile.TemporaryDirectory(prefix="dcpkv-bench-durability-") as tmp:
        local = LocalCluster(Path(tmp), nodes=nodes, replicas=1, num_vbuckets=VBUCKETS)
        try:
            with _placement.servers():
                local.start()
            addresses = ",".join(local.address(c) for c in local.data_nodes)
            conn = ConnectionSettings.parse(f"couchbase://{addresses}")
            asyncio.run(_ready(conn))
            yield conn
        finally:
            local.stop()


async def _ready(conn: ConnectionSettings) -> None:
    """Until the map names an active and a replica for every vbucket."""
    async with await ClusterKV.open(ClientSettings(conn)) as kv:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            m = kv.router.map
            if m is not None and all(
                m.active(vb) and kv.router.replicas(vb) for vb in range(m.num_vbuckets)
            ):
                return
            await asyncio.sleep(0.2)
            await kv.refresh()
    raise SystemExit("the cluster map never named an active and a replica for every vbucket")


def main(
    nodes: Annotated[int, typer.Option(help="1 (single-node topologies) or a cluster's.")] = 1,
    seconds: Annotated[float, typer.Option(help="Seconds per way of writing and level.")] = 8.0,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds those seconds split into.")] = 4,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures here.")] = None,
) -> None:
    """SyncWrite latency per level vs client durability (polling) and plain writes."""
    where = one_node() if nodes == 1 else cluster(nodes)
    persist_to = 1 if nodes == 1 else 2  # the active; the active and a replica
    print(f"durability: {nodes} node(s), {VBUCKETS} vbuckets, polling persist_to={persist_to}")
    with where as conn:
        figures = asyncio.run(_measure(conn, persist_to, seconds, max(1, rounds)))
    write_json(json_out, "durability", figures, nodes=nodes, seconds=seconds, rounds=rounds)


if __name__ == "__main__":
    bench_main(main)
