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

Each prints items/s and the final count against the expected one; ``--json PATH`` writes the
rates for ``make bench``'s summary.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write_json
from dcp import loaded_server
from dcpkv.client import events
from dcpkv.client.config import ClientConfig
from dcpkv.client.consumer import Consumer
from dcpkv.client.settings import ConnectionSettings


async def consume(port: int) -> tuple[int, float]:
    count = 0
    start = time.perf_counter()
    async with Consumer(
        ClientConfig(ConnectionSettings.at(port=port), name="bench:consumer")
    ) as consumer:
        async for ev in consumer.stream(end="now"):
            if type(ev) is events.Mutation:
                count += 1
    return count, time.perf_counter() - start


def cli(port: int) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "dcpkv.cli.main", "stream", "--port", str(port), "--from",
           "beginning", "--to", "now", "--format", "json", "--name", "bench:cli"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    lines = sum(chunk.count(b"\n") for chunk in iter(lambda: proc.stdout.read(1 << 20), b""))
    proc.wait()
    if proc.returncode:
        raise SystemExit(f"dcpkv stream exited {proc.returncode}")
    return lines, time.perf_counter() - start


def main(
    count: int = typer.Option(1_000_000, "--count", help="items loaded before streaming"),
    vbuckets: int = typer.Option(64, "--vbuckets", help="vbuckets of the bucket"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    figures: dict[str, float] = {}
    print(f"stream bench: {count:,} items, {vbuckets} vbuckets")
    with loaded_server(count, vbuckets, "stream", width=30) as port:
        for what, metric, (items, seconds) in (
            ("Consumer (asyncio), to now", "consumer", asyncio.run(consume(port))),
            ("dcpkv stream --format json", "cli_json", cli(port)),
        ):
            figures[f"{metric}_items_per_s"] = items / seconds
            figures[f"{metric}_items_missing"] = count - items
            ok = "ok" if items == count else f"MISMATCH, expected {count:,}"
            print(f"  {what:<30} {items:>10,} items {seconds:7.2f} s "
                  f"{items / seconds:>10,.0f} items/s  ({ok})")  # fmt: skip
    write_json(json_out, "stream", figures)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    typer.run(main)
