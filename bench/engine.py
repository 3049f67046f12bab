"""Engine throughput: front-end sets into a vbucket, and flushes of 100k items to SQLite.

Run: ``.venv/bin/python bench/engine.py [N] [--json PATH]`` (default N = 100,000; ``BENCH_DIR``
picks the filesystem, default the temp dir, often tmpfs where fsync is free). Prints items/s
(``--json`` also writes them for ``make bench``'s summary) for:

* ``set``: ``VBucket.set`` of N distinct keys (100-byte values) into one active vbucket;
* ``flush 1 vb``: one ``Bucket.flush_once`` of those N items, synchronous=FULL and NORMAL;
* ``flush 1024 vb x 2``: many small flushes as a server sees them at realistic write rates:
  2 items into each of 1,024 active vbuckets, then one ``Bucket.flush_once``, repeated until N
  items are flushed (the per-dirty-vbucket cost of the flusher dominates there);
* ``flush updates``: a server's steady state, keys written again: 100k keys over 1,024
  vbuckets loaded first, then N writes of random existing keys, flushed 6,000 at a time (as a
  loaded server flushes), history kept (each replaced version is copied for rollback);
* the storage layout choice: N items spread over 64 vbuckets, flushed as one transaction
  in one file (the design), one transaction per vbucket in one file, and one file per vbucket.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from _report import bench_main, write_json
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.item import Item
from dcpkv.engine.storage import Storage, VBState

VALUE = b"x" * 100


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} items/s  ({seconds:.3f} s)"


def bench_bucket(n: int, synchronous: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        bucket = Bucket(
            "bench", Path(tmp), num_vbuckets=1, rng=random.Random(1), synchronous=synchronous,
            memory_quota=1 << 34,
        )  # fmt: skip
        vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
        keys = [b"key-%08d" % i for i in range(n)]
        start = time.perf_counter()
        for key in keys:
            vb.set(key, VALUE)
        set_time = time.perf_counter() - start
        start = time.perf_counter()
        flushed = bucket.flush_once()
        flush_time = time.perf_counter() - start
        assert flushed == n
        bucket.shutdown()
        return set_time, flush_time


def bench_small_flushes(n: int, vbs: int = 1024, per_vb: int = 2) -> float:
    """Seconds spent in ``flush_once`` for N items written ``per_vb`` per vbucket per flush."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        bucket = Bucket(
            "bench", Path(tmp), num_vbuckets=vbs, rng=random.Random(1), synchronous="NORMAL",
            memory_quota=1 << 34,
        )  # fmt: skip
        vbuckets = [bucket.set_vbucket_state(vb, VBucketState.ACTIVE) for vb in range(vbs)]
        bucket.flush_once()
        flushing, done, i = 0.0, 0, 0
        while done < n:
            for vb in vbuckets:
                for _ in range(per_vb):
                    vb.set(b"key-%08d" % (i % 50_000), VALUE)
                    i += 1
            start = time.perf_counter()
            done += bucket.flush_once()
            flushing += time.perf_counter() - start
        bucket.shutdown()
        return flushing


def bench_update_flushes(n: int, keys: int = 100_000, per_flush: int = 6_000) -> float:
    """Seconds spent in ``flush_once`` for N overwrites of existing keys (module docstring)."""
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        bucket = Bucket(
            "bench", Path(tmp), num_vbuckets=1024, rng=random.Random(1), memory_quota=1 << 34,
        )  # fmt: skip
        vbuckets = [bucket.set_vbucket_state(vb, VBucketState.ACTIVE) for vb in range(1024)]
        for i in range(keys):
            vbuckets[i % 1024].set(b"key-%08d" % i, VALUE)
        bucket.flush_once()
        flushing, done = 0.0, 0
        while done < n:
            for _ in range(min(per_flush, n - done)):
                i = rng.randrange(keys)
                vbuckets[i % 1024].set(b"key-%08d" % i, VALUE)
            start = time.perf_counter()
            done += bucket.flush_once()
            flushing += time.perf_counter() - start
        bucket.shutdown()
        return flushing


def _items(n: int, vbs: int) -> dict[int, list[Item]]:
    per_vb: dict[int, list[Item]] = {vb: [] for vb in range(vbs)}
    for i in range(n):
        vb = i % vbs
        seqno = len(per_vb[vb]) + 1
        per_vb[vb].append(Item(b"key-%08d" % i, VALUE, cas=i + 1, by_seqno=seqno, rev_seqno=1))
    return per_vb


def _state(items: list[Item]) -> VBState:
    high = items[-1].by_seqno
    return VBState("active", "[]", high, 0, high)


def bench_layout(n: int, vbs: int, layout: str) -> float:
    per_vb = _items(n, vbs)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        if layout == "file per vb":
            stores = {vb: Storage(Path(tmp) / f"vb{vb}.sqlite3") for vb in per_vb}
        else:
            one = Storage(Path(tmp) / "bucket.sqlite3")
            stores = dict.fromkeys(per_vb, one)
        start = time.perf_counter()
        if layout == "one txn":
            one.persist((vb, items, _state(items)) for vb, items in per_vb.items())
        else:
            for vb, items in per_vb.items():
                stores[vb].persist_snapshot(vb, items, _state(items))
        elapsed = time.perf_counter() - start
        for store in set(stores.values()):
            store.close()
        return elapsed


def main(
    n: Annotated[int, typer.Argument(help="items")] = 100_000,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    print(f"engine benchmark, {n:,} items of {len(VALUE)} bytes")
    figures: dict[str, float] = {}
    for sync in ("FULL", "NORMAL"):
        set_time, flush_time = bench_bucket(n, sync)
        if sync == "FULL":
            print(f"  set into one vbucket        {_rate(n, set_time)}")
            figures["set_items_per_s"] = n / set_time
        print(f"  flush 1 vb, sync={sync:<7}    {_rate(n, flush_time)}")
        figures[f"flush_{sync.lower()}_items_per_s"] = n / flush_time
    seconds = bench_small_flushes(n)
    print(f"  flush 1024 vb x 2 items     {_rate(n, seconds)}")
    figures["flush_1024vb_x2_items_per_s"] = n / seconds
    seconds = bench_update_flushes(n)
    print(f"  flush updates, 100k keys    {_rate(n, seconds)}")
    figures["flush_updates_items_per_s"] = n / seconds
    for layout in ("one txn", "txn per vb", "file per vb"):
        seconds = bench_layout(n, 64, layout)
        print(f"  64 vbs, {layout:<12}        {_rate(n, seconds)}")
        figures[f"flush_64vb_{layout.replace(' ', '_')}_items_per_s"] = n / seconds
    write_json(json_out, "engine", figures)


if __name__ == "__main__":
    bench_main(main)
