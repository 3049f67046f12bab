"""The memory figures and the live-key count stay equal to what the tables hold, whatever
the writes (hypothesis).

The write path keeps the hash table's and the checkpoints' byte counts, and the number of
live keys (``len(vbucket)``, the ``curr_items`` stat), by arithmetic rather than by summing
(:meth:`HashTable.store`, :meth:`CheckpointManager.queue_next`); after any mix of operations,
flushes, ejections and expiries, under a roomy quota or one that makes writes eject values,
the counts must equal the sums.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from tempfile import TemporaryDirectory

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hash_table import HashTable
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import EngineError
from dcpkv.engine.vbucket import VBucket

KEYS = [b"a", b"bb", b"ccc"]
VALUES = [b"", b"v", b"value" * 10]


def assert_counts(table: HashTable) -> None:
    entries = table.values()
    assert table.memory == sum(i.size() for i in entries)
    assert table.live == sum(1 for i in entries if not i.deleted)


def apply(
    bucket: Bucket, vb: VBucket, clock: ManualClock, op: str, key: bytes, value: bytes
) -> None:
    actions = {
        "set": lambda: vb.set(key, value),
        "set_expiring": lambda: vb.set(key, value, expiry=5),
        "add": lambda: vb.add(key, value),
        "replace": lambda: vb.replace(key, value),
        "append": lambda: vb.append(key, value),
        "delete": lambda: vb.delete(key),
        "incr": lambda: vb.incr(key, 1),
        "touch": lambda: vb.touch(key, 3),
        "flush": bucket.flush_once,
        "eject": vb.eject,
        "later": lambda: clock.advance(4),
        "pager": vb.expiry_pager,
    }
    with contextlib.suppress(EngineError):  # a refusal changes nothing: the counts must hold
        actions[op]()


OPS = ["set", "set_expiring", "add", "replace", "append", "delete", "incr", "touch"]
OPS += ["flush", "eject", "later", "pager"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OPS), st.sampled_from(KEYS), st.sampled_from(VALUES)),
        max_size=40,
    ),
    st.sampled_from([1 << 30, 2500]),  # 2500 bytes: admitting a write may eject values
)
def test_counts_equal_what_the_tables_hold(ops: list[tuple[str, bytes, bytes]], quota: int) -> None:
    clock = ManualClock()
    with TemporaryDirectory() as tmp:
        bucket = Bucket(
            "default", Path(tmp), num_vbuckets=1, clock=clock, rng=random.Random(3),
            checkpoint_max_items=4, memory_quota=quota,
        )  # fmt: skip
        vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
        for op, key, value in ops:
            apply(bucket, vb, clock, op, key, value)
            assert_counts(vb.hash_table)
            assert len(vb) == vb.hash_table.live
            slots = [i for c in vb.checkpoints.checkpoints for i in c.items if i is not None]
            assert vb.checkpoints.memory_used == sum(i.size() for i in slots)
        bucket.shutdown()


def test_a_write_whose_admission_ejects_the_value_it_replaces(tmp_path: Path) -> None:
    """Admitting a write may eject values, the key's own among them: the write must read the
    key's entry after that, or it credits the old value's bytes a second time."""
    bucket = Bucket(
        "default", tmp_path, num_vbuckets=1, clock=ManualClock(), rng=random.Random(1),
        memory_quota=20_000,
    )  # fmt: skip
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    vb.set(b"k", b"x" * 1000)  # the first entry: the first a reclaim ejects
    i = 0
    while bucket.memory_used + 2300 <= bucket.memory_quota:  # the next write of k goes over
        vb.set(b"f%d" % i, b"y" * 100)
        i += 1
        bucket.flush_once()
        vb.checkpoints.close_open_checkpoint()  # only the hash table holds memory now
    bucket._memory_estimate = bucket.memory_quota  # the next write recounts
    freed: list[int] = []
    eject = vb.eject
    vb.eject = lambda target=None: freed.append(eject(target)) or freed[-1]  # type: ignore[method-assign]
    vb.set(b"k", b"z" * 1000)
    assert freed and freed[0] >= 1000  # k's old value went first
    assert_counts(vb.hash_table)
    bucket.shutdown()
