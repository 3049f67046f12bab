"""The DCP client end to end: ``dcpkv stream`` and the asyncio Consumer over a loaded bucket.

Theory of operation
-------------------
1. Load ``--count`` items through the engine into a fresh data dir (``bench/dcp.py``'s
   loader), start a real ``dcpkv server`` on it.
2. Consumer: one :class:`~dcpkv.client.consumer.Consumer`, every vbucket from 0 to "now",
   counting Mutation events (the library's own cost: decode, consumer streams, offsets,
   events, flow control).
3. CLI: ``dcpkv stream --from beginning --to now --format json > /dev/null`` as a
   subprocess (adds JSON encoding and writing), counting lines through a pipe.

Each runs :data:`ROUNDS` times, each between two yardstick samples (``bench/_report.py``), and
prints items/s and the final count against the expected one; the figures are the rounds'
medians (``--json PATH`` writes them for ``make bench``'s summary).

4. Three nodes (``--cluster-count``, 0 skips it): the same ``--cluster-count`` items written
   through the protocol into a fresh node and into a local 3-node cluster (1 replica,
   ``bench/_cluster.py``), then the Consumer and ``dcpkv stream`` on each (the cluster through
   its connection string: one DCP connection per node, each vbucket from its active).
   Figures ``cluster3_*`` and ``single_same_data_*``, and their ratio.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cluster import same_data
from _report import bench_main, rounds, write_json
from dcp import loaded_server
from dcpkv.client import events
from dcpkv.client.consumer import Consumer
from dcpkv.client.settings import ClientSettings, ConnectionSettings

ROUNDS = 3  # of each figure, between yardstick samples


async def consume(port: int) -> tuple[int, float]:
    return await consume_from(ConnectionSettings.at(port=port))


async def consume_from(conn: ConnectionSettings) -> tuple[int, float]:
    count = 0
    start = time.perf_counter()
    async with Consumer(ClientSettings(conn, name="bench:consumer")) as consumer:
        async for ev in consumer.stream(end="now"):
            if type(ev) is events.Mutation:
                count += 1
    return count, time.perf_counter() - start


def cli(port: int, host: str | None = None) -> tuple[int, float]:
    where = ["--port", str(port)] if host is None else ["--host", host]
    cmd = [sys.executable, "-m", "dcpkv.cli.main", "stream", *where, "--from",
           "beginning", "--to", "now", "--format", "json", "--name", "bench:cli"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    lines = sum(chunk.count(b"\n") for chunk in iter(lambda: proc.stdout.read(1 << 20), b""))
    proc.wait()
    if proc.returncode:
        raise SystemExit(f"dcpkv stream exited {proc.returncode}")
    return lines, time.perf_counter() - start


def _consume_from(conn: ConnectionSettings) -> tuple[int, float]:
    return asyncio.run(consume_from(conn))


def _measured(
    what: str, metric: str, count: int, measure: Callable[[], tuple[int, float]]
) -> dict[str, float]:
    """One round of a figure: its rate and the items it missed (printed)."""
    items, seconds = measure()
    ok = "ok" if items == count else f"MISMATCH, expected {count:,}"
    print(f"  {what:<30} {items:>10,} items {seconds:7.2f} s "
          f"{items / seconds:>10,.0f} items/s  ({ok})")  # fmt: skip
    return {f"{metric}_items_per_s": items / seconds, f"{metric}_items_missing": count - items}


def main(
    count: int = typer.Option(1_000_000, "--count", help="items loaded before streaming"),
    vbuckets: int = typer.Option(64, "--vbuckets", help="vbuckets of the bucket"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
    cluster_count: int = typer.Option(
        200_000, "--cluster-count", help="items of the 3-node run (0: skip it)"
    ),
) -> None:
    figures: dict[str, float] = {}
    print(f"stream bench: {count:,} items, {vbuckets} vbuckets")
    with loaded_server(count, vbuckets, "stream", width=30) as port:
        figures |= rounds(
            ROUNDS,
            partial(
                _measured,
                "Consumer (asyncio), to now",
                "consumer",
                count,
                lambda: asyncio.run(consume(port)),
            ),
        )
        figures |= rounds(ROUNDS, partial(_measured, "dcpkv stream --format json", "cli_json",
                                          count, lambda: cli(port)))  # fmt: skip
    if cluster_count:
        figures |= three_nodes(cluster_count, vbuckets)
    write_json(json_out, "stream", figures)


def three_nodes(count: int, vbuckets: int) -> dict[str, float]:
    """The same items on one node and on three: the Consumer and the CLI on each."""
    print(f"3 nodes against 1 on the same data: {count:,} items, {vbuckets} vbuckets")
    figures: dict[str, float] = {}
    with same_data(count, vbuckets, "stream") as (single, three):
        for label, conn in (("single_same_data", single), ("cluster3", three)):
            host = None if conn is single else conn.connection_string
            figures |= rounds(
                ROUNDS,
                partial(
                    _measured,
                    f"Consumer, {label}",
                    f"{label}_consumer",
                    count,
                    partial(_consume_from, conn),
                ),
            )
            figures |= rounds(ROUNDS, partial(_measured, f"dcpkv stream, {label}",
                                              f"{label}_cli_json", count,
                                              partial(cli, conn.port, host)))  # fmt: skip
    for metric in ("consumer", "cli_json"):
        ratio = (
            figures[f"cluster3_{metric}_items_per_s"]
            / figures[f"single_same_data_{metric}_items_per_s"]
        )
        figures[f"cluster3_{metric}_vs_single"] = ratio
        print(f"  {metric}: 3 nodes / 1 node = {ratio:.2f}")
    return figures


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)
