"""A group of handovers (dcpkv.cluster.handover), no I/O: the staged map names every new active
of the group one rev up, the nodes are told what makes it theirs, and the map committed at
the end is the staged one when every move handed over, else one that replaces it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.cluster import config as cfg
from dcpkv.cluster.handover import Handover
from dcpkv.cluster.rebalance_plan import named_chains, with_named_chains
from dcpkv.cluster.vbucket_map import VBucketMap
from dcpkv.core.vbucket import VBucketState

A, B, C = "a:1", "b:1", "c:1"
# vbuckets 0..3 over A and B, one replica
CURRENT = VBucketMap((A, B), ((0, 1), (1, 0), (0, 1), (1, 0)), num_replicas=1, rev=7)
GROUP = Handover.of("default", CURRENT, [(2, (A, B), (C, B)), (0, (A, B), (C, A))])


def test_the_staged_map_names_every_new_active_one_rev_up() -> None:
    staged = GROUP.staged(CURRENT)
    assert staged.rev == GROUP.rev == 8
    assert named_chains(staged) == [(C, A), (B, A), (C, B), (B, A)]
    assert GROUP.vbuckets == [0, 2]  # (sorted)


def test_each_old_and_new_active_is_told_what_makes_the_map_its_own() -> None:
    assert GROUP.instructions() == {
        A: {0: VBucketState.DEAD, 2: VBucketState.DEAD},
        C: {0: VBucketState.ACTIVE, 2: VBucketState.ACTIVE},
    }
    swap = Handover.of("default", CURRENT, [(0, (A, B), (B, A)), (1, (B, A), (A, B))])
    assert swap.instructions() == {
        A: {0: VBucketState.DEAD, 1: VBucketState.ACTIVE},
        B: {0: VBucketState.ACTIVE, 1: VBucketState.DEAD},
    }


@pytest.mark.parametrize(
    ("done", "failed", "rev", "chains", "left"),
    [
        # every move handed over: the staged map itself, nothing left
        ({0, 2}, set(), 8, [(C, A), (B, A), (C, B), (B, A)], None),
        # one did, the other runs on: the map with it above the staged map, which it
        # replaces; the other staged again above that
        ({2}, set(), 9, [(A, B), (B, A), (C, B), (B, A)], ([0], 10)),
        # one did, the other was reverted: above the staged map (which named the reverted
        # one's new copy wherever it was adopted), nothing left
        ({2}, {0}, 9, [(A, B), (B, A), (C, B), (B, A)], None),
        # both reverted: the current map again, one rev above the staged map
        (set(), {0, 2}, 9, [(A, B), (B, A), (A, B), (B, A)], None),
    ],
)
def test_what_is_committed_as_the_handovers_end(
    done: set[int],
    failed: set[int],
    rev: int,
    chains: list[tuple[str, ...]],
    left: tuple[list[int], int] | None,
) -> None:
    committed, rest = GROUP.ended(CURRENT, done, failed)
    assert committed.rev == rev and named_chains(committed) == chains
    if rev == GROUP.rev:
        assert committed == GROUP.staged(CURRENT)
    assert (rest.vbuckets, rest.rev) == left if rest else left is None
    if rest is not None:  # its staged map: the committed one with the others' chains
        assert named_chains(rest.staged(committed)) == [(C, A), (B, A), (C, B), (B, A)]


def test_a_group_ended_in_steps_ends_on_its_last_staged_map() -> None:
    committed, rest = GROUP.ended(CURRENT, {0}, set())
    assert rest is not None
    last, nothing = rest.ended(committed, {2}, set())
    assert nothing is None and last == rest.staged(committed) and last.rev == 10


def test_the_group_survives_the_configuration_file() -> None:
    config = cfg.ClusterConfig(rebalance=cfg.RebalanceConfig(handover=GROUP))
    assert cfg.from_json(cfg.to_json(config)).rebalance.handover == GROUP
    assert cfg.from_json(cfg.to_json(cfg.ClusterConfig())).rebalance.handover is None


NODES = [A, B, C, "d:1"]


@given(
    st.lists(st.sampled_from(NODES), min_size=2, max_size=2, unique=True),
    st.lists(
        st.tuples(
            st.integers(0, 7),
            st.permutations(NODES).map(lambda p: tuple(p[:2])),
            st.sampled_from(["done", "failed"]),
            st.integers(0, 3),  # the step it ends at
        ),
        min_size=1,
        max_size=8,
        unique_by=lambda m: m[0],
    ),
)
def test_every_rev_names_one_map_however_the_group_ends(
    servers: list[str], moves: list[tuple[int, tuple[str, ...], str, int]]
) -> None:
    """Whatever ends when, each map committed names exactly the moves handed over so far, and
    has a rev no map before it had, staged or committed: the only map that shares its rev is
    the staged one it is, byte for byte."""
    start = VBucketMap(tuple(servers), tuple((0, 1) for _ in range(8)), num_replicas=1)
    old = named_chains(start)
    group: Handover | None = Handover.of("b", start, [(vb, old[vb], n) for vb, n, _, _ in moves])
    current = start
    seen: dict[int, VBucketMap] = {}
    done: set[int] = set()
    for step in range(4):
        assert group is not None
        seen[group.rev] = group.staged(current)
        ending = {vb: how for vb, _, how, at in moves if vb in group.vbuckets and at <= step}
        if not ending:
            continue
        now_done = {vb for vb, how in ending.items() if how == "done"}
        done |= now_done
        current, group = group.ended(current, now_done, set(ending) - now_done)
        handed_over = {vb: n for vb, n, _, _ in moves if vb in done}
        assert named_chains(current) == named_chains(with_named_chains(start, handed_over))
        assert current.rev not in seen or seen[current.rev] == current
        seen[current.rev] = current
        if group is None:
            break
    assert group is None


def test_a_restarted_manager_ends_the_group_above_any_map_it_may_have_pushed() -> None:
    """It died after pushing a step (a commit at rev + 1, the others staged at rev + 2) but
    before writing it: the map it ends the group with is above both."""
    lifted = GROUP.lifted(CURRENT)
    assert lifted.rev == GROUP.rev + 2 and lifted.chains == CURRENT.chains
    committed, rest = GROUP.ended(lifted, {0, 2}, set())
    assert rest is None and committed.rev == GROUP.rev + 3
    assert named_chains(committed) == named_chains(GROUP.staged(CURRENT))
