"""SyncWrites over the wire against a real server: a vbucket given a replication topology by
SetVbucket answers a durable write once its prepare commits (server/sync_writes.py). Frames are
built by the independent raw client (no dcpkv codec)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.engine.bucket import STORAGE_ENGINES
from support.rawclient import DCP_MARKER, DCP_MUTATION, RawClient
from support.sdk_cluster import module_server
from support.serverproc import ServerProcess

GET, SET, DELETE, SET_VBUCKET = 0x00, 0x01, 0x04, 0x3D
SUCCESS, KEY_EEXISTS, EINVAL = 0x00, 0x02, 0x04
DURABILITY_IMPOSSIBLE, IN_PROGRESS, AMBIGUOUS = 0xA1, 0xA2, 0xA3
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
    for value in (b"{}", b'{"topology": [["someone-else"]]}', b"not json"):
        answer = raw.call(SET_VBUCKET, value=value, extras=bytes((ACTIVE,)), vbucket=9)
        assert answer.status == EINVAL, (value, answer)


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


@pytest.mark.parametrize("engine", STORAGE_ENGINES)
def test_a_persisted_durable_set_survives_kill9(
    server_factory: type[ServerProcess], tmp_path: Path, engine: str
) -> None:
    """PersistToMajority is answered once the prepare is on disk: after kill -9 the write is
    there, committed (its commit was flushed) or committed again once the vbucket has its
    topology back (the prepare read back at warm-up), on either storage engine."""
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", "--storage", engine)
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
