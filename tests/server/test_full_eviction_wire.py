"""Full eviction over the wire: a real server whose bucket holds several quotas of small items.

Small items are mostly key and metadata. Under ``valueOnly`` every key stays in memory, so such
a bucket fills up and refuses writes (Etmpfail) for good; under ``fullEviction`` the persisted
items leave memory whole and every write is taken once the flusher has caught up. Every item
then reads back (from disk), ``curr_items`` is exact, and so it is after a restart, whose
warm-up loads no items.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import vbucket_for_key
from dcpkv.protocol.constants import Opcode
from support.kvclient import KVClient, send_batch, write_keys
from support.replicacheck import contents
from support.serverproc import ServerProcess

QUOTA_MB = 1
VALUE = b"v" * 100
ITEMS = 4 * QUOTA_MB * 1024 * 1024 // len(VALUE)  # four quotas of values alone (~42k keys)
VBUCKETS = 16  # (ServerProcess starts its servers with 16)
BATCH = 500


def key_of(i: int) -> bytes:
    return b"fe-%08d" % i


def write_all(c: KVClient, keys: list[bytes], window_s: float) -> list[bytes]:
    """Set every key (support.kvclient.write_keys); the keys of the first batch still refused
    after ``window_s`` of retries (none: all were taken)."""
    return write_keys(c, keys, VALUE, batch=BATCH, window_s=window_s)[1]


def read_all(c: KVClient, keys: list[bytes]) -> None:
    for base in range(0, len(keys), BATCH):
        batch = keys[base : base + BATCH]
        for key, frame in zip(batch, send_batch(c, Opcode.Get, batch), strict=True):
            got = (frame.status, frame.value)
            assert got == (Status.Success, VALUE), (key, Status(got[0]))


@pytest.mark.parametrize("policy", ["valueOnly", "fullEviction"])
def test_a_bucket_of_several_quotas_of_small_items(
    server_factory: type, tmp_path: Path, policy: str
) -> None:
    srv: ServerProcess = server_factory(
        tmp_path / "data", tmp_path / "log", "--memory-quota-mb", str(QUOTA_MB),
        "--eviction-policy", policy,
    )  # fmt: skip
    srv.start()
    keys = [key_of(i) for i in range(ITEMS)]
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        if policy == "valueOnly":
            # The keys alone fill the quota: refused for good, whatever the flusher does.
            refused = write_all(c, keys, window_s=3.0)
            assert refused
            return
        # The window is a safety net for a busy machine: a refusal lasts until the next flush.
        assert write_all(c, keys, window_s=60.0) == []
        stats = c.stats()
        assert stats["ep_item_eviction_policy"] == "full_eviction"
        assert int(stats["curr_items"]) == ITEMS
        assert int(stats["mem_used"]) <= int(stats["ep_max_size"])
        read_all(c, keys)
        missing = b"never-written"
        got = c.get(missing, vbucket=vbucket_for_key(missing, VBUCKETS))
        assert got.status == Status.KeyEnoent
    assert srv.terminate() == 0
    srv.start()  # warm-up loads no items: the count comes from each vbucket's state
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        assert int(c.stats()["curr_items"]) == ITEMS
        read_all(c, keys[::7])
    assert srv.terminate() == 0


def test_flush_deletes_the_keys_only_disk_holds(server_factory: type, tmp_path: Path) -> None:
    """After a restart a full-eviction bucket holds no item in memory: Flush must still delete
    every key (one tombstone, one seqno each), and the count stays 0 across another restart."""
    srv: ServerProcess = server_factory(
        tmp_path / "data", tmp_path / "log", "--eviction-policy", "fullEviction"
    )
    srv.start()
    keys = [key_of(i) for i in range(300)]
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        assert write_all(c, keys, window_s=60.0) == []
    assert srv.terminate() == 0
    srv.start()  # warm-up loads no items: every key is on disk only
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        assert c.set(keys[0], b"rewritten", vbucket=vbucket_for_key(keys[0], VBUCKETS)).status == 0
        before = c.stats(b"vbucket-seqno")
        assert int(c.stats()["curr_items"]) == len(keys)
        assert c.call(Opcode.Flush).status == Status.Success
        assert int(c.stats()["curr_items"]) == 0
        after = c.stats(b"vbucket-seqno")
        per_vb = [0] * VBUCKETS
        for key in keys:
            per_vb[vbucket_for_key(key, VBUCKETS)] += 1
        for vb, n in enumerate(per_vb):
            assert int(after[f"vb_{vb}:high_seqno"]) == int(before[f"vb_{vb}:high_seqno"]) + n
        for key in keys[::10]:
            assert c.get(key, vbucket=vbucket_for_key(key, VBUCKETS)).status == Status.KeyEnoent
    # a DCP consumer from 0 ends with every key deleted (from memory and disk alike)
    streamed = contents(srv.port, "after-flush")
    ended = {key: value for docs in streamed.values() for key, (_, _, value) in docs.items()}
    assert set(keys) <= set(ended) and all(ended[key] is None for key in keys)
    assert srv.terminate() == 0
    srv.start()
    with KVClient(srv.port, timeout=60) as c:
        c.login()
        assert int(c.stats()["curr_items"]) == 0
        key = keys[5]
        assert c.get(key, vbucket=vbucket_for_key(key, VBUCKETS)).status == Status.KeyEnoent
    assert srv.terminate() == 0
