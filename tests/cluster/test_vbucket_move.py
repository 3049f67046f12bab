"""One vbucket move as a state machine: the spec's rebalance steps and its faults, no I/O."""

from __future__ import annotations

import pytest

from dcpkv.cluster.vbucket_move import (
    CommitChain,
    Delete,
    NodeView,
    Phase,
    SetState,
    VBucketMove,
)
from dcpkv.core.vbucket import VBucketState

A, B, C = "a:1", "b:1", "c:1"
ACTIVE, REPLICA, PENDING, DEAD = (
    VBucketState.ACTIVE,
    VBucketState.REPLICA,
    VBucketState.PENDING,
    VBucketState.DEAD,
)


def v(state: VBucketState | None, high: int = 0, persisted: int | None = None) -> NodeView:
    return NodeView(state, high, high if persisted is None else persisted)


def test_an_active_move_walks_build_takeover_map_clean() -> None:
    """[A, B] -> [C, B]: C built as a replica of A, then pending with a takeover stream; once
    C is active and A dead the map changes; A's copy is deleted once C and B persisted."""
    move = VBucketMove(7, old=(A, B), new=(C, B), now=0.0)
    assert move.builders == [C]
    views = {A: v(ACTIVE, 10), B: v(REPLICA, 10), C: v(None)}
    assert move.step(views, 1) == [SetState(C, 7, REPLICA)]
    views[C] = v(REPLICA, 4)
    assert move.step(views, 2) == []  # catching up to 10
    views[C] = v(REPLICA, 10, persisted=9)
    assert move.step(views, 3) == []  # not persisted yet
    views[C] = v(REPLICA, 12)  # A took more writes meanwhile: 10 was the target
    assert move.step(views, 4) == []  # built: waits for the driver to stage its map
    assert move.phase is Phase.READY
    assert move.step(views, 4.2) == []
    assert move.hand_over(4.5) == [SetState(C, 7, PENDING)]
    assert move.phase is Phase.TAKEOVER
    views[C] = v(PENDING, 12)
    assert move.step(views, 5) == []
    views.update({A: v(DEAD, 13), C: v(ACTIVE, 13, persisted=12)})
    assert move.step(views, 6) == [CommitChain(7)]
    assert move.phase is Phase.MAP
    assert move.step(views, 6.5) == [CommitChain(7)]  # until the driver says it is done
    move.committed(7)
    views[B] = v(REPLICA, 13, persisted=12)
    assert move.step(views, 8) == []  # the new active's 13 is not persisted everywhere
    views.update({B: v(REPLICA, 13), C: v(ACTIVE, 13)})
    assert move.step(views, 9) == [Delete(A, 7)]
    assert move.phase is Phase.DONE and move.error is None


def test_a_replica_only_move_builds_the_new_replica_before_dropping_the_old() -> None:
    move = VBucketMove(3, old=(A, B), new=(A, C), now=0.0)
    views = {A: v(ACTIVE, 5), B: v(REPLICA, 5), C: v(None)}
    assert move.step(views, 1) == [SetState(C, 3, REPLICA)]
    views[C] = v(REPLICA, 5)
    assert move.step(views, 2) == [CommitChain(3)]  # no takeover: the active stays
    move.committed(3)
    assert move.step(views, 4) == [Delete(B, 3)]  # only now is B's copy dropped


def test_promoting_an_existing_replica_copies_nothing_first() -> None:
    """[A, B] -> [B, A]: B holds the data already, so it goes pending at once, and A's copy
    stays (as a replica of the new chain, set by the driver's sync after the map)."""
    move = VBucketMove(1, old=(A, B), new=(B, A), now=0.0)
    assert move.builders == []
    views = {A: v(ACTIVE, 5), B: v(REPLICA, 5)}
    assert move.step(views, 1) == [] and move.phase is Phase.READY
    assert move.hand_over(1) == [SetState(B, 1, PENDING)]
    views.update({A: v(DEAD, 5), B: v(ACTIVE, 5)})
    assert move.step(views, 2) == [CommitChain(1)]
    move.committed(2)
    assert move.nodes() == set()  # the sync may now drive both copies to the map
    assert move.step(views, 3) == [SetState(A, 1, REPLICA)]  # A's dead copy stays on
    views[A] = v(REPLICA, 5)
    assert move.step(views, 4) == []  # nothing to delete
    assert move.phase is Phase.DONE


def test_a_stopped_promotion_puts_both_copies_back() -> None:
    move = VBucketMove(1, old=(A, B), new=(B, A), now=0.0)
    views = {A: v(ACTIVE, 5), B: v(REPLICA, 5)}
    move.step(views, 1)
    move.hand_over(1)
    views.update({A: v(DEAD, 5), B: v(PENDING, 5)})
    assert move.stop(views) == [SetState(B, 1, REPLICA), SetState(A, 1, ACTIVE)]
    assert move.phase is Phase.REVERTED and move.nodes() == set()
    assert move.stop(views) == []  # once


@pytest.mark.parametrize(
    ("a", "c", "expected"),
    [
        # A already dead (the handoff began): C's copy dead first (so it refuses the
        # handoff's last step), then A back to active
        (v(DEAD, 9), v(PENDING, 9), [SetState(C, 0, DEAD), SetState(A, 0, ACTIVE)]),
        # C never became pending: A is still active, only C's copy goes
        (v(ACTIVE, 9), v(REPLICA, 9), [SetState(C, 0, DEAD)]),
        # C unreachable: A back; C's copy is left to the next sync (not in the map: dead)
        (v(DEAD, 9), None, [SetState(A, 0, ACTIVE)]),
    ],
)
def test_a_handoff_that_times_out_puts_the_old_active_back(
    a: NodeView, c: NodeView | None, expected: list[SetState]
) -> None:
    move = VBucketMove(0, old=(A, B), new=(C, B), now=0.0, takeover_s=30)
    views: dict[str, NodeView | None] = {A: v(ACTIVE, 9), B: v(REPLICA, 9), C: v(REPLICA, 9)}
    assert move.step(views, 1) == []
    assert move.hand_over(1) == [SetState(C, 0, PENDING)]
    views.update({A: a, C: c})
    assert move.step(views, 20) in ([], [SetState(C, 0, PENDING)])
    assert move.step(views, 31.5) == expected
    assert move.phase is Phase.REVERTED and "timed out" in (move.error or "")


def test_a_handoff_that_completed_is_never_reverted_even_when_late() -> None:
    move = VBucketMove(0, old=(A, B), new=(C, B), now=0.0, takeover_s=30)
    views: dict[str, NodeView | None] = {A: v(ACTIVE, 9), B: v(REPLICA, 9), C: v(REPLICA, 9)}
    move.step(views, 1)
    move.hand_over(1)
    views.update({A: None, C: v(ACTIVE, 9)})  # A stopped answering after the handoff
    assert move.step(views, 100) == [CommitChain(0)]


def test_a_ready_move_waits_for_its_handover_and_is_reverted_like_a_building_one() -> None:
    move = VBucketMove(6, old=(A, B), new=(C, B), now=0.0, stall_s=10)
    views: dict[str, NodeView | None] = {A: v(ACTIVE, 9), B: v(REPLICA, 9), C: v(REPLICA, 9)}
    assert move.step(views, 1) == [] and move.phase is Phase.READY
    assert move.step(views, 100) == []  # no stall while the driver has not handed it over
    assert move.nodes() == {A, B, C}
    assert move.stop(views) == [SetState(C, 6, DEAD)]
    assert move.phase is Phase.REVERTED


def test_a_build_that_stalls_is_reverted_but_one_that_advances_is_not() -> None:
    move = VBucketMove(2, old=(A, B), new=(C, B), now=0.0, stall_s=10)
    views = {A: v(ACTIVE, 100), B: v(REPLICA, 100), C: v(REPLICA, 0)}
    for t in range(1, 40):
        views[C] = v(REPLICA, t)  # slow but moving
        assert move.step(views, float(t)) == []
    assert move.phase is Phase.BUILD
    assert move.step(views, 45) == []
    assert move.step(views, 50) == [SetState(C, 2, DEAD)]
    assert move.phase is Phase.REVERTED and "catching up" in (move.error or "")


def test_a_vbucket_without_an_active_goes_straight_to_the_map() -> None:
    """A failover left no copy anywhere: there is nothing to copy, the new active starts empty."""
    move = VBucketMove(4, old=(None, None), new=(A, B), now=0.0)
    assert move.step({A: v(None), B: v(None)}, 1) == [CommitChain(4)]


def test_a_clean_that_never_persists_ends_keeping_the_old_copies() -> None:
    move = VBucketMove(5, old=(A, B), new=(A, C), now=0.0, stall_s=10)
    views = {A: v(ACTIVE, 5), B: v(REPLICA, 5), C: v(REPLICA, 5)}
    assert move.step(views, 1) == [CommitChain(5)]
    move.committed(1)
    views[C] = None  # C died after the map changed
    assert move.step(views, 5) == []  # (a copy going away counts as a change)
    assert move.step(views, 14) == [] and move.phase is Phase.CLEAN
    assert move.step(views, 15) == []
    assert move.phase is Phase.DONE and "old copies kept" in (move.error or "")


def test_items_transferred_count_what_the_new_copies_received() -> None:
    move = VBucketMove(0, old=(A, B), new=(C, B), now=0.0)
    assert move.transferred({C: v(REPLICA, 3)}) == 0  # a copy that had 3 already
    assert move.transferred({C: v(REPLICA, 10)}) == 7
    empty = VBucketMove(0, old=(A, B), new=(C, B), now=0.0)
    assert empty.transferred({C: v(None)}) == 0
    assert empty.transferred({C: v(REPLICA, 10)}) == 10  # it had nothing
    assert move.nodes() == {A, B, C}


def test_a_move_whose_node_is_down_is_abandoned() -> None:
    """Mid-handoff (A dead, C pending, then C gone): A back to active at once."""
    move = VBucketMove(0, old=(A, B), new=(C, B), now=0.0)
    views: dict[str, NodeView | None] = {A: v(ACTIVE, 9), B: v(REPLICA, 9), C: v(REPLICA, 9)}
    move.step(views, 1)
    move.hand_over(1)
    views.update({A: v(DEAD, 9), C: None})
    assert move.abandon(views, "c:1 stopped answering") == [SetState(A, 0, ACTIVE)]
    assert move.phase is Phase.REVERTED and "stopped answering" in (move.error or "")


def test_a_move_whose_node_is_down_after_the_map_changed_ends_keeping_old_copies() -> None:
    move = VBucketMove(0, old=(A, B), new=(C, B), now=0.0)
    views: dict[str, NodeView | None] = {A: v(ACTIVE, 9), B: v(REPLICA, 9), C: v(REPLICA, 9)}
    move.step(views, 1)
    move.hand_over(1)
    views.update({A: v(DEAD, 9), C: v(ACTIVE, 9)})
    assert move.step(views, 2) == [CommitChain(0)]
    move.committed(3)
    views[B] = None
    assert move.abandon(views, "b:1 stopped answering") == []
    assert move.phase is Phase.DONE and "old copies kept" in (move.error or "")
