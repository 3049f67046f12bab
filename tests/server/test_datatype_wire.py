"""Snappy and xattrs on the wire, checked with an independent client (:mod:`rawclient`):
Hello acknowledges them, values come in validated and go out as each connection negotiated,
and a client that insists on Xattr, XError, Snappy and JSON streams the bucket unchanged."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.client import events
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.sync import SyncConsumer
from dcpkv.core.vbucket import vbucket_for_key
from support.rawclient import (
    DCP_DELETION,
    DCP_END,
    DCP_MUTATION,
    F_DATATYPE,
    F_JSON,
    F_SNAPPY,
    F_XATTR,
    SNAPPY,
    XATTR,
    RawClient,
    deflate,
    inflate,
    insisting_client,
    split_xattrs,
    xattr_blob,
)
from support.serverproc import ServerProcess

VBUCKETS = 16
GET, SET, DELETE = 0x00, 0x01, 0x04
JSON_DT = 0x01
INCLUDE_XATTRS, NO_VALUE = 0x04, 0x08
SUCCESS, EINVAL, ENOENT = 0x00, 0x04, 0x01
DOC = json.dumps({"text": "compressible " * 50}).encode()


def vb(key: bytes) -> int:
    return vbucket_for_key(key, VBUCKETS)


def store(c: RawClient, key: bytes, value: bytes, datatype: int = JSON_DT) -> int:
    answer = c.call(SET, key, value, struct.pack(">II", 0, 0), vbucket=vb(key), datatype=datatype)
    return answer.status


def client(port: int, *features: int) -> RawClient:
    c = RawClient(port)
    c.hello(*features)
    c.login()
    return c


@pytest.fixture
def port(server: ServerProcess) -> int:
    return server.port


@pytest.fixture
def active_server(server_factory: type[ServerProcess], tmp_path: Path) -> Iterator[int]:
    srv = server_factory(tmp_path / "active", tmp_path / "active.log", "--compression-mode",
                         "active")  # fmt: skip
    yield srv.start()


def test_hello_acknowledges_what_couchbase_tools_insist_on(port: int) -> None:
    with insisting_client(port) as c:
        assert store(c, b"doc", deflate(DOC), JSON_DT | SNAPPY) == SUCCESS


def test_corrupt_snappy_is_refused_and_never_stored(port: int) -> None:
    c = client(port, F_DATATYPE, F_JSON, F_SNAPPY)
    assert store(c, b"bad", b"\x40" + b"\xff" * 10, JSON_DT | SNAPPY) == EINVAL
    assert c.call(GET, b"bad", vbucket=vb(b"bad")).status == ENOENT
    assert c.call(0x0A).status == SUCCESS  # the connection goes on


@pytest.mark.parametrize("datatype", [SNAPPY, XATTR])
def test_bits_not_negotiated_are_refused(port: int, datatype: int) -> None:
    c = client(port, F_DATATYPE, F_JSON)
    assert store(c, b"k", deflate(DOC), datatype | JSON_DT) == EINVAL


def test_get_answers_compressed_only_to_snappy_connections(port: int) -> None:
    snappy_conn = client(port, F_DATATYPE, F_JSON, F_SNAPPY)
    plain_conn = client(port, F_DATATYPE, F_JSON)
    assert store(snappy_conn, b"z", deflate(DOC), JSON_DT | SNAPPY) == SUCCESS
    got = snappy_conn.call(GET, b"z", vbucket=vb(b"z"))
    assert got.datatype == JSON_DT | SNAPPY and inflate(got.value) == DOC
    got = plain_conn.call(GET, b"z", vbucket=vb(b"z"))
    assert (got.datatype, got.value) == (JSON_DT, DOC)


def test_get_of_a_document_with_xattrs_returns_the_body(port: int) -> None:
    c = client(port, F_DATATYPE, F_JSON, F_XATTR)
    value = xattr_blob({"_sync": '{"rev":1}', "user": '"u"'}) + b'{"a":1}'
    assert store(c, b"x", value, JSON_DT | XATTR) == SUCCESS
    got = c.call(GET, b"x", vbucket=vb(b"x"))
    assert (got.datatype, got.value) == (JSON_DT, b'{"a":1}')


def test_active_mode_compresses_what_it_stores(active_server: int) -> None:
    c = client(active_server, F_DATATYPE, F_JSON, F_SNAPPY)
    assert store(c, b"a", DOC) == SUCCESS
    got = c.call(GET, b"a", vbucket=vb(b"a"))
    assert got.datatype == JSON_DT | SNAPPY and inflate(got.value) == DOC
    assert len(got.value) < len(DOC)


def _stream(port: int, flags: int, *features: int, control: tuple[str, str] | None = None,
            ) -> dict[bytes, tuple[int, int, bytes]]:  # fmt: skip
    """{key: (opcode, datatype, value)} of every vbucket streamed to the current high seqno."""
    c = client(port, *features)
    c.dcp_open("test-stream", flags)
    if control is not None:
        assert c.control(*control) == SUCCESS
    out: dict[bytes, tuple[int, int, bytes]] = {}
    for v in range(VBUCKETS):
        answer = c.stream_request(v, end=c.high_seqno(v))
        assert answer.status == SUCCESS, answer
        for p in c.stream_until_end():
            if p.opcode in (DCP_MUTATION, DCP_DELETION):
                out[p.key] = (p.opcode, p.datatype, p.value)
            assert p.opcode != DCP_END or struct.unpack(">I", p.extras)[0] == 0
    c.close()
    return out


@pytest.fixture
def loaded(port: int) -> dict[bytes, bytes]:
    """Documents of every kind: plain, compressed, with xattrs, deleted with system xattrs."""
    c = client(port, F_DATATYPE, F_JSON, F_SNAPPY, F_XATTR)
    with_x = xattr_blob({"_sync": '{"rev":"1-a"}', "meta": '"m"'}) + DOC
    assert store(c, b"plain", DOC) == SUCCESS
    assert store(c, b"small", b'{"n":1}') == SUCCESS
    assert store(c, b"packed", deflate(DOC), JSON_DT | SNAPPY) == SUCCESS
    assert store(c, b"xattrs", with_x, JSON_DT | XATTR) == SUCCESS
    assert store(c, b"both", deflate(with_x), JSON_DT | XATTR | SNAPPY) == SUCCESS
    assert store(c, b"gone", with_x, JSON_DT | XATTR) == SUCCESS
    assert c.call(DELETE, b"gone", vbucket=vb(b"gone")).status == SUCCESS
    c.close()
    return {b"plain": DOC, b"small": b'{"n":1}', b"packed": DOC, b"xattrs": with_x,
            b"both": with_x}  # fmt: skip


def test_insisting_client_streams_the_bucket_unchanged(
    port: int, loaded: dict[bytes, bytes]
) -> None:
    with insisting_client(port):
        pass  # the handshake it insists on succeeds (the stream below speaks the same Hello)
    got = _stream(port, INCLUDE_XATTRS, F_DATATYPE, F_XATTR, 0x07, F_SNAPPY, F_JSON)
    for key, value in loaded.items():
        op, dt, sent = got[key]
        assert op == DCP_MUTATION
        assert (inflate(sent) if dt & SNAPPY else sent) == value, key
    op, dt, sent = got[b"gone"]
    assert op == DCP_DELETION and dt == XATTR
    assert split_xattrs(sent) == ({"_sync": '{"rev":"1-a"}'}, b"")  # the system xattr only


def test_a_consumer_without_xattrs_or_snappy_gets_plain_bodies(
    port: int, loaded: dict[bytes, bytes]
) -> None:
    got = _stream(port, 0)
    for key in loaded:
        assert got[key] == (DCP_MUTATION, JSON_DT, DOC if key != b"small" else b'{"n":1}'), key
    assert got[b"gone"] == (DCP_DELETION, 0, b"")


def test_no_value_with_include_xattrs_sends_just_the_xattrs(
    port: int, loaded: dict[bytes, bytes]
) -> None:
    got = _stream(port, NO_VALUE | INCLUDE_XATTRS, F_DATATYPE, F_XATTR)
    xattrs = {"_sync": '{"rev":"1-a"}', "meta": '"m"'}
    for key in (b"xattrs", b"both"):
        _, dt, sent = got[key]
        assert dt == XATTR and split_xattrs(sent) == (xattrs, b"")
    assert got[b"plain"] == (DCP_MUTATION, 0, b"")


def test_force_value_compression(port: int, loaded: dict[bytes, bytes]) -> None:
    got = _stream(port, 0, F_DATATYPE, F_SNAPPY, control=("force_value_compression", "true"))
    for key in (b"plain", b"packed", b"xattrs", b"both"):
        _, dt, sent = got[key]
        assert dt == JSON_DT | SNAPPY and inflate(sent) == DOC, key
    assert got[b"small"] == (DCP_MUTATION, JSON_DT, b'{"n":1}')  # too small to gain
    c = client(port, F_DATATYPE)
    c.dcp_open("no-snappy", 0)
    assert c.control("force_value_compression", "true") == EINVAL


@pytest.mark.parametrize("compression", [False, True])
def test_the_client_library_inflates_transparently(
    port: int, loaded: dict[bytes, bytes], compression: bool
) -> None:
    cfg = ClientSettings(ConnectionSettings.at(port=port), name=f"test:z{compression}",
                       noop_interval=1.0, compression=compression)  # fmt: skip
    with SyncConsumer(cfg) as sync:
        got = {ev.key: ev for ev in sync.stream(end="now") if isinstance(ev, events.Mutation)}
    for key in loaded:
        assert got[key].value == (b'{"n":1}' if key == b"small" else DOC), key
        assert got[key].datatype == JSON_DT
