"""A node's side of a handover (dcpkv.server.handover) and the map pushes to subscribed clients:
the staged map served from the state change it waits for, never followed by replication; no
sockets (a real bucket, the dispatcher, a connection whose ``send`` is a list)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine.bucket import Bucket
from dcpkv.protocol import kv
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame
from dcpkv.protocol.messages import decode_message
from dcpkv.server.cluster_map import PushedConfig
from dcpkv.server.config import ServerSettings
from dcpkv.server.connection import Connection
from dcpkv.server.dispatch import handle
from dcpkv.server.handover import Handovers, StagedMap, parse_push
from dcpkv.server.state import ServerState

ACTIVE, REPLICA, PENDING, DEAD = (
    VBucketState.ACTIVE,
    VBucketState.REPLICA,
    VBucketState.PENDING,
    VBucketState.DEAD,
)
A, B = "127.0.0.1:1", "127.0.0.1:2"


def config(rev: int, actives: list[int], adopt_when: dict[str, str] | None = None) -> bytes:
    """A pushed config over servers A and B: ``actives[vb]`` indexes them."""
    doc: dict[str, Any] = {
        "rev": rev,
        "revEpoch": 1,
        "name": "default",
        "vBucketServerMap": {"serverList": [A, B], "vBucketMap": [[a] for a in actives]},
        "dcpkv": {"repairOnRollback": False},
    }
    if adopt_when is not None:
        doc["dcpkv"]["adoptWhen"] = adopt_when
    return json.dumps(doc).encode()


def pushed(rev: int, actives: list[int]) -> PushedConfig:
    return PushedConfig.parse(config(rev, actives))


# -- the pure part ---------------------------------------------------------------------------


def test_a_staged_push_is_told_apart_and_its_instructions_stripped() -> None:
    plain, when = parse_push(config(5, [0, 0]))
    assert when is None and plain.version == (1, 5)
    staged, when = parse_push(config(6, [1, 0], {"0": "dead", "1": "active"}))
    assert when == {0: DEAD, 1: ACTIVE} and staged.version == (1, 6)
    doc = json.loads(staged.raw)
    assert doc["dcpkv"] == {"repairOnRollback": False}  # what clients see: no instructions


@pytest.mark.parametrize("section", [{}, {"x": "dead"}, {"1": "pending"}, {"1": 4}, ["1"], "dead"])
def test_a_malformed_staged_push_is_refused(section: object) -> None:
    raw = json.loads(config(6, [1, 0]))
    raw["dcpkv"]["adoptWhen"] = section
    with pytest.raises(ValueError, match="adoptWhen"):
        parse_push(json.dumps(raw).encode())


@pytest.mark.parametrize(
    ("served_rev", "state", "expected"),
    [
        (5, DEAD, 6),  # the change it waits for, and newer than the map served: served
        (7, DEAD, None),  # a newer map came meanwhile: nothing
        (5, REPLICA, None),  # another change: nothing
        (5, None, None),  # the copy deleted: nothing
    ],
)
def test_a_staged_map_is_served_from_the_change_it_waits_for(
    served_rev: int, state: VBucketState | None, expected: int | None
) -> None:
    handovers = Handovers()
    handovers.stage(StagedMap(pushed(6, [1, 0]), {0: DEAD}))
    handovers.state_changed(0, ACTIVE, None, 0.0)
    got = handovers.state_changed(0, state, pushed(served_rev, [0, 0]), 1.0)
    assert (got.version[1] if got else None) == expected


def test_the_same_state_again_adopts_nothing_and_serving_drops_older_staged_maps() -> None:
    handovers = Handovers()
    handovers.stage(StagedMap(pushed(6, [0, 0]), {1: ACTIVE}))
    handovers.stage(StagedMap(pushed(8, [0, 1]), {1: ACTIVE}))
    assert handovers.state_changed(1, ACTIVE, None, 0.0) is not None  # (unknown before)
    assert handovers.state_changed(1, ACTIVE, None, 1.0) is None  # not a change
    handovers.serving(pushed(7, [0, 0]), 2.0)
    assert [s.config.version[1] for s in handovers.staged] == [8]


def test_the_times_of_a_handover_are_noted() -> None:
    handovers = Handovers()
    handovers.serving(pushed(5, [0, 0]), 1.0)
    handovers.state_changed(1, ACTIVE, None, 2.0)
    handovers.state_changed(1, DEAD, None, 3.0)
    handovers.state_changed(1, DEAD, None, 4.0)  # still dead: the first moment stays
    handovers.serving(pushed(6, [0, 1]), 5.0)
    assert handovers.dead_at == {1: 3.0}
    assert handovers.named_at == {0: 1.0, 1: 5.0}  # vb 0's active never changed since


# -- the node's state and its connections ----------------------------------------------------


def request(opcode: int, **parts: Any) -> Frame:
    (frame,) = FrameParser().feed(encode_frame(Magic.ClientRequest, opcode, **parts))
    return frame


def answer(raw: bytes | None) -> Frame:
    assert raw is not None
    (frame,) = FrameParser().feed(raw)
    return frame


class Node:
    """A managed node's state with one real bucket (2 vbuckets) and its state listener."""

    def __init__(self, tmp: Path) -> None:
        self.state = ServerState(ServerSettings(port=12000, managed=True, data_dir=tmp))
        self.bucket = Bucket("default", tmp, num_vbuckets=2)
        self.state.buckets["default"] = self.bucket
        self.bucket.state_listeners.append(
            lambda vb: self.state.vbucket_state_changed("default", vb)
        )

    def connect(self, *features: int) -> tuple[Connection, list[bytes]]:
        """A logged-in connection in the bucket, after Hello with ``features``; what the
        server sends it unasked is appended to the list."""
        conn = Connection(self.state, peer="test")
        sent: list[bytes] = []
        conn.send = sent.append
        value = b"".join(int(f).to_bytes(2, "big") for f in features)
        handle(conn, request(Opcode.Hello, key=b"sdk", value=value))
        plain = b"\0Administrator\0password"
        assert answer(handle(conn, request(Opcode.SaslAuth, key=b"PLAIN", value=plain))).status == 0
        assert answer(handle(conn, request(Opcode.SelectBucket, key=b"default"))).status == 0
        return conn, sent

    def push(self, conn: Connection, raw: bytes) -> int:
        return answer(
            handle(conn, request(Opcode.SetClusterConfig, key=b"default", value=raw))
        ).status

    def served_rev(self, conn: Connection) -> int:
        return int(
            json.loads(bytes(answer(handle(conn, request(Opcode.GetClusterConfig))).value))["rev"]
        )


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def notifications(sent: list[bytes]) -> list[kv.ClustermapChangeNotification]:
    frames = [f for raw in sent for f in FrameParser().feed(raw)]
    out = [decode_message(f) for f in frames]
    assert all(isinstance(m, kv.ClustermapChangeNotification) for m in out)
    return out  # type: ignore[return-value]


def test_the_old_active_serves_the_staged_map_once_it_gave_the_vbucket_away(node: Node) -> None:
    admin, _ = node.connect()
    sdk, sent = node.connect(HelloFeature.Duplex, HelloFeature.ClustermapChangeNotification)
    node.bucket.set_vbucket_state(0, ACTIVE)
    assert node.push(admin, config(5, [0, 0])) == Status.Success
    assert node.push(admin, config(6, [1, 0], {"0": "dead"})) == Status.Success
    assert node.served_rev(sdk) == 5  # staged: not served yet
    assert node.state.pushed_config("default") == node.state.cluster_configs["default"].raw
    node.bucket.set_vbucket_state(0, DEAD)  # the takeover's last step on the old active
    miss = answer(handle(sdk, request(Opcode.Get, key=b"k", vbucket=0)))
    assert miss.status == Status.NotMyVbucket
    assert json.loads(bytes(miss.value))["vBucketServerMap"]["vBucketMap"][0] == [1]  # its new home
    assert node.served_rev(sdk) == 6
    assert json.loads(node.state.pushed_config("default") or b"")["rev"] == 5  # replication's
    assert [(n.bucket, n.epoch, n.rev) for n in notifications(sent)] == [
        ("default", 1, 5),
        ("default", 1, 6),
    ]
    assert json.loads(bytes(notifications(sent)[1].config)) == json.loads(bytes(miss.value))
    # the manager's push of the same map afterwards: replication follows, clients hear nothing
    assert node.push(admin, config(6, [1, 0])) == Status.Success
    assert json.loads(node.state.pushed_config("default") or b"")["rev"] == 6
    assert len(notifications(sent)) == 2


def test_the_new_active_serves_the_staged_map_from_the_moment_it_is_active(node: Node) -> None:
    admin, _ = node.connect()
    node.bucket.set_vbucket_state(1, REPLICA)
    node.push(admin, config(5, [0, 0]))
    node.push(admin, config(6, [0, 1], {"1": "active"}))
    node.bucket.set_vbucket_state(1, PENDING)
    assert node.served_rev(admin) == 5
    node.bucket.set_vbucket_state(1, ACTIVE)
    assert node.served_rev(admin) == 6


def test_a_staged_map_older_than_the_one_served_is_not_kept(node: Node) -> None:
    admin, _ = node.connect()
    node.push(admin, config(7, [0, 0]))
    node.push(admin, config(6, [1, 0], {"0": "dead"}))
    assert node.state.handover("default").staged == []
    bad = json.loads(config(8, [0, 0], {"0": "dead"}))
    bad["dcpkv"]["adoptWhen"] = {"0": "sideways"}
    assert node.push(admin, json.dumps(bad).encode()) == Status.Einval


def test_only_subscribers_in_the_bucket_hear_of_a_new_map(node: Node) -> None:
    admin, _ = node.connect()
    _, plain = node.connect()
    lone, without_duplex = node.connect(HelloFeature.ClustermapChangeNotification)
    assert lone.features == set()  # a server request needs Duplex: not acknowledged
    sub, sent = node.connect(HelloFeature.Duplex, HelloFeature.ClustermapChangeNotification)
    assert set(node.state.map_subscribers) == {id(sub)}
    node.push(admin, config(5, [0, 0]))
    assert plain == [] and without_duplex == [] and len(notifications(sent)) == 1
    sub.detach()  # the connection closed
    node.push(admin, config(6, [0, 0]))
    assert len(notifications(sent)) == 1 and node.state.map_subscribers == {}


def test_a_staged_map_for_a_handover_already_done_is_served_at_once(node: Node) -> None:
    """The manager stages a map again while one of its handovers ends (.handover): the old
    active, dead already, serves it at once rather than waiting for a change that happened."""
    admin, _ = node.connect()
    node.bucket.set_vbucket_state(0, ACTIVE)
    node.push(admin, config(5, [0, 0]))
    node.bucket.set_vbucket_state(0, DEAD)
    assert node.push(admin, config(7, [1, 0], {"0": "dead"})) == Status.Success
    assert node.served_rev(admin) == 7
