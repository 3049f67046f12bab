"""Background fetches (``engine/bg_fetch.py``): the pending-fetch table alone, then a bucket
whose fetcher thread reads while the test holds each landing until it chooses to land it, so
the races the table must survive (a write, an eviction, a rollback meanwhile) happen in a
chosen order."""

from __future__ import annotations

import queue
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.replication_topology import parse_topology
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bg_fetch import PendingFetches, WouldBlock
from dcpkv.engine.bg_fetcher import Landing
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hash_table import EvictionPolicy
from dcpkv.engine.item import Item, KeyExists, KeyNotFound, PrepareItem
from dcpkv.engine.vbucket import SyncOutcome, VBucket
from dcpkv.protocol.constants import DurabilityLevel

from .conftest import BucketFactory

FULL, VALUE_ONLY = EvictionPolicy.FULL, EvictionPolicy.VALUE_ONLY
V1 = Item(b"k", b"v1", by_seqno=1)


def _noted(log: list[str], name: str) -> Callable[[], None]:
    return lambda: log.append(name)


# -- the table --------------------------------------------------------------------------------


def test_requests_for_one_key_share_one_read() -> None:
    table, ran = PendingFetches(), list[str]()
    assert table.want(b"k", _noted(ran, "a")) is True  # the first: the fetcher is told
    assert table.want(b"k", _noted(ran, "b")) is False
    assert table.take() == [b"k"]
    assert table.want(b"k", _noted(ran, "c")) is False  # in flight: joins it
    assert table.take() == []
    for waiter in table.landed(b"k", V1):
        waiter()
    assert ran == ["a", "b", "c"] and table.ready == {b"k": V1}
    table.consumed(b"k")
    assert not table and table.want(b"k", _noted(ran, "d")) is True  # a new read


@pytest.mark.parametrize("drop", ["dropped", "dropped_all"])
def test_a_read_in_flight_when_its_key_leaves_the_table_is_not_used(drop: str) -> None:
    table = PendingFetches()
    table.want(b"k", lambda: None)
    table.take()
    getattr(table, drop)(*([b"k"] if drop == "dropped" else []))
    assert len(table.landed(b"k", V1)) == 1  # the waiter runs again (and asks again)
    assert table.ready == {}


def test_a_ready_result_is_forgotten_when_its_key_leaves_the_table() -> None:
    table = PendingFetches()
    table.want(b"k", lambda: None)
    table.take()
    table.landed(b"k", V1)
    assert list(table.watched()) == [b"k"]
    table.dropped(b"k")
    assert table.ready == {} and not table


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["want", "take", "drop", "land"]), st.integers(0, 2))))
def test_every_waiter_runs_once_and_only_valid_reads_are_ready(
    steps: list[tuple[str, int]],
) -> None:
    """Against a model: each waiter is handed back exactly once, by the landing of a read
    taken after it asked (or that it joined); a read is ready only if no drop of its key came
    between its take and its landing."""
    table, handed = PendingFetches(), []
    asked: dict[bytes, list[int]] = {}
    taken: dict[bytes, bool] = {}  # key -> valid
    n = 0
    for op, i in steps:
        key = b"k%d" % i
        if op == "want":
            table.want(key, lambda n=n: handed.append(n))  # type: ignore[misc]
            asked.setdefault(key, []).append(n)
            n += 1
        elif op == "take":
            for k in table.take():
                taken[k] = True
        elif op == "drop":
            table.dropped(key)
            if key in taken:
                taken[key] = False
        elif key in taken:  # land a taken read
            before = len(handed)
            for waiter in table.landed(key, V1):
                waiter()
            assert sorted(handed[before:]) == asked.pop(key)
            assert (key in table.ready) is taken.pop(key)
            table.consumed(key)
    assert sorted(handed + [w for ws in asked.values() for w in ws]) == list(range(n))


# -- a bucket with its fetcher thread -----------------------------------------------------------


class Held:
    """The landings of a bucket's fetcher, held until the test lands them (on its thread)."""

    def __init__(self, bucket: Bucket) -> None:
        self.landings: queue.Queue[Landing] = queue.Queue()
        bucket.start_background_fetch(self.landings.put)

    def land_next(self) -> None:
        Bucket.land_fetches(self.landings.get(timeout=30))

    def land_until(self, done: Callable[[], bool]) -> None:
        """Land batches until ``done`` (the fetcher may split what was asked in several)."""
        while not done():
            self.land_next()


def fetching_bucket(open_bucket: BucketFactory, policy: EvictionPolicy) -> tuple[Bucket, VBucket]:
    """One vbucket holding ``a`` .. ``e`` (values ``v-<key>``), persisted and evicted."""
    bucket = open_bucket(num_vbuckets=1, eviction_policy=policy, history_window=1000)
    vb = bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    for key in (b"a", b"b", b"c", b"d", b"e"):
        vb.set(key, b"v-" + key)
    bucket.flush_once()
    vb.eject()
    return bucket, vb


def run_waiting(op: Callable[[], object], answers: list[object]) -> Callable[[], None]:
    """A request as the server runs it: now, and again each time a fetch it waits for lands;
    its answer (or refusal) goes to ``answers``."""

    def attempt() -> None:
        try:
            answers.append(op())
        except WouldBlock as wait:
            wait.vbucket.wait_for(wait.key, attempt)
        except (KeyNotFound, KeyExists) as exc:
            answers.append(exc)

    return attempt


def value_of(answer: object) -> bytes | None:
    assert isinstance(answer, Item), answer
    return answer.value


@pytest.mark.parametrize("policy", list(EvictionPolicy))
def test_a_request_waits_for_its_read_and_gets_the_value(
    open_bucket: BucketFactory, policy: EvictionPolicy
) -> None:
    bucket, vb = fetching_bucket(open_bucket, policy)
    held = Held(bucket)
    answers: list[object] = []
    for key in (b"a", b"b", b"a"):  # two for one key: one read
        run_waiting(lambda key=key: vb.get(key), answers)()  # type: ignore[misc]
    assert answers == []  # all wait; nothing was read on this thread
    held.land_until(lambda: len(answers) == 3)
    assert sorted(value_of(a) or b"" for a in answers) == [b"v-a", b"v-a", b"v-b"]
    fetcher = bucket.bg_fetcher
    assert fetcher is not None and fetcher.keys_read == 2
    # A missing key: valueOnly knows every key; under full eviction RocksDB's filters rule
    # it out with no read at all
    run_waiting(lambda: vb.get(b"never-written"), answers)()
    held.land_until(lambda: len(answers) == 4)
    assert isinstance(answers[-1], KeyNotFound)
    assert fetcher.keys_read == 2
    assert vb.fetches.waiting == 0


def test_a_prefetched_missing_key_is_read_and_its_get_answers_key_not_found(
    open_bucket: BucketFactory,
) -> None:
    """A prefetch asks no filter (the read answers a miss, off the caller's thread): a key
    never written, prefetched behind a waiting Get, is read in the same batch as it, and its
    own Get then finds the read ready (None) and answers KeyNotFound without waiting."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    held = Held(bucket)
    answers: list[object] = []
    fetcher = bucket.bg_fetcher
    assert fetcher is not None
    fetcher.hold()  # (both keys in one batch, as a connection asks them)
    run_waiting(lambda: vb.get(b"a"), answers)()
    vb.prefetch(b"never-written")
    fetcher.release()
    landing = held.landings.get(timeout=30)
    assert sorted(key for _, key, _ in landing) == [b"a", b"never-written"]
    missing: list[object] = []

    def next_request() -> None:  # what the connection runs behind the Get, while ready
        run_waiting(lambda: vb.get(b"never-written"), missing)()

    vb.wait_for(b"a", next_request)
    Bucket.land_fetches(landing)
    assert [value_of(a) for a in answers] == [b"v-a"]
    assert len(missing) == 1 and isinstance(missing[0], KeyNotFound)
    assert fetcher.keys_read == 2 and vb.fetches.waiting == 0


def test_keys_asked_while_the_fetcher_is_held_are_read_in_one_batch(
    open_bucket: BucketFactory,
) -> None:
    """A connection holds the fetcher while it asks for its pipelined keys: however the
    thread is woken meanwhile, it reads them in one batch, which lands once."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    held = Held(bucket)
    fetcher = bucket.bg_fetcher
    assert fetcher is not None
    answers: list[object] = []
    fetcher.hold()
    for key in (b"a", b"b", b"c", b"d", b"e"):
        run_waiting(lambda key=key: vb.get(key), answers)()  # type: ignore[misc]
    fetcher.hold()  # (holds nest: the first release lets nothing go)
    fetcher.release()
    assert answers == [] and fetcher.batches == 0
    fetcher.release()
    held.land_next()
    assert sorted(value_of(a) or b"" for a in answers) == [b"v-a", b"v-b", b"v-c", b"v-d", b"v-e"]
    assert fetcher.batches == 1


def test_a_write_landing_while_the_read_is_in_flight_wins(open_bucket: BucketFactory) -> None:
    """valueOnly: a Set of a key whose value was ejected needs no read; a Get waiting for
    the old value then answers the new one, and the old value is not put back over it."""
    bucket, vb = fetching_bucket(open_bucket, VALUE_ONLY)
    held = Held(bucket)
    answers: list[object] = []
    run_waiting(lambda: vb.get(b"a"), answers)()
    assert answers == []
    vb.set(b"a", b"new")  # lands at once
    held.land_next()
    assert [value_of(a) for a in answers] == [b"new"]
    assert vb.peek(b"a").value == b"new"  # type: ignore[union-attr]


def test_a_key_evicted_again_before_its_waiters_ran_is_read_again(
    open_bucket: BucketFactory,
) -> None:
    """Full eviction: the first waiter writes the key, the flusher persists it and the next
    write's admission evicts it, all before the second waiter (a Get) runs: the read's result
    (the old version) must not answer it; it waits for a new read, which finds the new one."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    held = Held(bucket)
    answers: list[object] = []

    def write_then_evict() -> Item:
        item = vb.set(b"a", b"new")
        bucket.flush_once()
        vb.eject()
        assert vb.peek(b"a") is None
        return item

    run_waiting(write_then_evict, answers)()
    run_waiting(lambda: vb.get(b"a"), answers)()
    held.land_next()
    assert len(answers) == 1  # the write; the Get asked again
    held.land_next()
    assert value_of(answers[1]) == b"new"
    assert len(vb) == 5


def test_a_read_across_a_rollback_is_not_used(open_bucket: BucketFactory) -> None:
    """A read made before a rollback lands after it: what it found is history the rollback
    undid, so the waiting Get reads again and answers the rolled-back version."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    point = vb.high_seqno
    vb.set(b"a", b"undone")
    bucket.flush_once()
    vb.eject()
    held = Held(bucket)
    answers: list[object] = []
    run_waiting(lambda: vb.get(b"a"), answers)()
    landing = held.landings.get(timeout=30)  # read: "undone"
    bucket.set_vbucket_state(0, VBucketState.REPLICA)
    assert bucket.rollback(0, point) == point
    bucket.set_vbucket_state(0, VBucketState.ACTIVE)
    Bucket.land_fetches(landing)
    assert answers == []
    held.land_next()
    assert [value_of(a) for a in answers] == [b"v-a"]


def test_deletes_and_counts_through_background_fetches(open_bucket: BucketFactory) -> None:
    """Writes of non-resident keys wait for their reads and keep the item count exact."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    held = Held(bucket)
    answers: list[object] = []
    run_waiting(lambda: vb.delete(b"a"), answers)()
    run_waiting(lambda: vb.add(b"b", b"x"), answers)()
    run_waiting(lambda: vb.set(b"new", b"x"), answers)()
    held.land_until(lambda: len(answers) == 3)
    assert len(vb) == 5  # a deleted, new added
    assert [a.key for a in answers if isinstance(a, Item)] == [b"a", b"new"] or sorted(
        a.key for a in answers if isinstance(a, Item)
    ) == [b"a", b"new"]
    assert sum(isinstance(a, KeyExists) for a in answers) == 1  # Add of b: it exists on disk


def test_a_sync_write_of_a_non_resident_key_waits_then_prepares_once(
    open_bucket: BucketFactory,
) -> None:
    """A SyncWrite whose write must read its key first: WouldBlock leaves no prepare and no
    pending SyncWrite behind; run again after the fetch, it prepares (and, alone, commits)."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    vb.set_topology(parse_topology(b'{"topology": [["node-a:11210"]]}'))
    outcomes: list[SyncOutcome] = []
    vb.on_sync_outcomes = lambda _vb, got: outcomes.extend(got)
    held = Held(bucket)
    answers: list[object] = []

    def durable_set() -> object:
        return vb.sync_write(lambda: vb.set(b"a", b"durable"), DurabilityLevel.Majority,
                             cookie="c")  # fmt: skip

    run_waiting(durable_set, answers)()
    assert answers == [] and not vb.holds_prepares and vb.high_seqno == 5
    held.land_until(lambda: len(answers) == 1)
    assert [o.cookie for o in outcomes] == ["c"]  # one prepare, committed
    assert vb.get(b"a").value == b"durable"
    assert len(vb) == 5


# -- a replica's writes (DCP) and a monitor's commits ---------------------------------------------


def replica_bucket(open_bucket: BucketFactory) -> tuple[Bucket, VBucket]:
    """A full-eviction replica vbucket holding ``a`` .. ``e`` (seqnos 1-5, as its active made
    them), persisted and evicted."""
    bucket = open_bucket(num_vbuckets=1, eviction_policy=FULL, history_window=1000)
    vb = bucket.set_vbucket_state(0, VBucketState.REPLICA)
    vb.replica_snapshot_marker(1, 5)
    for seqno, key in enumerate((b"a", b"b", b"c", b"d", b"e"), 1):
        vb.set_with_meta(Item(key, b"v-" + key, cas=seqno, rev_seqno=1, by_seqno=seqno))
    bucket.flush_once()
    vb.eject()
    assert vb.table_entries == 0
    return bucket, vb


def test_a_replica_write_of_a_non_resident_key_waits_for_its_read(
    open_bucket: BucketFactory,
) -> None:
    """With a fetcher running, a replica's with-meta write of a key only storage holds reads
    nothing on its thread: it raises WouldBlock before any change, and applied again once the
    read landed it replaces (or deletes) the stored version with the count exact."""
    bucket, vb = replica_bucket(open_bucket)
    held = Held(bucket)
    vb.replica_snapshot_marker(6, 8)
    answers: list[object] = []
    update = Item(b"a", b"new", cas=6, rev_seqno=2, by_seqno=6)
    run_waiting(lambda: vb.set_with_meta(update), answers)()
    assert answers == [] and vb.high_seqno == 5 and vb.table_entries == 0
    held.land_until(lambda: len(answers) == 1)
    deletion = Item(b"b", b"", cas=7, rev_seqno=2, by_seqno=7, deleted=True)
    run_waiting(lambda: vb.delete_with_meta(deletion), answers)()
    held.land_until(lambda: len(answers) == 2)
    run_waiting(lambda: vb.set_with_meta(Item(b"z", b"n", cas=8, by_seqno=8)), answers)()
    held.land_until(lambda: len(answers) == 3)
    assert vb.high_seqno == 8
    assert len(vb) == 5  # a replaced, b deleted, z new
    bucket.flush_once()
    assert bucket.storage.item_count(0) == 5


def test_a_replica_commit_of_a_non_resident_key_waits_and_keeps_its_prepare(
    open_bucket: BucketFactory,
) -> None:
    """A replicated commit whose key's committed version only storage holds waits for the
    read with its prepare still held (taking the prepare first lost it: the commit, run
    again, found no prepare)."""
    bucket, vb = replica_bucket(open_bucket)
    held = Held(bucket)
    vb.replica_snapshot_marker(6, 7)
    vb.replica_prepare(PrepareItem(b"a", b"durable", cas=6, rev_seqno=2, by_seqno=6, level=1))
    answers: list[object] = []
    run_waiting(lambda: vb.replica_commit(b"a", 6, 7, 7), answers)()
    assert answers == [] and vb.holds_prepares
    held.land_until(lambda: len(answers) == 1)
    assert not vb.holds_prepares and vb.high_seqno == 7
    assert len(vb) == 5
    assert vb.peek(b"a") is not None and vb.peek(b"a").value == b"durable"  # type: ignore[union-attr]


def test_a_warmed_up_prepare_of_a_non_resident_key_commits_without_waiting(
    open_bucket: BucketFactory,
) -> None:
    """A prepare read back at warm-up (full eviction: its key's committed version is on disk
    only) commits when a topology lets it: the monitor's decision cannot wait for a fetch
    (it may land on the flusher's thread), so the commit reads in place."""
    bucket, vb = fetching_bucket(open_bucket, FULL)
    vb.set_topology(parse_topology(b'{"topology": [["node-a:11210", "node-b:11210"]]}'))
    vb.sync_write(lambda: vb.set(b"a", b"durable"), DurabilityLevel.Majority, cookie="c")
    assert vb.holds_prepares  # node-b never acknowledges it
    bucket.shutdown()
    again = open_bucket(num_vbuckets=1, eviction_policy=FULL, history_window=1000)
    Held(again)
    vb = again.get_vbucket(0)
    assert vb.holds_prepares and vb.table_entries == 0
    vb.set_topology(parse_topology(b'{"topology": [["node-a:11210"]]}'))  # commits now
    assert not vb.holds_prepares
    committed = vb.peek(b"a")
    assert committed is not None and committed.value == b"durable"
    assert len(vb) == 5
