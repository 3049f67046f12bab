"""The mirror's retention floor comes from what a failover cannot take away: the lowest seqno
persisted on the branch by the active and its replicas (``source_node.safe_seqno``), then the
highest consistent point of the applied offset at or below it (``mirror.floors_from``)."""

from __future__ import annotations

import pytest

from dcpkv.core.durability import Observation
from dcpkv.pipelines.source_node import safe_seqno
from dcpkv.pipelines.table_job import floors_from
from dcpkv.pipelines.vtable import Manifest


def active(persisted: int) -> Observation:
    return Observation(True, persisted, persisted)


def replica(persisted: int, known: bool = True, branch_end: int | None = None) -> Observation:
    return Observation(False, persisted, persisted, known, branch_end)


@pytest.mark.parametrize(
    ("found", "safe"),
    [
        ([], None),  # the branch moved, or the active gave no answer
        ([active(40)], 40),  # no replica
        ([active(40), replica(33)], 33),  # a failover would promote it at 33 at best
        ([active(40), replica(45)], 40),  # the replica flushed further than the active
        ([active(40), replica(33), replica(38)], 33),  # two replicas: the lowest
        ([active(40), replica(0, known=False)], 0),  # a replica being rebuilt
        ([active(40), replica(50, branch_end=30)], 30),  # its branch ended there
    ],
)
def test_safe_seqno(found: list[Observation], safe: int | None) -> None:
    assert safe_seqno(found) == safe


def test_the_floor_is_a_consistent_point_at_or_below_the_safe_seqno() -> None:
    manifest = Manifest()
    manifest.applied = {
        1: {"vb_uuid": "9", "seqno": "50", "points": ["10", "20", "30"]},
        2: {"vb_uuid": "9", "seqno": "5", "points": []},
        3: {"vb_uuid": "9", "seqno": "50", "points": ["40"]},
    }
    # vb 1: the replica persisted 33 though the active persisted 48 -> 30, not 40-something
    safe = {1: safe_seqno([active(48), replica(33)]), 2: 7, 3: 0}
    assert floors_from(manifest, {vb: s for vb, s in safe.items() if s is not None}) == {
        1: 30,
        2: 5,
    }
