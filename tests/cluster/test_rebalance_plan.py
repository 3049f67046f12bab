"""The rebalance planner: even, never a replica with its active, and as few moves as it can."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.cluster import config as cfg
from dcpkv.cluster.rebalance_plan import NamedChain, moves, plan_rebalance
from dcpkv.cluster.vbucket_map import NOBODY, PlacementError, plan_initial

NAMES = [f"n{i}:11210" for i in range(16)]


def named(chains: list[tuple[int, ...]], nodes: list[str]) -> list[NamedChain]:
    return [tuple(None if i == NOBODY else nodes[i] for i in c) for c in chains]


def spread(values: list[int]) -> int:
    return max(values) - min(values)


@st.composite
def rebalances(draw: st.DrawFn) -> tuple[list[NamedChain], list[str], int]:
    """A map placed over some nodes, then some of them gone (failed over: their slots may be
    empty) and some new ones: the current chains, the new node list and the replicas."""
    before = draw(st.integers(1, 8))
    replicas = draw(st.integers(0, min(3, before - 1)))
    vbuckets = draw(st.one_of(st.integers(1, 120), st.sampled_from([1024, 64])))
    old_nodes = NAMES[:before]
    current = named(plan_initial(before, replicas, vbuckets), old_nodes)
    kept = draw(st.lists(st.sampled_from(old_nodes), unique=True, max_size=before))
    added = NAMES[before : before + draw(st.integers(0, 4))]
    nodes = sorted(kept + added)
    replicas = draw(st.integers(0, 3))
    if not nodes or replicas > len(nodes) - 1:
        nodes, replicas = old_nodes, min(replicas, before - 1)
    if draw(st.booleans()):  # a failover emptied the slots of the nodes that left
        current = [tuple(n if n in nodes else None for n in c) for c in current]
        current = [c if c[0] is not None else (*c[1:], None) for c in current]
    return current, nodes, replicas


@settings(max_examples=200, deadline=None)
@given(rebalances())
def test_the_new_map_is_even_and_never_puts_a_replica_with_its_active(
    case: tuple[list[NamedChain], list[str], int],
) -> None:
    current, nodes, replicas = case
    chains = plan_rebalance(current, nodes, replicas)
    assert len(chains) == len(current)
    for chain in chains:
        assert len(chain) == replicas + 1
        assert NOBODY not in chain and len(set(chain)) == len(chain)
    actives = Counter(c[0] for c in chains)
    assert spread([actives[n] for n in range(len(nodes))]) <= 1
    if replicas:
        copies = Counter(n for c in chains for n in c[1:])
        assert spread([copies[n] for n in range(len(nodes))]) <= 1


@settings(max_examples=200, deadline=None)
@given(rebalances())
def test_actives_move_only_when_they_must(case: tuple[list[NamedChain], list[str], int]) -> None:
    """The changed actives are exactly the lower bound: orphans plus each node's surplus
    over its quota, the larger quotas going to the nodes holding the most."""
    current, nodes, replicas = case
    chains = plan_rebalance(current, nodes, replicas)
    changed = sum(1 for c, new in zip(current, chains, strict=True) if c[0] != nodes[new[0]])
    held = Counter(c[0] for c in current if c[0] in nodes)
    base, extra = divmod(len(current), len(nodes))
    ranked = sorted(nodes, key=lambda n: (-held[n], nodes.index(n)))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(ranked)}
    orphans = sum(1 for c in current if c[0] not in nodes)
    assert changed == orphans + sum(max(0, held[n] - quota[n]) for n in nodes)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(0, 3), st.integers(1, 300))
def test_a_balanced_map_over_the_same_nodes_is_left_alone(
    nodes: int, replicas: int, vbuckets: int
) -> None:
    replicas = min(replicas, nodes - 1)
    names = NAMES[:nodes]
    current = named(plan_initial(nodes, replicas, vbuckets), names)
    again = named(plan_rebalance(current, names, replicas), names)
    assert moves(current, again) == []


@pytest.mark.parametrize(("before", "replicas"), [(2, 1), (3, 1), (3, 2), (4, 1)])
def test_adding_a_node_moves_about_its_share(before: int, replicas: int) -> None:
    """One node joining takes ~V/(N+1) actives and ~R*V/(N+1) replicas; everything else stays."""
    vbuckets = 1024
    old = NAMES[:before]
    current = named(plan_initial(before, replicas, vbuckets), old)
    nodes = NAMES[: before + 1]
    target = named(plan_rebalance(current, nodes, replicas), nodes)
    newcomer = nodes[-1]
    share = -(-vbuckets // len(nodes))
    assert sum(1 for c in target if c[0] == newcomer) in (share - 1, share)
    actives_moved = sum(1 for a, b in zip(current, target, strict=True) if a[0] != b[0])
    assert actives_moved <= share
    new_copies = sum(1 for a, b in zip(current, target, strict=True) for n in b if n not in a)
    # every copy the newcomer takes is new; only leveling may add a few more elsewhere
    assert new_copies <= share * (replicas + 1) + len(nodes)


def test_removing_a_node_keeps_the_others_copies() -> None:
    """3 -> 2 nodes with one replica: every vbucket keeps a copy where one already was."""
    old = NAMES[:3]
    current = named(plan_initial(3, 1, 64), old)
    target = named(plan_rebalance(current, old[:2], 1), old[:2])
    for a, b in zip(current, target, strict=True):
        assert set(b) & set(a)  # data already on a node: no chain starts from nothing


def test_too_few_nodes_for_the_replicas_is_refused() -> None:
    current = named(plan_initial(2, 1, 16), NAMES[:2])
    with pytest.raises(PlacementError, match="1 replica"):
        plan_rebalance(current, NAMES[:1], 1)


def test_a_delta_recovered_node_gets_copies_of_what_it_holds() -> None:
    """n2 failed over (its slots emptied, its actives promoted), then delta-recovered: the
    planner gives it back copies of the vbuckets it still holds data of."""
    nodes = NAMES[:3]
    placed = named(plan_initial(3, 1, 64), nodes)
    held = {vb for vb, c in enumerate(placed) if nodes[2] in c}
    after_failover = [
        (*(n for n in c if n != nodes[2]), None) if nodes[2] in c else c for c in placed
    ]
    target = named(plan_rebalance(after_failover, nodes, 1, {nodes[2]: held}), nodes)
    given = {vb for vb, c in enumerate(target) if nodes[2] in c}
    assert len(given) >= 40 and given <= held  # its share (~43 copies), all from its data
    plain = named(plan_rebalance(after_failover, nodes, 1), nodes)
    assert len({vb for vb, c in enumerate(plain) if nodes[2] in c} & held) < len(given)


def test_the_rebalance_record_survives_the_config_file(tmp_path: Path) -> None:
    record = cfg.RebalanceConfig(
        cfg.RebalanceState.RUNNING, ("a:1",), (("b:1", cfg.Recovery.DELTA),), None, 8
    )
    config = cfg.ClusterConfig(rebalance=record)
    cfg.save(tmp_path, config)
    loaded = cfg.load(tmp_path)
    assert loaded is not None and loaded.rebalance == record
    # a file written before rebalance existed has nothing to finish
    doc = cfg.to_json(config)
    del doc["rebalance"]
    assert cfg.from_json(doc).rebalance == cfg.RebalanceConfig()
