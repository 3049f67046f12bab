"""Property: whatever was written and flushed, warm-up reproduces the persisted state exactly."""

from __future__ import annotations

import contextlib
import random
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import KeyNotFound
from dcpkv.engine.vbucket import VBucket

KEYS = [b"a", b"b", b"c", b"d"]
Op = tuple[str, int, bytes]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 3), st.binary(max_size=8)),
        st.tuples(st.just("delete"), st.integers(0, 3), st.just(b"")),
        st.tuples(st.just("flush"), st.just(0), st.just(b"")),
    ),
    max_size=40,
)


def _live(vb: VBucket) -> dict[bytes, tuple[bytes | None, int, int, int, int]]:
    return {
        i.key: (i.value, i.by_seqno, i.cas, i.rev_seqno, i.flags)
        for i in vb.items()
        if not i.deleted
    }


def _apply(vb: VBucket, op: Op) -> None:
    kind, k, value = op
    if kind == "set":
        vb.set(KEYS[k], value, flags=len(value))
    else:
        with contextlib.suppress(KeyNotFound):
            vb.delete(KEYS[k])


@settings(max_examples=60, deadline=None)
@given(ops=ops, clean=st.booleans())
def test_warmup_reproduces_persisted_state(ops: list[Op], clean: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock()
        bucket = Bucket("b", Path(tmp), num_vbuckets=1, clock=clock, rng=random.Random(0))
        vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
        bucket.flush_once()
        persisted, persisted_high = _live(vb), 0
        for op in ops:
            if op[0] == "flush":
                bucket.flush_once()
                persisted, persisted_high = _live(vb), vb.high_seqno
            else:
                _apply(vb, op)
        if clean:
            bucket.shutdown()
            persisted, persisted_high = _live(vb), vb.high_seqno
        else:
            bucket.storage.close()  # the process "dies": nothing more reaches the disk

        again = Bucket("b", Path(tmp), num_vbuckets=1, clock=clock, rng=random.Random(1))
        vb2 = again.get_vbucket(0)
        assert _live(vb2) == persisted
        assert vb2.high_seqno == vb2.persisted_seqno == persisted_high
        assert len(vb2.failover) == (1 if clean else 2)
        disk = list(again.storage.scan_by_seqno(0, 0))
        assert [i.by_seqno for i in disk] == sorted(i.by_seqno for i in disk)
        assert {i.key for i in disk if not i.deleted} == set(persisted)
        again.shutdown()
