"""SyncWrites in the engine: prepares beside committed values, commits and aborts as items,
the vbucket acting on its durability monitor's decisions (engine/vbucket.py, "SyncWrites")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dcpkv.core.replication_topology import parse_topology
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket, open_storage
from dcpkv.engine.checkpoint import CheckpointManager
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import (
    AbortItem,
    CommitItem,
    DurabilityImpossible,
    Einval,
    Item,
    KeyNotFound,
    PrepareItem,
    SyncWriteInProgress,
    SyncWriteItem,
    SyncWriteReCommitInProgress,
)
from dcpkv.engine.storage import VBState
from dcpkv.engine.subdoc import Mutated
from dcpkv.engine.vbucket import SyncOutcome, VBucket
from dcpkv.protocol.constants import DurabilityLevel

ME = "node-a:11210"
ALONE = parse_topology(b'{"topology": [["node-a:11210"]]}')
WITH_ABSENT_REPLICA = parse_topology(b'{"topology": [["node-a:11210", "replica1"]]}')

MAJORITY = DurabilityLevel.Majority
PERSIST = DurabilityLevel.PersistToMajority


def _answers(vb: VBucket) -> list[SyncOutcome]:
    got: list[SyncOutcome] = []
    vb.on_sync_outcomes = lambda _vb, outcomes: got.extend(outcomes)
    return got


def _queued(vb: VBucket) -> list[Item]:
    cursor = vb.checkpoints.register_cursor("test", 0)
    assert cursor is not None
    snap = cursor.next_snapshot(1000)
    return [] if snap is None else snap.items


def test_no_topology_no_sync_write(vbucket: VBucket) -> None:
    with pytest.raises(DurabilityImpossible):
        vbucket.sync_write(lambda: vbucket.set(b"k", b"v"), MAJORITY)
    assert vbucket.high_seqno == 0  # nothing queued


def test_majority_alone_commits_at_once(vbucket: VBucket) -> None:
    vbucket.set(b"k", b"old")
    vbucket.set_topology(ALONE)
    got = _answers(vbucket)
    prepare = vbucket.sync_write(lambda: vbucket.set(b"k", b"new"), MAJORITY, cookie="c1")
    assert isinstance(prepare, PrepareItem) and prepare.by_seqno == 2
    assert [(o.cookie, o.status) for o in got] == [("c1", Status.Success)]
    commit = got[0].item
    assert isinstance(commit, CommitItem)
    assert (commit.by_seqno, commit.prepared_seqno, commit.value) == (3, 2, b"new")
    assert commit.cas != prepare.cas
    assert vbucket.get(b"k") is commit
    assert not vbucket.hash_table.prepared
    # the commit deduplicates the key's older committed version, never the prepare
    assert [type(i) for i in _queued(vbucket)] == [PrepareItem, CommitItem]


def test_persist_level_waits_for_the_flusher_and_hides_the_prepare(
    vbucket: VBucket,
) -> None:
    vbucket.set(b"k", b"old")
    vbucket.set_topology(ALONE)
    got = _answers(vbucket)
    vbucket.sync_write(lambda: vbucket.set(b"k", b"new"), PERSIST, cookie="c1")
    assert got == []
    assert vbucket.get(b"k").value == b"old"  # no dirty read
    with pytest.raises(SyncWriteInProgress):
        vbucket.set(b"k", b"other")
    with pytest.raises(SyncWriteInProgress):
        vbucket.sync_write(lambda: vbucket.delete(b"k"), MAJORITY)
    batch = vbucket.take_flush_batch()
    assert batch is not None
    vbucket.mark_persisted(batch)
    assert [o.status for o in got] == [Status.Success]
    assert vbucket.get(b"k").value == b"new"
    vbucket.set(b"k", b"after")  # the key is free again


def test_timeout_aborts_and_answers_ambiguous(vbucket: VBucket, clock: ManualClock) -> None:
    vbucket.set(b"k", b"old")
    vbucket.set_topology(WITH_ABSENT_REPLICA)
    got = _answers(vbucket)
    vbucket.sync_write(lambda: vbucket.set(b"k", b"new"), MAJORITY, timeout_ms=500, cookie="c")
    vbucket.durability_tick()
    assert got == []
    clock.advance(0.5)
    vbucket.durability_tick()
    assert [(o.cookie, o.status) for o in got] == [("c", Status.SyncWriteAmbiguous)]
    assert vbucket.get(b"k").value == b"old"
    items = _queued(vbucket)
    assert [type(i) for i in items] == [Item, PrepareItem, AbortItem]
    abort = items[-1]
    assert isinstance(abort, AbortItem) and abort.prepared_seqno == 2
    vbucket.set(b"k", b"free")


def test_leaving_active_answers_ambiguous_and_keeps_the_prepare(vbucket: VBucket) -> None:
    vbucket.set_topology(WITH_ABSENT_REPLICA)
    got = _answers(vbucket)
    vbucket.sync_write(lambda: vbucket.set(b"k", b"new"), MAJORITY, cookie="c")
    vbucket.set_state(VBucketState.REPLICA)
    assert [o.status for o in got] == [Status.SyncWriteAmbiguous]
    assert vbucket.durability is None and b"k" in vbucket.hash_table.prepared
    vbucket.set_state(VBucketState.ACTIVE)
    with pytest.raises(DurabilityImpossible):  # no topology yet
        vbucket.sync_write(lambda: vbucket.set(b"j", b"v"), MAJORITY)
    vbucket.set_topology(ALONE)  # the kept prepare is re-committed
    assert vbucket.get(b"k").value == b"new"


def test_a_promoted_copy_re_commits_its_prepares_and_hides_them_meanwhile(
    vbucket: VBucket,
) -> None:
    """Failover (PROTOCOL.md, "SyncWrites"): the prepare may have been committed by the old
    active, so until the new chain satisfies it a read of its key answers
    SyncWriteReCommitInProgress (neither version may be served) and a write
    SyncWriteInProgress; other keys are served; the high prepared seqno stays reported."""
    vbucket.set(b"k", b"old")
    vbucket.set(b"other", b"v")
    vbucket.set_topology(WITH_ABSENT_REPLICA)
    vbucket.sync_write(lambda: vbucket.set(b"k", b"new"), MAJORITY, cookie="c")
    assert vbucket.get(b"k").value == b"old"  # its own client's prepare: no dirty read
    assert vbucket.high_prepared_seqno == 3
    vbucket.set_state(VBucketState.REPLICA)
    assert vbucket.high_prepared_seqno == 3  # what a failover compares
    vbucket.set_state(VBucketState.ACTIVE)  # promoted, no topology yet
    for read in (lambda: vbucket.get(b"k"), lambda: vbucket.read_any(b"k")):
        with pytest.raises(SyncWriteReCommitInProgress):
            read()
    assert vbucket.get_resident(b"k") is None  # the fast path leaves it to get()
    with pytest.raises(SyncWriteInProgress):
        vbucket.set(b"k", b"mine")
    assert vbucket.get(b"other").value == b"v"
    vbucket.set_topology(parse_topology(b'{"topology": [["node-a:11210", null]]}'))
    with pytest.raises(SyncWriteReCommitInProgress):  # a chain without a majority
        vbucket.get(b"k")
    vbucket.set_topology(ALONE)
    assert vbucket.get(b"k").value == b"new"
    assert not vbucket.hash_table.prepared


def test_a_pending_copy_takes_its_takeover_topology_when_it_becomes_active(
    vbucket: VBucket,
) -> None:
    vbucket.set_state(VBucketState.PENDING)
    vbucket.set_takeover_topology(ALONE)
    assert vbucket.topology is None
    vbucket.set_state(VBucketState.ACTIVE, transfer=True)  # the takeover
    assert vbucket.topology == ALONE
    got = _answers(vbucket)
    vbucket.sync_write(lambda: vbucket.set(b"k", b"v"), MAJORITY, cookie="c")
    assert [o.status for o in got] == [Status.Success]
    # forgotten when the copy goes any other way; refused on a copy that is not pending
    vbucket.set_state(VBucketState.PENDING)
    vbucket.set_takeover_topology(ALONE)
    vbucket.set_state(VBucketState.DEAD)
    vbucket.set_state(VBucketState.ACTIVE)
    assert vbucket.topology is None
    with pytest.raises(Einval):
        vbucket.set_takeover_topology(ALONE)


WRITES: dict[str, Callable[[VBucket], object]] = {
    "add": lambda vb: vb.add(b"new", b"v"),
    "replace": lambda vb: vb.replace(b"k", b"v2"),
    "delete": lambda vb: vb.delete(b"k"),
    "append": lambda vb: vb.append(b"k", b"+"),
    "prepend": lambda vb: vb.prepend(b"k", b"+"),
    "incr": lambda vb: vb.incr(b"n", 1),
    "decr": lambda vb: vb.decr(b"n", 1),
    "edit": lambda vb: vb.edit(b"k", lambda _cur, _cas, _seqno: Mutated(b"e", 0, 0, False)),
    "touch": lambda vb: vb.touch(b"k", 100),
}


@pytest.mark.parametrize("name", list(WRITES))
def test_every_write_takes_the_one_path(vbucket: VBucket, name: str) -> None:
    vbucket.set(b"k", b"v")
    vbucket.set(b"n", b"1")
    vbucket.set_topology(WITH_ABSENT_REPLICA)
    before = {k: vbucket.peek(k) for k in (b"k", b"n", b"new")}
    vbucket.sync_write(lambda: WRITES[name](vbucket), MAJORITY)
    assert {k: vbucket.peek(k) for k in (b"k", b"n", b"new")} == before  # nothing visible
    assert len(vbucket.hash_table.prepared) == 1


# The edit path's writes (read-modify-write under the lock): what each commits, starting from
# k = "v" and n = "7".
EDITS: list[tuple[str, bytes, bytes]] = [
    ("append", b"k", b"v+"),
    ("prepend", b"k", b"+v"),
    ("incr", b"n", b"8"),
    ("decr", b"n", b"6"),
    ("edit", b"k", b"e"),
]


@pytest.mark.parametrize(("name", "key", "committed"), EDITS)
def test_edits_commit_what_their_prepare_holds(
    vbucket: VBucket, name: str, key: bytes, committed: bytes
) -> None:
    vbucket.set(b"k", b"v")
    vbucket.set(b"n", b"7")
    vbucket.set_topology(ALONE)
    got = _answers(vbucket)
    vbucket.sync_write(lambda: WRITES[name](vbucket), MAJORITY, cookie=name)
    assert [(o.cookie, o.status) for o in got] == [(name, Status.Success)]
    commit = got[0].item
    assert isinstance(commit, CommitItem) and commit.value == committed
    assert vbucket.get(key).value == committed
    assert not vbucket.hash_table.prepared


def test_an_edit_of_a_key_with_a_pending_prepare_is_refused(vbucket: VBucket) -> None:
    vbucket.set(b"n", b"7")
    vbucket.set_topology(WITH_ABSENT_REPLICA)
    vbucket.sync_write(lambda: vbucket.incr(b"n", 1), MAJORITY)
    for name in ("incr", "decr"):
        with pytest.raises(SyncWriteInProgress):
            WRITES[name](vbucket)
    assert vbucket.get(b"n").value == b"7"


def test_durable_delete_commits_a_tombstone(vbucket: VBucket) -> None:
    vbucket.set(b"k", b"v")
    vbucket.set_topology(ALONE)
    vbucket.sync_write(lambda: vbucket.delete(b"k"), MAJORITY)
    with pytest.raises(KeyNotFound):
        vbucket.get(b"k")


def test_checkpoint_never_dedups_sync_writes() -> None:
    cm = CheckpointManager(0)
    cm.queue(Item(b"k", b"1", by_seqno=1))
    cm.queue_sync(PrepareItem(b"k", b"2", by_seqno=2))
    cm.queue_sync(AbortItem(b"k", b"", by_seqno=3, prepared_seqno=2))
    cm.queue(Item(b"x", b"", by_seqno=4))
    snap = cm.persistence_cursor.next_snapshot(100)
    assert snap is not None
    assert [i.by_seqno for i in snap.items] == [1, 2, 3, 4]
    assert cm.sync_items == 2


def test_prepares_persist_apart_and_come_back_at_warmup(
    open_bucket: Callable[..., Bucket],
) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set(b"k", b"committed")
    vb.set_topology(WITH_ABSENT_REPLICA)
    vb.sync_write(lambda: vb.set(b"k", b"prepared"), PERSIST)
    bucket.flush_once()
    assert bucket.storage.get(0, b"k").value == b"committed"  # type: ignore[union-attr]
    assert [p.value for p in bucket.storage.load_prepares(0)] == [b"prepared"]
    bucket.shutdown()

    again = open_bucket()
    vb = again.get_vbucket(0)
    with pytest.raises(SyncWriteReCommitInProgress):  # maybe visible: neither is served yet
        vb.get(b"k")
    assert vb.hash_table.entries[b"k"].value == b"committed"
    assert vb.hash_table.prepared[b"k"].value == b"prepared"
    vb.set_topology(ALONE)  # maybe visible: committed once satisfied
    assert vb.get(b"k").value == b"prepared"
    again.flush_once()
    assert again.storage.load_prepares(0) == []
    assert again.storage.get(0, b"k").value == b"prepared"  # type: ignore[union-attr]


@pytest.mark.parametrize("acked", [True, False], ids=["acked-before-topology", "never-acked"])
def test_a_replica_ack_before_the_topology_commits_a_prepare_read_back_at_warmup(
    open_bucket: Callable[..., Bucket], acked: bool
) -> None:
    """A restarted active reads its prepares back with no topology; its replica's stream
    reopens and acknowledges them at once, before the manager sets the topology again. The
    replica will not acknowledge the same prepares twice: the ack is kept for the monitor
    (found by the chaos suite: a PersistToMajority write unreadable, 0xa4, for good)."""
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set_topology(WITH_ABSENT_REPLICA)
    vb.sync_write(lambda: vb.set(b"k", b"prepared"), PERSIST)
    bucket.flush_once()
    bucket.shutdown()

    again = open_bucket()
    vb = again.get_vbucket(0)
    seqno = vb.hash_table.prepared[b"k"].by_seqno
    if acked:
        vb.seqno_acknowledged("replica1", seqno)
    vb.set_topology(WITH_ABSENT_REPLICA)
    if acked:
        assert vb.get(b"k").value == b"prepared"
    else:
        with pytest.raises(SyncWriteReCommitInProgress):
            vb.get(b"k")
        vb.seqno_acknowledged("replica1", seqno)
        assert vb.get(b"k").value == b"prepared"
    again.shutdown()


def test_a_restarted_replica_reports_the_high_prepared_seqno_it_persisted(
    open_bucket: Callable[..., Bucket],
) -> None:
    """A failover promotes the replica with the highest (high prepared seqno, high seqno): a
    restarted replica reporting 0 would lose to one holding fewer prepares. The HPS persists
    with the state (capped at what the flush held), comes back at warm-up, is acknowledged
    once the stream reopens. A rollback claims nothing: a prepare below the point whose commit
    lay above it may be gone with its commit."""
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    vb.replica_snapshot_marker(1, 2)
    vb.replica_prepare(PrepareItem(b"a", b"1", cas=5, by_seqno=1, level=1))
    vb.replica_commit(b"a", 1, 2, 6)
    vb.replica_snapshot_end(2)
    bucket.flush_once()  # a flush point at 2
    vb.replica_snapshot_marker(3, 4)
    vb.replica_prepare(PrepareItem(b"b", b"2", cas=7, by_seqno=3, level=3))
    vb.replica_prepare(PrepareItem(b"c", b"3", cas=8, by_seqno=4, level=1))
    vb.replica_snapshot_end(4)
    assert vb.high_prepared_seqno == 1  # 3 waits to be persisted
    bucket.flush_once()
    assert vb.high_prepared_seqno == 4
    bucket.shutdown()

    again = open_bucket()
    vb = again.get_vbucket(0)
    assert vb.high_prepared_seqno == 4
    assert vb.passive_durability is not None
    assert vb.passive_durability.high_completed_seqno == 1  # a's, committed at 2
    assert sorted(vb.hash_table.prepared) == [b"b", b"c"]  # still pending, kept
    vb.acknowledge_held()
    assert vb.take_seqno_ack() == 4
    assert again.rollback(0, 3) == 2
    assert again.get_vbucket(0).high_prepared_seqno == 0
    again.shutdown()


def test_sync_write_items_are_their_own_namespace() -> None:
    assert issubclass(PrepareItem, SyncWriteItem) and issubclass(AbortItem, SyncWriteItem)
    assert not issubclass(CommitItem, SyncWriteItem)


def _prepare(seqno: int, key: bytes, value: bytes) -> PrepareItem:
    return PrepareItem(key, value, by_seqno=seqno, cas=seqno, rev_seqno=seqno, level=2)


def _state(high: int) -> VBState:
    return VBState("active", '[{"id":7,"seq":0}]', high, high, high)


@pytest.mark.parametrize(
    ("batches", "pending"),
    [
        # one flush, two batches of a vbucket: the last word per key wins
        ([[_prepare(1, b"k", b"p")], [CommitItem(b"k", b"p", by_seqno=2, prepared_seqno=1)]], []),
        ([[_prepare(1, b"k", b"p")], [AbortItem(b"k", b"", by_seqno=2, prepared_seqno=1)]], []),
        ([[AbortItem(b"k", b"", by_seqno=2, prepared_seqno=1)], [_prepare(3, b"k", b"q")]], [3]),
        ([[_prepare(1, b"a", b"p"), _prepare(2, b"b", b"p")]], [1, 2]),
    ],
)
def test_storage_keeps_the_last_sync_write_word_per_key(
    tmp_path: Path, batches: list[list[Item]], pending: list[int]
) -> None:
    storage = open_storage(tmp_path, "b", history_window=10, cache_bytes=0)
    try:
        storage.persist((0, items, _state(items[-1].by_seqno)) for items in batches)
        assert [p.by_seqno for p in storage.load_prepares(0)] == pending
        committed = [i.key for i in storage.scan_by_seqno(0, 0)]
        assert committed == [b"k"] * any(isinstance(i, CommitItem) for b in batches for i in b)
    finally:
        storage.close()


def test_storage_rollback_and_deletion_drop_prepares(tmp_path: Path) -> None:
    storage = open_storage(tmp_path, "b", history_window=10, cache_bytes=0)
    try:
        storage.persist_snapshot(0, [Item(b"x", b"1", by_seqno=1, cas=1)], _state(1))
        storage.persist_snapshot(0, [_prepare(2, b"a", b"p")], _state(2))
        storage.persist_snapshot(0, [_prepare(3, b"b", b"p")], _state(3))
        assert storage.rollback(0, 2) == 2
        assert [p.key for p in storage.load_prepares(0)] == [b"a"]
        storage.delete_vbucket(0)
        assert storage.load_prepares(0) == []
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("completion", "point", "pending"),
    [
        # a commit above the point: its prepare (stored at an earlier flush) is pending again
        (CommitItem(b"a", b"p", by_seqno=4, prepared_seqno=2), 3, [2]),
        # so is an aborted one (the abort's row goes, the prepare comes back)
        (AbortItem(b"a", b"", by_seqno=4, prepared_seqno=2), 3, [2]),
        # a completion at or below the point stays completed
        (CommitItem(b"a", b"p", by_seqno=4, prepared_seqno=2), 4, []),
        # a point below the prepare drops both
        (CommitItem(b"a", b"p", by_seqno=4, prepared_seqno=2), 1, []),
    ],
    ids=["commit-above", "abort-above", "completed-below", "prepare-above"],
)
def test_rocksdb_rollback_revives_a_prepare_whose_completion_it_undoes(
    tmp_path: Path, completion: Item, point: int, pending: list[int]
) -> None:
    """Storage keeps a completed prepare until the history no longer reaches below its
    completion, so a rollback between the two gives it back from disk: a replica restarted
    since, or whose committed value was overwritten or ejected, has nothing in memory to
    revive it from (the active, restarted without the completion, waits for its ack)."""
    storage = open_storage(tmp_path, "b", history_window=10, cache_bytes=0)
    try:
        storage.persist_snapshot(0, [Item(b"x", b"1", by_seqno=1, cas=1)], _state(1))
        storage.persist_snapshot(0, [_prepare(2, b"a", b"p")], _state(2))
        storage.persist_snapshot(0, [Item(b"y", b"1", by_seqno=3, cas=3)], _state(3))
        storage.persist_snapshot(0, [completion], _state(4))
        storage.persist_snapshot(0, [Item(b"a", b"newer", by_seqno=5, cas=5)], _state(5))
        assert storage.load_prepares(0) == []
        assert storage.rollback(0, point) == point
        revived = storage.load_prepares(0)
        assert [p.by_seqno for p in revived] == pending
        assert all((p.key, p.value, p.level) == (b"a", b"p", 2) for p in revived)
        assert storage.rollback(0, 1) == 1  # a second rollback drops what the first revived
        assert storage.load_prepares(0) == []
    finally:
        storage.close()


def test_rocksdb_forgets_completed_prepares_with_the_history(tmp_path: Path) -> None:
    """A completion at or below the history's start is never rolled back: its kept prepare
    goes when the history is trimmed past it."""
    storage = open_storage(tmp_path, "b", history_window=4, cache_bytes=0)
    try:
        storage.persist_snapshot(0, [_prepare(1, b"a", b"p")], _state(1))
        storage.persist_snapshot(0, [CommitItem(b"a", b"p", by_seqno=2, prepared_seqno=1)],
                                 _state(2))  # fmt: skip
        assert storage.rollback(0, 1) == 1  # (kept: revived)
        storage.persist_snapshot(0, [CommitItem(b"a", b"p", by_seqno=2, prepared_seqno=1)],
                                 _state(2))  # fmt: skip
        for seqno in range(3, 40):
            storage.persist_snapshot(0, [Item(b"x%d" % seqno, b"v", by_seqno=seqno, cas=seqno)],
                                     _state(seqno))  # fmt: skip
        assert storage.flush_points(0)[0] > 2  # the history starts above the completion
        assert storage.rollback(0, storage.flush_points(0)[0]) > 2
        assert storage.load_prepares(0) == []
        kept = storage._db.cf["completed"]  # type: ignore[attr-defined]
        assert list(kept.keys()) == []  # (the prepare kept for a rollback is gone)
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("level", "wanted"),
    [
        (DurabilityLevel.Majority, False),  # acknowledged from memory
        (DurabilityLevel.MajorityAndPersistToActive, True),  # a fence until persisted here
        (DurabilityLevel.PersistToMajority, True),
    ],
)
def test_a_prepare_to_persist_asks_for_the_next_flush(
    vbucket: VBucket, level: DurabilityLevel, wanted: bool
) -> None:
    asked: list[bool] = []
    vbucket.on_persistence_wanted = lambda: asked.append(True)
    vbucket.set_topology(WITH_ABSENT_REPLICA)
    vbucket.sync_write(lambda: vbucket.set(b"k", b"v"), level)
    assert bool(asked) is wanted


@pytest.mark.parametrize(("level", "wanted"), [(1, False), (2, False), (3, True)])
def test_a_replica_prepare_to_persist_asks_for_the_next_flush(
    vbucket: VBucket, level: int, wanted: bool
) -> None:
    """A replica acknowledges a PersistToMajority prepare only once it persisted it."""
    asked: list[bool] = []
    vbucket.on_persistence_wanted = lambda: asked.append(True)
    vbucket.set_state(VBucketState.REPLICA)
    vbucket.replica_snapshot_marker(1, 1)
    vbucket.replica_prepare(PrepareItem(b"k", b"v", cas=5, by_seqno=1, level=level))
    assert bool(asked) is wanted
