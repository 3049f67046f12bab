"""Consumer-side flow control: what counts, when to ack; noop liveness."""

from __future__ import annotations

import pytest

from dcpkv.client.flow_control import FlowControl, Liveness, ack_threshold
from dcpkv.protocol import dcp
from dcpkv.protocol.base import GenericResponse
from dcpkv.protocol.constants import Opcode
from dcpkv.protocol.frame import Frame, FrameParser


def frame(msg: object) -> Frame:
    (f,) = FrameParser().feed(msg.encode())  # type: ignore[attr-defined]
    return f


@pytest.mark.parametrize(
    ("size", "threshold"), [(1000, 200), (100_000, 20_000), (10 * 1024 * 1024, 50 * 1024)]
)
def test_threshold_is_20_percent_or_50_kb(size: int, threshold: int) -> None:
    assert ack_threshold(size) == threshold


def test_counts_every_dcp_message_but_noop_header_included() -> None:
    fc = FlowControl(1000)
    mutation = frame(dcp.Mutation(vbucket=1, key=b"k", value=b"v" * 10, by_seqno=1))
    assert fc.received(mutation) and fc.unacked == 24 + 31 + 1 + 10
    assert fc.received(frame(dcp.SnapshotMarker(vbucket=1, start_seqno=1, end_seqno=2)))
    assert fc.received(frame(dcp.StreamEnd(vbucket=1)))
    before = fc.unacked
    assert not fc.received(frame(dcp.DcpNoop(opaque=1)))
    ok = frame(GenericResponse(opcode=Opcode.DcpControl))
    assert not fc.received(ok)  # answers to our own requests are not stream data
    assert fc.unacked == before


def test_ack_due_after_threshold_and_resets() -> None:
    fc = FlowControl(1000)  # threshold 200
    m = frame(dcp.Mutation(vbucket=1, key=b"k", value=b"v" * 40, by_seqno=1))  # 96 bytes
    fc.received(m)
    fc.received(m)
    assert not fc.ack_due and fc.take_ack() is None
    fc.received(m)
    ack = fc.take_ack(opaque=5)
    assert ack is not None and (ack.bytes_acked, ack.opaque) == (288, 5)
    assert fc.unacked == 0 and fc.total_acked == 288


def test_disabled_when_buffer_size_is_zero() -> None:
    fc = FlowControl(0)
    assert not fc.received(frame(dcp.StreamEnd(vbucket=1)))
    assert fc.take_ack() is None


def test_dead_after_two_silent_noop_intervals() -> None:
    live = Liveness(10.0, now=100.0)
    assert not live.is_dead(119.9)
    live.heard(115.0)
    assert not live.is_dead(134.9)
    assert live.is_dead(135.0)
    with pytest.raises(ValueError):
        Liveness(0, now=0)


class _Wire:
    """What DcpLinks.ack needs of a connection: the messages it would send."""

    error = None

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []  # (message index, bytes acked)
        self.at = 0

    def send(self, msg: dcp.BufferAck) -> None:
        self.sent.append((self.at, msg.bytes_acked))


def _acks_sent(sizes: list[int], buffer_size: int, batched: bool) -> list[tuple[int, int]]:
    from dcpkv.client.dcp_links import DcpLinks, PendingAcks
    from dcpkv.client.settings import Node

    node = Node("127.0.0.1", 1)
    links = DcpLinks(None, buffer_size)  # type: ignore[arg-type]
    wire = _Wire()
    links.conns[node] = wire  # type: ignore[assignment]
    links.flows[node] = FlowControl(buffer_size)
    pending = PendingAcks(links)
    for i, size in enumerate(sizes):
        wire.at = i
        if batched:
            pending.add(node, size)
        else:
            links.ack(node, size)
    pending.flush()
    return wire.sent


@pytest.mark.parametrize("buffer_size", [0, 500, 1000, 100_000])
@pytest.mark.parametrize("sizes", [[66] * 100, [24, 300, 1000, 24, 24, 5000, 31] * 5, [1]])
def test_batched_acks_go_out_at_the_same_messages(sizes: list[int], buffer_size: int) -> None:
    """The consumer tells the links once per threshold instead of once per message: the
    BufferAcks must be the very same, sent after the very same messages."""
    per_message = _acks_sent(sizes, buffer_size, batched=False)
    assert _acks_sent(sizes, buffer_size, batched=True) == per_message
    assert (len(per_message) > 0) == (buffer_size > 0 and sum(sizes) >= ack_threshold(buffer_size))
