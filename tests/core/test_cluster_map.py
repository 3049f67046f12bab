"""The cluster map as a client reads it (core/cluster_map.py) and the router on top of it
(client/router.py): parsing, rev ordering, routing, the thisNode alias, the retry schedule."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.client.router import RetrySchedule, Router
from dcpkv.client.settings import (
    ConnectionSettings,
    Node,
    NodeAddressError,
    is_connection_string,
    parse_nodes,
)
from dcpkv.core.cluster_map import ClusterMap, ClusterMapError


def config(
    chains: list[list[int]],
    servers: tuple[str, ...] = ("h1:1", "h2:2", "h3:3"),
    rev: int = 1,
    epoch: int | None = None,
    this: str | None = None,
) -> bytes:
    doc: dict = {
        "rev": rev,
        "vBucketServerMap": {"serverList": list(servers), "vBucketMap": chains},
        "nodesExt": [
            {
                "hostname": s.split(":")[0],
                "services": {"kv": int(s.split(":")[1])},
                **({"thisNode": True} if s == this else {}),
            }
            for s in servers
        ],
    }
    if epoch is not None:
        doc["revEpoch"] = epoch
    return json.dumps(doc).encode()


# -- connection strings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nodes"),
    [
        ("couchbase://h1,h2:11211", [("h1", 11210), ("h2", 11211)]),
        ("couchbase://h1:1?network=default", [("h1", 1)]),
        ("COUCHBASE://h1/", [("h1", 11210)]),
        ("h1:5", [("h1", 5)]),
        ("h1", [("h1", 11210)]),
        ("h1;h2:7", [("h1", 11210), ("h2", 7)]),
        ("[::1]:99,[fe80::1]", [("::1", 99), ("fe80::1", 11210)]),
        (" couchbase://a , b:3 ", [("a", 11210), ("b", 3)]),
    ],
)
def test_connection_strings_name_their_nodes(text: str, nodes: list[tuple[str, int]]) -> None:
    assert parse_nodes(text) == tuple(Node(h, p) for h, p in nodes)


@pytest.mark.parametrize(
    "text", ["", "couchbase://", "http://h1", "h1:notaport", "h1:0", "h1:70000", ":11210"]
)
def test_bad_connection_strings_are_refused_clearly(text: str) -> None:
    with pytest.raises(NodeAddressError):
        parse_nodes(text)


def test_a_host_option_takes_a_connection_string_and_the_port_fills_the_gaps() -> None:
    assert ConnectionSettings.at("localhost", 99).nodes == (Node("localhost", 99),)
    both = ConnectionSettings.at("couchbase://a,b:3", 99, bucket="x")
    assert both.nodes == (Node("a", 99), Node("b", 3)) and both.bucket == "x"
    assert both.connection_string == "couchbase://a:99,b:3"
    assert ConnectionSettings.parse(both.connection_string).nodes == both.nodes
    assert not is_connection_string("localhost") and not is_connection_string("::1")
    assert str(Node("::1", 5)) == "[::1]:5"


@pytest.mark.parametrize("text", ["couchbase://a:1,b:2", "localhost:7", "h"])
def test_a_view_definition_keeps_every_seed_of_its_source(text: str) -> None:
    from dcpkv.pipelines.source_node import SourceSettings

    source = SourceSettings(ConnectionSettings.at(text, 11210, bucket="b"), "0-3", 5)
    assert SourceSettings.from_json_obj(json.loads(json.dumps(source.to_json_obj()))) == source


# -- the map ----------------------------------------------------------------------------------


def test_a_map_routes_each_vbucket_to_its_active_and_lists_its_replicas() -> None:
    m = ClusterMap.parse(config([[0, 1], [1, 2], [-1, 0], [2, -1]], rev=7, epoch=2))
    assert m.version == (2, 7) and m.num_vbuckets == 4
    assert [m.active(vb) for vb in range(4)] == ["h1:1", "h2:2", None, "h3:3"]
    assert [m.replicas(vb) for vb in range(4)] == [("h2:2",), ("h3:3",), ("h1:1",), ()]
    assert m.actives_of("h2:2") == [1] and m.actives_of("nowhere:1") == []
    assert m.active(99) is None and m.replicas(99) == ()


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"rev": 1}',
        b'{"rev": "x", "vBucketServerMap": {"serverList": [], "vBucketMap": []}}',
        config([[3]]),  # an index past the server list
        config([[]]),
    ],
)
def test_what_is_no_map_is_refused(raw: bytes) -> None:
    with pytest.raises(ClusterMapError):
        ClusterMap.parse(raw)


def test_the_node_that_served_the_map_takes_the_address_the_client_reached() -> None:
    raw = config([[0], [1]], servers=("0.0.0.0:1", "h2:2"), this="0.0.0.0:1")
    assert ClusterMap.parse(raw, served_by="10.0.0.5:1").servers == ("10.0.0.5:1", "h2:2")
    # an address the map already names is kept as it is
    assert ClusterMap.parse(raw, served_by="h2:2").servers == ("0.0.0.0:1", "h2:2")


def test_with_tls_the_nodes_are_named_by_their_tls_ports() -> None:
    doc = json.loads(config([[0, 1], [1, 0]], servers=("h1:1", "h2:2"), this="h1:1"))
    for ext, tls_port in zip(doc["nodesExt"], (11, 22), strict=True):
        ext["services"]["kvSSL"] = tls_port
    raw = json.dumps(doc).encode()
    assert ClusterMap.parse(raw, tls=True).servers == ("h1:11", "h2:22")
    assert ClusterMap.parse(raw).servers == ("h1:1", "h2:2")
    # the node that served the map over TLS keeps the address the client reached
    served = ClusterMap.parse(raw, served_by="10.0.0.5:11", tls=True)
    assert served.servers == ("10.0.0.5:11", "h2:22") and served.active(1) == "h2:22"
    with pytest.raises(ClusterMapError, match="no TLS port"):
        ClusterMap.parse(config([[0]], servers=("h1:1",)), tls=True)
    assert ConnectionSettings.parse("couchbases://h1:11207").tls is not None
    settings = ConnectionSettings.at("couchbases://h1,h2:11207")
    assert settings.tls is not None and settings.connection_string.startswith("couchbases://")
    assert ConnectionSettings.at("couchbase://h1").tls is None


# -- the router -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "offered", "kept"),
    [
        ((0, 5), (0, 6), True),  # a higher rev
        ((0, 5), (0, 5), False),  # the same map again
        ((0, 5), (0, 4), False),  # a late answer from a node behind
        ((1, 1), (0, 9), False),  # the epoch weighs first
        ((0, 9), (1, 1), True),
    ],
)
def test_the_router_keeps_only_newer_maps(
    held: tuple[int, int], offered: tuple[int, int], kept: bool
) -> None:
    router = Router((Node("h1", 1),))
    assert router.offer(config([[0]], rev=held[1], epoch=held[0]))
    assert router.offer(config([[1]], rev=offered[1], epoch=offered[0])) is kept
    assert router.version == (offered if kept else held)
    assert router.active(0) == (Node("h2", 2) if kept else Node("h1", 1))


def test_before_any_map_every_vbucket_goes_to_the_first_seed() -> None:
    router = Router((Node("a", 1), Node("b", 2)))
    assert router.active(5) == Node("a", 1) and router.replicas(5) == []
    assert router.nodes() == [Node("a", 1)]
    assert not router.offer(b"") and not router.offer(b"NotMyVbucket")  # no map: no change
    assert router.candidates() == [Node("a", 1), Node("b", 2)]


def test_the_router_asks_the_map_nodes_then_the_other_seeds() -> None:
    router = Router((Node("h3", 3), Node("seed", 9)))
    router.offer(config([[0, 1], [1, 0], [-1, 1]], servers=("h1:1", "h2:2")))
    assert router.candidates() == [Node("h1", 1), Node("h2", 2), Node("h3", 3), Node("seed", 9)]
    assert router.actives_by_node() == {Node("h1", 1): [0], Node("h2", 2): [1]}
    assert router.active(2) is None  # mid-failover: nobody
    with pytest.raises(NodeAddressError):
        Router(())


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), min_size=1, max_size=20))
def test_whatever_order_maps_arrive_in_the_newest_wins(versions: list[tuple[int, int]]) -> None:
    router = Router((Node("h1", 1),))
    for epoch, rev in versions:
        router.offer(config([[0]], rev=rev, epoch=epoch))
    assert router.version == max(versions)


# -- retries ----------------------------------------------------------------------------------


def test_retries_back_off_up_to_the_cap_and_stop_at_the_deadline() -> None:
    schedule = RetrySchedule(now=0.0, budget=1.0, cap=0.3, rng=random.Random(1))
    now, delays = 0.0, []
    while (delay := schedule.next_delay(now)) is not None:
        delays.append(delay)
        now += delay
    assert all(0 < d <= 0.3 for d in delays)
    assert now == pytest.approx(1.0)  # the last wait ends exactly at the deadline
    assert delays[1] > delays[0] / 2  # grows (jitter keeps each within half of its step)
