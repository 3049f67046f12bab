"""The flusher's cadence: the case table of ``engine/flush_cadence.py``, then a real bucket's
backlog (counted, O(1)) and :meth:`Bucket.flush_if_due` on it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.flush_cadence import (
    BIG_FLUSH_ITEMS,
    DENSE_ITEMS_PER_VBUCKET,
    SPARSE_WAIT_INTERVALS,
    Backlog,
    due,
)
from dcpkv.engine.item import TempFail

from .conftest import BucketFactory

INTERVAL = 0.05
OLD = SPARSE_WAIT_INTERVALS * INTERVAL  # the age at which a sparse backlog is written anyway


def backlog(items: int = 0, vbuckets: int = 0, lag_s: float = 0.0, *, state: bool = False,
            wanted: bool = False, last_flush: int = 0) -> Backlog:  # fmt: skip
    return Backlog(items=items, vbuckets=vbuckets, lag_s=lag_s, state=state, wanted=wanted,
                   last_flush=last_flush)  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    backlog: Backlog
    flush: bool
    waiting: bool = False


CASES = [
    Case("N: nothing", backlog(), False),
    Case("N: nothing, even with someone waiting", backlog(), False, waiting=True),
    Case("W: a client asked (ObserveSeqno below the high seqno)",
         backlog(1, 1, 0.0, wanted=True), True),
    Case("W: parked SeqnoPersistence or held writers", backlog(1, 1, 0.0), True, waiting=True),
    Case("S: a vbucket state to write, no items", backlog(0, 1, state=True), True),
    Case("S: a state among a sparse backlog", backlog(3, 100, 0.0, state=True), True),
    Case("B: a big backlog however wide", backlog(BIG_FLUSH_ITEMS, 1024, 0.0), True),
    Case("B: the previous flush was big (a stall thinned this tick's backlog)",
         backlog(BIG_FLUSH_ITEMS // 2, 1024, 0.0, last_flush=BIG_FLUSH_ITEMS), True),
    Case("G: the previous flush was not big", backlog(500, 400, 0.0, last_flush=1500), False),
    Case("D: dense (4 items a vbucket)", backlog(DENSE_ITEMS_PER_VBUCKET * 10, 10, 0.0), True),
    Case("G: just under dense, young",
         backlog(DENSE_ITEMS_PER_VBUCKET * 10 - 1, 10, OLD / 2), False),
    Case("G: wide and light (10k writes/s over 1,024 vbuckets, one tick)",
         backlog(500, 400, INTERVAL), False),
    Case("A: the same, old enough", backlog(500, 400, OLD), True),
    Case("G: one write, just younger than the bound", backlog(1, 1, OLD * 0.99), False),
    Case("A: one write at the bound", backlog(1, 1, OLD), True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_due(case: Case) -> None:
    assert due(case.backlog, INTERVAL, waiting=case.waiting) is case.flush


def test_the_bound_scales_with_the_interval() -> None:
    """A longer ``--flush-interval`` lets a sparse backlog wait as many intervals, no more."""
    assert not due(backlog(1, 1, 2.9), 1.0)
    assert due(backlog(1, 1, 3.0), 1.0)


# -- a real bucket ---------------------------------------------------------------------------


def _active(open_bucket: BucketFactory, vbuckets: int) -> Bucket:
    """A new bucket with every vbucket set active (their states not yet flushed)."""
    bucket = open_bucket(num_vbuckets=vbuckets)
    for vb in range(vbuckets):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    return bucket


def test_backlog_counts_items_and_vbuckets_and_a_flush_resets_it(
    open_bucket: BucketFactory,
) -> None:
    bucket = _active(open_bucket, 64)
    assert bucket.backlog() == backlog(0, 64, 0.0, state=True)  # new vbuckets' states
    bucket.flush_once()
    assert bucket.backlog() == backlog(0, 0, 0.0)
    for vb in (1, 2, 3):
        bucket.get_vbucket(vb).set(b"k%d" % vb, b"v")
    bucket.get_vbucket(3).set(b"k3", b"v2")
    got = bucket.backlog()
    assert (got.items, got.vbuckets, got.state, got.wanted) == (4, 3, False, False)
    assert got.lag_s >= 0.0
    bucket.want_persistence()
    assert bucket.backlog().wanted
    assert bucket.flush_once() == 3  # one row per key
    assert bucket.backlog() == backlog(0, 0, 0.0, last_flush=3)


def test_flush_if_due_lets_a_sparse_backlog_gather_and_writes_it_when_asked(
    open_bucket: BucketFactory,
) -> None:
    bucket = _active(open_bucket, 64)
    assert bucket.flush_if_due(INTERVAL) == 0  # states only: written at once (case S)
    assert not bucket.backlog().state and bucket.flushes_deferred == 0
    for vb in range(10):
        bucket.get_vbucket(vb).set(b"key%d" % vb, b"v")
    vb0 = bucket.get_vbucket(0)
    assert bucket.flush_if_due(3600.0) == 0  # sparse and young: gathers
    assert bucket.flushes_deferred == 1 and vb0.persisted_seqno == 0
    bucket.want_persistence()  # ObserveSeqno saw it unpersisted
    assert bucket.flush_if_due(3600.0) == 10
    assert vb0.persisted_seqno == vb0.high_seqno
    assert bucket.flush_if_due(3600.0) == 0 and bucket.flushes_deferred == 1  # (nothing: N)


def test_flush_if_due_writes_a_dense_backlog_at_once(open_bucket: BucketFactory) -> None:
    bucket = _active(open_bucket, 4)
    bucket.flush_once()
    for i in range(DENSE_ITEMS_PER_VBUCKET * 4):
        key = b"dense-%d" % i
        bucket.get_vbucket(bucket.vbucket_for(key)).set(key, b"v")
    assert bucket.flush_if_due(3600.0) == DENSE_ITEMS_PER_VBUCKET * 4
    assert bucket.flushes_deferred == 0


def test_a_failed_flush_is_due_again_at_once(
    open_bucket: BucketFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batches of a failed flush come back as state to write (case S): the retry does not
    wait for the sparse bound."""
    bucket = _active(open_bucket, 64)
    bucket.flush_once()
    bucket.get_vbucket(5).set(b"one", b"v")

    def disk_full(*_args: object) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(bucket.storage, "persist", disk_full)
    bucket.want_persistence()
    with pytest.raises(OSError):
        bucket.flush_if_due(3600.0)
    monkeypatch.undo()
    assert bucket.backlog().state
    assert bucket.flush_if_due(3600.0) == 1


def test_a_bucket_over_its_quota_flushes_a_sparse_backlog_at_once(
    open_bucket: BucketFactory,
) -> None:
    """Writes refused over the quota wait for persisted values to eject: the flusher does not
    let that backlog gather (case W)."""
    bucket = open_bucket(num_vbuckets=1024, memory_quota=1_000_000)
    for vb in range(1024):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    bucket.flush_once()
    refused = 0
    for i in range(5_000):
        key = b"big-%d" % i
        try:
            bucket.get_vbucket(bucket.vbucket_for(key)).set(key, b"v" * 1000)
        except TempFail:
            refused += 1
            break
    assert refused, "the quota never refused a write"
    sparse = bucket.backlog()
    assert sparse.items < DENSE_ITEMS_PER_VBUCKET * sparse.vbuckets  # not due for its shape
    assert sparse.wanted
    assert bucket.flush_if_due(3600.0) > 0
