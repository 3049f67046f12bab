"""The request-path cost of full eviction: engine operations on non-resident keys.

Run: ``.venv/bin/python bench/eviction.py [--items N] [--ops M] [--rounds R] [--json PATH]``
(default 200,000 items, 20,000 operations per row, 3 rounds; ``BENCH_DIR`` picks the
filesystem). A RocksDB bucket of 64 vbuckets is filled with N keys (100-byte values), flushed
and reopened twice, once per eviction policy; under ``fullEviction`` warm-up loads no items, so
every key is non-resident. Each row then times M operations on random keys, in microseconds per
operation, the two policies interleaved round by round (only same-run ratios hold on this host):

* ``get_hit``: a Get of a written key (valueOnly: resident; fullEviction: a storage read);
* ``get_miss``: a Get of a key never written (fullEviction: a read the bloom filter answers);
* ``set_new``: a Set of a key never written (fullEviction: the write path's read of it);
* ``set_existing``: a Set over a written key (fullEviction: read back, then replaced);
* ``storage_get``: ``RocksStorage.get`` of a written key alone, what the reads above pay;
* ``warmup_s``: the reopen's warm-up, seconds.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from _report import bench_main, write_json
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.item import KeyNotFound

VALUE = b"x" * 100
VBUCKETS = 64


def _key(i: int) -> bytes:
    return b"key-%010d" % i


def _fill(path: Path, items: int) -> None:
    bucket = Bucket("b", path, num_vbuckets=VBUCKETS, memory_quota=1 << 34)
    for vb in range(VBUCKETS):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    for i in range(items):
        key = _key(i)
        bucket.get_vbucket(bucket.vbucket_for(key)).set(key, VALUE)
        if i % 6000 == 5999:
            bucket.flush_once()
    bucket.shutdown()


def _open(path: Path, policy: EvictionPolicy) -> tuple[Bucket, float]:
    started = time.perf_counter()
    bucket = Bucket("b", path, num_vbuckets=VBUCKETS, memory_quota=1 << 34,
                    eviction_policy=policy)  # fmt: skip
    return bucket, time.perf_counter() - started


def _us_per_op(keys: list[bytes], op: Callable[[bytes], object]) -> float:
    started = time.perf_counter()
    for key in keys:
        op(key)
    return (time.perf_counter() - started) / len(keys) * 1e6


def _get(bucket: Bucket) -> Callable[[bytes], object]:
    def get(key: bytes) -> object:
        try:
            return bucket.get_vbucket(bucket.vbucket_for(key)).get(key)
        except KeyNotFound:
            return None

    return get


def _set(bucket: Bucket) -> Callable[[bytes], object]:
    return lambda key: bucket.get_vbucket(bucket.vbucket_for(key)).set(key, VALUE)


def _round(buckets: dict[EvictionPolicy, Bucket], items: int, ops: int, n: int) -> dict[str, float]:
    rng = random.Random(n)
    out: dict[str, float] = {}
    rows = {
        "get_hit": (lambda: [_key(rng.randrange(items)) for _ in range(ops)], _get),
        "get_miss": (lambda: [b"miss-%d-%d" % (n, i) for i in range(ops)], _get),
        "set_new": (lambda: [b"new-%d-%d" % (n, i) for i in range(ops)], _set),
        "set_existing": (lambda: [_key(rng.randrange(items)) for _ in range(ops)], _set),
    }
    for row, (make_keys, op) in rows.items():
        keys = make_keys()
        for policy, bucket in buckets.items():
            out[f"{row}_us_{policy}"] = _us_per_op(keys, op(bucket))
            bucket.flush_once()
    full = buckets[EvictionPolicy.FULL]
    keys = [_key(rng.randrange(items)) for _ in range(ops)]
    out["storage_get_us"] = _us_per_op(keys, lambda k: full.storage.get(full.vbucket_for(k), k))
    return out


def main(
    items: int = typer.Option(200_000, help="keys written before the rows"),
    ops: int = typer.Option(20_000, help="operations per row and round"),
    rounds: int = typer.Option(3, help="rounds (the policies interleaved in each)"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    print(f"eviction bench: {items:,} items of 14+{len(VALUE)} bytes, {VBUCKETS} vbuckets")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        paths = {p: Path(tmp) / p.value for p in EvictionPolicy}
        for path in paths.values():
            _fill(path, items)
        buckets = {}
        for policy, path in paths.items():
            buckets[policy], figures[f"warmup_s_{policy}"] = _open(path, policy)
        try:
            runs = [_round(buckets, items, ops, n) for n in range(rounds)]
        finally:
            for bucket in buckets.values():
                bucket.shutdown()
    for name in runs[0]:
        figures[name] = min(run[name] for run in runs)  # the least disturbed round
    for name, value in sorted(figures.items()):
        print(f"  {name:<34} {value:10.2f}")
    write_json(json_out, "eviction", figures)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)
