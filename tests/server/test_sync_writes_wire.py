"""SyncWrites over the wire against a real server: a vbucket given a replication topology by
SetVbucket answers a durable write once its prepare commits (server/sync_writes.py). Frames are
built by the independent raw client (no dcpkv codec)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.server.dispatch import ROUTES
from dcpkv.server.sync_writes import SYNC_WRITE_OPS
from support.rawclient import DCP_MARKER, DCP_MUTATION, RawClient
from support.sdk_cluster import module_server
from support.serverproc import ServerProcess

GET, SET, DELETE, SET_VBUCKET = 0x00, 0x01, 0x04, 0x3D
SUCCESS, KEY_EEXISTS, EINVAL = 0x00, 0x02, 0x04
DURABILITY_IMPOSSIBLE, IN_PROGRESS, AMBIGUOUS = 0xA1, 0xA2, 0xA3
RECOMMIT_IN_PROGRESS = 0xA4
DCP_PREPARE, DCP_COMMIT, DCP_ABORT = 0x60, 0x62, 0x63
ALT_REQUEST, MUTATION_SEQNO, SYNC_REPLICATION = 0x10, 0x04, 0x11
SET_EXTRAS = struct.pack(">II", 0, 0)
ACTIVE = 1
ALONE_VB, WAITING_VB, BARE_VB = 3, 5, 7  # the single-node chain, the absent replica, none


def durability(level: int, timeout_ms: int | None = None) -> bytes:
    if timeout_ms is None:
        return bytes((0x11, level))
    return bytes((0x13, level)) + struct.pack(">H", timeout_ms)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with module_server(tmp_path_factory.mktemp("syncwrites")) as srv:
        me = f"127.0.0.1:{srv.port}"
        admin = client(srv)
        for vb, chain in ((ALONE_VB, [me]), (WAITING_VB, [me, "replica1"])):
            value = json.dumps({"topology": [chain]}).encode()
            answer = admin.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE,)), vbucket=vb)
            assert answer.status == SUCCESS, answer
        admin.close()
        yield srv


def client(srv: ServerProcess) -> RawClient:
    raw = RawClient(srv.port)
    assert SYNC_REPLICATION in raw.hello(ALT_REQUEST, MUTATION_SEQNO, SYNC_REPLICATION)
    raw.login()
    return raw


@pytest.fixture
def raw(node: ServerProcess) -> Iterator[RawClient]:
    c = client(node)
    yield c
    c.close()


def test_bad_topologies_are_refused(raw: RawClient, node: ServerProcess) -> None:
    for value in (b"{}", b"not json", b'{"topology": "x"}'):
        answer = raw.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE,)), vbucket=9)
        assert answer.status == EINVAL, (value, answer)
    me = json.dumps({"topology": [[f"127.0.0.1:{node.port}"]]}).encode()
    for state in (2, 4):  # replica, dead: a topology is for an active or a pending copy
        answer = raw.call(SET_VBUCKET, value=me, extras=bytes((state,)), vbucket=9)
        assert answer.status == EINVAL, (state, answer)


def test_a_topology_must_name_this_node_as_the_managers_map_does(tmp_path: Path) -> None:
    """A node's name is the one the manager's map gives it (``thisNode``: a proxy's or NAT's
    address, say, not the one it binds). Before a map names it (a bucket's first states come
    before its first map) the manager's word is taken; after, a topology whose first chain's
    active is another node is refused."""
    with module_server(tmp_path) as srv:
        raw = client(srv)
        other = json.dumps({"topology": [["someone-else:11210"]]}).encode()
        answer = raw.call(SET_VBUCKET, value=other, extras=bytes((ACTIVE,)), vbucket=9)
        assert answer.status == SUCCESS, answer
        name = "proxy.example:4321"  # what the manager calls this node
        doc = {
            "rev": 1, "name": "default",
            "nodesExt": [{"hostname": "proxy.example", "services": {"kv": 4321}, "thisNode": True}],
            "vBucketServerMap": {"serverList": [name], "vBucketMap": [[0]] * 16},
        }  # fmt: skip
        pushed = raw.call(0xB4, b"default", json.dumps(doc).encode())  # SetClusterConfig
        assert pushed.status == SUCCESS, pushed
        for vb, chain, status in ((10, "someone-else:11210", EINVAL), (11, name, SUCCESS)):
            value = json.dumps({"topology": [[chain]]}).encode()
            answer = raw.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE,)), vbucket=vb)
            assert answer.status == status, (chain, answer)
        raw.close()


def test_a_pending_copy_serves_durable_writes_from_the_moment_it_is_active(
    raw: RawClient, node: ServerProcess
) -> None:
    """A rebalance's new copy goes pending with its chain (the manager's takeover), and takes
    it when it becomes active: no DurabilityImpossible window until the manager hears of it."""
    vb = 13
    set_state(raw, vb, 3, [[f"127.0.0.1:{node.port}"]])  # pending
    assert stat_group(raw, b"vbucket-topology %d" % vb) == {}  # not active yet
    set_state(raw, vb, ACTIVE)
    answer = raw.call(SET, b"taken", b"v", SET_EXTRAS, vbucket=vb, framing=durability(1))
    assert answer.status == SUCCESS, answer


def test_no_topology_still_refuses(raw: RawClient) -> None:
    answer = raw.call(SET, b"bare", b"v", SET_EXTRAS, vbucket=BARE_VB, framing=durability(1))
    assert answer.status == DURABILITY_IMPOSSIBLE


@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_durable_set_is_answered_after_its_commit(raw: RawClient, level: int) -> None:
    key = b"alone-%d" % level
    assert raw.call(SET, key, b"old", SET_EXTRAS, vbucket=ALONE_VB).status == SUCCESS
    answer = raw.call(SET, key, b"new", SET_EXTRAS, vbucket=ALONE_VB, framing=durability(level))
    assert answer.status == SUCCESS, answer
    _uuid, seqno = struct.unpack(">QQ", answer.extras)
    read = raw.call(GET, key, vbucket=ALONE_VB)
    assert (read.status, read.value, read.cas) == (SUCCESS, b"new", answer.cas)
    assert seqno <= raw.high_seqno(ALONE_VB)
    deleted = raw.call(DELETE, key, vbucket=ALONE_VB, framing=durability(level))
    assert deleted.status == SUCCESS
    assert raw.call(GET, key, vbucket=ALONE_VB).status == 0x01


def test_a_prepare_without_its_majority_times_out_ambiguous(node: ServerProcess) -> None:
    writer, other = client(node), client(node)
    key = b"waiting"
    assert writer.call(SET, key, b"old", SET_EXTRAS, vbucket=WAITING_VB).status == SUCCESS
    durable = writer.send(
        SET, key, b"new", SET_EXTRAS, vbucket=WAITING_VB, framing=durability(1, 1500)
    )
    behind = writer.send(GET, key, vbucket=WAITING_VB)  # answered after the durable Set
    # A Delete with a wrong CAS changes nothing: KeyExists until the prepare is there, then
    # SyncWriteInProgress (its check comes first).
    status = KEY_EEXISTS
    while status == KEY_EEXISTS:
        status = other.call(DELETE, key, vbucket=WAITING_VB, cas=1).status
    assert status == IN_PROGRESS
    assert other.call(SET, key, b"x", SET_EXTRAS, vbucket=WAITING_VB).status == IN_PROGRESS
    assert other.call(GET, key, vbucket=WAITING_VB).value == b"old"  # no dirty read
    first, second = writer.recv(), writer.recv()
    assert (first.opaque, first.status) == (durable, AMBIGUOUS)
    assert (second.opaque, second.status, second.value) == (behind, SUCCESS, b"old")
    assert other.call(SET, key, b"free", SET_EXTRAS, vbucket=WAITING_VB).status == SUCCESS
    writer.close()
    other.close()


def stat_group(raw: RawClient, group: bytes) -> dict[bytes, bytes]:
    answer, out = raw.call(0x10, group), {}
    while answer.key:
        out[answer.key] = answer.value
        answer = raw.recv()
    return out


def set_state(raw: RawClient, vb: int, state: int, topology: list[object] | None = None) -> None:
    value = b"" if topology is None else json.dumps({"topology": topology}).encode()
    answer = raw.call(SET_VBUCKET, value=value, extras=bytes((state,)), vbucket=vb)
    assert answer.status == SUCCESS, answer


def test_leaving_active_answers_ambiguous_and_a_promoted_copy_re_commits(
    node: ServerProcess,
) -> None:
    """A client waiting on a durable write gets SyncWriteAmbiguous when its vbucket leaves
    the active state; made active again (a promotion), the vbucket keeps the prepare: a read of
    its key answers SyncWriteReCommitInProgress and a write SyncWriteInProgress until a
    topology with a majority lets it commit (PROTOCOL.md, "SyncWrites": Failover)."""
    vb, replica, key = 11, 2, b"promoted"
    writer, admin = client(node), client(node)
    me = f"127.0.0.1:{node.port}"
    set_state(admin, vb, ACTIVE, [[me, "replica1"]])
    assert writer.call(SET, key, b"old", SET_EXTRAS, vbucket=vb).status == SUCCESS
    durable = writer.send(SET, key, b"new", SET_EXTRAS, vbucket=vb, framing=durability(1))
    while admin.call(SET, key, b"x", SET_EXTRAS, vbucket=vb).status != IN_PROGRESS:
        pass  # until the prepare is there
    details = stat_group(admin, b"vbucket-details %d" % vb)
    prefix = b"vb_%d:" % vb
    assert details[prefix + b"sync_write_pending"] == b"1"
    assert json.loads(details[prefix + b"topology"]) == {"topology": [[me, "replica1"]]}
    hps = details[prefix + b"high_prepared_seqno"].decode()
    assert details[prefix + b"acks"] == f"{me}={hps},replica1=0".encode()  # waits for replica1
    set_state(admin, vb, replica)
    answer = writer.recv()
    assert (answer.opaque, answer.status) == (durable, AMBIGUOUS)
    set_state(admin, vb, ACTIVE)  # promoted: no topology yet
    assert stat_group(admin, b"vbucket-topology %d" % vb) == {b"vb_%d" % vb: b""}
    high_prepared = stat_group(admin, b"vbucket-details %d" % vb)[prefix + b"high_prepared_seqno"]
    assert int(high_prepared) == admin.high_seqno(vb)  # the prepare is the last item
    assert admin.call(GET, key, vbucket=vb).status == RECOMMIT_IN_PROGRESS
    assert admin.call(SET, key, b"x", SET_EXTRAS, vbucket=vb).status == IN_PROGRESS
    set_state(admin, vb, ACTIVE, [[me, None]])  # no majority: still waiting
    assert admin.call(GET, key, vbucket=vb).status == RECOMMIT_IN_PROGRESS
    set_state(admin, vb, ACTIVE, [[me]])
    read = admin.call(GET, key, vbucket=vb)
    assert (read.status, read.value) == (SUCCESS, b"new")
    writer.close()
    admin.close()


def test_a_consumer_without_sync_writes_sees_committed_items_only(raw: RawClient) -> None:
    key = b"streamed"
    answer = raw.call(SET, key, b"v1", SET_EXTRAS, vbucket=ALONE_VB, framing=durability(1))
    assert answer.status == SUCCESS
    high = raw.high_seqno(ALONE_VB)
    raw.dcp_open("sync-writes-test", 0)
    assert raw.stream_request(ALONE_VB, end=high).status == SUCCESS
    messages = raw.stream_until_end()
    opcodes = {m.opcode for m in messages}
    assert not opcodes & {DCP_PREPARE, DCP_COMMIT, DCP_ABORT}
    mutations = [m for m in messages if m.opcode == DCP_MUTATION and m.key == key]
    assert [m.value for m in mutations] == [b"v1"]
    seqno = struct.unpack_from(">Q", mutations[0].extras)[0]
    assert seqno == struct.unpack(">QQ", answer.extras)[1]  # the commit's seqno
    ends = [struct.unpack_from(">QQ", m.extras)[1] for m in messages if m.opcode == DCP_MARKER]
    assert max(ends) <= high


def set_topology(raw: RawClient, vb: int, chain: list[str]) -> None:
    value = json.dumps({"topology": [chain]}).encode()
    answer = raw.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE,)), vbucket=vb)
    assert answer.status == SUCCESS, answer


def test_a_persisted_durable_set_survives_kill9(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """PersistToMajority is answered once the prepare is on disk: after kill -9 the write is
    there, committed (its commit was flushed) or committed again once the vbucket has its
    topology back (the prepare read back at warm-up)."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log")
    srv.start()
    raw = client(srv)
    set_topology(raw, ALONE_VB, [f"127.0.0.1:{srv.port}"])
    assert raw.call(SET, b"k", b"old", SET_EXTRAS, vbucket=ALONE_VB).status == SUCCESS
    answer = raw.call(SET, b"k", b"new", SET_EXTRAS, vbucket=ALONE_VB, framing=durability(3))
    assert answer.status == SUCCESS, answer
    raw.close()
    srv.kill9()
    srv.start(same_port=True)
    raw = client(srv)
    set_topology(raw, ALONE_VB, [f"127.0.0.1:{srv.port}"])
    assert raw.call(GET, b"k", vbucket=ALONE_VB).value == b"new"
    raw.close()


APPEND, PREPEND, INCREMENT, DECREMENT = 0x0E, 0x0F, 0x05, 0x06
SUBDOC_DICT_UPSERT, SUBDOC_MULTI_MUTATION = 0xC8, 0xD1


def subdoc_extras(path: bytes) -> bytes:
    return struct.pack(">HB", len(path), 0)


def counter_extras(delta: int) -> bytes:
    return struct.pack(">QQI", delta, 0, 0)


def multi_upsert(path: bytes, value: bytes) -> bytes:
    return struct.pack(">BBHI", SUBDOC_DICT_UPSERT, 0, len(path), len(value)) + path + value


# Every mutation of the edit path, from '{"n":1}' (or, for the counters, "7"), and what its
# commit holds.
EDIT_PATH = [
    ("append", APPEND, b"", b"x", b'{"n":1}x'),
    ("prepend", PREPEND, b"", b"x", b'x{"n":1}'),
    ("incr", INCREMENT, counter_extras(2), b"", b"9"),
    ("decr", DECREMENT, counter_extras(2), b"", b"5"),
    ("subdoc", SUBDOC_DICT_UPSERT, subdoc_extras(b"m"), b"m2", b'{"n":1,"m":2}'),
    ("multi", SUBDOC_MULTI_MUTATION, b"", multi_upsert(b"m", b"3"), b'{"n":1,"m":3}'),
]


@pytest.mark.parametrize(("name", "opcode", "extras", "value", "committed"), EDIT_PATH)
@pytest.mark.parametrize("level", [1, 2, 3])
def test_every_mutation_is_a_sync_write_answered_with_its_commit(
    raw: RawClient, name: str, opcode: int, extras: bytes, value: bytes, committed: bytes,
    level: int,
) -> None:  # fmt: skip
    key = b"edit-%s-%d" % (name.encode(), level)
    start = b"7" if opcode in (INCREMENT, DECREMENT) else b'{"n":1}'
    assert raw.call(SET, key, start, SET_EXTRAS, vbucket=ALONE_VB).status == SUCCESS
    answer = raw.call(
        opcode, key, value, extras, vbucket=ALONE_VB, framing=durability(level, 10_000)
    )
    assert answer.status == SUCCESS, answer
    read = raw.call(GET, key, vbucket=ALONE_VB)
    assert (read.status, read.value, read.cas) == (SUCCESS, committed, answer.cas)
    if opcode in (INCREMENT, DECREMENT):  # the counter answered is the committed one
        assert struct.unpack(">Q", answer.value)[0] == int(committed)
    if opcode in (INCREMENT, DECREMENT, SUBDOC_DICT_UPSERT, SUBDOC_MULTI_MUTATION):
        seqno = struct.unpack(">QQ", answer.extras)[1]
        assert seqno == raw.high_seqno(ALONE_VB)  # the commit's seqno, not the prepare's


@pytest.mark.parametrize(("name", "opcode", "extras", "value", "committed"), EDIT_PATH)
def test_an_edit_without_its_majority_changes_nothing_and_is_ambiguous(
    raw: RawClient, name: str, opcode: int, extras: bytes, value: bytes, committed: bytes
) -> None:
    key = b"edit-waiting-" + name.encode()
    start = b"7" if opcode in (INCREMENT, DECREMENT) else b'{"n":1}'
    assert raw.call(SET, key, start, SET_EXTRAS, vbucket=WAITING_VB).status == SUCCESS
    answer = raw.call(opcode, key, value, extras, vbucket=WAITING_VB, framing=durability(1, 200))
    assert answer.status == AMBIGUOUS, answer
    assert raw.call(GET, key, vbucket=WAITING_VB).value == start


def test_every_route_that_takes_durability_is_a_sync_write() -> None:
    durable = {op for op, route in ROUTES.items() if route.durable}
    assert durable == SYNC_WRITE_OPS


def test_a_bucket_minimum_level_makes_every_write_a_sync_write(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """``--durability-min-level persistToMajority`` with a flusher that never runs: a plain
    Set and a Majority Set both wait for a persistence that never comes (their own short
    timeout, or the bucket's default one), are ambiguous and change nothing; where there is no
    topology every write is refused DurabilityImpossible."""
    srv = server_factory(
        tmp_path / "data", tmp_path / "server.log", "--flush-interval", "3600",
        "--durability-min-level", "persistToMajority", "--durability-timeout-ms", "300",
    )  # fmt: skip
    srv.start()
    raw = client(srv)
    set_topology(raw, ALONE_VB, [f"127.0.0.1:{srv.port}"])
    plain = raw.call(SET, b"k", b"v", SET_EXTRAS, vbucket=ALONE_VB)  # the bucket's 300 ms
    assert plain.status == AMBIGUOUS, plain
    majority = raw.call(SET, b"k", b"v", SET_EXTRAS, vbucket=ALONE_VB, framing=durability(1, 200))
    assert majority.status == AMBIGUOUS, majority
    assert raw.call(GET, b"k", vbucket=ALONE_VB).status == 0x01  # never committed
    bare = raw.call(SET, b"k", b"v", SET_EXTRAS, vbucket=BARE_VB)
    assert bare.status == DURABILITY_IMPOSSIBLE
    assert raw.call(GET, b"k", vbucket=BARE_VB).status == 0x01
    raw.close()


def test_without_a_minimum_a_majority_write_commits_before_persistence(
    server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    """The control of the test above: the same server without the minimum level commits a
    Majority write from memory and answers a plain Set at once."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--flush-interval", "3600")
    srv.start()
    raw = client(srv)
    set_topology(raw, ALONE_VB, [f"127.0.0.1:{srv.port}"])
    assert raw.call(SET, b"k", b"v", SET_EXTRAS, vbucket=ALONE_VB).status == SUCCESS
    answer = raw.call(SET, b"k", b"w", SET_EXTRAS, vbucket=ALONE_VB, framing=durability(1))
    assert answer.status == SUCCESS
    assert raw.call(GET, b"k", vbucket=ALONE_VB).value == b"w"
    raw.close()


def test_with_unordered_execution_a_waiting_sync_write_holds_back_no_answer(
    node: ServerProcess,
) -> None:
    """A connection whose Hello asked for UnorderedExecution (0x0e, as the official SDKs do)
    gets the answers of requests sent after a waiting SyncWrite at once; without it they wait
    behind it (the test above)."""
    unordered = 0x0E
    writer = RawClient(node.port)
    assert unordered in writer.hello(ALT_REQUEST, SYNC_REPLICATION, unordered)
    writer.login()
    key = b"unordered"
    durable = writer.send(
        SET, key, b"new", SET_EXTRAS, vbucket=WAITING_VB, framing=durability(1, 1500)
    )
    behind = writer.send(GET, b"unordered-other", vbucket=ALONE_VB)
    first, second = writer.recv(), writer.recv()
    assert (first.opaque, first.status) == (behind, 0x01)  # KeyEnoent, not held back
    assert (second.opaque, second.status) == (durable, AMBIGUOUS)
    writer.close()


@pytest.mark.parametrize("unordered", [False, True], ids=["ordered", "unordered"])
def test_a_sync_write_committed_within_its_own_request_is_answered_with_the_commit(
    node: ServerProcess, unordered: bool
) -> None:
    """A majority of one commits a Majority prepare inside its own request, and the answer
    is given on the loop at once: it still carries the commit's CAS and seqno (built from
    the handler's answer once that returned), in either answer order, pipelined."""
    features = (ALT_REQUEST, MUTATION_SEQNO, SYNC_REPLICATION) + ((0x0E,) if unordered else ())
    writer = RawClient(node.port)
    writer.hello(*features)
    writer.login()
    keys = [b"own-%d-%d" % (unordered, i) for i in range(8)]
    sent = {
        writer.send(SET, k, b"v%d" % i, SET_EXTRAS, vbucket=ALONE_VB, framing=durability(1)): k
        for i, k in enumerate(keys)
    }
    answers = [writer.recv() for _ in keys]
    assert sorted(a.opaque for a in answers) == sorted(sent)
    for answer in answers:
        assert answer.status == SUCCESS, answer
        _uuid, seqno = struct.unpack(">QQ", answer.extras)
        read = writer.call(GET, sent[answer.opaque], vbucket=ALONE_VB)
        assert (read.status, read.cas) == (SUCCESS, answer.cas)
        assert 0 < seqno <= writer.high_seqno(ALONE_VB)
    writer.close()
