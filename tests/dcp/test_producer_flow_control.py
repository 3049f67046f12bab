"""Producer-side flow control (dcp/flow_control.py): the window, and how a run of messages is
cut so it goes out exactly as its messages would one at a time."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.dcp.active_stream import Pending
from dcpkv.dcp.flow_control import UNLIMITED, FlowWindow, split_run
from dcpkv.protocol import dcp


def test_the_window_counts_what_is_sent_and_releases_what_is_acked() -> None:
    w = FlowWindow()
    assert (w.limit, w.is_open) == (UNLIMITED, True)  # size 0: no flow control
    w.size = 100
    w.sent(60)
    w.sent(50)
    assert (w.unacked, w.is_open) == (110, False)  # one message may overflow the window
    w.ack(30)
    assert (w.unacked, w.is_open) == (80, True)
    w.ack(1000)
    assert w.unacked == 0  # never below zero


def run_of(seqnos: list[int], value_len: int = 10) -> tuple[Pending, list[bytes]]:
    frames = [dcp.Mutation(key=b"k%d" % s, value=b"v" * value_len, by_seqno=s).encode()
              for s in seqnos]  # fmt: skip
    return (b"".join(frames), seqnos[0], seqnos[-1], len(frames)), frames


def test_a_run_that_fits_goes_whole() -> None:
    run, _ = run_of([5, 6, 7])
    rest: deque[Pending] = deque()
    assert split_run(run, rest, 1 << 20, 1 << 20, False) == (run[0], 7, 7, 3) and not rest


@pytest.mark.parametrize(
    ("budget", "room", "one", "taken"),
    [
        (1, 1 << 20, False, 1),  # at least one message, even past the budget
        (1 << 20, 1, False, 1),  # ... and past the window
        (1 << 20, 1 << 20, True, 1),  # a barrier waits: one message at a time
        ("2 frames", 1 << 20, False, 2),  # a message goes while budget remains before it
        ("2 frames + 1", 1 << 20, False, 3),
        (1 << 20, "2 frames", False, 2),
        (1 << 20, "2 frames + 1", False, 3),
    ],
)
def test_where_a_run_is_cut(budget: object, room: object, one: bool, taken: int) -> None:
    run, frames = run_of([10, 11, 12, 13, 14])
    sizes = {"2 frames": len(frames[0]) + len(frames[1])}
    sizes["2 frames + 1"] = sizes["2 frames"] + 1
    b, r = sizes.get(str(budget), budget), sizes.get(str(room), room)
    rest: deque[Pending] = deque()
    head = split_run(run, rest, b, r, one)  # type: ignore[arg-type]
    assert head == (b"".join(frames[:taken]), 9 + taken, 9 + taken, taken)
    assert list(rest) == [(b"".join(frames[taken:]), 10, 14, 5 - taken)]


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=12),
    st.integers(1, 600),
    st.integers(1, 600),
    st.booleans(),
)
def test_cutting_again_and_again_sends_the_run_as_single_messages_would(
    value_lens: list[int], budget: int, room: int, one: bool
) -> None:
    frames = [dcp.Mutation(key=b"key", value=b"v" * n, by_seqno=i + 1).encode()
              for i, n in enumerate(value_lens)]  # fmt: skip
    rest: deque[Pending] = deque([(b"".join(frames), 1, len(frames), len(frames))])
    sent: list[bytes] = []
    while rest:
        run = rest.popleft()
        data, seqno, covers, count = split_run(run, rest, budget, room, one)
        # one at a time: the first always, then each while budget and room remain before it
        expect, used = 0, 0
        for f in frames[len(sent) : len(sent) + run[3]]:
            if expect and (used >= budget or used >= room or one):
                break
            expect, used = expect + 1, used + len(f)
        # a cut run covers up to its last message; the run's last part, what the run covered
        assert count == expect and covers == (seqno if rest else len(frames))
        sent.extend(frames[len(sent) : len(sent) + count])
        assert data == b"".join(sent[-count:]) and seqno == len(sent)
    assert sent == frames
