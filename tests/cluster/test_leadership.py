"""The leadership rules (cluster/leadership.py), table by table, without etcd."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.cluster.leadership import Leadership, Role, Verdict, rev_epoch_for

TTL = 10.0  # margin 2 s


@pytest.mark.parametrize(
    ("events", "now", "verdict", "term"),
    [
        ([], 0.0, Verdict.FOLLOW, 0),
        ([("won", 7, 100.0)], 100.0, Verdict.ACT, 7),
        ([("won", 7, 100.0)], 107.9, Verdict.ACT, 7),
        ([("won", 7, 100.0)], 108.0, Verdict.STOP, 7),  # ttl - margin after the send
        ([("won", 7, 100.0), ("refreshed", 105.0, 10.0)], 112.9, Verdict.ACT, 7),
        ([("won", 7, 100.0), ("refreshed", 105.0, 10.0)], 113.0, Verdict.STOP, 7),
        # a late answer to an older keep-alive never moves the deadline back
        ([("won", 7, 100.0), ("refreshed", 105.0, 10.0), ("refreshed", 101.0, 10.0)],
         112.0, Verdict.ACT, 7),
        # etcd answered with less TTL left than asked (its clock started earlier)
        ([("won", 7, 100.0), ("refreshed", 104.0, 3.0)], 106.5, Verdict.ACT, 7),
        ([("lost",)], 0.0, Verdict.FOLLOW, 0),
        ([("won", 7, 100.0), ("lost",)], 100.0, Verdict.FOLLOW, 0),
        ([("refreshed", 100.0, 10.0)], 100.0, Verdict.FOLLOW, 0),  # a follower's lease
        ([("won", 7, 100.0), ("lost",), ("won", 12, 200.0)], 201.0, Verdict.ACT, 12),
    ],
)  # fmt: skip
def test_verdicts(
    events: list[tuple[object, ...]], now: float, verdict: Verdict, term: int
) -> None:
    state = Leadership(ttl_s=TTL)
    for event in events:
        match event:
            case ("won", int(won_term), float(sent)):
                state = state.won("m1", won_term, sent)
            case ("refreshed", float(sent), float(ttl)):
                state = state.refreshed(sent, ttl)
            case ("lost",):
                state = state.lost()
    assert state.verdict(now) == verdict
    assert state.term == term


def test_a_leader_notes_itself_and_a_follower_notes_who_leads() -> None:
    state = Leadership().won("m1", 9, 0.0)
    assert (state.leader, state.leader_term, state.role) == ("m1", 9, Role.LEADER)
    follower = Leadership().observed("m2", 11)
    assert (follower.leader, follower.leader_term, follower.role) == ("m2", 11, Role.FOLLOWER)


@given(st.lists(st.integers(min_value=1, max_value=10**9), min_size=2, unique=True))
def test_a_later_term_maps_are_newer_whatever_the_rev(terms: list[int]) -> None:
    """Terms are etcd create revisions, which only grow: a later leader's first map (rev 1)
    is newer than any map an earlier one sent (any rev)."""
    earlier, later = sorted(terms)[:2]
    assert (rev_epoch_for(later), 1) > (rev_epoch_for(earlier), 2**31)
