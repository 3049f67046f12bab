"""The byte-by-byte snapshot marker examples of ``004_20d1633ae76612fc.txt``."""

from __future__ import annotations

from dcpkv.protocol import FrameParser, decode_message
from dcpkv.protocol.dcp import SnapshotMarker, SnapshotMarkerV2_0, SnapshotMarkerV2_2

# The V1 diagram, word by word (the spec labels type 1 "disk", but 0x01 is Memory in its own
# flag table; the bytes are what matter).
V1_BYTES = bytes.fromhex(
    "80560000" "14000000" "00000014" "deadbeef" "00000000" "00000000"
    "00000000" "00000000" "00000000" "00000008" "00000001"
)  # fmt: skip

# V2.0 is built from the example's *field table*: extras length 0x01, total body 0x25,
# version 0x00, start 1, end 8, type 2, max visible 8, high completed 7. The ASCII diagram
# above it in the spec is inconsistent (it shows extras length 0x14, a body length of 0 and
# little-endian, misaligned seqnos), so it is not used.
V2_0_BYTES = (
    bytes.fromhex("80560000" "01000000" "00000025" "deadbeef" "0000000000000000")
    + b"\x00"
    + (1).to_bytes(8, "big")
    + (8).to_bytes(8, "big")
    + (2).to_bytes(4, "big")
    + (8).to_bytes(8, "big")
    + (7).to_bytes(8, "big")
)  # fmt: skip


def test_v1_example_encodes_to_the_spec_bytes() -> None:
    marker = SnapshotMarker(opaque=0xDEADBEEF, start_seqno=0, end_seqno=8, flags=1)
    assert len(V1_BYTES) == 44
    assert marker.encode() == V1_BYTES


def test_v1_example_decodes() -> None:
    frame = next(FrameParser().feed(V1_BYTES))
    assert (frame.magic, frame.opcode, len(frame.extras), frame.opaque) == (
        0x80,
        0x56,
        0x14,
        0xDEADBEEF,
    )
    marker = decode_message(frame)
    assert marker == SnapshotMarker(opaque=0xDEADBEEF, start_seqno=0, end_seqno=8, flags=1)


def test_v2_0_example_field_table() -> None:
    marker = SnapshotMarkerV2_0(
        opaque=0xDEADBEEF,
        start_seqno=1,
        end_seqno=8,
        flags=2,
        max_visible_seqno=8,
        high_completed_seqno=7,
    )
    wire = marker.encode()
    assert wire == V2_0_BYTES
    assert len(wire) == 24 + 0x25
    assert wire[4] == 0x01 and wire[24] == 0x00
    decoded = decode_message(next(FrameParser().feed(V2_0_BYTES)))
    assert type(decoded) is SnapshotMarkerV2_0
    assert decoded == marker
    assert isinstance(decoded, SnapshotMarker)


def test_v2_2_layout_follows_protocol_md() -> None:
    marker = SnapshotMarkerV2_2(
        start_seqno=1,
        end_seqno=8,
        flags=2,
        max_visible_seqno=8,
        high_completed_seqno=7,
        purge_seqno=5,
        high_prepared_seqno=6,
    )
    wire = marker.encode()
    assert wire[4] == 1 and wire[24] == 0x02
    assert len(wire) - 25 == 52
    # purge seqno right after high completed, then high prepared
    assert wire[25 + 36 : 25 + 44] == (5).to_bytes(8, "big")
    assert wire[25 + 44 :] == (6).to_bytes(8, "big")
