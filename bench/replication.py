"""Replication between two nodes: a replica built from scratch, and the lag under a steady load.

Theory of operation
-------------------
Two ``dcpkv server --managed`` processes on this machine, 1024 vbuckets, set up over the wire
as the cluster manager does (SetVbucket for states, SetClusterConfig for the map):

1. **Build**: node A's data dir is loaded with ``--count`` items (16-byte keys, 100-byte values)
   through the engine (as ``bench/dcp.py`` does), every vbucket active; A starts on it, B
   starts empty. The clock starts when B is told its 1024 replica states and both nodes get
   the map, and stops when B's high seqnos (GetAllVbSeqnos) equal A's: items/s of a replica
   built from nothing, backfill and apply included.
2. **Lag**: a writer process paces plain Sets into A (``--rate`` writes/s, batches every
   millisecond, as ``bench/latency.py`` and the Redis peer pace), and a DCP consumer process
   streams B's replica vbuckets from their high seqnos: write acknowledged by A -> mutation
   received from B, i.e. replicated, applied on B and sent on by B's own producer (an upper
   bound of write-to-replica-applied). p50/p99/p999 in ms.

``--json PATH`` writes the figures for ``make bench``'s summary.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from _report import bench_main, window, write_json
from _server import bench_server
from dcp import load
from dcpkv.client.blocking import BlockingKV
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import Opcode
from latency import _quantile_ms, paced_tail

VBUCKETS = 1024


def _session(port: int) -> BlockingKV:
    kv = BlockingKV("127.0.0.1", port, timeout=120)
    kv.login("Administrator", "password", "default")
    return kv


def set_up(a: int, b: int) -> None:
    """B holds every vbucket as replica; both nodes get the map (A active, B replica)."""
    servers = [f"127.0.0.1:{a}", f"127.0.0.1:{b}"]
    config = json.dumps({
        "rev": 1, "name": "default", "nodeLocator": "vbucket",
        "vBucketServerMap": {"hashAlgorithm": "CRC", "numReplicas": 1, "serverList": servers,
                             "vBucketMap": [[0, 1]] * VBUCKETS},
    }).encode()  # fmt: skip
    with _session(b) as kv:
        state = struct.pack(">I", VBucketState.REPLICA)
        for vb in range(VBUCKETS):
            kv.call(Opcode.SetVbucket, extras=state, vbucket=vb)
    for port in (a, b):
        with _session(port) as kv:
            kv.call(Opcode.SetClusterConfig, key=b"default", value=config)


def high_seqnos(port: int) -> dict[int, int]:
    with _session(port) as kv:
        frame = kv.call(Opcode.GetAllVbSeqnos)
    return dict(struct.iter_unpack(">HQ", bytes(frame.value)))


def build(a: int, b: int, count: int) -> float:
    target = high_seqnos(a)
    start = time.perf_counter()
    set_up(a, b)
    while high_seqnos(b) != target:
        time.sleep(0.05)
    return time.perf_counter() - start


def lag(a: int, b: int, rate: int, seconds: float) -> dict[str, float]:
    with _session(b) as kv:
        stats = kv.stats("vbucket-seqno")
    uuids = {int(k[3:].split(":")[0]): int(v) for k, v in stats if k.endswith(":uuid")}
    sent, acked, elapsed, received = paced_tail(a, b, rate, seconds, uuids)
    lat = sorted(at - acked[i] for i, at in received.items())
    return {
        "achieved_writes_per_s": len(sent) / elapsed,
        "received": len(received),
        "writes": len(sent),
        "lag_p50_ms": _quantile_ms(lat, 0.5),
        "lag_p99_ms": _quantile_ms(lat, 0.99),
        "lag_p999_ms": _quantile_ms(lat, 0.999),
    }


def main(
    count: Annotated[int, typer.Option(help="items on the active before the replica starts")] = (
        1_000_000
    ),
    rate: Annotated[int, typer.Option(help="paced writes/s of the lag phase")] = 5_000,
    seconds: Annotated[float, typer.Option(help="seconds of the lag phase")] = 10.0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dcpkv-bench-replication-"))
    try:
        print(f"replication bench: {count:,} items, {VBUCKETS} vbuckets, two managed nodes")
        loaded = load(tmp / "a", count, VBUCKETS)
        print(f"  load A through the engine      {loaded:8.2f} s")
        quota = ("--memory-quota-mb", "4096")  # 1M items stay resident: the figure is the link's
        with bench_server(VBUCKETS, "--managed", *quota, label="repl-a", data_dir=tmp / "a") as a, \
                bench_server(VBUCKETS, "--managed", *quota, label="repl-b") as b:  # fmt: skip
            with window("replica_build_items_per_s"):
                seconds_build = build(a, b, count)
            build_rate = count / seconds_build
            print(f"  replica built from scratch     {seconds_build:8.2f} s  "
                  f"{build_rate:>10,.0f} items/s")  # fmt: skip
            figures = lag(a, b, rate, seconds)
        print(f"  lag at {rate:,} writes/s (achieved {figures['achieved_writes_per_s']:,.0f}): "
              f"p50 {figures['lag_p50_ms']:.2f} ms  p99 {figures['lag_p99_ms']:.2f} ms  "
              f"p999 {figures['lag_p999_ms']:.2f} ms  ({figures['received']:,} of "
              f"{figures['writes']:,} received)")  # fmt: skip
        write_json(json_out, "replication",
                   {"replica_build_items_per_s": build_rate, **figures})  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    bench_main(main)
