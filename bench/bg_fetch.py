"""Random Gets on a bucket larger than memory: full eviction over the wire.

Run: ``.venv/bin/python bench/bg_fetch.py [--items N] [--quota-mb Q] [--ops M] [--rounds R]
[--json PATH]`` (default 200,000 items, a 64 MiB quota, 50,000 Gets per row, 5 rounds;
``BENCH_DIR`` picks the filesystem; larger runs: ``--items 1000000`` / ``3000000`` /
``10000000 --quota-mb 512``). The engine writes N keys (100-byte values) into a data folder
as the server stores them (1024 vbuckets); then, round by round, a server opens that folder
with ``fullEviction`` and the quota: warm-up loads no items, so every key read is non-resident
(a Get does not put an item back). Each row is pipelined GetK requests, 100 per batch:

* ``random_get_ops_per_s_1conn`` / ``_4conn``: uniform random written keys, 1 and 4
  connections, Gets/s (each a background fetch);
* ``missing_get_ops_per_s_4conn``: keys never written (storage's bloom filters answer), Gets/s;
* ``random_get_server_cpu_us_per_get_1conn`` (and the others'): the server's CPU (all its
  threads) per Get of each row, which swings much less than the rates on a shared host;
* ``rss_mib``: the server's resident set after the rows;
* ``warmup_s``: from the server's start to its port file (interpreter start included);
* ``fill_sets_per_s_first`` / ``_last``: the engine's Set rate while filling the folder (the
  flushes included), over the first and the last tenth of the keys: how the cost of a write
  grows with the bucket. The folder is filled :data:`FILL_ROUNDS` times, each in a fresh
  process (a tenth of the default fill lasts 0.1-0.3 s: one fill's rate moved 1.5x between
  two runs), and the figures are the median round's.

Every figure is the median of its rounds, each round between yardstick samples
(``bench/_report.py``): a row lasts about a second.

``DCPKV_SRC_BEFORE``: the ``src`` folder of another checkout, whose server runs the same rows
on the same folder, interleaved round by round and labelled ``before`` (only same-run ratios
hold on this host).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

import _placement
import kv
from _report import a_round, bench_main, write_json
from _server import rss_mib
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.item import TempFail
from dcpkv.protocol.constants import Magic, Opcode
from dcpkv.protocol.frame import encode_frame
from dcpkv.server.config import DEFAULT_BUCKET

BATCH = 100
FILL_QUOTA = 1 << 30  # the filling bucket's (full eviction: it evicts to stay under)
FILL_ROUNDS = 3  # fills, each in a fresh process: the fill figures are the median round's


def _get(key: bytes, opaque: int) -> bytes:
    vb = vbucket_for_key(key, kv.VBUCKETS)
    return encode_frame(Magic.ClientRequest, Opcode.GetK, key=key, vbucket=vb, opaque=opaque)


def _gets(keys: list[bytes]) -> list[tuple[bytes, int]]:
    return [
        (b"".join(_get(k, i) for i, k in enumerate(keys[s : s + BATCH])), len(keys[s : s + BATCH]))
        for s in range(0, len(keys), BATCH)
    ]


@contextmanager
def _server(
    data: Path, quota_mb: int, policy: str, src: str | None
) -> Iterator[tuple[kv.Target, float]]:
    """A server on ``data`` (``src``: another source tree's); yields it and its start time."""
    tmp = Path(tempfile.mkdtemp(prefix="dcpkv-bgfetch-"))
    port_file = tmp / "port"
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    cmd = [
        sys.executable, "-m", "dcpkv.cli.main", "server", "--port", "0", "--data-dir", str(data),
        "--port-file", str(port_file), "--vbuckets", str(kv.VBUCKETS), "--memory-quota-mb",
        str(quota_mb), "--eviction-policy", policy,
    ]  # fmt: skip
    started = time.perf_counter()
    with open(tmp / "server.log", "wb") as log, _placement.servers():
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        while not port_file.exists():
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.01)
        warmup = time.perf_counter() - started
        yield kv.Target("dcpkv", int(port_file.read_text()), True, True, proc.pid), warmup
    finally:
        proc.terminate()
        proc.wait(timeout=300)
        shutil.rmtree(tmp, ignore_errors=True)


def _fill(data: Path, items: int) -> dict[str, float]:
    """Write ``items`` keys straight through the engine (as the server would store them: its
    bucket, its vbuckets), a full-eviction bucket whose writes wait for the flusher when full.
    Returns the Set rate (flushes included) over the first and the last tenth of the keys."""
    bucket = Bucket(DEFAULT_BUCKET, data, num_vbuckets=kv.VBUCKETS, memory_quota=FILL_QUOTA,
                    eviction_policy=EvictionPolicy.FULL)  # fmt: skip
    for vb in range(kv.VBUCKETS):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    vbuckets = [bucket.get_vbucket(vb) for vb in range(kv.VBUCKETS)]
    tenth = max(1, items // 10)
    marks = {0: time.perf_counter()}
    for i in range(items):
        key = kv._key(i)
        vbucket = vbuckets[vbucket_for_key(key, kv.VBUCKETS)]
        while True:
            try:
                vbucket.set(key, kv.VALUE)
                break
            except TempFail:
                bucket.flush_once()
        if i % 50_000 == 49_999:
            bucket.flush_once()
        if i + 1 in (tenth, items - tenth):
            marks[i + 1] = time.perf_counter()
    bucket.shutdown()
    marks[items] = time.perf_counter()
    return {
        "fill_sets_per_s_first": tenth / (marks[tenth] - marks[0]),
        "fill_sets_per_s_last": tenth / (marks[items] - marks[items - tenth]),
    }


def _fills(data: Path, items: int) -> dict[str, float]:
    """:func:`_fill` :data:`FILL_ROUNDS` times, each round in a fresh process (the fill's heap
    and the collector's work are the round's own) and a fresh folder, the last left as
    ``data``: the median of each figure, every round between yardstick samples."""
    results = []
    for r in range(FILL_ROUNDS):
        shutil.rmtree(data, ignore_errors=True)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=spawn) as pool, a_round() as measured:
            measured.update(pool.submit(_fill, data, items).result())
        results.append(measured)
        print(f"fill {r}: " + ", ".join(f"{k} {v:,.0f}" for k, v in measured.items()), flush=True)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


async def _rate(target: kv.Target, keys: list[bytes], conns: int) -> tuple[float, float]:
    """Gets/s, and the server's CPU per Get in us (all its threads)."""
    clients = [await kv.Conn.open(target) for _ in range(conns)]
    work = [_gets(keys[i::conns]) for i in range(conns)]
    try:
        cpu, start = kv.cpu_seconds(target.pid), time.perf_counter()
        await asyncio.gather(*(c.run(w) for c, w in zip(clients, work, strict=True)))
        seconds, cpu = time.perf_counter() - start, kv.cpu_seconds(target.pid) - cpu
        return len(keys) / seconds, cpu / len(keys) * 1e6
    finally:
        for c in clients:
            await c.close()


async def _rows(target: kv.Target, items: int, ops: int, rng: random.Random) -> dict[str, float]:
    written = [kv._key(rng.randrange(items)) for _ in range(ops)]
    missing = [b"missing-%09d" % rng.randrange(1 << 30) for _ in range(ops)]
    row: dict[str, float] = {}
    for name, keys, conns in (("random", written, 1), ("random", written, 4),
                              ("missing", missing, 4)):  # fmt: skip
        rate, cpu = await _rate(target, keys, conns)
        row[f"{name}_get_ops_per_s_{conns}conn"] = rate
        row[f"{name}_get_server_cpu_us_per_get_{conns}conn"] = cpu
    return row | {"rss_mib": rss_mib(target.pid)}


def main(
    items: Annotated[int, typer.Option(help="keys in the bucket")] = 200_000,
    quota_mb: Annotated[int, typer.Option(help="the bucket's quota while reading")] = 64,
    ops: Annotated[int, typer.Option(help="Gets per row")] = 50_000,
    rounds: Annotated[int, typer.Option(help="rounds (variants interleaved)")] = 5,
    json: Annotated[Path | None, typer.Option(help="write the figures here")] = None,
) -> None:
    before = os.environ.get("DCPKV_SRC_BEFORE")
    variants: list[tuple[str, str | None]] = [("after", None)]
    if before:
        variants = [("before", before), *variants]
    rng = random.Random(31)
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        data = Path(tmp) / "data"
        started = time.perf_counter()
        fill = _fills(data, items)
        print(f"filled {items:,} keys {FILL_ROUNDS} times in {time.perf_counter() - started:.1f}"
              " s: " + ", ".join(f"{k} {v:,.0f}" for k, v in fill.items()), flush=True)  # fmt: skip
        for r in range(rounds):
            for name, src in variants:
                with (
                    a_round() as measured,
                    _server(data, quota_mb, "fullEviction", src) as (target, warmup),
                ):
                    row = asyncio.run(_rows(target, items, ops, rng))
                    row["warmup_s"] = warmup
                    measured.update({f"{name}_{k}": v for k, v in row.items()})
                results[name].append(row)
                print(f"round {r} {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
    figures = {
        name: {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        for name, rows in results.items()
    }
    for name, row in figures.items():
        print(f"median {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
    flat = {f"{name}_{k}": v for name, row in figures.items() for k, v in row.items()}
    flat |= fill  # (the fill is this tree's engine, whatever the rows' variants)
    write_json(json, "bg_fetch", flat, items=items, quota_mb=quota_mb, ops=ops)


if __name__ == "__main__":
    bench_main(main)
