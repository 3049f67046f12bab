"""The producer's ready queue (dcp/ready_queue.py), as a plain object: who is in line, in which
order, and the invariant that a key is in line at most once, exactly when it is a member."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpkv.dcp.ready_queue import TURN_MESSAGES, ReadyQueue


def queue() -> tuple[ReadyQueue, list[int]]:
    forgotten: list[int] = []
    return ReadyQueue(forgotten.append), forgotten


def visit(q: ReadyQueue, turn: int, *, idle: bool = False, finished: bool = False) -> int:
    key = q.line.popleft()
    return q.end_visit(key, idle, finished, turn)


def test_a_key_woken_twice_is_in_line_once() -> None:
    q, _ = queue()
    q.wake(3)
    q.wake(3)
    q.wake(5)
    assert list(q.line) == [3, 5] and q.members == {3, 5} and len(q) == 2


def test_notes_join_the_line_at_the_drain_only() -> None:
    q, _ = queue()
    q.wake(1)
    q.note(2)
    q.note_all((1, 3, 2))
    assert list(q.line) == [1] and q.has_work and len(q.notes) == 4
    q.drain()
    assert list(q.line) == [1, 2, 3] and not q.notes


def test_a_turn_is_turn_messages_visits_then_the_back_of_the_line() -> None:
    q, _ = queue()
    q.wake(1)
    q.wake(2)
    turn, order = 0, []
    for _ in range(2 * TURN_MESSAGES):
        order.append(q.line[0])
        turn = visit(q, turn)
    assert order == [1] * TURN_MESSAGES + [2] * TURN_MESSAGES
    assert list(q.line) == [1, 2] and turn == 0


@pytest.mark.parametrize(
    ("idle", "finished", "stays", "forgotten"),
    [
        (False, False, True, []),
        (True, False, False, []),  # nothing until its next notification
        (False, True, False, [7]),  # finished: out, and its owner forgets it
        (True, True, False, [7]),
    ],
)
def test_where_a_visited_stream_goes(
    idle: bool, finished: bool, stays: bool, forgotten: list[int]
) -> None:
    q, gone = queue()
    q.wake(7)
    turn = visit(q, 1, idle=idle, finished=finished)
    assert (7 in q.members, 7 in q.line, gone) == (stays, stays, forgotten)
    assert turn == (2 if stays else 0)


def test_a_dropped_key_can_be_woken_again() -> None:
    q, _ = queue()
    q.wake(4)
    q.drop(q.line.popleft())  # its stream was forgotten while it waited
    assert not q.has_work and len(q) == 0
    q.wake(4)
    assert list(q.line) == [4]


def test_clear_empties_everything() -> None:
    q, _ = queue()
    q.wake(1)
    q.note(2)
    q.clear()
    assert (list(q.line), q.members, list(q.notes), q.has_work) == ([], set(), [], False)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("wake"), st.integers(0, 5)),
        st.tuples(st.just("note"), st.integers(0, 5)),
        st.tuples(st.just("drain"), st.just(0)),
        st.tuples(st.just("visit"), st.sampled_from(["busy", "idle", "finished"])),
    ),
    max_size=60,
)


@given(OPS)
def test_a_key_is_in_line_at_most_once_exactly_when_a_member(ops: list[tuple[str, object]]) -> None:
    q, forgotten = queue()
    turn = 0
    for op, arg in ops:
        if op == "wake":
            q.wake(int(arg))  # type: ignore[call-overload]
        elif op == "note":
            q.note(int(arg))  # type: ignore[call-overload]
        elif op == "drain":
            q.drain()
        elif q.line:
            turn = visit(q, turn, idle=arg == "idle", finished=arg == "finished")
        assert len(q.line) == len(set(q.line)) and set(q.line) == q.members
        assert 0 <= turn < TURN_MESSAGES
    q.drain()
    assert set(q.line) == q.members and len(forgotten) <= len(ops)
