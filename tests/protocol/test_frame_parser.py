"""FrameParser: chunking, flex framing, limits, and a fuzz test of hostile input."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.core.status import Status
from dcpkv.protocol import CodecError, Frame, FrameParser, decode_message, encode_frame
from dcpkv.protocol.dcp import Mutation
from dcpkv.protocol.frame import body_length, encode_framing_item
from support.protocol_samples import EXAMPLES

STREAM = b"".join(m.encode() for m in EXAMPLES)


def _parse_all(parser: FrameParser, chunks: list[bytes]) -> list[Frame]:
    frames: list[Frame] = []
    for chunk in chunks:
        frames.extend(parser.feed(chunk))
    return frames


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def test_one_byte_at_a_time() -> None:
    parser = FrameParser()
    frames = _parse_all(parser, [STREAM[i : i + 1] for i in range(len(STREAM))])
    assert [decode_message(f) for f in frames] == EXAMPLES
    assert parser.buffered == 0


def test_everything_at_once() -> None:
    frames = list(FrameParser().feed(STREAM))
    assert [decode_message(f) for f in frames] == EXAMPLES


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=40))
def test_any_chunking_gives_the_same_frames(cuts: list[int]) -> None:
    frames = _parse_all(FrameParser(), _split(STREAM, cuts))
    assert [decode_message(f) for f in frames] == EXAMPLES


def test_mutable_input_is_copied() -> None:
    wire = bytearray(Mutation(key=b"k", value=b"abc").encode())
    frame = next(FrameParser().feed(wire))
    wire[-3:] = b"xyz"  # the caller reuses its receive buffer
    assert bytes(frame.value) == b"abc"


def test_unconsumed_frames_come_with_the_next_feed() -> None:
    parser = FrameParser()
    parser.feed(STREAM)  # iterator dropped without reading
    assert parser.buffered == len(STREAM)
    assert len(list(parser.feed(b""))) == len(EXAMPLES)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=6), st.integers(0, 5))
def test_what_is_taken_back_is_every_byte_not_yet_a_frame(cuts: list[int], read: int) -> None:
    """take_buffered: the bytes fed and not returned as frames, however they were chunked
    (a partial frame too); the parser is empty after, and parses them again as it would have."""
    parser = FrameParser()
    chunks = _split(STREAM, cuts)
    for chunk in chunks:
        parser.feed(chunk)  # (fed, nothing parsed yet)
    frames = parser.feed(b"")
    taken_frames = [bytes(f.key) for f in itertools.islice(frames, read)]
    rest = parser.take_buffered()
    assert parser.buffered == 0
    again = [bytes(f.key) for f in FrameParser().feed(rest)]
    assert taken_frames + again == [bytes(f.key) for f in FrameParser().feed(STREAM)]


def test_stream_id_uses_flex_magic() -> None:
    wire = Mutation(key=b"k", stream_id=0x1234).encode()
    assert wire[0] == 0x08 and wire[2] == 3 and wire[3] == 1  # framing 3 bytes, key 1 byte
    assert wire[24:27] == b"\x22\x12\x34"
    assert next(FrameParser().feed(wire)).stream_id == 0x1234


def test_escaped_framing_items_are_skipped() -> None:
    items = encode_framing_item(20, b"x" * 16) + encode_framing_item(2, b"\x00\x07")
    assert items[0] == 0xFF and items[1:3] == bytes([5, 1])
    wire = encode_frame(0x80, 0x57, key=b"k", extras=bytes(31), framing_extras=items)
    frame = next(FrameParser().feed(wire))
    assert frame.stream_id == 7
    assert bytes(frame.framing_extras) == items


def test_response_server_duration() -> None:
    wire = encode_frame(0x81, 0x00, framing_extras=b"\x02\x01\x02", status=1)
    frame = next(FrameParser().feed(wire))
    assert (frame.magic, frame.server_duration, frame.status) == (0x18, 0x0102, 1)


def test_oversize_value_is_refused_from_the_header_alone() -> None:
    parser = FrameParser(max_value_len=100)
    header = struct.pack(">BBHBBHIIQ", 0x80, 0x57, 1, 31, 0, 0, 31 + 1 + 101, 0, 0)
    with pytest.raises(CodecError) as err:
        list(parser.feed(header))  # no body sent: rejected before buffering it
    assert err.value.status == Status.E2big and "value length 101" in err.value.message
    with pytest.raises(CodecError):
        parser.feed(b"")  # the stream cannot be resynchronised


def test_default_limit_is_20_mib() -> None:
    at_limit = encode_frame(0x80, 0x01, key=b"k", extras=bytes(8), value=bytes(20 << 20))
    assert len(list(FrameParser().feed(at_limit))) == 1
    header = struct.pack(">BBHBBHIIQ", 0x80, 0x01, 0, 0, 0, 0, (20 << 20) + 1, 0, 0)
    with pytest.raises(CodecError, match="value length"):
        list(FrameParser().feed(header))


def _fuzz_inputs() -> st.SearchStrategy[bytes]:
    def mutate(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
        buf = bytearray(data)
        for pos, byte in edits:
            buf[pos % len(buf)] = byte
        return bytes(buf[: cut % (len(buf) + 1)]) if cut % 3 == 0 else bytes(buf)

    valid = st.sampled_from(EXAMPLES).map(lambda m: m.encode())
    several = st.lists(valid, min_size=1, max_size=4).map(b"".join)
    mutated = st.builds(
        mutate,
        several,
        st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255))),
        st.integers(0, 1 << 16),
    )
    return st.one_of(st.binary(max_size=200), mutated)


@settings(max_examples=400, deadline=None)
@given(data=_fuzz_inputs(), cuts=st.lists(st.integers(0, 1 << 16), max_size=8))
def test_fuzz_only_codec_errors(data: bytes, cuts: list[int]) -> None:
    parser = FrameParser(max_value_len=1 << 16)
    frames: list[Frame] = []
    try:
        for chunk in _split(data, cuts):
            frames.extend(parser.feed(chunk))
    except CodecError as exc:
        assert isinstance(exc.status, Status) and exc.message
    assert sum(f.size for f in frames) + parser.buffered <= len(data)
    for frame in frames:
        assert frame.size <= len(data)
        try:
            decode_message(frame)
        except CodecError as exc:
            assert exc.status in (Status.Einval, Status.E2big, Status.UnknownCommand)


def test_the_fast_paths_set_every_field() -> None:
    """The parser's and Mutation.decode's constructors bypass __init__: they must still set
    every field of the dataclass (a new field would otherwise be missing)."""
    import dataclasses

    data = Mutation(key=b"k", value=b"v", by_seqno=5, opaque=3, vbucket=2).encode()
    (frame,) = FrameParser().feed(data)
    assert all(hasattr(frame, f.name) for f in dataclasses.fields(Frame))
    msg = Mutation.decode(frame)
    assert all(hasattr(msg, f.name) for f in dataclasses.fields(Mutation))
    assert msg == Mutation(key=b"k", value=b"v", by_seqno=5, opaque=3, vbucket=2)


def _parts(f: Frame) -> tuple[int, bytes, bytes, bytes]:
    return f.opcode, bytes(f.extras), bytes(f.key), bytes(f.value)


def test_interleaved_next_frame_and_feed_keep_the_order() -> None:
    """An iterator suspended in the middle of a chunk while the parser moves on (next_frame,
    a feed) resumes from where the parser is, not from where it was."""
    parser = FrameParser()
    frames = iter(parser.feed(STREAM[: len(STREAM) // 2]))
    got = [_parts(next(frames))]
    nxt = parser.next_frame()
    assert nxt is not None
    got.append(_parts(nxt))
    parser.feed(STREAM[len(STREAM) // 2 :])
    got += [_parts(f) for f in frames]
    assert got == [_parts(f) for f in FrameParser().feed(STREAM)]


@pytest.mark.parametrize("magic", [0x80, 0x81, 0x08, 0x18])
def test_body_length_reads_either_header_form(magic: int) -> None:
    framing = encode_framing_item(2, b"\x00\x07") if magic in (0x08, 0x18) else b""
    wire = encode_frame(magic, 1, extras=b"e" * 8, key=b"key", value=b"v" * 300,
                        framing_extras=framing)  # fmt: skip
    assert body_length(b"pad" + wire, 3) == len(wire) - 24 == body_length(wire)
