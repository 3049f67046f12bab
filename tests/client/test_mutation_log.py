"""The spec-002 mutation log: bounds, persistence, repair plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcpkv.client.mutation_log import MutationLog, RepairPlan


def test_bounded_per_vbucket_and_covers() -> None:
    with MutationLog(":memory:", capacity=3) as log:
        for seqno, key in enumerate([b"a", b"b", b"c", b"d", b"e"], start=1):
            log.record(0, seqno, key)
        log.record(1, 1, b"x")
        assert log.entries(0) == [(3, b"c"), (4, b"d"), (5, b"e")]
        assert log.entries(1) == [(1, b"x")]
        assert len(log) == 4
        assert log.evicted_high(0) == 2 and log.evicted_high(1) is None
        assert log.covers(0, 2) and log.covers(0, 4)
        assert not log.covers(0, 1)
        assert log.covers(1, 0)


def test_keys_above_are_distinct_oldest_first() -> None:
    with MutationLog(":memory:") as log:
        log.record_many([(0, 1, b"a"), (0, 2, b"b"), (0, 3, b"a"), (0, 4, b"c")])
        assert log.keys_above(0, 1) == [b"b", b"a", b"c"]
        assert log.keys_above(0, 4) == []


def test_replayed_record_does_not_grow_the_log() -> None:
    with MutationLog(":memory:", capacity=2) as log:
        log.record(0, 1, b"a")
        log.record(0, 1, b"a")  # crash after logging, before applying: logged again
        log.record(0, 2, b"b")
        assert log.entries(0) == [(1, b"a"), (2, b"b")]
        assert log.evicted_high(0) is None


def test_repair_plan_inside_and_outside_the_buffer() -> None:
    with MutationLog(":memory:", capacity=3) as log:
        log.record_many([(7, s, k) for s, k in [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"a")]])
        assert log.repair_plan(7, 2) == RepairPlan(7, 2, False, (b"c", b"a"))
        assert log.repair_plan(7, 0) == RepairPlan(7, 0, True)
        log.truncate_above(7, 2)
        assert log.entries(7) == [(2, b"b")]
        # Everything above 2 is gone, so was the history it was evicted from: but what lies
        # below 2 is still unknown.
        assert log.covers(7, 2) and not log.covers(7, 0)
        log.truncate_above(7, 0)  # a full resync starts the vbucket over
        assert log.covers(7, 0) and log.entries(7) == []


def test_repaired_logs_the_refetched_documents() -> None:
    with MutationLog(":memory:") as log:
        log.record_many([(0, 1, b"a"), (0, 2, b"b"), (0, 3, b"c")])
        log.repaired(0, 1, [(b"b", 9), (b"c", 9)])  # two documents gone: the high seqno
        assert log.entries(0) == [(1, b"a"), (9, b"b"), (9, b"c")]
        assert log.keys_above(0, 1) == [b"b", b"c"]


def test_persisted_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "mutations.db"
    with MutationLog(path, capacity=2) as log:
        log.record_many([(0, 1, b"a"), (0, 2, b"b"), (0, 3, b"c"), (0, 2**64 - 1, b"z")])
    with MutationLog(path, capacity=2) as log:
        assert log.entries(0) == [(3, b"c"), (2**64 - 1, b"z")]
        assert log.evicted_high(0) == 2 and len(log) == 2
        log.record(0, 4, b"d")  # the bound still holds after reopening
        assert len(log) == 2


def test_failed_batch_leaves_nothing_behind() -> None:
    with MutationLog(":memory:") as log:
        log.record(0, 1, b"a")
        with pytest.raises(ValueError, match="64-bit"):
            log.record_many([(0, 2, b"b"), (0, -1, b"bad")])
        assert log.entries(0) == [(1, b"a")] and len(log) == 1
