"""The consumer's rollback point: every worked table of spec 002."""

from __future__ import annotations

import pytest

from dcpkv.client.rollback_point import ImpossibleHistoryError, consumer_rollback_point
from dcpkv.core.failover_table import FailoverEntry as E

CAFEBABE, DEADBEEF, BA5EBA11 = 0xCAFEBABE, 0xDEADBEEF, 0xBA5EBA11

# (title of the spec's table, master log, client log, client snapshot, seen through, answer)
TABLES = [
    ("first connect, replica has no log, no snapshot", [E(CAFEBABE, 0)], [], 0, 0, 0),
    ("no failover, no snapshot, seen through seq 5", [E(CAFEBABE, 0)], [E(CAFEBABE, 0)], 0, 5, 5),
    ("no failover, snapshot at 6, seen through seq 7", [E(CAFEBABE, 0)], [E(CAFEBABE, 0)], 6, 7, 7),
    (
        "deadbeef master failover at 5, snapshot at 6, seen through 7",
        [E(DEADBEEF, 5), E(CAFEBABE, 0)],
        [E(CAFEBABE, 0)],
        6,
        7,
        5,
    ),
    (
        "deadbeef master failover at 8, snapshot at 6, seen through 7",
        [E(DEADBEEF, 8), E(CAFEBABE, 0)],
        [E(CAFEBABE, 0)],
        6,
        7,
        6,
    ),
    (
        "deadbeef at 8, client saw ba5eba11 at 7, snapshot at 7, seen through 9",
        [E(DEADBEEF, 8), E(CAFEBABE, 0)],
        [E(BA5EBA11, 7), E(CAFEBABE, 0)],
        7,
        9,
        7,
    ),
    (
        "deadbeef at 8, client saw ba5eba11 at 7, snapshot at 6 (entry elided), seen through 9",
        [E(DEADBEEF, 8), E(CAFEBABE, 0)],
        [E(BA5EBA11, 7), E(CAFEBABE, 0)],
        6,
        9,
        6,
    ),
    (
        "deadbeef created with no replica available, client saw ba5eba11 at 7",
        [E(DEADBEEF, 0)],
        [E(BA5EBA11, 7), E(CAFEBABE, 0)],
        7,
        9,
        0,
    ),
]


@pytest.mark.parametrize(
    ("title", "master", "client", "snapshot", "seen", "answer"), TABLES, ids=[t[0] for t in TABLES]
)
def test_worked_table(
    title: str, master: list, client: list, snapshot: int, seen: int, answer: int
) -> None:
    assert (
        consumer_rollback_point(master, client, snapshot_seqno=snapshot, seen_seqno=seen) == answer
    )


def test_the_impossible_table_is_a_clear_error() -> None:
    # No failover of master, client last saw master failover at ba5eba11 at 7: "Not possible!"
    with pytest.raises(ImpossibleHistoryError, match="no branch after it"):
        consumer_rollback_point(
            [E(CAFEBABE, 0)], [E(BA5EBA11, 7), E(CAFEBABE, 0)], snapshot_seqno=7, seen_seqno=9
        )


def test_the_newest_common_ancestor_is_used() -> None:
    master = [E(3, 20), E(2, 10), E(1, 0)]
    client = [E(2, 10), E(1, 0)]
    # common ancestor 2; next rows: master's branch 3 at 20, client sentinel at 15 -> 15
    assert consumer_rollback_point(master, client, snapshot_seqno=15, seen_seqno=18) == 15
