"""Replication over DCP between two real nodes (``dcpkv server --managed`` subprocesses), set up
over the wire as the cluster manager does it: states with SetVbucket, the map with
SetClusterConfig. Waits are bounded polling loops; nothing asserts on time."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.protocol.constants import HelloFeature, Opcode
from support.kvclient import poll_rounds
from support.rawclient import RawClient
from support.replicacheck import VBUCKETS, admin, contents, failover_logs, seqnos, wait_caught_up
from support.serverproc import ServerProcess


def make_pair(active: ServerProcess, replica: ServerProcess) -> None:
    """Every vbucket active on the first node and replica on the second; the map to both."""
    servers = [f"127.0.0.1:{active.port}", f"127.0.0.1:{replica.port}"]
    config = json.dumps({
        "rev": 1, "name": "default", "nodeLocator": "vbucket",
        "vBucketServerMap": {"hashAlgorithm": "CRC", "numReplicas": 1, "serverList": servers,
                             "vBucketMap": [[0, 1]] * VBUCKETS},
    }).encode()  # fmt: skip
    for srv, state in ((active, VBucketState.ACTIVE), (replica, VBucketState.REPLICA)):
        with admin(srv.port) as c:
            for vb in range(VBUCKETS):
                extras = struct.pack(">I", state)
                assert c.call(Opcode.SetVbucket, extras=extras, vbucket=vb).status == 0
            assert c.call(Opcode.SetClusterConfig, key=b"default", value=config).status == 0


def write(port: int, keys: list[bytes], value: bytes) -> None:
    with admin(port) as c:
        for key in keys:
            assert c.set(key, value, vbucket=vbucket_for_key(key, VBUCKETS)).status == 0


def delete(port: int, keys: list[bytes]) -> None:
    with admin(port) as c:
        for key in keys:
            c.send(c.frame(Opcode.Delete, key=key, vbucket=vbucket_for_key(key, VBUCKETS)))
            assert c.recv_frame().status == Status.Success


@pytest.fixture
def pair(
    server_factory: type[ServerProcess], tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[ServerProcess, ServerProcess]:
    extra = getattr(request, "param", ())
    a = server_factory(tmp_path / "a", tmp_path / "a.log", "--managed", *extra)
    b = server_factory(tmp_path / "b", tmp_path / "b.log", "--managed")
    a.start()
    b.start()
    make_pair(a, b)
    return a, b


def test_a_replica_follows_its_active_exactly(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = pair
    keys = [b"doc-%d" % i for i in range(300)]
    write(a.port, keys, b"v1")
    write(a.port, keys[::3], b"v2")
    delete(a.port, keys[::7])
    wait_caught_up(a.port, b.port)
    # same history (seqnos, keys, values, tombstones), same failover logs (the active's)
    assert contents(b.port, "check-b") == contents(a.port, "check-a")
    assert failover_logs(b.port) == failover_logs(a.port)
    with admin(b.port) as c:
        # a replica refuses front-end writes, and reports its own seqnos to ObserveSeqno
        assert c.set(keys[0], b"x", vbucket=vbucket_for_key(keys[0], VBUCKETS)).status == (
            Status.NotMyVbucket
        )
        stats = c.stats(b"dcp")
    name = f"Replica:127.0.0.1:{b.port}"
    assert int(stats[f"items_received:{name}"]) >= len(keys)
    with admin(a.port) as c:
        source = c.stats(b"dcp")
    # the source's producer is named for the replica, so its stats read as spec 002 says
    assert f"items_sent:3:{name}" in source


@pytest.mark.parametrize("pair", [("--flush-interval", "5")], indirect=True)
def test_a_replica_rolls_back_what_its_active_lost(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """Spec 001's story between two nodes: the active acknowledges writes it has not
    persisted, the replica receives them, the active dies (kill -9) and comes back on an
    older state with a new branch; the replica is told to roll back and ends equal."""
    a, b = pair
    persisted = [b"old-%d" % i for i in range(100)]
    write(a.port, persisted, b"kept")
    with admin(a.port) as c:  # wait for a flush: the next one is ~5 s away
        last = persisted[-1]
        vb = vbucket_for_key(last, VBUCKETS)
        uuid = failover_logs(a.port)[vb][0].uuid  # type: ignore[attr-defined]
        for _ in poll_rounds(30, 0.01):
            answer = c.call(Opcode.ObserveSeqno, vbucket=vb, value=struct.pack(">Q", uuid))
            _, _, _, persisted_seqno, current = struct.unpack(">BHQQQ", answer.value)
            if persisted_seqno == current:
                break
    lost = [b"lost-%d" % i for i in range(60)]
    write(a.port, lost, b"gone")
    wait_caught_up(a.port, b.port)  # the replica holds writes its active never persisted
    a.kill9()
    a.start(same_port=True)
    for _ in poll_rounds(60, 0.05):
        if seqnos(b.port) == seqnos(a.port) and contents(b.port, "b") == contents(a.port, "a"):
            break
    else:
        raise AssertionError("the replica never came back equal to its active")
    assert not any(k.startswith(b"lost") for docs in contents(b.port, "b2").values()
                   for k in docs)  # fmt: skip
    with admin(b.port) as c:
        stats = c.stats(b"dcp")
    rollbacks = sum(int(v) for k, v in stats.items() if k.startswith("rollbacks:"))
    assert rollbacks > 0
    # each one logged as an event (dcpkv.core.logs), naming its source
    events = [line for line in b.log().splitlines() if "event=rollback" in line]
    assert len(events) == rollbacks
    assert all(f"source=127.0.0.1:{a.port}" in line for line in events), events


def push(
    srv: ServerProcess, servers: list[str], rows: list[list[int]], rev: int,
    this_node: str | None = None,
) -> None:  # fmt: skip
    """The map as the manager pushes it; ``this_node`` (one of ``servers``): the name it gives
    ``srv`` (nodesExt's ``thisNode``)."""
    doc: dict[str, object] = {
        "rev": rev, "name": "default", "nodeLocator": "vbucket",
        "vBucketServerMap": {"hashAlgorithm": "CRC", "numReplicas": len(rows[0]) - 1,
                             "serverList": servers, "vBucketMap": rows},
    }  # fmt: skip
    if this_node is not None:
        host, port = this_node.rsplit(":", 1)
        doc["nodesExt"] = [{"hostname": host, "services": {"kv": int(port)}, "thisNode": True}]
    config = json.dumps(doc).encode()
    with admin(srv.port) as c:
        assert c.call(Opcode.SetClusterConfig, key=b"default", value=config).status == 0


def set_states(srv: ServerProcess, state: VBucketState) -> None:
    with admin(srv.port) as c:
        for vb in range(VBUCKETS):
            extras = struct.pack(">I", state)
            assert c.call(Opcode.SetVbucket, extras=extras, vbucket=vb).status == 0


def test_failover_promotes_a_replica_and_the_other_replica_rolls_back(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """The spec's failover, node by node (the manager's part done by hand): A active, B and C
    replicas. B is down while A takes more writes that only C receives; A dies. B, behind C,
    is promoted (a new failover entry where its history ends) and the map says so; C follows
    the new map, is told to roll back what B never had, and ends equal to B."""
    a, b, c = (server_factory(tmp_path / n, tmp_path / f"{n}.log", "--managed") for n in "abc")
    for srv in (a, b, c):
        srv.start()
    servers = [f"127.0.0.1:{s.port}" for s in (a, b, c)]
    set_states(a, VBucketState.ACTIVE)
    for srv in (b, c):
        set_states(srv, VBucketState.REPLICA)
    for srv in (a, b, c):
        push(srv, servers, [[0, 1, 2]] * VBUCKETS, rev=1)
    write(a.port, [b"first-%d" % i for i in range(200)], b"1")
    wait_caught_up(a.port, b.port)
    wait_caught_up(a.port, c.port)
    assert b.terminate() == 0  # B stops cleanly, behind from now on
    write(a.port, [b"second-%d" % i for i in range(100)], b"2")
    wait_caught_up(a.port, c.port)
    a.kill9()
    b.start(same_port=True)
    set_states(b, VBucketState.ACTIVE)  # the promotion: a new branch where B's history ends
    for srv in (b, c):
        push(srv, servers, [[1, 2, -1]] * VBUCKETS, rev=2)
    for _ in poll_rounds(60, 0.05):
        if seqnos(c.port) == seqnos(b.port) and contents(c.port, "c") == contents(b.port, "b"):
            break
    else:
        raise AssertionError("the remaining replica never came back equal to the new active")
    docs = {k for vbucket in contents(c.port, "c2").values() for k in vbucket}
    assert docs == {b"first-%d" % i for i in range(200)}
    assert failover_logs(c.port) == failover_logs(b.port)
    with admin(c.port) as client:
        stats = client.stats(b"dcp")
    assert sum(int(v) for k, v in stats.items() if k.startswith("rollbacks:")) > 0


def test_a_replica_named_by_a_later_map_acknowledges_under_that_name(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """An active counts a replica's acknowledgements under the name its topology gives the
    replica: the manager's name for it (``thisNode``), which may differ from the address it
    binds. A replica that streamed before a map named it (or that was ejected and added back,
    as the chaos suite's swap does) reopens its links under the name the newer map gives it,
    so a durable write on its active commits instead of waiting for an ack under a name no
    topology holds."""
    a, b = (server_factory(tmp_path / n, tmp_path / f"{n}.log", "--managed") for n in "ab")
    for srv in (a, b):
        srv.start()
    me, named = f"127.0.0.1:{a.port}", f"localhost:{b.port}"  # the manager's names
    set_states(a, VBucketState.ACTIVE)
    set_states(b, VBucketState.REPLICA)
    push(b, [me, named], [[0, 1]] * VBUCKETS, rev=1)  # names no node: b goes by its address
    write(a.port, [b"before-%d" % i for i in range(20)], b"v")
    wait_caught_up(a.port, b.port)  # b's link streams, acknowledging as 127.0.0.1:<port>
    push(b, [me, named], [[0, 1]] * VBUCKETS, rev=2, this_node=named)
    key = b"durable"
    vb = vbucket_for_key(key, VBUCKETS)
    raw = RawClient(a.port)
    features = (HelloFeature.AltRequestSupport, HelloFeature.SyncReplication)
    assert HelloFeature.SyncReplication in raw.hello(*features)
    raw.login()
    topology = json.dumps({"topology": [[me, named]]}).encode()
    state = raw.call(Opcode.SetVbucket, value=topology, extras=bytes((VBucketState.ACTIVE,)),
                     vbucket=vb)  # fmt: skip
    assert state.status == Status.Success, state
    majority = bytes((0x13, 1)) + struct.pack(">H", 60_000)  # level Majority, 60 s timeout
    answer = raw.call(Opcode.Set, key, b"v", struct.pack(">II", 0, 0), vbucket=vb,
                      framing=majority)  # fmt: skip
    assert answer.status == Status.Success, answer  # (SyncWriteAmbiguous: acked by no name)
    raw.close()
    with admin(a.port) as c:
        assert f"items_sent:{vb}:Replica:{named}" in c.stats(b"dcp")


def test_a_full_eviction_replica_fetches_its_non_resident_keys_in_the_background(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """A restarted full-eviction replica holds no item in memory: the updates and deletions
    it then receives replace versions only its disk holds. Its link waits for background
    fetches (none is read on the loop), and it ends equal to its active, its per-vbucket
    counts exact."""
    a, b = (
        server_factory(tmp_path / n, tmp_path / f"{n}.log", "--managed", "--eviction-policy",
                       "fullEviction")
        for n in ("a", "b")
    )  # fmt: skip
    a.start()
    b.start()
    make_pair(a, b)
    keys = [b"fe-%d" % i for i in range(400)]
    write(a.port, keys, b"v1")
    wait_caught_up(a.port, b.port)
    assert b.terminate() == 0
    b.start(same_port=True)  # warm-up loads no items: every key is on its disk only
    make_pair(a, b)
    write(a.port, keys[::2], b"v2")
    delete(a.port, keys[1::4])
    wait_caught_up(a.port, b.port)
    assert contents(b.port, "check-b") == contents(a.port, "check-a")
    with admin(b.port) as c:
        waits = sum(int(v) for k, v in c.stats(b"dcp").items() if k.startswith("fetch_waits:"))
        replica = c.stats(b"vbucket-details")
    assert waits > 0
    with admin(a.port) as c:
        active = c.stats(b"vbucket-details")
    counts = [int(replica[f"vb_{vb}:num_items"]) for vb in range(VBUCKETS)]
    assert counts == [int(active[f"vb_{vb}:num_items"]) for vb in range(VBUCKETS)]
    assert sum(counts) == len(keys) - len(keys[1::4])
