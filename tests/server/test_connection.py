"""The connection's session gates and opcodes, frame in, frame out (no sockets)."""

from __future__ import annotations

import json

import pytest
import scramp

from dcpkv.core.status import Status
from dcpkv.protocol.constants import HelloFeature, Magic, Opcode
from dcpkv.protocol.frame import Frame, FrameParser, encode_frame
from dcpkv.server.config import ServerSettings
from dcpkv.server.connection import CloseConnection, Connection
from dcpkv.server.dispatch import handle
from dcpkv.server.state import ServerState


def request(opcode: int, *, key: bytes = b"", value: bytes = b"", opaque: int = 9) -> Frame:
    raw = encode_frame(Magic.ClientRequest, opcode, key=key, value=value, opaque=opaque)
    (frame,) = FrameParser().feed(raw)
    return frame


def answer(raw: bytes | None) -> Frame:
    assert raw is not None
    (frame,) = FrameParser().feed(raw)
    return frame


@pytest.fixture
def conn() -> Connection:
    state = ServerState(ServerSettings(port=12000))
    state.buckets["default"] = object()
    return Connection(state, peer="test")


def login(conn: Connection) -> None:
    got = answer(
        handle(conn, request(Opcode.SaslAuth, key=b"PLAIN", value=b"\0Administrator\0password"))
    )
    assert got.status == Status.Success


def test_hello_acknowledges_only_implemented_features(conn: Connection) -> None:
    asked = [HelloFeature.Xerror, HelloFeature.Tracing, HelloFeature.MutationSeqno, 0x7777]
    value = b"".join(int(f).to_bytes(2, "big") for f in asked)
    got = answer(handle(conn, request(Opcode.Hello, key=b'{"a":"sdk"}', value=value)))
    assert bytes(got.value) == b"\x00\x04\x00\x07"
    assert conn.features == {HelloFeature.Xerror, HelloFeature.MutationSeqno}


def test_data_needs_authentication_then_a_bucket(conn: Connection) -> None:
    assert answer(handle(conn, request(Opcode.GetClusterConfig))).status == Status.Eaccess
    login(conn)
    assert answer(handle(conn, request(Opcode.GetClusterConfig))).status == Status.NoBucket
    assert (
        answer(handle(conn, request(Opcode.SelectBucket, key=b"nope"))).status == Status.KeyEnoent
    )
    assert (
        answer(handle(conn, request(Opcode.SelectBucket, key=b"default"))).status == Status.Success
    )
    got = answer(handle(conn, request(Opcode.GetClusterConfig)))
    doc = json.loads(bytes(got.value))
    assert doc["vBucketServerMap"]["serverList"] == ["127.0.0.1:12000"]
    assert len(doc["vBucketServerMap"]["vBucketMap"]) == 1024
    assert doc["nodesExt"][0]["services"]["kv"] == 12000


def test_wrong_password_answers_auth_error(conn: Connection) -> None:
    got = answer(handle(conn, request(Opcode.SaslAuth, key=b"PLAIN", value=b"\0Administrator\0x")))
    assert got.status == Status.AuthError and conn.user is None


def test_scram_sha512_exchange(conn: Connection) -> None:
    client = scramp.ScramClient(["SCRAM-SHA-512"], "Administrator", "password")
    first = answer(
        handle(
            conn,
            request(Opcode.SaslAuth, key=b"SCRAM-SHA512", value=client.get_client_first().encode()),
        )
    )
    assert first.status == Status.AuthContinue
    client.set_server_first(bytes(first.value).decode())
    final = answer(
        handle(
            conn,
            request(Opcode.SaslStep, key=b"SCRAM-SHA512", value=client.get_client_final().encode()),
        )
    )
    assert final.status == Status.Success
    client.set_server_final(bytes(final.value).decode())
    assert conn.user == "Administrator"


def test_unknown_opcode_and_error_map(conn: Connection) -> None:
    assert answer(handle(conn, request(0xEE))).status == Status.UnknownCommand
    got = answer(handle(conn, request(Opcode.GetErrorMap, value=b"\x00\x02")))
    errors = json.loads(bytes(got.value))["errors"]
    assert errors["7"]["name"] == "NOTMYVBUCKET" and "fetch-config" in errors["7"]["attrs"]
    assert answer(handle(conn, request(Opcode.GetErrorMap, value=b"\x02"))).status == Status.Einval


def test_responses_echo_the_opaque_and_quit_closes(conn: Connection) -> None:
    assert answer(handle(conn, request(Opcode.Noop, opaque=0xDEADBEEF))).opaque == 0xDEADBEEF
    assert bytes(answer(handle(conn, request(Opcode.Version))).value).startswith(b"dcpkv-")
    with pytest.raises(CloseConnection):
        handle(conn, request(Opcode.Quit))
