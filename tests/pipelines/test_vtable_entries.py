"""The liveness rule of the versioned table (``vtable.is_dead``), table-driven on the stories
that produce entries: a rollback, a resync (a rollback to -1, the resync's rows at its place,
a skip up to the resync's high seqno), and a vbucket reset twice, which lost its oldest
documents in the chaos demo while a skip reached past the next reset."""

from __future__ import annotations

import pytest

from dcpkv.pipelines.vtable import Entry, is_dead, scopes

VB = 7

# One vbucket's story, in stream order (ord, pos):
#   ord 1: changes 1..40 streamed;
#   ord 2, pos 10: rollback below the floor -> resync #1 of seqnos 1..36 stored at (2, 10),
#                  skip up to 36; the stream then re-sends 1..40 after it (pos 11..);
#   ord 5, pos 3: reset again (second failover) -> resync #2 of seqnos 1..30 at (5, 3), skip 30.
STORY = [
    Entry("rollback", VB, -1, 2, 10),
    Entry("skip", VB, 36, 2, 10),
    Entry("rollback", VB, -1, 5, 3),
    Entry("skip", VB, 30, 5, 3),
]


@pytest.mark.parametrize(
    ("seqno", "ord_", "pos", "dead", "why"),
    [
        (5, 1, 0, True, "streamed before the first reset"),
        (5, 2, 10, True, "resync #1's row, before the second reset"),
        (5, 2, 11, True, "the stream's re-send after resync #1: skipped"),
        (37, 2, 12, True, "above skip #1 but before the second reset"),
        (5, 5, 3, False, "resync #2's row: skip #1 ends at the second reset"),
        (30, 5, 3, False, "resync #2's newest row"),
        (30, 5, 4, True, "the stream's re-send after resync #2: skipped"),
        (31, 5, 4, False, "the new branch above resync #2"),
        (5, 6, 0, True, "a later change at or below skip #2's seqno: still skipped"),
        (5, 4, 0, True, "between the resets, under skip #1, before the second reset"),
    ],
)
def test_a_vbucket_reset_twice(seqno: int, ord_: int, pos: int, dead: bool, why: str) -> None:
    assert is_dead(VB, seqno, ord_, pos, scopes(STORY)) is dead, why


@pytest.mark.parametrize(
    ("entries", "seqno", "ord_", "pos", "dead"),
    [
        ([Entry("rollback", VB, 10, 3, 5)], 11, 3, 4, True),  # before the rollback, above R
        ([Entry("rollback", VB, 10, 3, 5)], 10, 3, 4, False),  # at R: kept
        ([Entry("rollback", VB, 10, 3, 5)], 11, 3, 6, False),  # after it: the new branch
        ([Entry("rollback", VB, 10, 3, 5)], 11, 3, 5, False),  # at its place (a resync row)
        ([Entry("rollback", VB + 1, 10, 3, 5)], 11, 3, 4, False),  # another vbucket's
        ([Entry("skip", VB, 20, 3, 5)], 20, 4, 0, True),  # a lone skip reaches on
        ([Entry("skip", VB, 20, 3, 5)], 20, 3, 5, False),  # not at its own place
        # an exact rollback after a skip (R >= the skip's H) ends it: the new branch is above R
        ([Entry("skip", VB, 20, 3, 5), Entry("rollback", VB, 25, 4, 0)], 26, 4, 1, False),
        ([Entry("skip", VB, 20, 3, 5), Entry("rollback", VB, 25, 4, 0)], 20, 3, 9, True),
        # another vbucket's rollback does not end this vbucket's skip
        ([Entry("skip", VB, 20, 3, 5), Entry("rollback", VB + 1, -1, 4, 0)], 20, 5, 0, True),
    ],
)
def test_single_entries(entries: list[Entry], seqno: int, ord_: int, pos: int, dead: bool) -> None:
    assert is_dead(VB, seqno, ord_, pos, scopes(entries)) is dead


def test_scopes_do_not_depend_on_the_order_entries_were_listed() -> None:
    shuffled = [STORY[2], STORY[0], STORY[3], STORY[1]]
    assert sorted(scopes(shuffled), key=lambda s: (s.entry.ord, s.entry.pos, s.entry.kind)) == (
        sorted(scopes(STORY), key=lambda s: (s.entry.ord, s.entry.pos, s.entry.kind))
    )
