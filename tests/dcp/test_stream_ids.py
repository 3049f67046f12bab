"""Stream IDs on a producer connection: the enable_stream_id control, several streams of one
vbucket, every message tagged with its stream's id, CloseStream by id, stats per id."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcpkv.core.seqno import U64_MAX
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.dcp.producer import DcpProducer, ProducerError
from dcpkv.engine.bucket import Bucket
from dcpkv.engine.hlc import ManualClock
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import Magic, OpenFlag
from dcpkv.protocol.frame import FrameParser, tag_stream_id
from dcpkv.protocol.messages import decode_message


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def bucket(tmp_path: Path, clock: ManualClock) -> Iterator[Bucket]:
    b = Bucket("default", tmp_path, num_vbuckets=2, clock=clock, synchronous="NORMAL")
    b.set_vbucket_state(0, VBucketState.ACTIVE)
    vb = b.get_vbucket(0)
    for i in range(10):
        vb.set(b"k%d" % i, b"v%d" % i)
    yield b
    b.storage.close()


def request(p: DcpProducer, sid: int | None, *, end: int = U64_MAX, opaque: int = 1) -> Message:
    msg = dcp.StreamRequest(opaque=opaque, vbucket=0, start_seqno=0, end_seqno=end,
                            stream_id=sid)  # fmt: skip
    (answer,) = [decode_message(f) for f in FrameParser().feed(p.stream_request(msg))]
    return answer


def drain(p: DcpProducer) -> list[tuple[int | None, Message, int]]:
    """(stream id, message, magic) of everything the producer sends now."""
    parser, out = FrameParser(), []
    while chunks := p.next_messages():
        for frame in parser.feed(b"".join(chunks)):
            out.append((frame.stream_id, decode_message(frame), frame.magic))
    return out


def test_two_streams_of_one_vbucket_tagged_with_their_ids(
    bucket: Bucket, clock: ManualClock
) -> None:
    p = DcpProducer(bucket, "sids", OpenFlag.Producer, clock=clock)
    p.control("enable_stream_id", "true")
    refused = request(p, None)
    assert isinstance(refused, GenericResponse) and refused.status == Status.DcpStreamIdInvalid
    assert isinstance(request(p, 7, end=4, opaque=70), dcp.StreamRequestOk)
    assert isinstance(request(p, 9, opaque=90), dcp.StreamRequestOk)
    again = request(p, 9)
    assert isinstance(again, GenericResponse) and again.status == Status.KeyEexists
    by_sid: dict[int | None, list[Message]] = defaultdict(list)
    for sid, msg, magic in drain(p):
        assert magic == Magic.AltClientRequest and sid in (7, 9)
        by_sid[sid].append(msg)
    seven = [m.by_seqno for m in by_sid[7] if isinstance(m, dcp.Mutation)]
    nine = [m.by_seqno for m in by_sid[9] if isinstance(m, dcp.Mutation)]
    assert seven == [1, 2, 3, 4] and nine == list(range(1, 11))
    assert isinstance(by_sid[7][-1], dcp.StreamEnd)
    assert all(m.opaque == 90 for m in by_sid[9])
    # a new write reaches the open stream only
    bucket.get_vbucket(0).set(b"new", b"x")
    assert [(sid, type(m)) for sid, m, _ in drain(p)][-1] == (9, dcp.Mutation)
    stats = p.stats()
    assert stats["items_sent:0:sid9:sids"] == "11"  # sid 7 ended: gone from the stats
    assert stats["num_streams:sids"] == "1" and "items_sent:0:sid7:sids" not in stats
    # CloseStream needs the id too, and closes that stream only
    assert _status(p.close_stream(0, 5)) == Status.DcpStreamIdInvalid
    assert _status(p.close_stream(0, 5, 9)) == Status.Success
    assert _status(p.close_stream(0, 5, 9)) == Status.KeyEnoent


def test_stream_ids_only_when_enabled_and_before_any_stream(
    bucket: Bucket, clock: ManualClock
) -> None:
    p = DcpProducer(bucket, "plain", OpenFlag.Producer, clock=clock)
    refused = request(p, 3)
    assert isinstance(refused, GenericResponse) and refused.status == Status.DcpStreamIdInvalid
    assert isinstance(request(p, None), dcp.StreamRequestOk)
    with pytest.raises(ProducerError):
        p.control("enable_stream_id", "true")
    assert all(magic == Magic.ClientRequest and sid is None for sid, _, magic in drain(p))


def test_tagging_keeps_the_message() -> None:
    raw = dcp.Mutation(opaque=5, vbucket=3, key=b"key", value=b"value", by_seqno=9).encode()
    (frame,) = list(FrameParser().feed(tag_stream_id(raw, 0x1234)))
    msg = decode_message(frame)
    assert frame.stream_id == 0x1234 and isinstance(msg, dcp.Mutation)
    assert (bytes(msg.key), bytes(msg.value), msg.by_seqno, msg.vbucket) == (b"key", b"value", 9, 3)


def _status(answer: bytes) -> int:
    (frame,) = list(FrameParser().feed(answer))
    return frame.status
