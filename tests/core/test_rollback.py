"""The producer's rollback decision: every case of spec 000, the examples of spec 001."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dcpkv.core.failover_table import FailoverEntry, FailoverTable
from dcpkv.core.rollback import (
    REASON_NO_COMMON_HISTORY,
    RollbackDecision,
    adjust_snapshot,
    needs_rollback,
    reason_ahead,
    reason_purged,
)
from dcpkv.core.seqno import U64_MAX

# The producer of spec 001: branch 1111 from 0, branch 2222 from 3, high seqno 10.
SPEC_TABLE = FailoverTable([FailoverEntry(2222, 3), FailoverEntry(1111, 0)])


@dataclass(frozen=True)
class Case:
    name: str
    uuid: int
    snap: tuple[int, int]
    start: int
    expect: RollbackDecision | None
    purge: int = 0
    high: int = 10
    strict: bool = False
    consumer_purge: int | None = None
    ignore_purged: bool = False


CASES = [
    # spec 001, the correct resume request: told to roll back to its snapshot start
    Case("001 correct resume", 1111, (1, 4), 3, RollbackDecision(1, reason_ahead(3))),
    # spec 001, the incorrect request (snapshot claimed as {3,3}): wrongly not rolled back
    Case("001 lying resume", 1111, (3, 3), 3, None),
    # 1a: nothing to undo at zero
    Case("1a uuid 0", 0, (0, 0), 0, None),
    Case("1a unknown uuid, not strict", 9999, (0, 0), 0, None),
    Case("1a uuid 0, strict", 0, (0, 0), 0, None, strict=True),
    # 1b: a history at zero is checked by 3 and 4 when the consumer is strict
    Case(
        "1b unknown uuid, strict",
        9999,
        (0, 0),
        0,
        RollbackDecision(0, REASON_NO_COMMON_HISTORY),
        strict=True,
    ),
    Case("1b known uuid, strict", 1111, (0, 0), 0, None, strict=True),
    # 2: the producer purged tombstones the consumer may not have seen
    Case(
        "2 purge above snap start", 2222, (4, 6), 5, RollbackDecision(0, reason_purged(5)), purge=5
    ),
    Case("2 purge equal snap start", 2222, (5, 6), 5, None, purge=5),
    Case("2 not at start 0", 0, (0, 0), 0, None, purge=5),
    Case("2 whole snapshot held: adjusted", 2222, (4, 6), 6, None, purge=5),
    Case("2 consumer knows the purge", 2222, (4, 6), 5, None, purge=5, consumer_purge=5),
    Case(
        "2 consumer knows an older purge",
        2222,
        (4, 6),
        5,
        RollbackDecision(0, reason_purged(5)),
        purge=5,
        consumer_purge=4,
    ),
    Case("2 IgnorePurgedTombstones", 2222, (4, 6), 5, None, purge=5, ignore_purged=True),
    # 3: no common history
    Case("3 unknown uuid", 3333, (4, 6), 5, RollbackDecision(0, REASON_NO_COMMON_HISTORY)),
    # 4a: lagging consumer, on the latest branch or an older one
    Case("4a latest branch", 2222, (4, 6), 5, None),
    Case("4a latest branch at high seqno", 2222, (10, 10), 10, None),
    Case("4a old branch ends at its upper", 1111, (0, 3), 2, None),
    Case("4a old branch, full snapshot", 1111, (2, 3), 3, None),
    # 4b: leading consumer, whole snapshot above upper
    Case("4b old branch", 1111, (5, 8), 6, RollbackDecision(3, reason_ahead(3))),
    Case(
        "4b latest branch past high seqno",
        2222,
        (12, 14),
        13,
        RollbackDecision(10, reason_ahead(10)),
    ),
    Case("4b full snapshot adjusted", 1111, (1, 5), 5, RollbackDecision(3, reason_ahead(3))),
    # 4c: snapshot straddles upper
    Case("4c old branch", 1111, (2, 5), 4, RollbackDecision(2, reason_ahead(3))),
    Case("4c empty snapshot adjusted to start", 1111, (2, 5), 2, None),
    Case("4c latest branch", 2222, (9, 12), 11, RollbackDecision(9, reason_ahead(10))),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_rollback_decision(case: Case) -> None:
    got = needs_rollback(
        start=case.start,
        vb_uuid=case.uuid,
        snap_start=case.snap[0],
        snap_end=case.snap[1],
        purge_seqno=case.purge,
        failover_table=SPEC_TABLE,
        high_seqno=case.high,
        strict_vb_uuid=case.strict,
        consumer_purge_seqno=case.consumer_purge,
        ignore_purged_tombstones=case.ignore_purged,
    )
    assert got == case.expect


@pytest.mark.parametrize(
    ("start", "snap", "adjusted"),
    [
        (5, (1, 5), (5, 5)),  # has the whole snapshot
        (1, (1, 5), (1, 1)),  # has none of it
        (3, (1, 5), (1, 5)),  # inside it
        (4, (4, 4), (4, 4)),
    ],
)
def test_snapshot_adjustment(start: int, snap: tuple[int, int], adjusted: tuple[int, int]) -> None:
    assert adjust_snapshot(start, *snap) == adjusted


def test_reason_texts_are_the_reference_texts() -> None:
    assert reason_purged(7) == (
        "purge seqno (7) is greater than start seqno - could miss purged deletions"
    )
    assert REASON_NO_COMMON_HISTORY == (
        "vBucket UUID not found in failover table, consumer and producer have no common history"
    )
    assert reason_ahead(3) == "consumer ahead of producer - producer upper at 3"


# -- invariants ----------------------------------------------------------------------------

seqno = st.integers(min_value=0, max_value=U64_MAX)


@st.composite
def producers(draw: st.DrawFn) -> tuple[FailoverTable, int, int]:
    """A failover table with non-increasing seqnos, a high seqno above it, a purge seqno."""
    cuts = sorted(draw(st.lists(seqno, min_size=1, max_size=6, unique=True)), reverse=True)
    uuids = draw(
        st.lists(st.integers(1, U64_MAX), min_size=len(cuts), max_size=len(cuts), unique=True)
    )
    high = draw(st.integers(min_value=cuts[0], max_value=U64_MAX))
    purge = draw(st.integers(min_value=0, max_value=high))
    return (
        FailoverTable([FailoverEntry(u, s) for u, s in zip(uuids, cuts, strict=True)]),
        high,
        purge,
    )


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, int, int]:
    a, b, c = sorted(draw(st.lists(seqno, min_size=3, max_size=3)))
    return a, b, c  # snap_start <= start <= snap_end


@given(producers(), requests(), st.booleans())
def test_latest_branch_within_high_seqno_never_rolls_back(producer, request, strict) -> None:
    table, high, purge = producer
    snap_start, start, snap_end = request
    assume(snap_end <= high and snap_start >= purge)
    got = needs_rollback(
        start=start,
        vb_uuid=table.latest.uuid,
        snap_start=snap_start,
        snap_end=snap_end,
        purge_seqno=purge,
        failover_table=table,
        high_seqno=high,
        strict_vb_uuid=strict,
    )
    assert got is None


@given(producers(), requests(), st.integers(0, U64_MAX), st.booleans())
def test_rollback_seqno_never_exceeds_the_start(producer, request, uuid, strict) -> None:
    table, high, purge = producer
    snap_start, start, snap_end = request
    for vb_uuid in (uuid, *(e.uuid for e in table)):
        got = needs_rollback(
            start=start,
            vb_uuid=vb_uuid,
            snap_start=snap_start,
            snap_end=snap_end,
            purge_seqno=purge,
            failover_table=table,
            high_seqno=high,
            strict_vb_uuid=strict,
        )
        if got is not None:
            assert got.seqno <= start
            assert got.seqno <= adjust_snapshot(start, snap_start, snap_end)[0]


@given(producers(), requests(), st.integers(0, U64_MAX))
def test_asking_again_from_the_answer_is_accepted(producer, request, uuid) -> None:
    table, high, purge = producer
    snap_start, start, snap_end = request
    for vb_uuid in (uuid, *(e.uuid for e in table)):
        got = needs_rollback(
            start=start,
            vb_uuid=vb_uuid,
            snap_start=snap_start,
            snap_end=snap_end,
            purge_seqno=purge,
            failover_table=table,
            high_seqno=high,
        )
        if got is None:
            continue
        r = got.seqno
        again = needs_rollback(
            start=r,
            vb_uuid=table.latest.uuid,
            snap_start=r,
            snap_end=r,
            purge_seqno=purge,
            failover_table=table,
            high_seqno=high,
        )
        if purge > r and r != 0:
            assert again == RollbackDecision(0, reason_purged(purge))
        else:
            assert again is None
