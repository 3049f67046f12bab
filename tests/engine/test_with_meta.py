"""VBucket.write_with_meta: the engine side of XDCR's with-meta writes."""

from __future__ import annotations

import pytest

from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket, ConflictModeMismatch
from dcpkv.engine.item import Item, KeyExists, KeyNotFound, NotMyVbucket
from dcpkv.engine.vbucket import VBucket

from .conftest import BucketFactory


def _doc(key: bytes, rev: int, cas: int, *, deleted: bool = False, value: bytes = b"v") -> Item:
    return Item(key, b"" if deleted else value, 0, 0, cas, rev, 0, 0, deleted=deleted)


def test_a_with_meta_write_keeps_cas_and_rev_takes_the_next_seqno_and_is_queued(
    vbucket: VBucket,
) -> None:
    vbucket.set(b"local", b"x")
    cursor = vbucket.checkpoints.register_cursor("dcp", 0)
    assert cursor is not None
    stored = vbucket.write_with_meta(_doc(b"k", rev=9, cas=1 << 60))
    assert (stored.by_seqno, stored.cas, stored.rev_seqno) == (2, 1 << 60, 9)
    snap = cursor.next_snapshot()
    assert snap is not None and [i.key for i in snap.items] == [b"local", b"k"]
    assert vbucket.set(b"k", b"after").cas > 1 << 60  # the HLC observed the adopted CAS


def test_refusals(vbucket: VBucket) -> None:
    vbucket.write_with_meta(_doc(b"k", rev=5, cas=50))
    with pytest.raises(KeyExists):
        vbucket.write_with_meta(_doc(b"k", rev=5, cas=50))  # the echo
    with pytest.raises(KeyExists):
        vbucket.write_with_meta(_doc(b"k", rev=9, cas=90), add=True)  # a live doc
    with pytest.raises(KeyExists):
        vbucket.write_with_meta(_doc(b"k", rev=9, cas=90), cas=49)  # header CAS mismatch
    with pytest.raises(KeyNotFound):
        vbucket.write_with_meta(_doc(b"none", rev=9, cas=90), cas=49)
    assert vbucket.write_with_meta(_doc(b"k", rev=1, cas=1), check_conflict=False).cas == 1
    vbucket.set_state(VBucketState.REPLICA)
    with pytest.raises(NotMyVbucket):
        vbucket.write_with_meta(_doc(b"k", rev=99, cas=99))


def test_a_tombstone_read_back_from_disk_still_takes_part(open_bucket: BucketFactory) -> None:
    bucket = open_bucket()
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.write_with_meta(_doc(b"k", rev=4, cas=40))
    vb.write_with_meta(_doc(b"k", rev=5, cas=50, deleted=True))
    bucket.flush_once()
    assert vb.peek(b"k") is None  # persisted tombstones leave the table
    with pytest.raises(KeyExists):
        vb.write_with_meta(_doc(b"k", rev=5, cas=50, deleted=True))
    with pytest.raises(KeyExists):
        vb.write_with_meta(_doc(b"k", rev=4, cas=99), add=True)
    assert vb.write_with_meta(_doc(b"k", rev=6, cas=60), add=True).rev_seqno == 6
    vb.write_with_meta(_doc(b"k", rev=7, cas=70, deleted=True))
    bucket.shutdown()
    # after a warm-up the table knows nothing of the tombstones on disk: they are read back
    again = open_bucket().get_vbucket(0)
    assert again.peek(b"k") is None
    with pytest.raises(KeyExists):
        again.write_with_meta(_doc(b"k", rev=7, cas=70, deleted=True))


def test_the_mode_is_fixed_when_the_bucket_is_created(open_bucket: BucketFactory) -> None:
    bucket: Bucket = open_bucket(conflict_mode=ConflictMode.LWW)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    assert vb.conflict_mode is ConflictMode.LWW
    vb.write_with_meta(_doc(b"k", rev=9, cas=100))
    assert vb.write_with_meta(_doc(b"k", rev=1, cas=101)).rev_seqno == 1  # later CAS wins
    bucket.shutdown()
    with pytest.raises(ConflictModeMismatch, match="fixed at creation"):
        open_bucket(conflict_mode=ConflictMode.SEQNO)
    assert open_bucket(conflict_mode=ConflictMode.LWW).conflict_mode is ConflictMode.LWW
