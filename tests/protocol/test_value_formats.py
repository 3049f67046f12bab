"""Snappy blocks and xattr blobs: the value formats behind datatype bits 0x02 and 0x04."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.core.status import Status
from dcpkv.protocol import snappy, xattr
from dcpkv.protocol.errors import CodecError

DOC = b'{"name":"' + b"abc" * 100 + b'"}'


def pair(key: bytes, value: bytes) -> bytes:
    entry = key + b"\0" + value + b"\0"
    return struct.pack(">I", len(entry)) + entry


def blob(*pairs: bytes) -> bytes:
    body = b"".join(pairs)
    return struct.pack(">I", len(body)) + body


@given(st.binary(max_size=4096))
def test_snappy_round_trip(data: bytes) -> None:
    assert snappy.inflate(snappy.deflate(data), len(data)) == data


@pytest.mark.parametrize(
    ("block", "status"),
    [
        (b"", Status.Einval),  # no header at all
        (b"\xff", Status.Einval),  # a varint that never ends
        (snappy.deflate(DOC[:90])[:-5], Status.Einval),  # truncated
        (b"\x05" + b"\xff" * 4, Status.Einval),  # a copy before any literal
        (snappy.deflate(DOC), Status.E2big),  # announces more than the limit below
    ],
)  # fmt: skip
def test_corrupt_or_oversize_blocks_are_refused(block: bytes, status: Status) -> None:
    with pytest.raises(CodecError) as err:
        snappy.inflate(block, 100)
    assert err.value.status == status


def test_deflate_if_smaller_keeps_short_and_random_values_plain() -> None:
    assert snappy.deflate_if_smaller(b"tiny") is None
    assert snappy.deflate_if_smaller(bytes(range(256))) is None  # incompressible: grows
    packed = snappy.deflate_if_smaller(DOC)
    assert packed is not None and len(packed) < len(DOC)


def test_xattr_blob_round_trip_keeps_order() -> None:
    pairs = {"_sync": b'{"rev":"1-a"}', "meta": b"[1,2]", "n": b"3"}
    value, has = xattr.join(pairs, b'{"body":true}')
    assert has
    cut, body = xattr.split(value)
    assert body == b'{"body":true}'
    assert list(xattr.decode(cut).items()) == list(pairs.items())
    assert xattr.encode({}) == b"" and xattr.join({}, b"x") == (b"x", False)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"\0\0", "no length word"),
        (struct.pack(">I", 100) + b"{}", "runs past"),
        (blob(pair(b"a", b"1")[:-1]), "truncated|malformed"),
        (blob(pair(b"", b"12")), "must be 1..16"),
        (blob(pair(b"x" * 17, b"1")), "must be 1..16"),
        (blob(pair(b"-dash", b"1")), "reserved"),
        (blob(pair(b"$virtual", b"1")), "virtual"),
        (blob(pair(b"a", b"1"), pair(b"a", b"2")), "twice"),
        (blob(pair(b"a", b"{nope")), "not JSON"),
        (blob(pair(b"a\0b", b"1")), "malformed"),
    ],
)  # fmt: skip
def test_malformed_blobs_are_refused(value: bytes, why: str) -> None:
    with pytest.raises(CodecError, match=why) as err:
        cut, _ = xattr.split(value)
        xattr.decode(cut)
    assert err.value.status == Status.Einval


def test_system_and_virtual_keys() -> None:
    assert xattr.is_system("_sync") and not xattr.is_system("user")
    assert xattr.is_virtual("$document")
    assert xattr.system_only({"_a": b"1", "b": b"2"}) == {"_a": b"1"}
