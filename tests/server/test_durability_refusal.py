"""A request with a durability requirement (a SyncWrite) against a real server, over the
wire: the server cannot meet one yet, so it refuses it and changes nothing; it never answers
Success from memory. Frames are built by the independent raw client (no dcpkv codec)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from support.rawclient import RawClient
from support.sdk_cluster import module_server
from support.serverproc import ServerProcess

SET, GET, DELETE, INCREMENT, APPEND, SUBDOC_DICT_UPSERT, SUBDOC_GET = (
    0x01, 0x00, 0x04, 0x05, 0x0E, 0xC8, 0xC5,
)  # fmt: skip
SUCCESS, KEY_ENOENT, EINVAL = 0x00, 0x01, 0x04
DURABILITY_INVALID_LEVEL, DURABILITY_IMPOSSIBLE = 0xA0, 0xA1
MAJORITY_5S = bytes.fromhex("13011388")  # the spec's example: Majority, 5,000 ms
SET_EXTRAS = struct.pack(">II", 0, 0)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with module_server(tmp_path_factory.mktemp("durability")) as srv:
        yield srv


@pytest.fixture
def raw(node: ServerProcess) -> Iterator[RawClient]:
    client = RawClient(node.port)
    client.hello(0x10)  # AltRequestSupport
    client.login()
    yield client
    client.close()


def subdoc_extras(path: bytes) -> bytes:
    return struct.pack(">HB", len(path), 0)


@pytest.mark.parametrize(
    ("opcode", "extras", "value"),
    [
        (SET, SET_EXTRAS, b"v"),
        (DELETE, b"", b""),
        (INCREMENT, struct.pack(">QQI", 1, 0, 0), b""),
        (APPEND, b"", b"tail"),
        (SUBDOC_DICT_UPSERT, subdoc_extras(b"f"), b"f1"),  # path "f", value 1
    ],
)
@pytest.mark.parametrize("level", [1, 2, 3])
def test_durable_mutations_are_refused_and_change_nothing(
    raw: RawClient, opcode: int, extras: bytes, value: bytes, level: int
) -> None:
    key = b"doc-%d-%d" % (opcode, level)
    assert raw.call(SET, key, b'{"n":1}', SET_EXTRAS).status == SUCCESS
    before = raw.call(GET, key)
    answer = raw.call(opcode, key, value, extras, framing=bytes((0x11, level)))
    assert answer.status == DURABILITY_IMPOSSIBLE
    assert b"not supported" in answer.value
    after = raw.call(GET, key)
    assert (after.status, after.value, after.cas) == (SUCCESS, before.value, before.cas)


def test_a_durable_set_of_a_new_key_stores_nothing(raw: RawClient) -> None:
    assert raw.call(SET, b"fresh", b"v", SET_EXTRAS, framing=MAJORITY_5S).status == (
        DURABILITY_IMPOSSIBLE
    )
    assert raw.call(GET, b"fresh").status == KEY_ENOENT


@pytest.mark.parametrize(
    ("framing", "status"),
    [
        (bytes.fromhex("1109"), DURABILITY_INVALID_LEVEL),  # level 9
        (bytes.fromhex("1100"), DURABILITY_INVALID_LEVEL),  # level 0
        (bytes.fromhex("13010000"), EINVAL),  # a reserved timeout
        (bytes.fromhex("120113"), EINVAL),  # two bytes: neither form
    ],
)
def test_malformed_requirements_get_their_status_and_the_connection_goes_on(
    raw: RawClient, framing: bytes, status: int
) -> None:
    key = b"bad-" + framing.hex().encode()
    assert raw.call(SET, key, b"v", SET_EXTRAS, framing=framing).status == status
    assert raw.call(GET, key).status == KEY_ENOENT
    assert raw.call(SET, key, b"v", SET_EXTRAS).status == SUCCESS  # still serving


def test_a_requirement_on_a_read_is_einval(raw: RawClient) -> None:
    raw.call(SET, b"r", b'{"f":1}', SET_EXTRAS)
    assert raw.call(GET, b"r", framing=MAJORITY_5S).status == EINVAL
    lookup = raw.call(SUBDOC_GET, b"r", b"f", subdoc_extras(b"f"), framing=MAJORITY_5S)
    assert lookup.status == EINVAL


def test_flex_frames_without_a_requirement_still_write(raw: RawClient) -> None:
    # framing item 5 (preserve TTL, no data): the SDK sends flex frames for other reasons too
    assert raw.call(SET, b"flex", b"v", SET_EXTRAS, framing=b"\x50").status == SUCCESS
    assert raw.call(GET, b"flex").value == b"v"
