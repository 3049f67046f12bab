"""The consumer stream state machine: every legal path, and illegal moves raise."""

from __future__ import annotations

import pytest

from dcpkv.client import events
from dcpkv.client.consumer_stream import (
    TRANSITIONS,
    ConsumerEvent,
    ConsumerState,
    ConsumerStateError,
    ConsumerStream,
)
from dcpkv.client.offsets import OffsetError, VbucketOffset, VbucketProgress
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.status import Status
from dcpkv.protocol import dcp, snappy
from dcpkv.protocol.base import GenericResponse, Message
from dcpkv.protocol.constants import Datatype, Opcode, StreamEndReason
from dcpkv.protocol.fast_dcp import MutationFields, feed_fields
from dcpkv.protocol.frame import FrameParser
from dcpkv.protocol.messages import decode_message

VB = 3
LOG = (FailoverEntry(0xAA, 0),)
S = ConsumerState


def wire(msg: Message) -> Message:
    """Through the codec, so the machine sees what a connection would decode."""
    (frame,) = FrameParser().feed(msg.encode())
    return decode_message(frame)


def streaming() -> ConsumerStream:
    s = ConsumerStream(VB)
    s.request()
    (ev,) = s.receive(wire(dcp.StreamRequestOk(failover_log=LOG)))
    assert isinstance(ev, events.StreamStart) and ev.offset.vb_uuid == 0xAA
    return s


def marker(start: int, end: int) -> dcp.SnapshotMarker:
    return dcp.SnapshotMarker(vbucket=VB, start_seqno=start, end_seqno=end, flags=1)


def test_happy_path_events_carry_the_offset_after_them() -> None:
    s = streaming()
    assert s.state is S.STREAMING
    msgs = [
        marker(1, 4),
        dcp.Mutation(vbucket=VB, key=b"k", value=b"v", by_seqno=1, rev_seqno=2, cas=9),
        dcp.DeletionV2(vbucket=VB, key=b"k", by_seqno=2, delete_time=5),
        dcp.Expiration(vbucket=VB, key=b"e", by_seqno=3),
        dcp.SeqnoAdvanced(vbucket=VB, by_seqno=4),
    ]
    evs = [ev for m in msgs for ev in s.receive(wire(m))]
    assert [type(e) for e in evs] == [
        events.SnapshotStart, events.Mutation, events.Deletion, events.Expiration,
        events.SeqnoAdvanced,
    ]  # fmt: skip
    assert evs[0].offset == VbucketOffset(0xAA, 0, 0, 0)  # the marker alone moves nothing
    assert evs[1].offset == VbucketOffset(0xAA, 1, 1, 4)
    assert isinstance(evs[1], events.Mutation) and (evs[1].key, evs[1].value) == (b"k", b"v")
    assert isinstance(evs[2], events.Deletion) and evs[2].delete_time == 5
    assert evs[4].offset == VbucketOffset.at(4, 0xAA)


def test_request_carries_the_offset() -> None:
    progress = VbucketProgress(VbucketOffset(0x1111, 3, 1, 4))
    s = ConsumerStream(VB, progress, end_seqno=100, flags=0x20)
    req = s.request(opaque=42)
    assert (req.vbucket, req.opaque, req.flags, req.end_seqno) == (VB, 42, 0x20, 100)
    assert (req.start_seqno, req.vbucket_uuid, req.snap_start_seqno, req.snap_end_seqno) == (
        3, 0x1111, 1, 4,
    )  # fmt: skip
    assert s.state is S.REQUESTED


def test_rollback_answer_then_request_again() -> None:
    progress = VbucketProgress(VbucketOffset(0xBB, 9, 8, 12), failover_log=[
        FailoverEntry(0xBB, 6), FailoverEntry(0xAA, 0)], consistent=[3, 7])  # fmt: skip
    s = ConsumerStream(VB, progress)
    s.request()
    (ev,) = s.receive(wire(dcp.StreamRequestRollback(rollback_seqno=6)))
    assert isinstance(ev, events.Rollback)
    assert (ev.producer_seqno, ev.rollback_seqno) == (6, 3)
    assert ev.failed_offset == VbucketOffset(0xBB, 9, 8, 12)
    assert ev.offset == VbucketOffset.at(3, 0xAA)
    assert s.state is S.ROLLING_BACK
    s.disconnected()
    assert s.state is S.ROLLING_BACK  # still owed
    req = s.request()
    assert (req.start_seqno, req.vbucket_uuid, req.snap_start_seqno, req.snap_end_seqno) == (
        3, 0xAA, 3, 3,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "state", "resume"),
    [
        (StreamEndReason.OK, S.ENDED, False),
        (StreamEndReason.Closed, S.ENDED, False),
        (StreamEndReason.FilterEmpty, S.ENDED, False),
        (StreamEndReason.StateChanged, S.RESUMING, True),
        (StreamEndReason.Disconnected, S.RESUMING, True),
        (StreamEndReason.TooSlow, S.RESUMING, True),
        (StreamEndReason.BackfillFailed, S.RESUMING, True),
        (StreamEndReason.Rollback, S.RESUMING, True),
        (StreamEndReason.LostPrivileges, S.FAILED, False),
    ],
)
def test_stream_end(reason: StreamEndReason, state: ConsumerState, resume: bool) -> None:
    s = streaming()
    s.receive(marker(1, 2))
    (ev,) = s.receive(wire(dcp.StreamEnd(vbucket=VB, reason=reason)))
    assert isinstance(ev, events.StreamEnd) and ev.will_resume is resume
    assert s.state is state
    assert s.progress.pending is None  # the marker never got data
    assert s.needs_request is resume


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (Status.NotMyVbucket, S.RESUMING),
        (Status.Etmpfail, S.RESUMING),
        (Status.Erange, S.FAILED),
        (Status.KeyEexists, S.FAILED),
    ],
)
def test_refused(status: Status, state: ConsumerState) -> None:
    s = ConsumerStream(VB)
    s.request()
    (ev,) = s.receive(GenericResponse(opcode=Opcode.DcpStreamRequest, status=status))
    assert isinstance(ev, events.StreamRefused) and ev.status == status
    assert s.state is state


def test_disconnect_mid_snapshot_resumes_inside_it() -> None:
    s = streaming()
    s.receive(marker(1, 4))
    s.receive(dcp.Mutation(vbucket=VB, key=b"a", by_seqno=2))
    s.disconnected()
    assert s.state is S.RESUMING
    req = s.request()
    assert (req.start_seqno, req.snap_start_seqno, req.snap_end_seqno) == (2, 1, 4)


def test_check_failover_log_saves_a_round_trip() -> None:
    # Spec 002: deadbeef master failover at 5, snapshot at 6, seen through 7.
    progress = VbucketProgress(failover_log=[FailoverEntry(0xCAFE, 0)])
    s = ConsumerStream(VB, progress)
    progress.marker(1, 6)
    progress.deliver(6)
    progress.marker(7, 9)
    progress.deliver(7)
    ev = s.check_failover_log([FailoverEntry(0xDEAD, 5), FailoverEntry(0xCAFE, 0)])
    assert isinstance(ev, events.Rollback) and (ev.producer_seqno, ev.rollback_seqno) == (5, 0)
    assert s.state is S.ROLLING_BACK
    # Same history: nothing to do.
    s2 = ConsumerStream(VB, VbucketProgress(VbucketOffset.at(4, 0xCAFE), failover_log=[
        FailoverEntry(0xCAFE, 0)]))  # fmt: skip
    assert s2.check_failover_log([FailoverEntry(0xCAFE, 0)]) is None
    assert s2.state is S.IDLE


def test_impossible_history_is_left_to_the_producer() -> None:
    progress = VbucketProgress(
        VbucketOffset.at(7, 0xBA5E),
        failover_log=[FailoverEntry(0xBA5E, 7), FailoverEntry(0xCAFE, 0)],
    )
    s = ConsumerStream(VB, progress)
    assert s.check_failover_log([FailoverEntry(0xCAFE, 0)]) is None


def test_full_resync_rolls_back_further() -> None:
    s = ConsumerStream(VB, VbucketProgress(VbucketOffset.at(7, 0xAA), failover_log=LOG))
    s.request()
    s.receive(dcp.StreamRequestRollback(rollback_seqno=7))
    ev = s.roll_back(0)
    assert ev.offset == VbucketOffset.at(0, 0xAA)
    assert s.request().start_seqno == 0


def test_every_transition_is_reachable_and_the_rest_raise() -> None:
    drivers = {
        ConsumerEvent.REQUEST_SENT: lambda s: s.request(),
        ConsumerEvent.ACCEPTED: lambda s: s.receive(dcp.StreamRequestOk(failover_log=LOG)),
        ConsumerEvent.ROLLBACK: lambda s: s.receive(dcp.StreamRequestRollback(rollback_seqno=0)),
        ConsumerEvent.REFUSED_RETRY: lambda s: s.receive(
            GenericResponse(opcode=Opcode.DcpStreamRequest, status=Status.NotMyVbucket)
        ),
        ConsumerEvent.REFUSED: lambda s: s.receive(
            GenericResponse(opcode=Opcode.DcpStreamRequest, status=Status.Erange)
        ),
        ConsumerEvent.LOCAL_ROLLBACK: lambda s: s.roll_back(0),
        ConsumerEvent.MARKER: lambda s: s.receive(marker(1, 5)),
        ConsumerEvent.ITEM: lambda s: s.receive(dcp.SeqnoAdvanced(vbucket=VB, by_seqno=1)),
        ConsumerEvent.END_DONE: lambda s: s.receive(dcp.StreamEnd(vbucket=VB)),
        ConsumerEvent.END_RESUME: lambda s: s.receive(
            dcp.StreamEnd(vbucket=VB, reason=StreamEndReason.TooSlow)
        ),
        ConsumerEvent.END_FAILED: lambda s: s.receive(
            dcp.StreamEnd(vbucket=VB, reason=StreamEndReason.LostPrivileges)
        ),
        ConsumerEvent.DISCONNECT: lambda s: s.disconnected(),
    }
    for state in ConsumerState:
        for event, drive in drivers.items():
            s = ConsumerStream(VB)
            s.state = state
            if event is ConsumerEvent.ITEM:
                s.progress.marker(1, 5)
            if (state, event) in TRANSITIONS:
                drive(s)
                assert s.state is TRANSITIONS[state, event], (state, event)
            else:
                with pytest.raises(ConsumerStateError, match="illegal in state"):
                    drive(s)
                assert s.state is state


def test_wrong_vbucket_and_unknown_messages_raise() -> None:
    s = streaming()
    with pytest.raises(ConsumerStateError, match="for vbucket 9"):
        s.receive(marker(1, 2).__class__(vbucket=9, start_seqno=1, end_seqno=2))
    with pytest.raises(ConsumerStateError, match="does not handle"):
        s.receive(dcp.DcpNoop(vbucket=VB))


def _fields(m: dcp.Mutation) -> MutationFields:
    """What the receive path makes of ``m`` on the fused path (``fast_dcp``)."""
    (run,) = feed_fields(FrameParser(), m.encode())
    assert isinstance(run, list)
    (fields,) = run
    return fields


def _mutation(seqno: int, value: bytes = b"v", datatype: int = 0, vb: int = VB) -> dcp.Mutation:
    return dcp.Mutation(vbucket=vb, key=b"k%d" % seqno, value=value, by_seqno=seqno,
                        rev_seqno=seqno + 7, flags=3, expiration=4, cas=seqno * 11,
                        datatype=datatype)  # fmt: skip


@pytest.mark.parametrize(
    ("msgs", "raises"),
    [
        ([_mutation(1), _mutation(2), _mutation(4)], None),  # the last completes {1, 4}
        ([_mutation(1, snappy.deflate(b"inflated"), Datatype.Snappy | Datatype.JSON)], None),
        ([_mutation(1, vb=9)], ConsumerStateError),  # another vbucket's change
        ([_mutation(2), _mutation(2)], OffsetError),  # no advance
        ([_mutation(5)], OffsetError),  # past the snapshot
    ],
)
def test_change_from_fields_is_event_for_the_message(
    msgs: list[dcp.Mutation], raises: type[Exception] | None
) -> None:
    """``change`` (the fused receive path) makes exactly the event, offset and progress that
    ``event_for`` makes of the decoded message, and refuses exactly what it refuses."""
    by_message, by_fields = streaming(), streaming()
    for s in (by_message, by_fields):
        s.receive(wire(marker(1, 4)))
    for m in msgs:
        if raises is not None and m is msgs[-1]:
            with pytest.raises(raises):
                by_message.event_for(wire(m))
            with pytest.raises(raises):
                by_fields.change(_fields(m))
            break
        expected, got = by_message.event_for(wire(m)), by_fields.change(_fields(m))
        assert type(got) is events.Mutation and got == expected
        assert by_fields.offset == by_message.offset
        assert by_fields.progress.consistent_points == by_message.progress.consistent_points
    assert by_fields.state is by_message.state


def test_change_moves_the_state_like_any_item() -> None:
    s = ConsumerStream(VB)
    s.request()
    with pytest.raises(ConsumerStateError, match="illegal in state requested"):
        s.change(_fields(_mutation(1)))
