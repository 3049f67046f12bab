"""A manager's term on its node connections (core/manager_term.py): the agent's table and
the node's fence."""

from __future__ import annotations

import pytest

from dcpkv.core.manager_term import TermFence, agent_for, term_of


@pytest.mark.parametrize(
    ("agent", "term"),
    [
        ("dcpkv-manager term=42", 42),
        ("dcpkv-manager", 0),
        ("dcpkv-manager term=x", 0),
        ("dcpkv-manager term=", 0),
        ("dcpkv-manager term=-3", 0),
        ("dcpkv-client term=5", 0),
        ("", 0),
    ],
)
def test_the_term_an_agent_names(agent: str, term: int) -> None:
    assert term_of(agent) == term


@pytest.mark.parametrize("term", [0, 1, 2**40])
def test_agents_round_trip(term: int) -> None:
    assert term_of(agent_for(term)) == term


@pytest.mark.parametrize(
    ("seen", "asking", "allowed"),
    [
        ([], 0, True),  # a one-manager cluster: nobody names a term
        ([7], 7, True),
        ([7], 9, True),
        ([7, 9], 7, False),  # the deposed leader's connection
        ([9, 7], 7, False),  # a late HELLO of an older term lowers nothing
        ([7], 0, False),  # a tool naming no term, on a node managers over etcd drive
    ],
)
def test_the_fence(seen: list[int], asking: int, allowed: bool) -> None:
    fence = TermFence()
    for term in seen:
        fence.saw(term)
    assert fence.allows(asking) is allowed


def test_only_a_newer_term_raises_the_fence() -> None:
    """``saw`` says when the fence rose: the node writes the term down then, and only then."""
    fence = TermFence()
    assert [fence.saw(t) for t in (0, 7, 7, 5, 9)] == [False, True, False, False, True]
    assert fence.newest == 9
