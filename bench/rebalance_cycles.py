"""Rebalance cycles under the official SDK: a node joins a cluster of three and one leaves it
again, ``--cycles`` times (twenty by default), while the official Couchbase SDK writes and
reads every ~2 ms; every failed operation is counted. Not in ``make test`` nor ``make bench``:
it runs for half an hour or more.

Theory of operation
-------------------
Three ``dcpkv server --managed`` nodes and ``dcpkv manager`` (``--vbuckets``, 1024 by default,
one replica). A writer subprocess runs the official SDK (PyPI ``couchbase``; in a process of
its own, as the SDK made no progress from a second Python thread here) bootstrapped from the
three nodes with its default settings (a KV timeout of 2.5 s): each step upserts a counter to
one of 1,000 keys and reads another back, then sleeps 2 ms, until a stop file appears; then it
reads every key back (each must hold the last value acknowledged) and writes its counts to a
JSON file: operations per second, failures (exception type and time), values lost.

Each cycle adds a fresh node and rebalances (3 -> 4), then ejects the oldest member, the SDK's
first seed included in the end, and rebalances (4 -> 3), and stops it. Per rebalance: its
duration, the writer's operations and failures meanwhile, and the stale-map window of
``bench/rebalance.py`` (p99 and max). The exit status is 1 if any operation failed or any value
was lost.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

from _server import bench_server
from latency import _quantile_ms
from rebalance import Manager, Router, stale_map_windows

KEYS = 1000
PAUSE_S = 0.002


# -- the writer (its own process) --------------------------------------------------------------


def writer(ports: list[int], out: Path, stop: Path) -> None:
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.exceptions import CouchbaseException
    from couchbase.options import ClusterOptions

    seeds = ",".join(f"127.0.0.1:{p}" for p in ports)
    options = ClusterOptions(PasswordAuthenticator("Administrator", "password"))
    cluster = Cluster(f"couchbase://{seeds}", options)
    coll = cluster.bucket("default").default_collection()
    acked: dict[str, int] = {}
    per_second: Counter[int] = Counter()
    failures: list[tuple[float, str, str]] = []
    i = 0
    while not stop.exists():
        key, read = f"w-{i % KEYS}", f"w-{(i * 7) % KEYS}"
        try:
            coll.upsert(key, {"i": i})
            acked[key] = i
            if read in acked:
                coll.get(read)
            per_second[int(time.monotonic())] += 1
        except CouchbaseException as exc:
            failures.append((time.monotonic(), type(exc).__name__, str(exc)[:200]))
        i += 1
        time.sleep(PAUSE_S)
    lost = [k for k, v in acked.items() if coll.get(k).content_as[dict]["i"] != v]
    cluster.close()
    doc = {"per_second": per_second, "failures": failures, "lost": lost, "acked": len(acked)}
    out.write_text(json.dumps(doc))


# -- the driver --------------------------------------------------------------------------------


class Cycles:
    def __init__(self, stack: ExitStack, tmp: Path, vbuckets: int) -> None:
        self.stack, self.tmp, self.vbuckets = stack, tmp, vbuckets
        self.members: list[tuple[int, ExitStack]] = []  # (port, what stops it), oldest first
        self.rebalances: list[dict[str, Any]] = []
        self.started = 0

    def node(self) -> int:
        own = self.stack.enter_context(ExitStack())
        self.started += 1
        port = own.enter_context(
            bench_server(self.vbuckets, "--managed", label=f"cycle-{self.started}")
        )
        self.members.append((port, own))
        return port

    def rebalance(self, manager: Manager, what: str, **params: str) -> None:
        ports = [p for p, _ in self.members]
        before = Router(ports).refresh()
        began = time.monotonic()
        manager.api("POST", "/controller/rebalance", **params)
        while (doc := manager.api("GET", "/pools/default/rebalanceProgress"))["state"] == "running":
            time.sleep(0.2)
        ended = time.monotonic()
        if doc["state"] != "idle":
            raise SystemExit(f"{what}: the rebalance ended {doc['state']}: {doc.get('error')}")
        windows = sorted(
            max(0.0, w) for w in stale_map_windows(before, Router(ports).refresh(), ports)
        )
        self.rebalances.append({
            "what": what, "began": began, "ended": ended,
            "stale_p99_ms": _quantile_ms(windows, 0.99),
            "stale_max_ms": windows[-1] * 1e3 if windows else 0.0,
        })  # fmt: skip

    def cycle(self, manager: Manager, n: int) -> None:
        port = self.node()
        manager.api("POST", "/controller/addNode", hostname=f"127.0.0.1:{port}")
        self.rebalance(manager, f"cycle {n}: in")
        leaving, stops = self.members[0]
        self.rebalance(manager, f"cycle {n}: out", ejectedNodes=f"127.0.0.1:{leaving}")
        self.members.pop(0)
        stops.close()


def report(rebalances: list[dict[str, Any]], result: dict[str, Any]) -> bool:
    per_second = {int(k): v for k, v in result["per_second"].items()}
    failures = result["failures"]
    print(f"{'rebalance':<16} {'seconds':>8} {'ops':>7} {'failed':>6} {'stale p99':>10} {'max':>8}")
    for r in rebalances:
        ops = sum(v for s, v in per_second.items() if r["began"] <= s < r["ended"])
        failed = sum(1 for t, _, _ in failures if r["began"] <= t < r["ended"])
        print(f"{r['what']:<16} {r['ended'] - r['began']:8.1f} {ops:7d} {failed:6d} "
              f"{r['stale_p99_ms']:8.1f}ms {r['stale_max_ms']:6.1f}ms")  # fmt: skip
    total = sum(per_second.values())
    kinds = Counter(kind for _, kind, _ in failures)
    print(f"SDK operations: {total:,} ok, {len(failures)} failed {dict(kinds)}, "
          f"{len(result['lost'])} of {result['acked']} keys lost")  # fmt: skip
    for when, kind, text in failures[:10]:
        print(f"  {when:.3f} {kind}: {text}")
    worst = max((r["stale_max_ms"] for r in rebalances), default=0.0)
    print(f"stale-map window: max {worst:.1f} ms over {len(rebalances)} rebalances")
    return not failures and not result["lost"]


def main(
    cycles: Annotated[int, typer.Option(help="rebalance-in and remove-node cycles")] = 20,
    vbuckets: Annotated[int, typer.Option(help="vbuckets of the bucket")] = 1024,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dcpkv-bench-cycles-"))
    print(f"rebalance cycles: {cycles} x (3 -> 4 -> 3), {vbuckets} vbuckets, official SDK writing")
    with ExitStack() as stack:
        run = Cycles(stack, tmp, vbuckets)
        seeds = [run.node() for _ in range(3)]
        manager = Manager(tmp, seeds, vbuckets)
        stack.callback(manager.stop)
        out, stop = tmp / "writer.json", tmp / "writer.stop"
        cmd = [sys.executable, __file__, "--writer", str(out), str(stop), *map(str, seeds)]
        sdk = subprocess.Popen(cmd)
        stack.callback(sdk.kill)  # (only if still running: a failed run)
        time.sleep(5)  # the SDK bootstraps
        for n in range(1, cycles + 1):
            run.cycle(manager, n)
            print(f"  cycle {n}: " + ", ".join(
                f"{r['ended'] - r['began']:.1f} s" for r in run.rebalances[-2:]
            ), flush=True)  # fmt: skip
        stop.touch()
        if sdk.wait(timeout=300) != 0:
            raise SystemExit("the SDK writer failed")
    result = json.loads(out.read_text())
    ok = report(run.rebalances, result)
    if json_out is not None:
        json_out.write_text(json.dumps({"rebalances": run.rebalances, "writer": result}))
    if ok:  # (kept otherwise: the manager's log says what the rebalances did)
        shutil.rmtree(tmp, ignore_errors=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--writer"]:
        out_path, stop_path, *ports = sys.argv[2:]
        writer([int(p) for p in ports], Path(out_path), Path(stop_path))
    else:
        typer.run(main)
