"""The SyncWrite DCP messages byte by byte, from PROTOCOL.md's layouts ("SyncWrites").

Each row gives a message and its wire bytes written out field by field (header, then extras,
key, value): encoding gives exactly those bytes and decoding them gives the message back.
"""

from __future__ import annotations

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol import FrameParser, decode_message
from dcpkv.protocol.base import Message
from dcpkv.protocol.dcp import Abort, Commit, Prepare, SeqnoAcknowledged
from dcpkv.protocol.errors import CodecError


def u(n: int, width: int) -> bytes:
    return n.to_bytes(width, "big")


def header(opcode: int, keylen: int, extlen: int, vbucket: int, body: int, opaque: int) -> bytes:
    # magic, opcode, key length, extras length, datatype, vbucket, body length, opaque, cas
    return (
        bytes([0x80, opcode]) + u(keylen, 2) + bytes([extlen, 0]) + u(vbucket, 2)
        + u(body, 4) + u(opaque, 4) + u(0, 8)
    )  # fmt: skip


PREPARE_EXTRAS = (
    u(7, 8)  # by seqno
    + u(3, 8)  # rev seqno
    + u(0xCAFE, 4)  # flags
    + u(60, 4)  # expiration
    + u(0, 4)  # lock time
    + bytes([2])  # nru
    + bytes([1])  # deleted: a durable delete
    + bytes([3])  # durability level: PersistToMajority
)

PREPARE = Prepare(
    opaque=9, vbucket=5, key=b"key", value=b"val", by_seqno=7, rev_seqno=3, flags=0xCAFE,
    expiration=60, nru=2, deleted=1, durability_level=3,
)  # fmt: skip

ROWS: list[tuple[str, Message, bytes]] = [
    (
        "prepare 0x60: 31-byte extras, key, value",
        PREPARE,
        header(0x60, 3, 31, 5, 31 + 3 + 3, 9) + PREPARE_EXTRAS + b"key" + b"val",
    ),
    (
        "seqno acknowledged 0x61: 8-byte extras, the high prepared seqno",
        SeqnoAcknowledged(opaque=4, vbucket=1023, prepared_seqno=0x0102030405060708),
        header(0x61, 0, 8, 1023, 8, 4) + bytes(range(1, 9)),
    ),
    (
        "commit 0x62: prepared seqno, commit seqno; key, no value",
        Commit(opaque=1, vbucket=2, key=b"k", prepared_seqno=7, commit_seqno=8),
        header(0x62, 1, 16, 2, 17, 1) + u(7, 8) + u(8, 8) + b"k",
    ),
    (
        "abort 0x63: prepared seqno, abort seqno; key, no value",
        Abort(opaque=1, vbucket=2, key=b"k", prepared_seqno=7, abort_seqno=9),
        header(0x63, 1, 16, 2, 17, 1) + u(7, 8) + u(9, 8) + b"k",
    ),
]


@pytest.mark.parametrize(("message", "wire"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_layout(message: Message, wire: bytes) -> None:
    assert message.encode() == wire
    decoded = decode_message(next(FrameParser().feed(wire)))
    assert type(decoded) is type(message)
    assert decoded == message


BAD_EXTRAS = [
    ("prepare with 30 bytes", 0x60, 30, b"k"),
    ("seqno acknowledged with 4 bytes", 0x61, 4, b""),
    ("commit with 8 bytes", 0x62, 8, b"k"),
    ("abort with 17 bytes", 0x63, 17, b"k"),
]


@pytest.mark.parametrize(
    ("opcode", "extlen", "key"), [r[1:] for r in BAD_EXTRAS], ids=[r[0] for r in BAD_EXTRAS]
)
def test_wrong_extras_length_is_einval(opcode: int, extlen: int, key: bytes) -> None:
    wire = header(opcode, len(key), extlen, 0, extlen + len(key), 0) + bytes(extlen) + key
    with pytest.raises(CodecError) as info:
        decode_message(next(FrameParser().feed(wire)))
    assert info.value.status == Status.Einval


@pytest.mark.parametrize("opcode", [0x60, 0x62, 0x63])
def test_key_is_required(opcode: int) -> None:
    extlen = 31 if opcode == 0x60 else 16
    wire = header(opcode, 0, extlen, 0, extlen, 0) + bytes(extlen)
    with pytest.raises(CodecError) as info:
        decode_message(next(FrameParser().feed(wire)))
    assert info.value.status == Status.Einval
