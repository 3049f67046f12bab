"""The repair decision of ``dcp/repair.py``, case by case (its docstring's table)."""

from __future__ import annotations

import pytest

from dcpkv.dcp.repair import Meta, RepairKind, RepairWrite, decide, worth_asking
from dcpkv.engine.item import Item


def live(cas: int, value: bytes = b"ours") -> Item:
    return Item(b"k", value, flags=3, expiry=0, cas=cas, by_seqno=cas, datatype=1)


def deleted(cas: int) -> Item:
    return Item(b"k", b"", cas=cas, by_seqno=cas, deleted=True)


OURS_LIVE, OURS_DELETED = live(9), deleted(9)
SET = RepairWrite(RepairKind.SET, b"k", 5, b"ours", 3, 0, 1)
ADD = RepairWrite(RepairKind.ADD, b"k", 0, b"ours", 3, 0, 1)
DELETE = RepairWrite(RepairKind.DELETE, b"k", cas=5)

CASES = [
    # (case, ours, our version at the point, the new active's GetMeta, the repair)
    ("R1 unchanged live doc", OURS_LIVE, live(5), Meta(5, False), SET),
    ("R2 created after the point, absent there", OURS_LIVE, None, None, ADD),
    ("R2 re-created after a shared delete", OURS_LIVE, deleted(5), Meta(5, True), ADD),
    ("R2 shared tombstone purged there", OURS_LIVE, deleted(5), None, ADD),
    ("R3 deleted after the point", OURS_DELETED, live(5), Meta(5, False), DELETE),
    ("R4 created and deleted on our side", OURS_DELETED, None, None, None),
    ("R4 deleted on both sides", OURS_DELETED, deleted(5), Meta(7, True), None),
    ("R5 changed there", OURS_LIVE, live(5), Meta(6, False), None),
    ("R5 deleted there", OURS_LIVE, live(5), Meta(6, True), None),
    ("R5 live doc gone there (cannot be)", OURS_LIVE, live(5), None, None),
    ("R5 created there too", OURS_LIVE, None, Meta(6, False), None),
    ("R5 created and deleted there", OURS_LIVE, None, Meta(6, True), None),
    ("R5 re-created there after a shared delete", OURS_LIVE, deleted(5), Meta(6, False), None),
    ("R5 changed there, we deleted", OURS_DELETED, live(5), Meta(6, False), None),
]


@pytest.mark.parametrize(
    ("ours", "base", "theirs", "repair"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_repair_decision(
    ours: Item, base: Item | None, theirs: Meta | None, repair: RepairWrite | None
) -> None:
    assert decide(ours, base, theirs) == repair
    if not worth_asking(ours, base):  # then no answer of the new active can matter
        assert repair is None
        assert all(decide(ours, base, m) is None for m in (None, Meta(5, False), Meta(5, True)))
