"""Property: a replica rolled back to a seqno holds exactly the history's state at the flush
point it lands on, and ``divergence`` named exactly the keys that rollback changed.

A replica is fed snapshots of sets and deletions over a few keys, the flusher runs after some
of them, then it rolls back to a random seqno. The model is the list of writes: the state at
seqno p is the last write of each key at or below p. With a small history window the storage
thins its older flush points (one per stride): the rollback then lands on the newest point it
kept, which must be one the flusher wrote.
"""

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
from dcpkv.engine.item import Item

KEYS = [b"a", b"b", b"c", b"d"]
Write = tuple[int, bytes | None]  # (key index, value or None for a deletion)
snapshots = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3), st.none() | st.binary(max_size=4)), min_size=1),
        st.booleans(),  # flushed after this snapshot
    ),
    min_size=1,
    max_size=8,
)


def state_at(history: list[tuple[int, bytes, bytes | None]], seqno: int) -> dict[bytes, bytes]:
    state: dict[bytes, bytes | None] = {}
    for s, key, value in history:
        if s <= seqno:
            state[key] = value
    return {k: v for k, v in state.items() if v is not None}


@settings(max_examples=80, deadline=None)
@given(snapshots, st.integers(0, 40), st.sampled_from([64_000, 192]))
def test_rollback_lands_on_the_state_at_a_flush_point(
    feed: list[tuple[list[Write], bool]], target: int, window: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bucket = Bucket(
            "default", Path(tmp), num_vbuckets=1, clock=ManualClock(1_700_000_000.0),
            rng=random.Random(1), history_window=window, synchronous="NORMAL",
        )  # fmt: skip
        try:
            vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
            history: list[tuple[int, bytes, bytes | None]] = []
            flush_points = [0]
            for writes, flushed in feed:
                start = vb.high_seqno + 1
                vb.replica_snapshot_marker(start, start + len(writes) - 1)
                for i, (k, value) in enumerate(writes):
                    seqno = start + i
                    item = Item(KEYS[k], value or b"", cas=1000 + seqno, by_seqno=seqno)
                    _ = vb.set_with_meta(item) if value is not None else vb.delete_with_meta(item)
                    history.append((seqno, KEYS[k], value))
                if flushed:
                    bucket.flush_once()
                    flush_points.append(vb.high_seqno)
            if not feed[-1][1]:
                # A rollback flushes what is pending first: that flush is a point (and may
                # thin the older ones), so the points it chooses from are read after it.
                bucket.flush_once()
                flush_points.append(vb.high_seqno)
            high = vb.high_seqno
            kept = bucket.storage.flush_points(0)
            assert set(kept) <= set(flush_points)
            if window // 64 >= high:  # nothing was old enough to thin
                assert sorted(kept) == sorted(set(flush_points) - {0})
            before = state_at(history, high)
            diverged = {ours.key: (ours, old) for ours, old in bucket.divergence(0, target)}
            point = bucket.rollback(0, target)
            if target >= high:
                assert point == high and not diverged
            else:
                assert point == max((p for p in kept if p <= target), default=0)
            after = state_at(history, point)
            live = {i.key: i.value for i in vb.items() if not i.deleted}
            assert live == after
            assert vb.high_seqno == point
            assert all(i.by_seqno <= point for i in vb.items())
            if target < high and point > 0:
                # every key the rollback changed, and only those, with both versions right
                changed = {k for k in KEYS if before.get(k) != after.get(k)}
                assert changed <= set(diverged)
                for key, (ours, old) in diverged.items():
                    assert (None if ours.deleted else ours.value) == before.get(key)
                    assert (None if old is None or old.deleted else old.value) == after.get(key)
        finally:
            with contextlib.suppress(Exception):
                bucket.storage.close()
