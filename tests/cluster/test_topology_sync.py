"""Which replication topologies the manager sends (cluster/topology_sync.py): its table's cases
T1-T6, and the values as the node parses them."""

from __future__ import annotations

import re

import pytest

from dcpkv.cluster import topology_sync
from dcpkv.cluster.topology_sync import Chains, by_active, held_chains, to_send, wanted
from dcpkv.cluster.vbucket_map import NOBODY, VBucketMap
from dcpkv.core.replication_topology import parse_topology, topology_value

A, B, C = "h:1", "h:2", "h:3"
# vb0: A active, B replica; vb1: B active, C; vb2: A active, no replica placed; vb3: nobody
MAP = VBucketMap((A, B, C), ((0, 1), (1, 2), (0, NOBODY), (NOBODY, 2)), 1)
VB0: Chains = ((A, B),)
VB2: Chains = ((A, None),)


@pytest.mark.parametrize(
    ("case", "node", "held", "second", "skip", "sent"),
    [
        ("T1 no topology held", A, {}, None, (), {0: VB0, 2: VB2}),
        ("T1 an empty one held (restarted)", A, {0: None, 2: None}, None, (), {0: VB0, 2: VB2}),
        ("T2 the same chains held", A, {0: VB0, 2: VB2}, None, (), {}),
        ("T3 other chains held", A, {0: ((A, C),), 2: VB2}, None, (), {0: VB0}),
        ("T4 a takeover's last stage", A, {0: VB0, 2: VB2}, {0: (C, A)}, (), {0: ((A, B), (C, A))}),
        ("T5 not active here", C, {}, None, (), {}),
        ("T5 a node the map does not name", "h:9", {}, None, (), {}),
        ("T6 a vbucket a rebalance move drives", A, {}, None, (0,), {2: VB2}),
    ],
)  # fmt: skip
def test_topologies_to_send(
    case: str,
    node: str,
    held: dict[int, Chains | None],
    second: dict[int, tuple[str | None, ...]] | None,
    skip: tuple[int, ...],
    sent: dict[int, Chains],
) -> None:
    values = to_send(wanted(MAP, node, second=second, skip=skip), held)
    assert values == {vb: topology_value(*chains) for vb, chains in sent.items()}, case
    for value in values.values():  # what the node takes: the first chain's active is itself
        assert parse_topology(value, node).first.active == node


def test_every_case_of_the_docstring_table_is_tested() -> None:
    documented = set(re.findall(r"^(T\d+) ", topology_sync.__doc__ or "", re.M))
    assert documented == {f"T{n}" for n in range(1, 7)}


def test_what_a_node_reports_compares_with_what_the_map_wants() -> None:
    reported = parse_topology(topology_value(*VB0), A).to_json().decode()
    assert held_chains(reported) == VB0
    assert held_chains("") is None
    assert to_send(wanted(MAP, A), {0: held_chains(reported), 2: VB2}) == {}


def test_a_rebalance_sends_each_topology_to_its_first_chains_active() -> None:
    sent = by_active({0: ((A, B), (C, A)), 1: ((B, C),), 3: ((None, C),)})
    assert sent == {A: {0: topology_value((A, B), (C, A))}, B: {1: topology_value((B, C))}}
