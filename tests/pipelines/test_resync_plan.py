"""A batch's rollback rows -> which vbuckets it resyncs (one Spark read for all of them) and
its manifest entries, table-driven: each resync is a reset (rollback to -1) and a skip to the
vbucket's resync seqno at the rollback row's own place, as one read per vbucket made them."""

from __future__ import annotations

import pytest

from dcpkv.pipelines.table_job import resync_rows, rollback_entries
from dcpkv.pipelines.vtable import Entry, RollbackRow, is_dead, scopes

ORD = 4
FLOORS = {1: 50, 2: 50, 3: 0}


def rb(vb: int, seqno: int, pos: int) -> RollbackRow:
    return RollbackRow(vb, seqno, pos)


@pytest.mark.parametrize(
    ("rows", "resynced", "why"),
    [
        ([rb(1, 60, 0)], [], "at or above the floor: an exact rollback"),
        ([rb(1, 50, 0)], [], "at the floor itself: exact"),
        ([rb(1, 49, 0)], [rb(1, 49, 0)], "below the floor: the history is gone"),
        ([rb(3, 0, 0)], [], "no floor: everything is kept"),
        (
            [rb(1, 10, 0), rb(2, 20, 1), rb(3, 5, 2)],
            [rb(1, 10, 0), rb(2, 20, 1)],
            "several vbuckets below their floors: one read for all",
        ),
        (
            [rb(1, 70, 0), rb(1, 10, 5)],
            [rb(1, 10, 5)],
            "an exact rollback first, then a resync of the same vbucket",
        ),
        (
            [rb(1, 10, 0), rb(1, 90, 5)],
            [rb(1, 10, 0), rb(1, 90, 5)],
            "a later rollback of a vbucket resynced in the batch is a resync too",
        ),
    ],
)
def test_resync_rows(rows: list[RollbackRow], resynced: list[RollbackRow], why: str) -> None:
    assert resync_rows(rows, FLOORS) == resynced, why


def test_entries_keep_stream_order_and_each_rows_own_place() -> None:
    rows = [rb(1, 70, 0), rb(2, 20, 1), rb(1, 10, 5), rb(3, 5, 6)]
    resyncs = resync_rows(rows, FLOORS)
    assert rollback_entries(rows, resyncs, {1: 80, 2: 33}, ORD) == [
        Entry("rollback", 1, 70, ORD, 0),
        Entry("rollback", 2, -1, ORD, 1),
        Entry("skip", 2, 33, ORD, 1),
        Entry("rollback", 1, -1, ORD, 5),
        Entry("skip", 1, 80, ORD, 5),
        Entry("rollback", 3, 5, ORD, 6),
    ]


def test_a_vbucket_reset_twice_in_one_batch_keeps_only_the_read_at_its_last_place() -> None:
    """Its read is stored at the last resync row's place (5): it is live, the stream's rows
    between the resets are dead, and what the stream re-sends after it is skipped up to H."""
    rows = [rb(1, 10, 0), rb(1, 90, 5)]
    reach = scopes(rollback_entries(rows, resync_rows(rows, FLOORS), {1: 80}, ORD))
    assert not is_dead(1, 80, ORD, 5, reach)  # the read's newest row
    assert not is_dead(1, 1, ORD, 5, reach)  # and its oldest
    assert is_dead(1, 95, ORD, 3, reach)  # streamed between the two resets
    assert is_dead(1, 80, ORD, 6, reach)  # re-sent after the read: skipped
    assert not is_dead(1, 81, ORD, 7, reach)  # the new branch above H
    assert is_dead(1, 40, ORD - 1, 0, reach)  # the history before the batch
