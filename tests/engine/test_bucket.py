"""The bucket: flusher, warm-up after clean and unclean shutdowns, replicas, rollback, memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from dcpkv.core.failover_table import FailoverEntry, FailoverTable
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.item import Item, KeyNotFound, NotMyVbucket, TempFail

from .conftest import BucketFactory


def test_missing_vbucket_is_not_my_vbucket(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    with pytest.raises(NotMyVbucket):
        bucket.get_vbucket(0)
    with pytest.raises(NotMyVbucket):
        bucket.set_vbucket_state(99, "active")


def test_flusher_persists_whole_snapshots_with_state(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set(b"a", b"1")
    vb.set(b"b", b"1")
    vb.set(b"a", b"2")
    vb.delete(b"b")
    assert vb.persisted_seqno == 0
    assert bucket.flush_once() == 2  # deduplicated: a@3 and the tombstone b@4
    assert vb.persisted_seqno == 4
    assert vb.peek(b"b") is None  # persisted tombstone dropped from the hash table
    state = bucket.storage.vbucket_state(0)
    assert state is not None
    assert (state.state, state.high_seqno, state.snap_end) == ("active", 4, 4)
    assert FailoverTable.from_json(state.failover_json, 4) == vb.failover
    scanned = [(i.key, i.by_seqno, i.deleted) for i in bucket.storage.scan_by_seqno(0, 0)]
    assert scanned == [(b"a", 3, False), (b"b", 4, True)]
    assert bucket.flush_once() == 0


def test_warmup_after_clean_shutdown_keeps_failover_table(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    bucket.set_vbucket_state(1, VBucketState.REPLICA)
    for i in range(10):
        vb.set(b"k%d" % i, b"v%d" % i, flags=i)
    table, cas = vb.failover, vb.peek(b"k3").cas  # type: ignore[union-attr]
    bucket.shutdown()
    again = open_bucket()
    assert again.warmed_up_after_clean_shutdown
    vb2 = again.get_vbucket(0)
    assert vb2.failover == table
    assert vb2.high_seqno == vb2.persisted_seqno == 10
    assert vb2.get(b"k3").value == b"v3" and vb2.get(b"k3").cas == cas
    assert vb2.set(b"new", b"x").cas > cas  # the HLC continues above the persisted max CAS
    assert again.get_vbucket(1).state == VBucketState.REPLICA


_CHILD = """
import os, random, sys
from dcpkv.engine.bucket import Bucket
bucket = Bucket("default", sys.argv[1], num_vbuckets=4, rng=random.Random(5))
vb = bucket.set_vbucket_state(0, "active")
for i in range(20):
    vb.set(b"flushed%d" % i, b"v")
bucket.flush_once()
for i in range(5):
    vb.set(b"lost%d" % i, b"v")
print(vb.failover.to_json(), flush=True)
sys.stdin.read()  # wait to be killed
"""


def test_warmup_after_sigkill_cuts_a_new_branch(tmp_path: Path, open_bucket: BucketFactory) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), str(tmp_path / "data")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    table_before = child.stdout.readline()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    before = FailoverTable.from_json(table_before, 0)

    bucket = open_bucket()
    assert not bucket.warmed_up_after_clean_shutdown
    vb = bucket.get_vbucket(0)
    assert vb.high_seqno == 20
    assert len(vb.failover) == 2
    assert vb.failover.latest.seqno == 20  # the last persisted snapshot's end
    assert vb.failover.entries[1:] == before.entries
    assert vb.get(b"flushed19").value == b"v"
    with pytest.raises(KeyNotFound):
        vb.get(b"lost0")
    # the new entry is already on disk
    state = bucket.storage.vbucket_state(0)
    assert state is not None and FailoverTable.from_json(state.failover_json, 20) == vb.failover


def test_unclean_without_subprocess_and_replicas_get_no_entry(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    bucket.set_vbucket_state(0, VBucketState.ACTIVE).set(b"a", b"1")
    bucket.set_vbucket_state(1, VBucketState.REPLICA)
    bucket.flush_once()
    bucket.storage.close()  # dropped without shutdown()
    again = open_bucket()
    assert len(again.get_vbucket(0).failover) == 2
    assert len(again.get_vbucket(1).failover) == 1


def test_becoming_active_cuts_a_branch_and_writes_go_on(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    vb.replica_snapshot_marker(1, 3)
    for seqno in (1, 3):
        vb.set_with_meta(Item(b"k%d" % seqno, b"v", cas=1000 + seqno, rev_seqno=4, by_seqno=seqno))
    bucket.flush_once()  # (where the branch starts when not: the table below)
    bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    assert vb.failover.latest.seqno == 3
    assert vb.set(b"x", b"y").by_seqno == 4


def test_replica_preserves_seqnos_and_resumes(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(2, VBucketState.REPLICA)
    with pytest.raises(NotMyVbucket):
        vb.set(b"a", b"1")
    vb.replica_snapshot_marker(0, 10)
    vb.set_with_meta(Item(b"a", b"1", flags=5, cas=77, rev_seqno=9, by_seqno=4))
    vb.delete_with_meta(Item(b"b", cas=78, rev_seqno=2, by_seqno=7, delete_time=123))
    item = vb.peek(b"a")
    assert item is not None and (item.by_seqno, item.cas, item.rev_seqno) == (4, 77, 9)
    bucket.flush_once()
    state = bucket.storage.vbucket_state(2)
    assert state is not None
    # inside a snapshot: the persisted range says so, for the stream request on resume
    assert (state.high_seqno, state.snap_start, state.snap_end) == (7, 0, 10)
    stored = {i.key: i for i in bucket.storage.scan_by_seqno(2, 0)}
    assert (stored[b"a"].by_seqno, stored[b"a"].cas, stored[b"a"].rev_seqno) == (4, 77, 9)
    assert stored[b"b"].deleted and stored[b"b"].delete_time == 123
    bucket.set_vbucket_state(2, VBucketState.DEAD)
    with pytest.raises(NotMyVbucket):
        vb.set_with_meta(Item(b"c", b"1", cas=79, by_seqno=8))


def test_replica_rollback_via_bucket(open_bucket: BucketFactory) -> None:
    bucket = open_bucket(history_window=1000)
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    seqno = 0
    for round_ in range(3):
        vb.replica_snapshot_marker(seqno + 1, seqno + 2)
        for key in (b"a", b"b"):
            seqno += 1
            vb.set_with_meta(Item(key, b"%d" % round_, cas=seqno, by_seqno=seqno))
        bucket.flush_once()
    vb.replica_snapshot_marker(7, 8)
    vb.set_with_meta(Item(b"c", b"x", cas=7, by_seqno=7))  # not flushed yet
    cursor = vb.checkpoints.register_cursor("dcp", 0)
    assert bucket.rollback(0, 5) == 4
    assert vb.high_seqno == vb.persisted_seqno == 4
    assert vb.peek(b"a").value == b"1" and vb.peek(b"c") is None  # type: ignore[union-attr]
    assert cursor is None or cursor.dropped
    assert bucket.rollback(0, 0) == 0
    assert vb.items() == [] and vb.high_seqno == 0
    bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    with pytest.raises(NotMyVbucket):
        bucket.rollback(0, 0)


def test_compaction_via_bucket(open_bucket: BucketFactory, clock) -> None:  # type: ignore[no-untyped-def]
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set(b"a", b"1")
    vb.set(b"b", b"1")
    vb.delete(b"a")
    bucket.flush_once()
    clock.advance(3600)
    result = bucket.compact(purge_older_than_secs=60)[0]
    assert (result.purged, result.purge_seqno) == (1, 3)
    assert vb.purge_seqno == 3
    bucket.shutdown()
    assert open_bucket().get_vbucket(0).purge_seqno == 3


def test_eviction_and_tempfail(open_bucket: BucketFactory) -> None:
    bucket = open_bucket(memory_quota=200_000)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    value = b"x" * 1000
    with pytest.raises(TempFail):
        for i in range(1000):
            vb.set(b"k%d" % i, value)
    written = vb.high_seqno
    assert written < 1000
    bucket.flush_once()
    for i in range(written, written + 50):  # persisted values can now be ejected
        vb.set(b"k%d" % i, value)
    assert bucket.memory_used <= bucket.memory_quota
    assert any(item.value is None for item in vb.items())
    assert vb.get(b"k0").value == value  # read back from storage
    # An append on an ejected value fetches it, then is admitted; when that admission reclaims
    # memory it may eject the value again and answer TempFail ("retry"), as it does after some
    # write counts with any accounting. A client retries; the retry finds the headroom the
    # reclaim made.
    for _ in range(3):
        try:
            vb.append(b"k1", b"!")
            break
        except TempFail:
            continue
    assert vb.get(b"k1").value == value + b"!"


# The failover entry a vbucket cuts when it becomes active (``VBucket.branch_point``): a
# promoted replica at the last complete snapshot it persisted, anything else at its high seqno.
# Each case: the state it is promoted from, the snapshots it received as (marker start, marker
# end, items received), whether the last one was flushed, and where the new entry starts.
BRANCH_POINTS = [
    ("replica, all persisted", VBucketState.REPLICA, [(1, 4, 4)], True, 4),
    (
        "replica, last snapshot only in memory",
        VBucketState.REPLICA,
        [(1, 4, 4), (5, 8, 4)],
        False,
        4,
    ),
    ("replica, partial snapshot persisted", VBucketState.REPLICA, [(1, 4, 4), (5, 8, 2)], True, 5),
    ("pending (a drained takeover)", VBucketState.PENDING, [(1, 4, 4), (5, 8, 2)], False, 6),
]


@pytest.mark.parametrize(
    ("state", "snapshots", "flush_last", "entry"),
    [case[1:] for case in BRANCH_POINTS],
    ids=[case[0] for case in BRANCH_POINTS],
)
def test_promotion_branches_at_the_last_complete_persisted_snapshot(
    open_bucket: BucketFactory,
    state: VBucketState,
    snapshots: list[tuple[int, int, int]],
    flush_last: bool,
    entry: int,
) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, state)
    for n, (start, end, received) in enumerate(snapshots):
        vb.replica_snapshot_marker(start, end)
        for seqno in range(start, start + received):
            vb.set_with_meta(Item(b"k%d" % seqno, b"v", cas=seqno, by_seqno=seqno))
        if n < len(snapshots) - 1 or flush_last:
            bucket.flush_once()
    old = vb.failover.entries
    bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    assert vb.failover.entries[1:] == old and vb.failover.entries[0].seqno == entry


def test_divergence_names_what_a_rollback_undoes(open_bucket: BucketFactory) -> None:
    """Before rolling back, a replica can tell, key by key, its latest version and the one it
    would return to: what a repair of the new active needs (spec 002, figure 8)."""
    bucket = open_bucket(history_window=1000)
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    writes = [  # (seqno, key, value or None for a deletion), one snapshot per flush
        [(1, b"a", b"a1"), (2, b"b", b"b1"), (3, b"gone", b"g1")],
        [(4, b"a", b"a2"), (5, b"new", b"n1"), (6, b"gone", None)],
        [(7, b"new", b"n2")],  # memory only: divergence flushes it first
    ]
    for n, snapshot in enumerate(writes):
        vb.replica_snapshot_marker(snapshot[0][0], snapshot[-1][0])
        for seqno, key, value in snapshot:
            item = Item(key, value or b"", cas=100 + seqno, by_seqno=seqno)
            _ = vb.set_with_meta(item) if value else vb.delete_with_meta(item)
        if n < 2:
            bucket.flush_once()
    found = {ours.key: (ours, old) for ours, old in bucket.divergence(0, 3)}
    assert sorted(found) == [b"a", b"gone", b"new"]  # b is the same at 3
    ours, old = found[b"a"]
    assert (ours.value, ours.by_seqno, old and old.value, old and old.cas) == (b"a2", 4, b"a1", 101)
    ours, old = found[b"gone"]
    assert ours.deleted and old is not None and old.value == b"g1"
    ours, old = found[b"new"]
    assert (ours.value, ours.by_seqno, old) == (b"n2", 7, None)
    assert bucket.divergence(0, 7) == []  # nothing above the high seqno
    assert bucket.rollback(0, 3) == 3  # the rollback lands where divergence said
    assert vb.peek(b"a").value == b"a1"  # type: ignore[union-attr]


def _write_to(bucket: Bucket, vbs: list[int]) -> None:
    for vb in vbs:
        bucket.get_vbucket(vb).set(b"key-%d" % vb, b"v")


def _promote(bucket: Bucket, vbs: list[int]) -> None:
    for vb in vbs:
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)


def _adopt_log(bucket: Bucket, vbs: list[int]) -> None:
    for vb in vbs:
        bucket.get_vbucket(vb).adopt_failover_log([FailoverEntry(1000 + vb, 0)])


# (what happens between two flushes, to which vbuckets, the vbuckets the next flush visits)
FLUSH_QUEUE_CASES = [
    ("nothing", None, [], []),
    ("writes to three vbuckets", _write_to, [3, 17, 39], [3, 17, 39]),
    ("two writes to one vbucket", _write_to, [5, 5], [5]),
    ("a replica promoted (a state to write, no item)", _promote, [40], [40]),
    ("a replica adopts its producer's log", _adopt_log, [41, 42], [41, 42]),
]


@pytest.mark.parametrize(
    ("change", "vbs", "visited"),
    [case[1:] for case in FLUSH_QUEUE_CASES],
    ids=[case[0] for case in FLUSH_QUEUE_CASES],
)
def test_a_flush_visits_only_the_vbuckets_with_changes(
    open_bucket: BucketFactory,
    change: Callable[[Bucket, list[int]], None] | None,
    vbs: list[int],
    visited: list[int],
) -> None:
    """Counted, not timed: the flusher's work follows what changed, not the vbucket count
    (64 here; the replicas are 40..63), and what it visits it persists."""
    bucket = open_bucket(num_vbuckets=64)
    for vb in range(64):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE if vb < 40 else VBucketState.REPLICA)
    bucket.flush_once()
    assert bucket.flush_once() == 0
    before = bucket.flush_visits
    if change is not None:
        change(bucket, vbs)
    bucket.flush_once()
    assert bucket.flush_visits - before == len(visited)
    for vb in visited:
        vbucket, state = bucket.get_vbucket(vb), bucket.storage.vbucket_state(vb)
        assert state is not None
        assert (state.state, state.high_seqno) == (vbucket.state.label, vbucket.high_seqno)
        assert FailoverTable.from_json(state.failover_json, 0) == vbucket.failover
    after = bucket.flush_visits
    assert bucket.flush_once() == 0 and bucket.flush_visits == after  # nothing left to visit


def test_warmup_past_the_value_fraction_loads_keys_and_metadata_only(
    open_bucket: BucketFactory,
) -> None:
    """Once warm-up has loaded values up to its fraction of the quota, the other vbuckets
    come back without them (not resident): their metadata exact, their values read from disk."""
    bucket = open_bucket(memory_quota=1 << 30)
    written: dict[bytes, Item] = {}
    for vbid in range(4):
        vb = bucket.set_vbucket_state(vbid, VBucketState.ACTIVE)
        for i in range(20):
            written[b"%d-%d" % (vbid, i)] = vb.set(
                b"%d-%d" % (vbid, i), b"x" * 2000, flags=0xFFFFFFFF, expiry=0, datatype=0
            )
    written[b"0-0"] = bucket.get_vbucket(0).set(b"0-0", b"big", cas=written[b"0-0"].cas)
    bucket.shutdown()
    again = open_bucket(memory_quota=60_000)  # values of about one vbucket fit in 80 %
    items = {i.key: i for vbid in range(4) for i in again.get_vbucket(vbid).items()}
    assert sorted(items) == sorted(written)
    assert {k: (i.by_seqno, i.cas, i.flags, i.rev_seqno) for k, i in items.items()} == {
        k: (i.by_seqno, i.cas, i.flags, i.rev_seqno) for k, i in written.items()
    }
    ejected = [k for k, i in items.items() if i.value is None]
    assert ejected and len(ejected) < len(items)
    for key in ejected:
        vbid = int(key.split(b"-")[0])
        assert again.get_vbucket(vbid).get(key).value == written[key].value


def test_no_admitted_write_takes_the_bucket_over_its_quota(open_bucket: BucketFactory) -> None:
    """After every write admitted, whether admitting it recounted, reclaimed or did neither,
    the bucket holds at most its quota (values persisted as it goes, so reclaims can eject)."""
    bucket = open_bucket(memory_quota=100_000)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    value = b"x" * 10_000  # a write's charge is ~20 % of the quota: one too many shows
    for i in range(200):
        with contextlib.suppress(TempFail):  # refused: nothing stored
            vb.set(b"k%d" % i, value)
        assert bucket.memory_used <= bucket.memory_quota, f"after write {i}"
        if i % 3 == 2:
            bucket.flush_once()
