"""The write queue: dedup, snapshots, cursors, the memory window, slow cursors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.engine.checkpoint import CheckpointManager, Cursor, CursorDropped, Snapshot
from dcpkv.engine.item import Item


def _item(seqno: int, key: bytes, value: bytes = b"v") -> Item:
    return Item(key, value, by_seqno=seqno, cas=seqno, rev_seqno=1)


def _queue(mgr: CheckpointManager, *pairs: tuple[int, bytes]) -> None:
    for seqno, key in pairs:
        mgr.queue(_item(seqno, key))


def _view(snap: Snapshot | None) -> tuple[int, int, list[tuple[int, bytes]], bool] | None:
    if snap is None:
        return None
    return snap.start, snap.end, [(i.by_seqno, i.key) for i in snap.items], snap.checkpoint


def _cursor(mgr: CheckpointManager, name: str, seqno: int) -> Cursor:
    cursor = mgr.register_cursor(name, seqno)
    assert cursor is not None
    return cursor


def test_dedup_visible_in_snapshot() -> None:
    mgr = CheckpointManager()
    cursor = _cursor(mgr, "dcp", 0)
    _queue(mgr, (1, b"A"), (2, b"B"), (3, b"A"))
    assert _view(cursor.next_snapshot()) == (0, 3, [(2, b"B"), (3, b"A")], True)
    assert cursor.next_snapshot() is None
    assert mgr.num_items() == 2  # the older A is gone from memory too


def test_no_dedup_past_a_cursor() -> None:
    mgr = CheckpointManager()
    fast = _cursor(mgr, "fast", 0)
    slow = _cursor(mgr, "slow", 0)
    _queue(mgr, (1, b"A"), (2, b"B"))
    assert _view(fast.next_snapshot()) == (0, 2, [(1, b"A"), (2, b"B")], True)
    _queue(mgr, (3, b"A"), (4, b"C"))
    # fast read 1:A already, so it stays; fast sees the new A in a mid-checkpoint snapshot
    assert _view(fast.next_snapshot()) == (3, 4, [(3, b"A"), (4, b"C")], False)
    # slow still gets one consistent, deduplicated snapshot
    assert _view(slow.next_snapshot()) == (0, 4, [(2, b"B"), (3, b"A"), (4, b"C")], True)


def test_two_cursors_consistent_while_writes_go_on() -> None:
    mgr = CheckpointManager(max_items=3)
    a, b = _cursor(mgr, "a", 0), _cursor(mgr, "b", 0)
    state_a: dict[bytes, int] = {}
    state_b: dict[bytes, int] = {}
    truth: dict[bytes, int] = {}
    seqno = 0
    for round_ in range(30):
        for _ in range(round_ % 4 + 1):
            seqno += 1
            key = b"k%d" % (seqno % 5)
            mgr.queue(_item(seqno, key))
            truth[key] = seqno
        for cursor, state in ((a, state_a), (b, state_b)):
            if cursor is b and round_ % 3:
                continue  # b reads less often
            while snap := cursor.next_snapshot(max_items=2):
                seqnos = [i.by_seqno for i in snap.items]
                assert seqnos == sorted(seqnos)
                assert len({i.key for i in snap.items}) == len(snap.items)
                assert snap.start <= seqnos[0] and seqnos[-1] <= snap.end
                state.update({i.key: i.by_seqno for i in snap.items})
                # consistent at the snapshot end: every key as the truth had it then
                expect = {k: s for k, s in _history(seqno, snap.end).items()}
                assert state == expect
    assert state_a == truth


def _history(high: int, at: int) -> dict[bytes, int]:
    state: dict[bytes, int] = {}
    for s in range(1, min(high, at) + 1):
        state[b"k%d" % (s % 5)] = s
    return state


def test_cursor_below_memory_window_needs_backfill() -> None:
    mgr = CheckpointManager(max_items=2)
    _queue(mgr, (1, b"a"), (2, b"b"), (3, b"c"), (4, b"d"), (5, b"e"))
    while mgr.persistence_cursor.next_snapshot():
        pass
    # checkpoints 1..2 and 3..4 were read by the only cursor, hence freed
    assert mgr.lowest_seqno_in_memory == 5
    assert mgr.register_cursor("dcp", 3) is None
    cursor = _cursor(mgr, "dcp", 4)
    assert _view(cursor.next_snapshot()) == (4, 5, [(5, b"e")], True)


def test_warm_started_manager_window() -> None:
    mgr = CheckpointManager(high_seqno=100)
    assert mgr.register_cursor("dcp", 99) is None
    cursor = _cursor(mgr, "dcp", 100)
    assert cursor.next_snapshot() is None
    mgr.queue(_item(101, b"x"))
    assert _view(cursor.next_snapshot()) == (100, 101, [(101, b"x")], True)


def test_checkpoint_flag_and_start_on_later_checkpoints() -> None:
    mgr = CheckpointManager(max_items=2)
    cursor = _cursor(mgr, "dcp", 0)
    _queue(mgr, (1, b"a"), (2, b"b"))
    assert _view(cursor.next_snapshot(max_items=1)) == (0, 2, [(1, b"a"), (2, b"b")], True)
    _queue(mgr, (3, b"c"), (4, b"d"), (5, b"e"))
    assert _view(cursor.next_snapshot(max_items=1)) == (3, 4, [(3, b"c"), (4, b"d")], True)
    assert _view(cursor.next_snapshot(max_items=1)) == (5, 5, [(5, b"e")], True)


def test_soft_max_items_merges_closed_checkpoints() -> None:
    mgr = CheckpointManager(max_items=2)
    cursor = _cursor(mgr, "dcp", 0)
    _queue(mgr, (1, b"a"), (2, b"b"), (3, b"a"), (4, b"c"), (5, b"d"))
    # 3:a is in the next checkpoint, so 1:a is kept in memory but deduplicated on read
    assert _view(cursor.next_snapshot(max_items=100)) == (
        0, 5, [(2, b"b"), (3, b"a"), (4, b"c"), (5, b"d")], True,
    )  # fmt: skip


def test_drop_slow_cursors_never_drops_the_flusher() -> None:
    mgr = CheckpointManager(max_items=2)
    slow = _cursor(mgr, "slow", 0)
    _queue(mgr, *[(s, b"k%d" % s) for s in range(1, 8)])
    while mgr.persistence_cursor.next_snapshot():
        pass
    before = mgr.memory_used
    assert mgr.drop_slow_cursors(0) == ["slow"]
    assert mgr.memory_used < before
    with pytest.raises(CursorDropped):
        slow.next_snapshot()
    assert "persistence" in mgr.cursors
    # with the flusher behind, nothing more can go
    _queue(mgr, *[(s, b"k%d" % s) for s in range(8, 12)])
    assert mgr.drop_slow_cursors(0) == []
    assert mgr.persistence_cursor.remaining() >= 4


def test_replica_snapshot_marker_ranges() -> None:
    mgr = CheckpointManager()
    flusher = mgr.persistence_cursor
    mgr.snapshot_marker(1, 10)
    _queue(mgr, (1, b"a"), (4, b"b"))
    snap = flusher.next_snapshot()
    assert snap is not None and (snap.start, snap.end, snap.high_seqno) == (0, 10, 4)
    _queue(mgr, (10, b"c"))
    mgr.snapshot_marker(11, 12)
    _queue(mgr, (12, b"d"))
    views = [_view(flusher.next_snapshot(1)), _view(flusher.next_snapshot(1))]
    assert views == [(10, 10, [(10, b"c")], False), (11, 12, [(12, b"d")], True)]
    mgr.snapshot_marker(13, 20)
    _queue(mgr, (14, b"e"))
    assert _view(flusher.next_snapshot()) == (13, 20, [(14, b"e")], True)
    _queue(mgr, (15, b"f"))
    assert _view(flusher.next_snapshot()) == (13, 20, [(15, b"f")], False)


def test_items_must_come_in_seqno_order() -> None:
    mgr = CheckpointManager()
    mgr.queue(_item(5, b"a"))
    with pytest.raises(ValueError):
        mgr.queue(_item(5, b"b"))


# A run of the write queue: ("w", key) queues the key's next version, ("r", n) has cursor n
# read everything queued (a cursor reads from where it last stopped; the flusher's is 0).
_STEP = st.one_of(
    st.tuples(st.just("w"), st.sampled_from([b"a", b"b", b"c", b"d"])),
    st.tuples(st.just("r"), st.integers(0, 2)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_STEP, max_size=60), st.sampled_from([3, 1000]))
def test_every_read_is_the_latest_version_of_each_key_in_seqno_order(
    steps: list[tuple[str, object]], max_items: int
) -> None:
    """Whatever the interleaving of writes and reads by several cursors (the flusher's among
    them), a read returns exactly the model's answer: of the versions queued since that
    cursor's last read, the latest of each key, in seqno order. (Reads skip the dedup when
    they can: this holds them to the same answer.)"""
    mgr = CheckpointManager(max_items=max_items)
    cursors = [mgr.persistence_cursor, _cursor(mgr, "dcp1", 0), _cursor(mgr, "dcp2", 0)]
    queued: list[Item] = []
    last_read = [0, 0, 0]
    for kind, arg in steps:
        if kind == "w":
            queued.append(_item(len(queued) + 1, arg))  # type: ignore[arg-type]
            mgr.queue(queued[-1])
            continue
        n = int(arg)  # type: ignore[call-overload]
        latest = {i.key: i for i in queued[last_read[n] :]}
        expected = sorted(latest.values(), key=lambda i: i.by_seqno)
        got: list[Item] = []
        while snap := cursors[n].next_snapshot(1 << 30):
            got += snap.items
        assert [(i.by_seqno, i.key) for i in got] == [(i.by_seqno, i.key) for i in expected]
        last_read[n] = len(queued)
