"""Fixtures for the engine tests: real storage in tmp_path, a manual clock, a seeded rng."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dcpkv.core.failover_table import FailoverTable
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.vbucket import VBucket

BucketFactory = Callable[..., Bucket]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def vbucket(clock: ManualClock) -> VBucket:
    return VBucket(
        0, VBucketState.ACTIVE, clock=clock, failover=FailoverTable.fresh(0, rng=random.Random(1))
    )


@pytest.fixture
def open_bucket(tmp_path: Path, clock: ManualClock) -> Iterator[BucketFactory]:
    opened: list[Bucket] = []

    def factory(**kwargs: object) -> Bucket:
        kwargs.setdefault("num_vbuckets", 4)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("rng", random.Random(len(opened) + 7))
        bucket = Bucket("default", tmp_path / "data", **kwargs)  # type: ignore[arg-type]
        opened.append(bucket)
        return bucket

    yield factory
    for bucket in opened:
        if not bucket.closed:
            bucket.stop_background_fetch()
            bucket.storage.close()
