"""A large bucket restarted: its warm-up under each eviction policy, and random Gets of
non-resident keys under full eviction with a small quota.

Run after ``bench/kv_growth.py --keep DIR`` (``make bench``: 10M keys), on the bucket it left
in ``DIR/data`` (``--items`` keys of 16 bytes with 100-byte values, 1,024 vbuckets, every
write persisted and the server stopped cleanly), so that the bucket is filled once for all of
these figures:

1. A server opens the bucket with ``valueOnly`` and ``--value-only-quota-mb`` (kv_growth's):
   ``value_only_warmup_s`` is from the server's start to its port file (the interpreter's start
   included; warm-up reads every key and its metadata, and values while they fit in 80 % of
   the quota); ``value_only_rss_mib``: its resident set then.
2. Round by round (``--rounds``, medians), a server opens it with ``fullEviction`` and
   ``--quota-mb``: warm-up loads no items, so every key read is non-resident (a Get does not
   bring its item back). ``full_eviction_warmup_s`` as above; ``random_get_ops_per_s_1conn`` /
   ``_4conn``: ``--ops`` uniform random written keys on 1 and 4 connections, pipelined GetK,
   100 a batch (each a background fetch); ``missing_get_ops_per_s_4conn``: keys never written
   (storage's bloom filters answer); ``full_eviction_rss_mib``: the server's resident set after
   those Gets.

Each server's ``curr_items`` must be ``--items`` (item counts stay exact under full eviction),
or the benchmark fails. The rows are ``bench/bg_fetch.py``'s, which fills its own bucket
through the engine (``--items 10000000 --quota-mb 512`` there is a second 10M fill)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Annotated

import typer

import kv
from _report import bench_main, rounds, window, write_json
from _server import rss_mib
from bg_fetch import _rows, _server

# bg_fetch's rows (bg_fetch._rows), as this benchmark names them
ROWS = ["random_get_ops_per_s_1conn", "random_get_ops_per_s_4conn", "missing_get_ops_per_s_4conn",
        "random_get_server_cpu_us_per_get_1conn", "random_get_server_cpu_us_per_get_4conn",
        "missing_get_server_cpu_us_per_get_4conn", "full_eviction_rss_mib"]  # fmt: skip


async def _check_items(target: kv.Target, items: int) -> None:
    conn = await kv.Conn.open(target)
    try:
        found = await kv.stat(conn, "curr_items")
    finally:
        await conn.close()
    if found != items:
        raise SystemExit(f"the restarted bucket holds {found:,} items, not {items:,}")


def value_only_warmup(data: Path, items: int, quota_mb: int) -> dict[str, float]:
    """A ``valueOnly`` server on ``data``: seconds from its start to its port file, and its
    resident set then."""
    server = _server(data, quota_mb, "valueOnly", None)
    with window("value_only_warmup_s"), server as (target, warmup):
        rss = rss_mib(target.pid)
        asyncio.run(_check_items(target, items))
    return {"value_only_warmup_s": warmup, "value_only_rss_mib": rss}


def full_eviction_round(
    data: Path, items: int, quota_mb: int, ops: int, rng: random.Random
) -> dict[str, float]:
    """One ``fullEviction`` server on ``data``: its warm-up, Gets and RSS."""
    with _server(data, quota_mb, "fullEviction", None) as (target, warmup):
        asyncio.run(_check_items(target, items))
        row = asyncio.run(_rows(target, items, ops, rng))
    row["full_eviction_rss_mib"] = row.pop("rss_mib")  # (beside value_only_rss_mib)
    return {"full_eviction_warmup_s": warmup} | row


def main(
    data_dir: Annotated[
        Path, typer.Option(help="the folder bench/kv_growth.py --keep left (its bucket in data/)")
    ],
    items: Annotated[int, typer.Option(help="keys kv_growth wrote (its --ops)")],
    value_only_quota_mb: Annotated[
        int, typer.Option(help="the valueOnly server's quota (kv_growth's --quota-mb)")
    ] = 7500,
    quota_mb: Annotated[int, typer.Option(help="the fullEviction servers' quota")] = 512,
    ops: Annotated[int, typer.Option(help="Gets per row")] = 50_000,
    rounds_: Annotated[int, typer.Option("--rounds", help="fullEviction servers, one by one")] = 3,
    json: Annotated[Path | None, typer.Option(help="write the figures here")] = None,
) -> None:
    data = data_dir / "data"
    if not data.is_dir():
        raise typer.BadParameter(f"{data}: no bucket (run bench/kv_growth.py --keep first)")
    figures = value_only_warmup(data, items, value_only_quota_mb)
    print(f"valueOnly warm-up of {items:,} items: {figures['value_only_warmup_s']:.1f} s")
    rng = random.Random(31)
    figures |= rounds(rounds_, lambda: full_eviction_round(data, items, quota_mb, ops, rng))
    print(f"fullEviction, {quota_mb} MiB (medians of {rounds_}): "
          + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()))  # fmt: skip
    write_json(json, "large_bucket", figures, items=items, quota_mb=quota_mb, ops=ops)


if __name__ == "__main__":
    bench_main(main)
