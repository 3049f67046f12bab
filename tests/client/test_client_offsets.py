"""Offsets: what moves them, what does not, and how they survive on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpkv.client.offsets import (
    OffsetError,
    Offsets,
    OffsetsFileError,
    VbucketOffset,
    VbucketProgress,
    temp_path,
)
from dcpkv.core.failover_table import FailoverEntry, FailoverTable
from dcpkv.core.rollback import needs_rollback
from dcpkv.core.seqno import U64_MAX

U = 0x1111


def progress_at(seqno: int) -> VbucketProgress:
    p = VbucketProgress()
    p.accepted([FailoverEntry(U, 0)])
    if seqno:
        p.marker(1, seqno)
        p.deliver(seqno)
    return p


# (steps, expected offset as (seqno, snap_start, snap_end), pending marker)
CASES = [
    ("marker without data does not move", [("m", 1, 4)], (0, 0, 0), (1, 4)),
    ("first item adopts the marker", [("m", 1, 4), ("d", 2)], (2, 1, 4), None),
    ("mid-snapshot", [("m", 1, 4), ("d", 2), ("d", 3)], (3, 1, 4), None),
    ("whole snapshot collapses", [("m", 1, 4), ("d", 2), ("d", 4)], (4, 4, 4), None),
    ("seqno advanced to the end collapses", [("m", 1, 4), ("a", 4)], (4, 4, 4), None),
    (
        "next marker proves the previous snapshot complete",
        [("m", 1, 4), ("d", 2), ("m", 5, 6)],
        (4, 4, 4),
        (5, 6),
    ),
    ("two markers in a row", [("m", 1, 4), ("m", 5, 6)], (4, 4, 4), (5, 6)),
    ("disconnect forgets a pending marker", [("m", 1, 4), ("x",)], (0, 0, 0), None),
    (
        "disconnect mid-snapshot keeps the snapshot",
        [("m", 1, 4), ("d", 3), ("x",)],
        (3, 1, 4),
        None,
    ),
]


@pytest.mark.parametrize(
    ("steps", "expected", "pending"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_offset_moves(steps: list[tuple], expected: tuple, pending: tuple | None) -> None:
    p = progress_at(0)
    for step in steps:
        match step:
            case ("m", start, end):
                p.marker(start, end)
            case ("d", seqno) | ("a", seqno):
                p.deliver(seqno)
            case ("x",):
                p.discard_pending()
    o = p.offset
    assert (o.seqno, o.snap_start, o.snap_end) == expected
    assert p.pending == pending
    assert o.vb_uuid == U


def test_spec_001_mid_snapshot_resume_sends_the_snapshot() -> None:
    """``1111 1 4 3``: the producer then finds the branch at 3 and rolls back to 1."""
    p = progress_at(0)
    p.marker(1, 4)
    p.deliver(2)
    p.deliver(3)
    start, uuid, snap_start, snap_end = p.offset.stream_request_fields()
    assert (uuid, snap_start, snap_end, start) == (0x1111, 1, 4, 3)
    table = FailoverTable([FailoverEntry(0x2222, 3), FailoverEntry(0x1111, 0)])
    rb = needs_rollback(
        start=start, vb_uuid=uuid, snap_start=snap_start, snap_end=snap_end,
        purge_seqno=0, failover_table=table, high_seqno=10,
    )  # fmt: skip
    assert rb is not None and rb.seqno == 1
    # ... and the consumer goes to its last consistent point below 1: zero.
    assert p.roll_back(rb.seqno) == VbucketOffset(0x1111, 0, 0, 0)


def test_rollback_lands_on_a_consistent_point_and_prunes_the_log() -> None:
    p = progress_at(0)
    for start, end in [(1, 3), (4, 7), (8, 10)]:
        p.marker(start, end)
        p.deliver(end)
    p.accepted([FailoverEntry(0xB, 8), FailoverEntry(U, 0)])
    p.marker(11, 20)
    p.deliver(12)
    assert p.consistent_points == (3, 7, 10)
    assert p.roll_back(9) == VbucketOffset.at(7, U)  # 9 is inside {8, 10}
    assert p.failover_log == (FailoverEntry(U, 0),)
    assert p.consistent_points == (3, 7)
    assert p.roll_back(2) == VbucketOffset.at(0, U)


def test_rollback_past_every_branch_asks_with_uuid_zero() -> None:
    p = VbucketProgress(VbucketOffset.at(5, 7), failover_log=[FailoverEntry(7, 3)])
    assert p.roll_back(2) == VbucketOffset(0, 0, 0, 0)


def test_consistent_points_thin_out_but_keep_the_newest() -> None:
    p = VbucketProgress(max_points=8)
    for seqno in range(1, 101):
        p.marker(seqno, seqno)
        p.deliver(seqno)
    points = p.consistent_points
    assert len(points) <= 8 and points[-1] == 100 and points == tuple(sorted(points))


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([("d", 1)], "outside any snapshot"),
        ([("m", 3, 2)], "ends before it starts"),
        ([("m", 2, 4), ("d", 1)], "outside its snapshot"),
        ([("m", 1, 4), ("d", 3), ("d", 3)], "does not advance"),
        ([("m", 1, 4), ("d", 5)], "outside its snapshot"),
        ([("m", 1, 4), ("d", 4), ("m", 2, 4)], "is not past seqno"),
    ],
)
def test_producer_rule_breaks_raise(steps: list[tuple], message: str) -> None:
    p = progress_at(0)
    with pytest.raises(OffsetError, match=message):
        for step in steps:
            if step[0] == "m":
                p.marker(step[1], step[2])
            else:
                p.deliver(step[1])


def test_offset_invariants() -> None:
    with pytest.raises(OffsetError):
        VbucketOffset(1, 5, 6, 9)
    with pytest.raises(OffsetError):
        VbucketOffset(U64_MAX + 1, 0, 0, 0)
    assert VbucketOffset(1, 5, 1, 9).stream_request_fields() == (5, 1, 1, 9)


u64 = st.integers(0, U64_MAX)


@st.composite
def offsets_docs(draw: st.DrawFn) -> Offsets:
    offsets = Offsets()
    for vb in draw(st.sets(st.integers(0, 1023), max_size=4)):
        a, b, c = sorted(draw(st.tuples(u64, u64, u64)))
        log = draw(st.lists(st.builds(FailoverEntry, u64, u64), max_size=3))
        points = draw(st.lists(st.integers(1, max(1, b)), max_size=3)) if b else []
        p = VbucketProgress(VbucketOffset(draw(u64), b, a, c), failover_log=log, consistent=points)
        p.note_seen(draw(u64))
        offsets._vbuckets[vb] = p
    return offsets


@settings(max_examples=100, deadline=None)
@given(offsets_docs())
def test_json_round_trip_is_exact(offsets: Offsets) -> None:
    text = offsets.to_json()
    back = Offsets.from_json(text)
    assert back.to_json() == text
    for vb in offsets:
        assert back[vb] == offsets[vb]
        assert back.progress(vb).failover_log == offsets.progress(vb).failover_log


def test_json_key_order_and_u64_max() -> None:
    offsets = Offsets()
    for vb in (10, 2):
        offsets.progress(vb).offset = VbucketOffset(U64_MAX, U64_MAX, U64_MAX, U64_MAX)
    doc = json.loads(offsets.to_json())
    assert list(doc) == ["version", "vbuckets"]
    assert list(doc["vbuckets"]) == ["2", "10"]
    assert list(doc["vbuckets"]["2"]) == [
        "vb_uuid", "seqno", "snap_start", "snap_end", "seen", "consistent", "failover_log",
    ]  # fmt: skip
    assert doc["vbuckets"]["2"]["seqno"] == 2**64 - 1
    assert f"{2**64 - 1}" in offsets.to_json()


def test_atomic_save_survives_a_crash_mid_write(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    offsets = Offsets()
    offsets.progress(3).offset = VbucketOffset(9, 5, 1, 9)
    offsets.save(path)
    # A crash while writing the next version leaves garbage in the temporary file only.
    temp_path(path).write_bytes(b'{"version": 1, "vbuck')
    assert Offsets.load(path)[3] == VbucketOffset(9, 5, 1, 9)
    offsets.progress(3).offset = VbucketOffset(9, 9, 9, 9)
    offsets.save(path)  # and the next save simply replaces it
    assert Offsets.load(path)[3] == VbucketOffset.at(9, 9)
    assert not temp_path(path).exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "version and vbuckets"),
        (b'{"version": 2, "vbuckets": {}}', "format version"),
        (b'{"version": 1, "vbuckets": {"x": {}}}', "vbucket id"),
        (b'{"version": 1, "vbuckets": {"0": {"seqno": 1}}}', "lacks"),
        (
            b'{"version": 1, "vbuckets": {"0": {"vb_uuid": 1, "seqno": 1.5, "snap_start": 0,'
            b' "snap_end": 2, "seen": 0, "consistent": [], "failover_log": []}}}',
            "seqno must be an integer",
        ),
        (
            b'{"version": 1, "vbuckets": {"0": {"vb_uuid": 1, "seqno": 3, "snap_start": 0,'
            b' "snap_end": 2, "seen": 0, "consistent": [], "failover_log": []}}}',
            "outside its snapshot",
        ),
        (
            b'{"version": 1, "vbuckets": {"0": {"vb_uuid": 18446744073709551616, "seqno": 0,'
            b' "snap_start": 0, "snap_end": 0, "seen": 0, "consistent": [], "failover_log": []}}}',
            "64-bit",
        ),
    ],
)
def test_corrupt_file_is_a_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "offsets.json"
    path.write_bytes(content)
    with pytest.raises(OffsetsFileError, match=f"corrupt offsets file {path}.*{message}"):
        Offsets.load(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OffsetsFileError, match="cannot read"):
        Offsets.load(tmp_path / "nope.json")
    assert len(Offsets.load_or_new(tmp_path / "nope.json")) == 0


@st.composite
def stream_steps(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Snapshots of 1..6 seqnos, each marker followed by some of its seqnos in order (a
    partial snapshot too: the next marker completes it), as (marker start, marker end) and
    (seqno, 0) steps."""
    steps: list[tuple[int, int]] = []
    seqno = 0
    for _ in range(draw(st.integers(1, 8))):
        start, end = seqno + 1, seqno + draw(st.integers(1, 6))
        steps.append((-start, end))  # a marker
        delivered = sorted(draw(st.sets(st.integers(start, end), max_size=end - start + 1)))
        steps.extend((s, 0) for s in delivered)
        seqno = end
    return steps


@given(stream_steps(), st.integers(2, 5))
@settings(max_examples=200)
def test_followed_repeats_a_delivery_made_on_a_copy(
    steps: list[tuple[int, int]], max_points: int
) -> None:
    """The facade's caller side repeats each delivery from the event's offset alone
    (``followed``); it must end exactly where the loop side's progress is, every step."""
    loop_side = VbucketProgress(max_points=max_points)
    loop_side.accepted([FailoverEntry(U, 0)])
    caller_side = loop_side.copy()
    for a, b in steps:
        if a < 0:  # a marker: the facade hands over a copy of the progress
            loop_side.marker(-a, b)
            caller_side = loop_side.copy()
            continue
        offset = loop_side.deliver(a)
        caller_side.followed(offset)
        assert caller_side.to_json_obj() == loop_side.to_json_obj()
        assert caller_side.pending == loop_side.pending
        assert caller_side.consistent_points == loop_side.consistent_points
