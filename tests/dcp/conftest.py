"""Fixtures of the DCP tests."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import ManualClock
from support.dcplink import VBS


@pytest.fixture
def buckets(tmp_path: Path) -> Iterator[Callable[[str, VBucketState], Bucket]]:
    opened: list[Bucket] = []

    def make(name: str, state: VBucketState) -> Bucket:
        clock, rng = ManualClock(1_700_000_000.0), random.Random(len(opened))
        bucket = Bucket("default", tmp_path / name, num_vbuckets=VBS, synchronous="NORMAL",
                        clock=clock, rng=rng)  # fmt: skip
        for vb in range(VBS):
            bucket.set_vbucket_state(vb, state)
        opened.append(bucket)
        return bucket

    yield make
    for bucket in opened:
        if not bucket.closed:
            bucket.storage.close()
