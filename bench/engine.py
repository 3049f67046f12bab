"""Engine throughput: front-end sets into a vbucket, and flushes to storage (RocksDB).

Run: ``.venv/bin/python bench/engine.py [N] [--keys 100000,1000000] [--rounds R] [--before
COMMIT] [--json PATH]`` (default N = 100,000; ``BENCH_DIR`` picks the filesystem, default the
temp dir). The rows run ``--rounds`` times over and print items/s (``--json`` also writes them
for ``make bench``'s summary) for:

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
  compactions), and the bytes the process wrote to disk (``/proc/self/io``, the final
  shutdown's included).

``--before COMMIT`` (``make bench``: the last commit with the SQLite engine, ``bench/_before.py``)
runs that commit's own ``bench/engine.py`` after each round of today's, in a detached worktree,
with the same N and ``--keys``: its rows for each engine it had (``sqlite``, ``rocksdb``) are
printed and kept as ``before_METRIC_ENGINE``, and each of today's figures is printed beside
theirs as a ratio (this host's speed swings: only ratios of one run hold).
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
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from _before import old_tree, run_old
from _report import bench_main, rounds, write_json
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.vbucket import VBucket

VALUE = b"x" * 100
PER_FLUSH = 6_000
FLUSH_ROUNDS = 5  # of each flush row, between yardstick samples
BEFORE_ROUNDS = 3  # runs of the old commit's engine.py (--before): its rows are short too
_TICK = os.sysconf("SC_CLK_TCK")


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} items/s  ({seconds:.3f} s)"


@contextmanager
def _bucket(vbs: int, **kwargs: object) -> Iterator[Bucket]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        bucket = Bucket(
            "bench", Path(tmp), num_vbuckets=vbs, rng=random.Random(1), memory_quota=1 << 34,
            **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip
        try:
            yield bucket
        finally:
            if not bucket.closed:
                bucket.shutdown()


def bench_bucket(n: int, synchronous: str) -> tuple[float, float]:
    with _bucket(1, synchronous=synchronous) as bucket:
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


def bench_small_flushes(n: int, vbs: int = 1024, per_vb: int = 2) -> float:
    """Seconds spent in ``flush_once`` for N items written ``per_vb`` per vbucket per flush."""
    with _bucket(vbs, synchronous="NORMAL") as bucket:
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


def bench_update_flushes(n: int, keys: int = 100_000) -> float:
    """Seconds spent in ``flush_once`` for N overwrites of existing keys (module docstring)."""
    rng = random.Random(7)
    with _bucket(1024) as bucket:
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


def bench_growth(keys: int, updates: int) -> tuple[Phase, Phase]:
    """The ``growth`` row (module docstring): the fill, then the updates."""
    rng = random.Random(11)
    load, update = Phase(), Phase()
    with _bucket(1024) as bucket:
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


def _one_bucket(n: int, sync: str) -> dict[str, float]:
    set_time, flush_time = bench_bucket(n, sync)
    out = {f"flush_{sync.lower()}_items_per_s": n / flush_time}
    return out | ({"set_items_per_s": n / set_time} if sync == "FULL" else {})


def _flush_rows(n: int, figures: dict[str, float]) -> None:
    # each row FLUSH_ROUNDS times between yardstick samples: a flush of 100k items takes a
    # fraction of a second, less than this host takes to change speed (bench/_report.py)
    rows: list[tuple[str, Callable[[], dict[str, float]]]] = [
        ("flush 1 vb, sync=FULL   ", partial(_one_bucket, n, "FULL")),
        ("flush 1 vb, sync=NORMAL ", partial(_one_bucket, n, "NORMAL")),
        ("flush 1024 vb x 2 items ",
         lambda: {"flush_1024vb_x2_items_per_s": n / bench_small_flushes(n)}),
        ("flush updates, 100k keys",
         lambda: {"flush_updates_items_per_s": n / bench_update_flushes(n)}),
    ]  # fmt: skip
    for label, measure in rows:
        got = rounds(FLUSH_ROUNDS, measure)
        if "set_items_per_s" in got:
            print(f"  set into one vbucket                {_rate(n, n / got['set_items_per_s'])}")
        rate = next(v for k, v in got.items() if k.startswith("flush_"))
        print(f"  {label}            {_rate(n, n / rate)}")
        figures |= got


def _growth_rows(keys: int, updates: int, figures: dict[str, float]) -> None:
    for phase_name, phase in zip(("fill", "updates"), bench_growth(keys, updates), strict=True):
        print(f"  growth {keys:>9,} keys, {phase_name:<7} {phase.line()}")
        n = max(1, phase.items)
        stem = f"growth_{keys}_{phase_name}"
        figures[f"{stem}_flusher_cpu_us_per_item"] = phase.flusher_cpu / n * 1e6
        figures[f"{stem}_background_cpu_us_per_item"] = phase.background_cpu / n * 1e6
        figures[f"{stem}_disk_bytes_per_item"] = phase.written / n


def _beside(figures: dict[str, float], before: dict[str, float]) -> None:
    """Each of today's figures against the old run's figure of each engine."""
    print("  today / before (the old commit's engines, same run):")
    for name, value in figures.items():
        theirs = {e: before.get(f"before_{name}_{e}") for e in ("sqlite", "rocksdb")}
        theirs["both"] = before.get(f"before_{name}")  # (a row the old run had once)
        said = [f"{e} {value / v:.2f}x" for e, v in theirs.items() if v]
        if said:
            print(f"    {name:<48} {', '.join(said)}")


def main(
    n: Annotated[int, typer.Argument(help="items")] = 100_000,
    keys: Annotated[str, typer.Option(help="bucket sizes of the growth rows")] = "100000",
    times: Annotated[int, typer.Option("--rounds", help="times over")] = 1,
    before: Annotated[
        str | None,
        typer.Option(help="also run this commit's bench/engine.py after each round (SQLite)"),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    print(f"engine benchmark, {n:,} items of {len(VALUE)} bytes")
    figures: dict[str, float] = {}
    old: dict[str, float] = {}
    with old_tree(before) as tree:
        for r in range(times):
            if times > 1:
                print(f" round {r + 1}")
            _flush_rows(n, figures)
            for size in (int(k) for k in keys.split(",") if k):
                _growth_rows(size, n, figures)
            if tree is not None:
                old = run_old(tree, "engine.py", [str(n), "--keys", keys, "--no-layout"],
                              times=BEFORE_ROUNDS)  # fmt: skip
                _beside(figures, old)
    write_json(json_out, "engine", {**figures, **old})


if __name__ == "__main__":
    bench_main(main)
