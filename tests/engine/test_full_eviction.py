"""Eviction policies (``hash_table.EvictionPolicy``): under full eviction a persisted item
leaves memory whole, and every operation on it reads it back from storage.

Each test runs for both policies: under ``valueOnly`` the same
operations on an ejected item must give the same answers, so the two are a differential test
of each other. Counts (``len(vbucket)``, the ``curr_items`` stat) must stay exact throughout.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.vbucket import VBucketState
from dcpkv.engine import document
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import EngineError, Item, KeyExists, KeyNotFound, NotStored, TempFail
from dcpkv.engine.vbucket import VBucket

from .conftest import BucketFactory

FULL, VALUE_ONLY = EvictionPolicy.FULL, EvictionPolicy.VALUE_ONLY
KEYS = [b"k%02d" % i for i in range(20)]


@pytest.fixture(params=list(EvictionPolicy))
def policy(request: pytest.FixtureRequest) -> EvictionPolicy:
    return EvictionPolicy(request.param)


def evicted_bucket(open_bucket: BucketFactory, policy: EvictionPolicy) -> tuple[Bucket, VBucket]:
    """A bucket of one vbucket holding KEYS (value ``v-<key>``), persisted, then evicted."""
    bucket = open_bucket(num_vbuckets=1, eviction_policy=policy)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    for key in KEYS:
        vb.set(key, b"v-" + key)
    bucket.flush_once()
    vb.eject()
    return bucket, vb


def deleted_one(open_bucket: BucketFactory, policy: EvictionPolicy, key: bytes) -> Bucket:
    """:func:`evicted_bucket`, then ``key`` deleted (not flushed yet)."""
    bucket, vb = evicted_bucket(open_bucket, policy)
    vb.delete(key)
    return bucket


def resident_keys(vb: VBucket) -> int:
    """Keys whose item (key and metadata) is in the hash table."""
    return vb.table_entries


def test_eviction_leaves_what_the_policy_says(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    _, vb = evicted_bucket(open_bucket, policy)
    assert len(vb) == len(KEYS)
    if policy is FULL:
        assert resident_keys(vb) == 0 and vb.hash_table.nonresident == len(KEYS)
    else:  # every key stays, with its value ejected
        assert resident_keys(vb) == len(KEYS)
        assert all(item.value is None for item in vb.items())


def test_read_an_evicted_key(open_bucket: BucketFactory, policy: EvictionPolicy) -> None:
    _, vb = evicted_bucket(open_bucket, policy)
    got = vb.get(KEYS[3])
    assert got.value == b"v-" + KEYS[3]
    meta = vb.get_meta(KEYS[4])
    assert meta is not None and not meta.deleted and meta.rev_seqno == 1
    with pytest.raises(KeyNotFound):
        vb.get(b"never-written")
    assert vb.get_meta(b"never-written") is None
    assert vb.get_resident(KEYS[3]) is None or policy is VALUE_ONLY
    assert len(vb) == len(KEYS)
    if policy is FULL:  # a read does not bring the item back (memory stays as it was)
        assert resident_keys(vb) == 0


def test_cas_checked_writes_to_an_evicted_key(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    _, vb = evicted_bucket(open_bucket, policy)
    key = KEYS[5]
    cas = vb.get_meta(key).cas  # type: ignore[union-attr]
    with pytest.raises(KeyExists):
        vb.set(key, b"stale", cas=cas + 1)
    with pytest.raises(KeyExists):
        vb.replace(key, b"stale", cas=cas + 1)
    written = vb.set(key, b"new", cas=cas)
    assert written.rev_seqno == 2  # the evicted version's rev seqno + 1
    assert vb.get(key).value == b"new"
    replaced = vb.replace(KEYS[6], b"replaced")
    assert replaced.rev_seqno == 2
    with pytest.raises(KeyNotFound):
        vb.replace(b"never-written", b"x")
    assert len(vb) == len(KEYS)


def test_add_of_an_evicted_key_finds_it(open_bucket: BucketFactory, policy: EvictionPolicy) -> None:
    _, vb = evicted_bucket(open_bucket, policy)
    with pytest.raises(KeyExists):
        vb.add(KEYS[0], b"again")
    assert vb.get(KEYS[0]).value == b"v-" + KEYS[0]
    vb.add(b"new-key", b"fresh")
    assert len(vb) == len(KEYS) + 1


def test_delete_an_evicted_key(open_bucket: BucketFactory, policy: EvictionPolicy) -> None:
    bucket, vb = evicted_bucket(open_bucket, policy)
    tombstone = vb.delete(KEYS[1])
    assert tombstone.deleted and tombstone.rev_seqno == 2
    assert len(vb) == len(KEYS) - 1
    with pytest.raises(KeyNotFound):
        vb.get(KEYS[1])
    with pytest.raises(KeyNotFound):
        vb.delete(KEYS[1])
    bucket.flush_once()  # the persisted tombstone leaves the table
    vb.eject()
    with pytest.raises(KeyNotFound):
        vb.get(KEYS[1])
    meta = vb.get_meta(KEYS[1])
    assert meta is not None and meta.deleted
    # Created again: its rev seqno goes on from the tombstone's, wherever that is.
    assert vb.set(KEYS[1], b"back").rev_seqno == 3
    assert len(vb) == len(KEYS)


def test_other_writes_to_an_evicted_key(open_bucket: BucketFactory, policy: EvictionPolicy) -> None:
    _, vb = evicted_bucket(open_bucket, policy)
    vb.append(KEYS[2], b"+a")
    assert vb.get(KEYS[2]).value == b"v-" + KEYS[2] + b"+a"
    with pytest.raises(NotStored):
        vb.append(b"never-written", b"+a")
    touched = vb.touch(KEYS[7], 100)
    assert touched.value == b"v-" + KEYS[7] and touched.expiry > 0
    with pytest.raises(KeyNotFound):
        vb.touch(b"never-written", 100)
    assert len(vb) == len(KEYS)


def test_an_evicted_key_that_expired_is_deleted_when_read(
    open_bucket: BucketFactory, policy: EvictionPolicy, clock: ManualClock
) -> None:
    bucket, vb = evicted_bucket(open_bucket, policy)
    vb.set(b"short-lived", b"v", expiry=10)
    bucket.flush_once()
    vb.eject()
    assert len(vb) == len(KEYS) + 1
    clock.advance(11)
    with pytest.raises(KeyNotFound):
        vb.get(b"short-lived")
    assert len(vb) == len(KEYS)  # the expiration is queued: DCP and the disk see it
    meta = vb.get_meta(b"short-lived")
    assert meta is not None and meta.deleted and meta.expired


def test_counter_of_an_evicted_key(open_bucket: BucketFactory, policy: EvictionPolicy) -> None:
    bucket, vb = evicted_bucket(open_bucket, policy)
    vb.set(b"counter", b"41")
    bucket.flush_once()
    vb.eject()
    assert vb.incr(b"counter", 1)[0] == 42
    assert len(vb) == len(KEYS) + 1


@dataclass
class _Edit:
    value: bytes
    datatype: int = 0
    flags: int = 0
    deleted: bool = False


def test_subdoc_paths_read_an_evicted_key(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    _, vb = evicted_bucket(open_bucket, policy)
    seen: list[Item | None] = []

    def change(current: Item | None, cas: int, seqno: int) -> _Edit:
        seen.append(current)
        return _Edit((current.value or b"") + b"!" if current else b"?")

    vb.edit(KEYS[8], change)
    assert seen[0] is not None and seen[0].value == b"v-" + KEYS[8]
    assert vb.get(KEYS[8]).value == b"v-" + KEYS[8] + b"!"
    read = vb.read_any(KEYS[9])
    assert read is not None and read.value == b"v-" + KEYS[9]
    assert len(vb) == len(KEYS)


def test_counts_stay_exact_over_flushes_and_evictions(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    bucket, vb = evicted_bucket(open_bucket, policy)
    for i, key in enumerate(KEYS):
        if i % 3 == 0:
            vb.delete(key)
        elif i % 3 == 1:
            vb.set(key, b"again")
    for i in range(10):
        vb.set(b"new%d" % i, b"n")
    expected = len(KEYS) - len(KEYS[::3]) + 10
    assert len(vb) == expected
    bucket.flush_once()
    vb.eject()
    assert len(vb) == expected
    assert bucket.storage.item_count(0) == expected


def test_warmup_under_full_eviction_loads_no_items(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    deleted_one(open_bucket, policy, KEYS[0]).shutdown()
    again = open_bucket(num_vbuckets=1, eviction_policy=policy)
    vb = again.get_vbucket(0)
    assert len(vb) == len(KEYS) - 1
    assert resident_keys(vb) == (0 if policy is FULL else len(KEYS) - 1)
    assert vb.get(KEYS[1]).value == b"v-" + KEYS[1]
    with pytest.raises(KeyNotFound):
        vb.get(KEYS[0])
    with pytest.raises(KeyExists):
        vb.add(KEYS[2], b"x")
    vb.set(KEYS[0], b"back")
    assert len(vb) == len(KEYS)


def test_warmup_without_a_recorded_count_counts_the_keys(open_bucket: BucketFactory) -> None:
    """A vbucket state written before counts were recorded: the key index is counted."""
    bucket = deleted_one(open_bucket, VALUE_ONLY, KEYS[0])
    bucket.flush_once()
    state = bucket.storage.vbucket_state(0)
    assert state is not None
    state.item_count = None
    bucket.storage.set_vbucket_state(0, state)
    assert bucket.storage.item_count(0) == len(KEYS) - 1
    bucket.storage.set_clean_shutdown(True)
    bucket.storage.close()
    bucket.closed = True
    again = open_bucket(num_vbuckets=1, eviction_policy=FULL)
    assert len(again.get_vbucket(0)) == len(KEYS) - 1


def test_a_full_bucket_evicts_items_to_take_more(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    """Keys and metadata fill a small quota many times over: full eviction takes every write
    once the flusher has persisted what it evicts; value eviction refuses writes once the keys
    alone fill the quota."""
    quota, writes = 64 * 1024, 2000  # ~10 quotas of keys with their metadata
    bucket = open_bucket(num_vbuckets=4, memory_quota=quota, eviction_policy=policy)
    for vb in range(4):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    accepted = []
    for i in range(writes):
        key = b"key-%05d" % i
        vb = bucket.get_vbucket(bucket.vbucket_for(key))
        for _ in range(2):
            try:
                vb.set(key, b"x" * 10)
            except TempFail:
                bucket.flush_once()  # what the server's flusher does meanwhile
                continue
            accepted.append(key)
            break
    total = sum(len(v) for v in bucket.vbuckets.values())
    assert total == len(accepted)
    if policy is VALUE_ONLY:
        assert len(accepted) < writes
        return
    assert len(accepted) == writes
    assert bucket.memory_used <= quota
    assert sum(v.table_entries for v in bucket.vbuckets.values()) < writes // 4
    for key in accepted:
        assert bucket.get_vbucket(bucket.vbucket_for(key)).get(key).value == b"x" * 10


def test_replica_counts_and_rollback(open_bucket: BucketFactory, policy: EvictionPolicy) -> None:
    """A replica's with-meta writes read evicted keys back too; a rollback lands on the count
    its flush point recorded, and warm-up after it starts from that count."""
    bucket = open_bucket(num_vbuckets=1, history_window=1000, eviction_policy=policy)
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    rounds = [  # (key, deleted) per seqno; live keys after each round: 3, 3, 2
        [(b"a", False), (b"b", False), (b"c", False)],
        [(b"a", True), (b"d", False), (b"b", False)],
        [(b"b", True), (b"c", True), (b"e", False)],
    ]
    seqno = 0
    for writes in rounds:
        vb.replica_snapshot_marker(seqno + 1, seqno + len(writes))
        for key, deleted in writes:
            seqno += 1
            item = Item(key, b"v%d" % seqno, cas=seqno, by_seqno=seqno, rev_seqno=seqno)
            (vb.delete_with_meta if deleted else vb.set_with_meta)(item)
        bucket.flush_once()
        vb.eject()
    assert len(vb) == 2
    assert bucket.rollback(0, 6) == 6
    assert len(vb) == 3 and bucket.storage.item_count(0) == 3
    assert resident_keys(vb) == (0 if policy is FULL else 3)  # as warm-up: no items loaded
    vb.replica_snapshot_marker(7, 7)  # a replica write over a key left on disk: counted once
    vb.set_with_meta(Item(b"b", b"again", cas=7, by_seqno=7, rev_seqno=7))
    assert len(vb) == 3
    bucket.shutdown()
    again = open_bucket(num_vbuckets=1, history_window=1000, eviction_policy=policy)
    assert len(again.get_vbucket(0)) == 3


def test_storage_rollback_keeps_the_points_count(open_bucket: BucketFactory) -> None:
    """The count storage keeps after a rollback is the one its flush point recorded (a crash
    before the next flush must not warm up from the count of the undone history)."""
    bucket = open_bucket(num_vbuckets=1, history_window=1000)
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    for seqno in range(1, 6):
        vb.replica_snapshot_marker(seqno, seqno)
        vb.set_with_meta(Item(b"k%d" % seqno, b"v", cas=seqno, by_seqno=seqno))
        bucket.flush_once()
    assert bucket.storage.item_count(0) == 5
    assert bucket.storage.rollback(0, 3) == 3
    assert bucket.storage.item_count(0) == 3


# -- a property: against a model, whatever the operations -----------------------------------

OPS = ["set", "add", "replace", "delete", "append", "set_cas", "evict", "flush", "reopen"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(KEYS[:4])), max_size=40),
    st.sampled_from(list(EvictionPolicy)),
)
def test_answers_and_counts_match_a_model(
    ops: list[tuple[str, bytes]], policy: EvictionPolicy
) -> None:
    model: dict[bytes, bytes] = {}
    with TemporaryDirectory() as tmp:
        bucket = _model_bucket(Path(tmp), policy)
        for n, (op, key) in enumerate(ops):
            value = b"%d" % n
            if op == "reopen":
                bucket.shutdown()
                bucket = _model_bucket(Path(tmp), policy)
            elif op in ("evict", "flush"):
                bucket.flush_once()
                if op == "evict":
                    bucket.get_vbucket(0).eject()
            else:
                _model_write(bucket.get_vbucket(0), model, op, key, value)
            assert len(bucket.get_vbucket(0)) == len(model)
        vb = bucket.get_vbucket(0)
        for key in KEYS[:4]:
            try:
                got: bytes | None = vb.get(key).value
            except KeyNotFound:
                got = None
            assert got == model.get(key)
        bucket.shutdown()


def _model_bucket(path: Path, policy: EvictionPolicy) -> Bucket:
    bucket = Bucket(
        "default", path, num_vbuckets=1, clock=ManualClock(), rng=random.Random(3),
        eviction_policy=policy,
    )  # fmt: skip
    if not bucket.vbuckets:
        bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    return bucket


def _model_write(vb: VBucket, model: dict[bytes, bytes], op: str, key: bytes, value: bytes) -> None:
    """Apply ``op`` to the vbucket, and to the model what it should have done."""
    present = key in model
    try:
        if op == "set":
            vb.set(key, value)
        elif op == "add":
            vb.add(key, value)
        elif op == "replace":
            vb.replace(key, value)
        elif op == "delete":
            vb.delete(key)
        elif op == "append":
            vb.append(key, value)
        else:  # a CAS-checked Set with the CAS GetMeta gives
            meta = vb.get_meta(key)
            vb.set(key, value, cas=meta.cas if meta is not None and not meta.deleted else 1)
    except EngineError as exc:
        refused = {"add": present, "replace": not present, "delete": not present}
        refused |= {"append": not present, "set_cas": not present, "set": False}
        assert refused[op], f"{op} of {key!r} refused: {exc!r}"
        return
    assert op in ("set", "set_cas") or (op == "add") != present
    if op == "delete":
        del model[key]
    elif op == "append":
        model[key] += value
    else:
        model[key] = value


def test_an_edit_whose_admission_evicts_its_key_counts_it_once(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    """A sub-document mutation reads the document first and is admitted after (its size is
    known only then): the reclaim that admits it may evict the very key it read."""
    quota, grown = 32 * 1024, b"!" * 2000  # the edit's charge: ~4.4 kB, under 15% of the quota
    bucket = open_bucket(num_vbuckets=1, memory_quota=quota, eviction_policy=policy)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set(b"doc", b"v")  # the oldest entry: the first a reclaim evicts
    others = 0
    while bucket.memory_used < quota - 1000:  # the hash table's alone: checkpoints freed
        vb.set(b"other%d" % others, b"x" * 200)
        others += 1
        bucket.flush_once()
        bucket.reclaim(quota)  # (closes the checkpoints; nothing to evict under the quota)
    assert vb.peek(b"doc") is not None
    vb.edit(b"doc", lambda current, cas, seqno: _Edit((current.value or b"") + grown))
    assert len(vb) == others + 1
    if policy is FULL:
        assert vb.table_entries < others  # the reclaim evicted items (the edited key first)
    assert vb.get(b"doc").value == b"v" + grown


# -- Flush (memcached's): every live key, resident or not ---------------------------------------


@pytest.mark.parametrize("fetching", [False, True], ids=["alone", "with-fetcher"])
def test_flush_deletes_every_live_key_resident_or_not(
    open_bucket: BucketFactory, policy: EvictionPolicy, fetching: bool, clock: ManualClock
) -> None:
    """Flush on a bucket whose keys are mostly evicted, some rewritten (resident, unpersisted),
    one deleted (a tombstone not yet flushed), one expired: every live key gets one tombstone
    with its own seqno (the expired one its expiration), the count goes to 0 and stays there
    after a restart, and storage holds no live key. Both policies give the same seqnos. With a
    fetcher running (the server's case) nothing waits for a background fetch."""
    bucket, vb = evicted_bucket(open_bucket, policy)
    vb.set(KEYS[0], b"rewritten")
    vb.set(b"fresh", b"new")
    vb.delete(KEYS[1])
    vb.set(KEYS[2], b"short-lived", expiry=5)
    bucket.flush_once()
    vb.eject()
    clock.advance(10)
    if fetching:
        bucket.start_background_fetch(lambda landing: None)  # (no request may wait)
    live, high = len(vb), vb.high_seqno
    assert live == len(KEYS)  # KEYS - KEYS[1] + fresh
    assert bucket.delete_all() == live - 1  # KEYS[2] expired: an expiration, not a deletion
    assert (len(vb), vb.high_seqno) == (0, high + live)
    assert vb.hash_table.nonresident == 0
    for key in [*KEYS, b"fresh"]:
        with pytest.raises(KeyNotFound):
            vb.get(key)
    bucket.flush_once()
    vb.eject()
    assert list(bucket.storage.load_items(0)) == []
    assert bucket.storage.item_count(0) == 0
    assert len(vb) == 0 and bucket.delete_all() == 0
    vb.set(b"after", b"x")  # the bucket is usable afterwards
    assert len(vb) == 1
    bucket.shutdown()
    again = open_bucket(num_vbuckets=1, eviction_policy=policy)
    assert len(again.get_vbucket(0)) == 1
    assert again.get_vbucket(0).get(b"after").value == b"x"


def test_flush_keeps_the_system_xattrs_of_an_evicted_document(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    """A deletion keeps a document's system xattrs; Flush too, for one only storage holds."""
    bucket = open_bucket(num_vbuckets=1, eviction_policy=policy)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    value, datatype = document.Document({"_sys": b'{"a":1}', "user": b"2"}, b"{}", True).pack()
    vb.set(b"x", value, datatype=datatype)
    bucket.flush_once()
    vb.eject()
    assert bucket.delete_all() == 1
    tombstone = vb.peek(b"x")
    assert tombstone is not None and tombstone.deleted
    kept = document.unpack(tombstone.value or b"", tombstone.datatype).xattrs
    assert kept == {"_sys": b'{"a":1}'}
