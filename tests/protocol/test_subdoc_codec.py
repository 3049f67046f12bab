"""Sub-document requests: encode and decode give each other back, for every layout of the
extras, and malformed bodies are refused with Einval."""

from __future__ import annotations

import struct

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol.constants import Magic
from dcpkv.protocol.constants import Opcode as O
from dcpkv.protocol.errors import CodecError
from dcpkv.protocol.frame import FrameParser, encode_frame
from dcpkv.protocol.subdoc import Spec, SubdocRequest, decode_lookup_results, lookup_results


def roundtrip(req: SubdocRequest) -> SubdocRequest:
    (frame,) = list(FrameParser().feed(req.encode()))
    return SubdocRequest.decode(frame)


@pytest.mark.parametrize(
    "req",
    [
        SubdocRequest(opcode=O.SubdocGet, key=b"k", specs=(Spec(O.SubdocGet, 4, "a.b"),)),
        SubdocRequest(opcode=O.SubdocCounter, key=b"k",
                      specs=(Spec(O.SubdocCounter, 1, "n", b"5"),),
                      expiry=60, doc_flags=1, cas=9, vbucket=3, opaque=7),
        SubdocRequest(opcode=O.SubdocDictUpsert, key=b"k", doc_flags=2,
                      specs=(Spec(O.SubdocDictUpsert, 0, "x", b"{}"),)),
        SubdocRequest(opcode=O.SubdocMultiLookup, key=b"k", doc_flags=4,
                      specs=(Spec(O.SubdocGet, 4, "_x"), Spec(O.Get))),
        SubdocRequest(opcode=O.SubdocMultiMutation, key=b"k", expiry=5,
                      specs=(Spec(O.SubdocDictUpsert, 0x14, "_x", b'"${Mutation.CAS}"'),
                             Spec(O.Set, 0, "", b"{}"))),
    ],
)  # fmt: skip
def test_requests_round_trip(req: SubdocRequest) -> None:
    assert roundtrip(req) == req


@pytest.mark.parametrize(
    ("opcode", "extras", "value"),
    [
        (O.SubdocGet, b"\x00", b"a"),  # extras of 1 byte
        (O.SubdocGet, struct.pack(">HB", 5, 0), b"ab"),  # path runs past the body
        (O.SubdocMultiLookup, b"\x00\x00", b""),
        (O.SubdocMultiLookup, b"", b"\xc5\x00\x00"),  # truncated spec
        (O.SubdocMultiMutation, b"\x00\x00", b""),
        (O.SubdocMultiMutation, b"", struct.pack(">BBHI", 0xC8, 0, 1, 9) + b"a"),
        (O.SubdocMultiLookup, b"", struct.pack(">BBH", 0xC5, 0, 1) + b"\xff"),  # not UTF-8
    ],
)  # fmt: skip
def test_malformed_requests(opcode: int, extras: bytes, value: bytes) -> None:
    raw = encode_frame(Magic.ClientRequest, opcode, key=b"k", extras=extras, value=value)
    (frame,) = list(FrameParser().feed(raw))
    with pytest.raises(CodecError) as err:
        SubdocRequest.decode(frame)
    assert err.value.status == Status.Einval


def test_lookup_results_layout() -> None:
    results = [(0, b'"v"'), (0xC0, b"")]
    assert decode_lookup_results(lookup_results(results)) == results
