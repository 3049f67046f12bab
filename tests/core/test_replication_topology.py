"""The replication topology of SetVbucket: the shapes it accepts, every refusal of its table."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.errors import DcpkvError
from dcpkv.core.replication_topology import (
    ReplicationChain,
    ReplicationTopology,
    TopologyError,
    parse_topology,
    topology_from_chains,
    topology_value,
)
from dcpkv.core.status import Status

# The example of PROTOCOL.md.
SPEC_VALUE = b'{"topology": [["active", "replica1", null], ["new_active", "new_replica"]]}'


def test_the_spec_example() -> None:
    topology = parse_topology(SPEC_VALUE, this_node="active")
    assert topology.first == ReplicationChain(("active", "replica1", None))
    assert topology.second == ReplicationChain(("new_active", "new_replica"))
    assert topology.first.active == "active" and topology.second.active == "new_active"
    assert topology.nodes == {"active", "replica1", "new_active", "new_replica"}
    assert parse_topology(topology.to_json(), this_node="active") == topology


@pytest.mark.parametrize(
    ("slots", "majority", "possible"),
    [
        (["a"], 1, True),  # no replica: the active alone is a majority of one
        (["a", "b"], 2, True),
        (["a", None], 2, False),  # a replica configured, none placed
        (["a", "b", "c"], 2, True),
        (["a", "b", None], 2, True),  # null counts in the length, never as an ack
        (["a", None, None], 2, False),
        (["a", "b", "c", "d"], 3, False),  # 3 replicas: more than SyncWrites support
        (["a", "b", None, None], 3, False),
    ],
)
def test_majority_and_whether_durability_is_possible(
    slots: list[str | None], majority: int, possible: bool
) -> None:
    chain = ReplicationChain(tuple(slots))
    assert chain.majority == majority
    assert chain.durability_possible is possible
    assert ReplicationTopology(chain).durability_possible is possible


def test_every_chain_must_make_durability_possible() -> None:
    good, bad = ReplicationChain(("a", "b")), ReplicationChain(("c", None))
    assert ReplicationTopology(good, good).durability_possible
    assert not ReplicationTopology(good, bad).durability_possible
    assert not ReplicationTopology(bad, good).durability_possible


def test_a_node_may_be_in_both_chains() -> None:
    topology = topology_from_chains([["a", "b"], ["b", "a"]], this_node="a")
    assert topology.nodes == {"a", "b"}


# The table of the module docstring: each refusal, with the words its message must carry.
REFUSALS = [
    (b"not json", "must be JSON"),
    (b"\xff\xfe", "must be JSON"),
    (b"[]", "JSON object"),
    (b'{"vb": 1}', "JSON object"),
    (b'{"topology": null}', "list of 1 or 2 chains"),
    (b'{"topology": "a"}', "list of 1 or 2 chains"),
    (b'{"topology": []}', "list of 1 or 2 chains"),
    (b'{"topology": [["a"], ["b"], ["c"]]}', "at most 2"),
    (b'{"topology": [[]]}', "first chain must be a non-empty list"),
    (b'{"topology": [["a"], []]}', "second chain must be a non-empty list"),
    (b'{"topology": ["a"]}', "non-empty list"),
    (b'{"topology": [["a", "b", "c", "d", "e"]]}', "more than a bucket supports"),
    (b'{"topology": [["a", 7]]}', "non-empty strings or null"),
    (b'{"topology": [["a", ""]]}', "non-empty strings or null"),
    (b'{"topology": [["a", ["b"]]]}', "non-empty strings or null"),
    (b'{"topology": [[null, "a"]]}', "first chain's active (its first slot) is null"),
    (b'{"topology": [["a"], [null, "b"]]}', "second chain's active"),
    (b'{"topology": [["a", "b", "b"]]}', "'b' is twice in the first chain"),
    (b'{"topology": [["a"], ["c", "c"]]}', "'c' is twice in the second chain"),
    (b'{"topology": [["other", "a"]]}', "this node is 'a'"),
]


@pytest.mark.parametrize(
    ("value", "words"), REFUSALS, ids=[v.decode("latin-1") for v, _ in REFUSALS]
)
def test_a_bad_topology_is_refused_with_a_clear_error(value: bytes, words: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(words)) as err:
        parse_topology(value, this_node="a")
    assert err.value.status == Status.Einval
    assert isinstance(err.value, DcpkvError) and isinstance(err.value, ValueError)


def test_without_this_node_any_active_is_accepted() -> None:
    assert parse_topology(b'{"topology": [["other"]]}').first.active == "other"


names = st.sampled_from(["n0", "n1", "n2", "n3", "n4", "n5"])
chains = st.lists(names, min_size=1, max_size=4, unique=True).flatmap(
    lambda nodes: st.lists(st.booleans(), min_size=len(nodes), max_size=len(nodes)).map(
        lambda holes: (
            [nodes[0]] + [None if hole else n for n, hole in zip(nodes[1:], holes[1:], strict=True)]
        )
    )
)


@settings(max_examples=200, deadline=None)
@given(st.lists(chains, min_size=1, max_size=2))
def test_what_the_manager_encodes_the_engine_parses_back(raw: list[list[str | None]]) -> None:
    value = topology_value(*raw)
    assert json.loads(value) == {"topology": raw}
    topology = parse_topology(value, this_node=raw[0][0])
    assert [list(chain.slots) for chain in topology.chains] == raw
    for chain in topology.chains:
        assert chain.majority == len(chain.slots) // 2 + 1
        named = sum(slot is not None for slot in chain.slots)
        assert chain.durability_possible == (chain.majority <= named <= 3)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_either_a_topology_or_a_topology_error(raw: object) -> None:
    for value in (json.dumps(raw), json.dumps({"topology": raw})):
        with contextlib.suppress(TopologyError):
            parse_topology(value)
