"""Every kind of malformed input raises CodecError with the right status, naming the field."""

from __future__ import annotations

import struct

import pytest

from dcpkv.core.status import Status
from dcpkv.protocol import CodecError, FrameParser, decode_message, encode_frame
from dcpkv.protocol.dcp import DcpOpen, Mutation, SnapshotMarker, StreamRequestOk
from dcpkv.protocol.kv import Get, SetVbucket

HDR = struct.Struct(">BBHBBHIIQ")


def _frame_error(wire: bytes) -> CodecError:
    with pytest.raises(CodecError) as err:
        for frame in FrameParser().feed(wire):
            decode_message(frame)
    return err.value


def _req(opcode: int, **parts: bytes) -> bytes:
    return encode_frame(0x80, opcode, **parts)


CASES = [
    # (name, wire, status, words the message must contain)
    ("unknown magic", HDR.pack(0x42, 0, 0, 0, 0, 0, 0, 0, 0), Status.Einval, "magic 0x42"),
    (
        "body shorter than extras+key",
        HDR.pack(0x80, 0x57, 4, 31, 0, 0, 20, 0, 0) + bytes(20),
        Status.Einval,
        "total body length 20",
    ),
    (
        "key over 250",
        HDR.pack(0x80, 0x00, 251, 0, 0, 0, 251, 0, 0) + bytes(251),
        Status.Einval,
        "key length 251",
    ),
    (
        "framing overrun",
        bytes([0x08, 0x57, 2, 1, 31, 0, 0, 0])
        + struct.pack(">IIQ", 34, 0, 0)
        + b"\x23\x00"
        + bytes(32),
        Status.Einval,
        "framing extras",
    ),
    ("unknown opcode", _req(0x99), Status.UnknownCommand, "0x99"),
    ("retired DcpFlush", _req(0x5A), Status.UnknownCommand, "DcpFlush"),
    ("mutation extras", _req(0x57, key=b"k", extras=bytes(30)), Status.Einval, "Mutation extras"),
    ("mutation no key", _req(0x57, extras=bytes(31)), Status.Einval, "Mutation key"),
    ("get with value", _req(0x00, key=b"k", value=b"v"), Status.Einval, "Get value"),
    ("get without key", _req(0x00), Status.Einval, "Get key"),
    ("noop with key", _req(0x0A, key=b"k"), Status.Einval, "Noop key"),
    ("set short extras", _req(0x01, key=b"k", extras=bytes(4)), Status.Einval, "Set extras"),
    (
        "V1 marker with value",
        _req(0x56, extras=bytes(20), value=b"x"),
        Status.Einval,
        "SnapshotMarker value",
    ),
    (
        "marker with key",
        _req(0x56, extras=bytes(20), key=b"k"),
        Status.Einval,
        "SnapshotMarker key",
    ),
    (
        "V2 marker unknown version",
        _req(0x56, extras=b"\x01", value=bytes(36)),
        Status.Einval,
        "SnapshotMarker version",
    ),
    (
        "V2.2 marker short value",
        _req(0x56, extras=b"\x02", value=bytes(44)),
        Status.Einval,
        "SnapshotMarkerV2_2 value",
    ),
    ("deletion 19 bytes", _req(0x58, key=b"k", extras=bytes(19)), Status.Einval, "Deletion extras"),
    ("open name > 200", _req(0x50, key=b"n" * 201, extras=bytes(8)), Status.Einval, "DcpOpen name"),
    ("open name not utf-8", _req(0x50, key=b"\xff", extras=bytes(8)), Status.Einval, "UTF-8"),
    (
        "stream request bad JSON",
        _req(0x53, extras=bytes(48), value=b"{"),
        Status.Einval,
        "StreamRequest value",
    ),
    (
        "stream request numeric purge",
        _req(0x53, extras=bytes(48), value=b'{"purge_seqno":5}'),
        Status.Einval,
        "purge_seqno",
    ),
    (
        "stream request purge over u64",
        _req(0x53, extras=bytes(48), value=b'{"purge_seqno":"18446744073709551616"}'),
        Status.Einval,
        "u64",
    ),
    (
        "ragged failover log",
        encode_frame(0x81, 0x53, value=bytes(24)),
        Status.Einval,
        "StreamRequestOk failover_log",
    ),
    ("empty failover log", encode_frame(0x81, 0x54), Status.Einval, "failover_log"),
    (
        "rollback body 4 bytes",
        encode_frame(0x81, 0x53, status=0x23, value=bytes(4)),
        Status.Einval,
        "StreamRequestRollback value",
    ),
    ("bad vbucket state", _req(0x3D, extras=b"\0\0\0\x09"), Status.Einval, "SetVbucket state"),
    ("dcp bad state", _req(0x5B, extras=b"\x00"), Status.Einval, "SetVbucketState state"),
    ("hello odd features", _req(0x1F, value=b"\x00"), Status.Einval, "Hello features"),
    (
        "observe format 2",
        encode_frame(0x81, 0x91, value=b"\x02" + bytes(26)),
        Status.Einval,
        "ObserveSeqnoResponse format",
    ),
    ("incr value", encode_frame(0x81, 0x05, value=bytes(4)), Status.Einval, "IncrementResponse"),
    ("barrier no key", _req(0x66), Status.Einval, "DcpBarrier cookie"),
    ("server request unknown", encode_frame(0x82, 0x02), Status.UnknownCommand, "magic 0x82"),
    (
        "map notification extras",
        encode_frame(0x82, 0x01, extras=bytes(8)),
        Status.Einval,
        "ClustermapChangeNotification extras",
    ),
]


@pytest.mark.parametrize(
    ("wire", "status", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_input(wire: bytes, status: Status, words: str) -> None:
    err = _frame_error(wire)
    assert err.status == status
    assert words in err.message


def test_value_over_configured_limit() -> None:
    wire = Mutation(key=b"k", value=bytes(1001)).encode()
    with pytest.raises(CodecError) as err:
        list(FrameParser(max_value_len=1000).feed(wire))
    assert err.value.status == Status.E2big and "value length 1001" in err.value.message


@pytest.mark.parametrize(
    ("msg", "words"),
    [
        (Mutation(key=b"", by_seqno=1), "key"),
        (Mutation(key=b"k", by_seqno=1 << 64), "Mutation"),
        (Mutation(key=b"k" * 251), "key of 251"),
        (Get(key=b""), "Get key"),
        (SnapshotMarker(start_seqno=-1), "SnapshotMarker extras"),
        (DcpOpen(name="n" * 201), "DcpOpen name"),
        (StreamRequestOk(), "failover_log"),
        (SetVbucket(state=1 << 32), "SetVbucket extras"),
        (Get(key=b"k", stream_id=1 << 16), "stream_id"),
        (Get(key=b"k", vbucket=1 << 16), "header field"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_encoder_refuses_what_the_decoder_would(msg: object, words: str) -> None:
    with pytest.raises(CodecError) as err:
        msg.encode()  # type: ignore[attr-defined]
    assert err.value.status == Status.Einval
    assert words in err.value.message


def test_wrong_type_for_frame() -> None:
    frame = next(FrameParser().feed(Get(key=b"k").encode()))
    with pytest.raises(CodecError, match="opcode Get is not DcpMutation"):
        Mutation.decode(frame)
