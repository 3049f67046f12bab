"""The producer stream's state machine: legal moves, illegal ones, accounting."""

from __future__ import annotations

import itertools

import pytest

from dcpkv.dcp.stream import TRANSITIONS, Stream, StreamEvent, StreamState, StreamStateError

S, E = StreamState, StreamEvent


def new_stream(start: int = 5, end: int = 10) -> Stream:
    return Stream(vbucket=3, opaque=7, flags=0, start=start, end=end, vb_uuid=1)


@pytest.mark.parametrize(
    ("events", "final"),
    [
        ([E.MEMORY], S.IN_MEMORY),
        ([E.BACKFILL, E.BACKFILL_DONE], S.IN_MEMORY),
        ([E.MEMORY, E.CURSOR_DROPPED, E.BACKFILL_DONE], S.IN_MEMORY),
        ([E.MEMORY, E.TAKEOVER, E.STATE_SENT, E.ACKED, E.STATE_SENT, E.ACKED], S.TAKEOVER_SEND),
        ([E.BACKFILL, E.END], S.DEAD),
        ([E.END], S.DEAD),
    ],
)
def test_legal_paths(events: list[StreamEvent], final: StreamState) -> None:
    stream = new_stream()
    for event in events:
        stream.handle(event)
    assert stream.state is final


def test_every_pair_outside_the_table_raises() -> None:
    for state, event in itertools.product(S, E):
        stream = new_stream()
        stream.state = state
        if (state, event) in TRANSITIONS:
            assert stream.handle(event) is TRANSITIONS[(state, event)]
        else:
            with pytest.raises(StreamStateError, match=event.value):
                stream.handle(event)
            assert stream.state is state  # an illegal move changes nothing


def test_dead_is_final_and_keeps_the_reason() -> None:
    stream = new_stream()
    stream.handle(E.MEMORY)
    stream.finish(2)
    assert not stream.alive and stream.end_reason == 2
    with pytest.raises(StreamStateError):
        stream.finish(1)


def test_first_marker_starts_at_the_requested_start_then_at_the_snapshot() -> None:
    stream = new_stream(start=5)
    assert stream.marker_start(8) == 5
    stream.note_snapshot(5, 9)
    assert stream.marker_start(10) == 10


def test_accounting_and_end() -> None:
    stream = new_stream(start=5, end=7)
    assert not stream.reached_end
    stream.note_snapshot(5, 7)
    stream.note_item(6, 100)
    stream.note_item(7, 50)
    assert (stream.items_sent, stream.bytes_sent, stream.last_sent_seqno) == (2, 150, 7)
    assert stream.reached_end
