"""The memory figures and the live-key count stay equal to what the tables hold, whatever
the writes (hypothesis).

The hot write path keeps the hash table's and the checkpoints' byte counts, and the number of
live keys (``len(vbucket)``, the ``curr_items`` stat), by arithmetic rather than by summing
(:meth:`VBucket._put`, :meth:`CheckpointManager.queue_next`); after any mix of operations,
flushes, ejections and expiries, the counts must equal the sums.
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
from dcpkv.engine.hlc import ManualClock
from dcpkv.engine.item import EngineError
from dcpkv.engine.vbucket import VBucket

KEYS = [b"a", b"bb", b"ccc"]
VALUES = [b"", b"v", b"value" * 10]


def apply(
    bucket: Bucket, vb: VBucket, clock: ManualClock, op: str, key: bytes, value: bytes
) -> None:
    actions = {
        "set": lambda: vb.set(key, value),
        "set_plain": lambda: vb.set_plain(key, value, 0, 0, 0),
        "set_expiring": lambda: vb.set_plain(key, value, 0, 5, 0),
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


OPS = ["set", "set_plain", "set_expiring", "add", "replace", "append", "delete", "incr", "touch"]
OPS += ["flush", "eject", "later", "pager"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OPS), st.sampled_from(KEYS), st.sampled_from(VALUES)),
        max_size=40,
    )
)
def test_counts_equal_what_the_tables_hold(ops: list[tuple[str, bytes, bytes]]) -> None:
    clock = ManualClock()
    with TemporaryDirectory() as tmp:
        bucket = Bucket(
            "default", Path(tmp), num_vbuckets=1, clock=clock, rng=random.Random(3),
            checkpoint_max_items=4,
        )  # fmt: skip
        vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
        for op, key, value in ops:
            apply(bucket, vb, clock, op, key, value)
            assert vb._ht_memory == sum(i.size() for i in vb._ht.values())
            assert len(vb) == sum(1 for i in vb._ht.values() if not i.deleted)
            slots = [i for c in vb.checkpoints.checkpoints for i in c.items if i is not None]
            assert vb.checkpoints.memory_used == sum(i.size() for i in slots)
        bucket.shutdown()
