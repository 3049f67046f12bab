"""XDCR checkpoints: the resume rule's case table, the rollback rule, the log's bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.cluster.xdcr.checkpoints import (
    KEEP,
    Checkpoint,
    CheckpointLog,
    pick_after_rollback,
    pick_resume,
    target_branch_changed,
)
from dcpkv.core.failover_table import FailoverEntry as E

NEW = Checkpoint(source_uuid=0xA2, seqno=90, snap_start=80, snap_end=90, target_uuid=0xB1,
                 target_seqno=50)  # fmt: skip
OLD = Checkpoint(source_uuid=0xA1, seqno=40, snap_start=40, snap_end=40, target_uuid=0xB1,
                 target_seqno=20)  # fmt: skip
SOURCE = (E(0xA2, 60), E(0xA1, 0))  # newest first
TARGET = (E(0xB1, 0),)

CASES = [
    # (case, checkpoints, source log, target log, target high seqno, expected)
    ("newest passes both checks", [NEW, OLD], SOURCE, TARGET, 55, NEW),
    ("source failed over to a branch that does not know NEW: OLD", [NEW, OLD],
     (E(0xA3, 45), E(0xA1, 0)), TARGET, 55, OLD),
    ("no source branch known: from 0", [NEW, OLD], (E(0xA9, 0),), TARGET, 55, None),
    ("target rebuilt (uuid gone): from 0", [NEW, OLD], SOURCE, (E(0xB7, 0),), 55, None),
    ("target lost writes: its high seqno is below NEW's target point: OLD", [NEW, OLD],
     SOURCE, TARGET, 30, OLD),
    ("target failed over at 45 (above NEW's 50? no, below): OLD still held", [NEW, OLD],
     SOURCE, (E(0xB2, 45), E(0xB1, 0)), 100, OLD),
    ("target failed over at 50: NEW's branch reached 50: NEW", [NEW, OLD], SOURCE,
     (E(0xB2, 50), E(0xB1, 0)), 100, NEW),
    ("nothing kept: from 0", [], SOURCE, TARGET, 55, None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "cps", "source", "target", "high", "expected"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_resume_case_table(
    case: str,
    cps: list[Checkpoint],
    source: tuple[E, ...],
    target: tuple[E, ...],
    high: int,
    expected: Checkpoint | None,
) -> None:
    assert pick_resume(cps, source, target, high) == expected


def test_a_rollback_keeps_the_newest_checkpoint_at_or_below_its_point() -> None:
    assert pick_after_rollback([NEW, OLD], 90) == NEW
    assert pick_after_rollback([NEW, OLD], 89) == OLD
    assert pick_after_rollback([NEW, OLD], 39) is None
    log = CheckpointLog({3: [NEW, OLD]})
    assert log.rolled_back(3, 50) == OLD
    assert log.of(3) == [OLD]


def test_the_log_keeps_a_few_newest_first_and_round_trips_json() -> None:
    log = CheckpointLog()
    for seqno in range(1, 10):
        log.record(0, Checkpoint(1, seqno, seqno, seqno, 2, seqno))
    assert not log.record(0, Checkpoint(1, 9, 9, 9, 2, 9))  # unchanged
    assert [cp.seqno for cp in log.of(0)] == list(range(9, 9 - KEEP, -1))
    again = CheckpointLog.from_json(log.to_json())
    assert again.of(0) == log.of(0)
    with pytest.raises(ValueError, match="six"):
        CheckpointLog.from_json({"0": [[1, 2, 3]]})


seqnos = st.integers(0, 100)


@given(st.lists(seqnos, min_size=1, max_size=8), seqnos)
def test_after_a_rollback_no_checkpoint_above_the_point_survives(
    points: list[int], rollback: int
) -> None:
    log = CheckpointLog()
    for p in sorted(points):
        log.record(0, Checkpoint(1, p, p, p, 2, p))
    picked = log.rolled_back(0, rollback)
    assert all(cp.seqno <= rollback for cp in log.of(0))
    assert picked is None or picked == max(log.of(0), key=lambda cp: cp.seqno)


@pytest.mark.parametrize(
    ("now", "changed"),
    [
        ({0: (0xB1, 10), 1: (0xB2, 7)}, []),  # the same branches, writes went on
        ({0: (0xB1, 5), 1: (0xB2, 7)}, []),  # nothing new
        ({0: (0xB1, 10), 1: (0xC9, 9)}, [1]),  # vbucket 1 restarted uncleanly / failed over
        ({0: (0xB1, 4), 1: (0xB2, 7)}, [0]),  # the same uuid, but writes are gone
        ({0: (0xD0, 0), 1: (0xC9, 3)}, [0, 1]),
        ({0: (0xB1, 10), 1: (0xB2, 7), 2: (0xE0, 1)}, []),  # one not seen before
    ],
)
def test_a_target_vbucket_on_another_branch_is_noticed(
    now: dict[int, tuple[int, int]], changed: list[int]
) -> None:
    assert target_branch_changed({0: (0xB1, 5), 1: (0xB2, 3)}, now) == changed
