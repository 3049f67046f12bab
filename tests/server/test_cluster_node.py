"""A data node of a cluster, driven as the cluster manager drives it: a real server subprocess
started with ``--managed``, vbucket states and the map set over the wire (spec 002)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import Datatype, HelloFeature, Opcode
from dcpkv.protocol.messages import decode_message
from support.kvclient import KVClient
from support.serverproc import ServerProcess

ACTIVE, REPLICA = struct.pack(">I", VBucketState.ACTIVE), struct.pack(">I", VBucketState.REPLICA)
DEAD = struct.pack(">I", VBucketState.DEAD)


@pytest.fixture
def node(server_factory: type[ServerProcess], tmp_path: Path) -> KVClient:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--managed")
    srv.start()
    client = KVClient(srv.port)
    assert client.login().status == Status.Success
    return client


def config(rev: int, epoch: int = 0) -> bytes:
    return json.dumps({"rev": rev, "revEpoch": epoch, "name": "default",
                       "vBucketServerMap": {"vBucketMap": [[0]] * 16}}).encode()  # fmt: skip


def test_a_managed_node_holds_no_vbucket_until_told(node: KVClient) -> None:
    assert node.set(b"k", b"v", vbucket=3).status == Status.NotMyVbucket
    assert node.call(Opcode.GetAllVbSeqnos).value == b""
    before = json.loads(node.call(Opcode.GetClusterConfig).value)["vBucketServerMap"]
    assert before["vBucketMap"] == [[-1]] * 16  # nobody: no map was pushed yet
    assert node.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=3).status == Status.Success
    after = json.loads(node.call(Opcode.GetClusterConfig).value)["vBucketServerMap"]
    assert after["vBucketMap"][3] == [0] and after["vBucketMap"][4] == [-1]
    assert node.set(b"k", b"v", vbucket=3).status == Status.Success
    assert node.call(Opcode.SetVbucket, extras=REPLICA, vbucket=4).status == Status.Success
    assert node.set(b"k", b"v", vbucket=4).status == Status.NotMyVbucket  # replicas take no writes


def test_a_node_holding_nothing_still_tells_its_state_cas(node: KVClient) -> None:
    missing = node.call(Opcode.GetVbucket, vbucket=7)
    assert missing.status == Status.NotMyVbucket and missing.cas != 0
    first = node.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=7, cas=missing.cas)
    assert first.status == Status.Success and first.cas != missing.cas


def test_a_delayed_stale_state_change_is_refused(node: KVClient) -> None:
    """The spec's mis-ordering: the manager sends "active", loses the connection, re-reads the
    CAS and sends "replica"; the first command, still in the network, arrives last. It carries
    the old CAS, so it is refused with the current one and changes nothing."""
    first = node.call(Opcode.SetVbucket, extras=REPLICA, vbucket=5)
    assert first.status == Status.Success and first.cas != 0
    cas_before_race = first.cas
    delayed = node.frame(Opcode.SetVbucket, extras=ACTIVE, vbucket=5, cas=cas_before_race)
    newer = node.call(Opcode.SetVbucket, extras=REPLICA, vbucket=5, cas=cas_before_race)
    assert newer.status == Status.Success and newer.cas != cas_before_race
    node.send(delayed)
    refused = node.recv_frame()
    assert refused.status == Status.KeyEexists and refused.cas == newer.cas
    state = node.call(Opcode.GetVbucket, vbucket=5)
    assert struct.unpack(">I", state.value) == (VBucketState.REPLICA,)
    assert state.cas == newer.cas  # how a manager re-reads the CAS
    # with the current CAS the manager's retry goes through; deletion is ordered the same way
    retry = node.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=5, cas=state.cas)
    assert retry.status == Status.Success
    assert node.call(Opcode.DelVbucket, vbucket=5, cas=state.cas).status == Status.KeyEexists
    assert node.call(Opcode.DelVbucket, vbucket=5, cas=retry.cas).status == Status.Success


def test_the_pushed_map_is_served_and_only_moves_forward(node: KVClient) -> None:
    assert node.call(Opcode.SetClusterConfig, key=b"default", value=config(5),
                     datatype=Datatype.JSON).status == Status.Success  # fmt: skip
    assert json.loads(node.call(Opcode.GetClusterConfig).value)["rev"] == 5
    # an older map arriving late is ignored; a newer epoch wins whatever its rev
    node.call(Opcode.SetClusterConfig, key=b"default", value=config(3))
    assert json.loads(node.call(Opcode.GetClusterConfig).value)["rev"] == 5
    node.call(Opcode.SetClusterConfig, key=b"default", value=config(1, epoch=2))
    served = json.loads(node.call(Opcode.GetClusterConfig).value)
    assert (served["revEpoch"], served["rev"]) == (2, 1)
    # NotMyVbucket carries the same map, so a smart client re-routes
    miss = node.get(b"k", vbucket=9)
    assert miss.status == Status.NotMyVbucket and json.loads(miss.value) == served


@pytest.mark.parametrize(
    ("key", "value", "status"),
    [
        (b"default", b"{not json", Status.Einval),
        (b"default", b'{"rev": -1}', Status.Einval),
        (b"default", b"[1, 2]", Status.Einval),
        (b"nope", b'{"rev": 1}', Status.KeyEnoent),
    ],
)
def test_a_bad_map_is_refused_and_changes_nothing(
    node: KVClient, key: bytes, value: bytes, status: Status
) -> None:
    before = node.call(Opcode.GetClusterConfig).value
    assert node.call(Opcode.SetClusterConfig, key=key, value=value).status == status
    assert node.call(Opcode.GetClusterConfig).value == before


def test_a_handover_map_reaches_clients_that_asked_for_pushes(
    node: KVClient,
) -> None:
    """Over the wire: a client that asked Hello for Duplex and ClustermapChangeNotification is
    sent every newer map at once (magic 0x82), the staged one too when the old active gives
    its vbucket away; ``stat handover`` tells when."""
    sub = KVClient(node.sock.getpeername()[1])
    hello = sub.hello(HelloFeature.Duplex, HelloFeature.ClustermapChangeNotification)
    assert bytes(hello.value) == b"\x00\x0c\x00\x0d"
    assert sub.login().status == Status.Success
    assert node.call(Opcode.SetVbucket, extras=ACTIVE, vbucket=3).status == Status.Success
    node.call(Opcode.SetClusterConfig, key=b"default", value=config(5), datatype=Datatype.JSON)
    staged = json.loads(config(6))
    staged["vBucketServerMap"]["serverList"] = ["127.0.0.1:1"]  # vbucket 3's new home
    staged["dcpkv"] = {"adoptWhen": {"3": "dead"}}
    node.call(Opcode.SetClusterConfig, key=b"default", value=json.dumps(staged).encode())
    assert node.call(Opcode.SetVbucket, extras=DEAD, vbucket=3).status == Status.Success
    pushes = [decode_message(sub.recv_frame()) for _ in range(2)]
    assert [(type(p).__name__, p.rev) for p in pushes] == [  # type: ignore[attr-defined]
        ("ClustermapChangeNotification", 5),
        ("ClustermapChangeNotification", 6),
    ]
    served = json.loads(node.call(Opcode.GetClusterConfig).value)
    assert served["rev"] == 6 and served["dcpkv"] == {}  # the instructions stripped
    times = node.stats(b"handover")
    assert float(times["vb_3:dead_at"]) <= float(times["vb_3:new_active_served_at"])
    sub.close()
