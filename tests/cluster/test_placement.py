"""The vbucket map as a value, its config JSON, and the initial placement planner."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.cluster.vbucket_map import NOBODY, PlacementError, VBucketMap, plan_initial
from dcpkv.core.vbucket import VBucketState


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int]:
    nodes = draw(st.integers(1, 12))
    replicas = draw(st.integers(0, min(3, nodes - 1)))
    vbuckets = draw(st.one_of(st.integers(1, 200), st.sampled_from([1024, 1023, 64])))
    return nodes, replicas, vbuckets


def spread(values: list[int]) -> int:
    return max(values) - min(values)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_placement_is_even_and_never_puts_a_replica_with_its_active(
    layout: tuple[int, int, int],
) -> None:
    nodes, replicas, vbuckets = layout
    chains = plan_initial(nodes, replicas, vbuckets)
    assert len(chains) == vbuckets
    for chain in chains:
        assert len(chain) == replicas + 1
        assert NOBODY not in chain and len(set(chain)) == len(chain)  # all distinct, all placed
    actives = Counter(c[0] for c in chains)
    assert spread([actives[n] for n in range(nodes)]) <= 1
    if replicas:
        copies = Counter(n for c in chains for n in c[1:])
        assert spread([copies[n] for n in range(nodes)]) <= 1
        # one node's replicas are spread over all the others, so its failover spreads too
        for active in range(nodes):
            pairs = Counter(n for c in chains if c[0] == active for n in c[1:])
            assert spread([pairs[n] for n in range(nodes) if n != active]) <= 1


def test_placement_is_deterministic() -> None:
    assert plan_initial(3, 1, 1024) == plan_initial(3, 1, 1024)


@pytest.mark.parametrize(
    ("nodes", "replicas", "vbuckets", "message"),
    [
        (2, 2, 16, "2 replica(s) need at least 3 nodes"),
        (1, 1, 16, "1 replica(s) need at least 2 nodes"),
        (5, 4, 16, "replicas must be 0..3"),
        (0, 0, 16, "at least one node"),
        (3, 1, 0, "at least one vbucket"),
    ],
)
def test_impossible_placements_are_refused_clearly(
    nodes: int, replicas: int, vbuckets: int, message: str
) -> None:
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_initial(nodes, replicas, vbuckets)


def test_the_config_json_is_what_a_client_reads_and_reads_back() -> None:
    servers = ("127.0.0.1:12000", "127.0.0.1:12002")
    vb_map = VBucketMap(servers, tuple(plan_initial(2, 1, 4)), 1, rev=7, rev_epoch=1)
    doc = vb_map.to_config("default", "abc", this_node="127.0.0.1:12002")
    assert json.loads(json.dumps(doc)) == doc
    assert doc["rev"] == 7 and doc["revEpoch"] == 1 and doc["nodeLocator"] == "vbucket"
    assert doc["nodesExt"] == [
        {"hostname": "127.0.0.1", "services": {"kv": 12000}},
        {"hostname": "127.0.0.1", "services": {"kv": 12002}, "thisNode": True},
    ]
    server_map = doc["vBucketServerMap"]
    assert server_map == {
        "hashAlgorithm": "CRC",
        "numReplicas": 1,
        "serverList": list(servers),
        "vBucketMap": [[0, 1], [1, 0], [0, 1], [1, 0]],
    }
    assert VBucketMap.from_config(doc) == vb_map


def test_states_and_counts_per_node() -> None:
    vb_map = VBucketMap(("a:1", "b:2", "c:3"), ((0, 1), (1, 2), (2, 0), (0, -1)), 1)
    assert vb_map.states_of("a:1") == {
        0: VBucketState.ACTIVE,
        2: VBucketState.REPLICA,
        3: VBucketState.ACTIVE,
    }
    assert vb_map.states_of("z:9") == {}
    assert vb_map.counts() == {"a:1": (2, 1), "b:2": (1, 1), "c:3": (1, 1)}
    assert vb_map.with_chains(vb_map.servers, vb_map.chains).rev == vb_map.rev + 1


@pytest.mark.parametrize(
    "chains",
    [((0, 0),), ((0, 5),), ((0,),)],
    ids=["a node twice", "an index outside the list", "a short chain"],
)
def test_a_malformed_map_is_refused(chains: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ValueError, match="vbucket 0"):
        VBucketMap(("a:1", "b:2"), chains, 1)
