"""Which events make the blocking facade's pump wait for the caller (``client/sync.py``):
those the library acts on once the caller has them, and no others."""

from __future__ import annotations

from dcpkv.client import events
from dcpkv.client.offsets import VbucketOffset
from dcpkv.client.sync import _is_decision
from dcpkv.protocol.constants import StreamEndReason

AT = VbucketOffset.at(5, 77)


def test_a_stream_end_at_the_end_seqno_does_not_stop_the_pump() -> None:
    # 1024 vbuckets ending one after the other were 1024 waits for the caller's thread.
    assert not _is_decision(events.StreamEnd(3, StreamEndReason.OK, False, AT))


def test_events_the_library_follows_up_stop_it() -> None:
    assert _is_decision(events.StreamEnd(3, StreamEndReason.StateChanged, True, AT))
    assert _is_decision(events.StreamEnd(3, StreamEndReason.LostPrivileges, False, AT))
    assert _is_decision(events.StreamRefused(3, 7, True, AT))
    assert _is_decision(events.Rollback(3, 0, 2, AT, VbucketOffset()))


def test_changes_do_not_stop_it() -> None:
    mutation = events.Mutation(3, b"k", b"v", 5, 1, 0, 0, 9, 0, AT)
    assert not _is_decision(mutation)
