"""Engine throughput: front-end sets into a vbucket, and flushes to each storage engine.

Run: ``.venv/bin/python bench/engine.py [N] [--keys 100000,1000000] [--rounds R] [--json PATH]``
(default N = 100,000; ``BENCH_DIR`` picks the filesystem, default the temp dir). Every flush row
runs once per storage engine (``sqlite``, ``rocksdb``), the engines back to back and ``--rounds``
times over (this host's speed swings: only ratios of one run hold), and prints items/s (``--json``
also writes them for ``make bench``'s summary) for:

* ``set``: ``VBucket.set`` of N distinct keys (100-byte values) into one active vbucket;
* ``flush 1 vb``: one ``Bucket.flush_once`` of those N items, synchronous=FULL and NORMAL;
* ``flush 1024 vb x 2``: many small flushes as a server sees them at realistic write rates:
  2 items into each of 1,024 active vbuckets, then one ``Bucket.flush_once``, repeated until N
  items are flushed (the per-dirty-vbucket cost of the flusher dominates there);
* ``flush updates``: a server's steady state, keys written again: 100k keys over 1,024
  vbuckets loaded first, then N writes of random existing keys, flushed 6,000 at a time (as a
  loaded server flushes), history kept (each replaced version is kept for rollback);
* ``growth`` at each of ``--keys`` K: a bucket of 1,024 vbuckets filled with K keys (random,
  incompressible 100-byte values), flushed 6,000 items at a time, then N writes of random
  existing keys flushed the same way; per item of each phase: the flusher's CPU (its thread,
  in ``flush_once``), the engine's background threads' CPU (RocksDB's memtable flushes and
  compactions; SQLite has none), and the bytes the process wrote to disk (``/proc/self/io``,
  the final shutdown's included);
* SQLite's layout choice: N items spread over 64 vbuckets, flushed as one transaction in one
  file (the design), one transaction per vbucket in one file, and one file per vbucket.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from _report import bench_main, write_json
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import STORAGE_ENGINES, Bucket
from dcpkv.engine.item import Item
from dcpkv.engine.storage import Storage, VBState
from dcpkv.engine.vbucket import VBucket

VALUE = b"x" * 100
PER_FLUSH = 6_000
_TICK = os.sysconf("SC_CLK_TCK")


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} items/s  ({seconds:.3f} s)"


@contextmanager
def _bucket(engine: str, vbs: int, **kwargs: object) -> Iterator[Bucket]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        bucket = Bucket(
            "bench", Path(tmp), num_vbuckets=vbs, rng=random.Random(1), memory_quota=1 << 34,
            storage=engine, **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip
        try:
            yield bucket
        finally:
            if not bucket.closed:
                bucket.shutdown()


def bench_bucket(n: int, synchronous: str, engine: str) -> tuple[float, float]:
    with _bucket(engine, 1, synchronous=synchronous) as bucket:
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
        return set_time, flush_time


def bench_small_flushes(n: int, engine: str, vbs: int = 1024, per_vb: int = 2) -> float:
    """Seconds spent in ``flush_once`` for N items written ``per_vb`` per vbucket per flush."""
    with _bucket(engine, vbs, synchronous="NORMAL") as bucket:
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
        return flushing


def bench_update_flushes(n: int, engine: str, keys: int = 100_000) -> float:
    """Seconds spent in ``flush_once`` for N overwrites of existing keys (module docstring)."""
    rng = random.Random(7)
    with _bucket(engine, 1024) as bucket:
        vbuckets = [bucket.set_vbucket_state(vb, VBucketState.ACTIVE) for vb in range(1024)]
        for i in range(keys):
            vbuckets[i % 1024].set(b"key-%08d" % i, VALUE)
        bucket.flush_once()
        flushing, done = 0.0, 0
        while done < n:
            for _ in range(min(PER_FLUSH, n - done)):
                i = rng.randrange(keys)
                vbuckets[i % 1024].set(b"key-%08d" % i, VALUE)
            start = time.perf_counter()
            done += bucket.flush_once()
            flushing += time.perf_counter() - start
        return flushing


def _written() -> int:
    """Bytes this process has caused to be written to storage."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))


def _other_threads_cpu() -> float:
    """CPU seconds of every thread of this process but this one (the engine's own)."""
    me, total = threading.get_native_id(), 0
    for task in os.listdir("/proc/self/task"):
        if int(task) == me:
            continue
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (a thread that ended meanwhile)
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


@dataclass
class Phase:
    """Per item of one phase of ``growth``."""

    items: int = 0
    flusher_cpu: float = 0.0  # seconds, the flusher's thread in flush_once
    background_cpu: float = 0.0  # seconds, the engine's own threads
    wall: float = 0.0
    written: int = 0  # bytes to disk
    marks: list[float] = field(default_factory=list)

    def line(self) -> str:
        n = max(1, self.items)
        return (
            f"flusher {self.flusher_cpu / n * 1e6:6.2f} us, background "
            f"{self.background_cpu / n * 1e6:5.2f} us, wall {self.wall / n * 1e6:6.1f} us, "
            f"disk {self.written / n:7.0f} B per item"
        )


def _flushed(bucket: Bucket, phase: Phase, write: Callable[[int], None], total: int) -> None:
    """Write ``total`` items with ``write(i)``, flushing every PER_FLUSH, into ``phase``."""
    done = 0
    while done < total:
        for i in range(done, min(total, done + PER_FLUSH)):
            write(i)
        cpu, wall = time.thread_time(), time.perf_counter()
        done += bucket.flush_once()
        phase.flusher_cpu += time.thread_time() - cpu
        phase.wall += time.perf_counter() - wall
    phase.items += done


def bench_growth(keys: int, updates: int, engine: str) -> tuple[Phase, Phase]:
    """The ``growth`` row (module docstring): the fill, then the updates."""
    rng = random.Random(11)
    load, update = Phase(), Phase()
    with _bucket(engine, 1024) as bucket:
        vbs: list[VBucket] = [bucket.set_vbucket_state(v, VBucketState.ACTIVE) for v in range(1024)]
        bucket.flush_once()

        def put(i: int) -> None:
            vbs[i % 1024].set(b"key-%012d" % i, rng.randbytes(100))

        for phase, write, total in (
            (load, put, keys),
            (update, lambda _: put(rng.randrange(keys)), updates),
        ):
            written, background = _written(), _other_threads_cpu()
            _flushed(bucket, phase, write, total)
            phase.background_cpu = _other_threads_cpu() - background
            if phase is update:
                bucket.shutdown()  # (its writes count: a checkpoint, a memtable flush)
            phase.written = _written() - written
    return load, update


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


def _ratio(figures: dict[str, float], name: str) -> str:
    sqlite, rocks = figures.get(f"{name}_sqlite"), figures.get(f"{name}_rocksdb")
    return f"  rocksdb / sqlite {rocks / sqlite:.2f}x" if sqlite and rocks else ""


def _flush_rows(n: int, figures: dict[str, float]) -> None:
    for engine in STORAGE_ENGINES:
        for sync in ("FULL", "NORMAL"):
            set_time, flush_time = bench_bucket(n, sync, engine)
            if sync == "FULL" and engine == STORAGE_ENGINES[0]:
                print(f"  set into one vbucket                {_rate(n, set_time)}")
                figures["set_items_per_s"] = n / set_time
            name = f"flush_{sync.lower()}_items_per_s"
            figures[f"{name}_{engine}"] = n / flush_time
            print(f"  flush 1 vb, sync={sync:<7} {engine:<8} {_rate(n, flush_time)}"
                  f"{_ratio(figures, name)}")  # fmt: skip
    for engine in STORAGE_ENGINES:
        seconds = bench_small_flushes(n, engine)
        figures[f"flush_1024vb_x2_items_per_s_{engine}"] = n / seconds
        print(f"  flush 1024 vb x 2 items {engine:<8}   {_rate(n, seconds)}"
              f"{_ratio(figures, 'flush_1024vb_x2_items_per_s')}")  # fmt: skip
    for engine in STORAGE_ENGINES:
        seconds = bench_update_flushes(n, engine)
        figures[f"flush_updates_items_per_s_{engine}"] = n / seconds
        print(f"  flush updates, 100k keys {engine:<8}  {_rate(n, seconds)}"
              f"{_ratio(figures, 'flush_updates_items_per_s')}")  # fmt: skip


def _growth_rows(keys: int, updates: int, figures: dict[str, float]) -> None:
    for engine in STORAGE_ENGINES:
        for phase_name, phase in zip(
            ("fill", "updates"), bench_growth(keys, updates, engine), strict=True
        ):
            print(f"  growth {keys:>9,} keys, {phase_name:<7} {engine:<8} {phase.line()}")
            n = max(1, phase.items)
            stem = f"growth_{keys}_{phase_name}"
            figures[f"{stem}_flusher_cpu_us_per_item_{engine}"] = phase.flusher_cpu / n * 1e6
            figures[f"{stem}_background_cpu_us_per_item_{engine}"] = phase.background_cpu / n * 1e6
            figures[f"{stem}_disk_bytes_per_item_{engine}"] = phase.written / n
    for phase_name in ("fill", "updates"):
        stem = f"growth_{keys}_{phase_name}"
        cpu = [figures[f"{stem}_flusher_cpu_us_per_item_{e}"] for e in STORAGE_ENGINES]
        disk = [figures[f"{stem}_disk_bytes_per_item_{e}"] for e in STORAGE_ENGINES]
        print(f"    {stem}: sqlite / rocksdb flusher CPU {cpu[0] / cpu[1]:.1f}x, "
              f"disk written {disk[0] / disk[1]:.1f}x")  # fmt: skip


def main(
    n: Annotated[int, typer.Argument(help="items")] = 100_000,
    keys: Annotated[str, typer.Option(help="bucket sizes of the growth rows")] = "100000",
    rounds: Annotated[int, typer.Option(help="times over, engines back to back")] = 1,
    layout: Annotated[bool, typer.Option(help="SQLite's layout rows")] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    print(f"engine benchmark, {n:,} items of {len(VALUE)} bytes, engines {STORAGE_ENGINES}")
    figures: dict[str, float] = {}
    for r in range(rounds):
        if rounds > 1:
            print(f" round {r + 1}")
        _flush_rows(n, figures)
        for size in (int(k) for k in keys.split(",") if k):
            _growth_rows(size, n, figures)
    if layout:
        for kind in ("one txn", "txn per vb", "file per vb"):
            seconds = bench_layout(n, 64, kind)
            print(f"  64 vbs, {kind:<12} (sqlite)    {_rate(n, seconds)}")
            figures[f"flush_64vb_{kind.replace(' ', '_')}_items_per_s"] = n / seconds
    write_json(json_out, "engine", figures)


if __name__ == "__main__":
    bench_main(main)
