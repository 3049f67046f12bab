"""What a DCP consumer hands to the application, one typed event per change or decision.

Every event carries ``offset``: the vbucket's :class:`VbucketOffset` *after* the event is
applied. An application that persists ``event.offset`` (or the whole :class:`Offsets`) after
it has applied the event resumes exactly there, never past a change it did not apply.

Keys and values are ``bytes`` copies (the codec's memoryviews point into a receive buffer that
the connection reuses). The events are frozen dataclasses built with ``fast_init``'s
constructor (one is built per change: the generated frozen ``__init__`` cost more than the
rest of a change's handling).
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpkv.client.offsets import VbucketOffset
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.core.fastinit import fast_init


@fast_init
@dataclass(frozen=True, slots=True)
class StreamStart:
    """The producer accepted the stream request. The consumer adopted its failover log (which
    the application should persist now, with ``offset``: the branch may have changed)."""

    vbucket: int
    failover_log: tuple[FailoverEntry, ...]
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class StreamRefused:
    """The producer answered the stream request with an error ``status``. With
    ``will_retry`` the library asks again on the next connection (NotMyVbucket: reload the
    cluster map first; Etmpfail, Ebusy, Enomem: later); otherwise the stream failed."""

    vbucket: int
    status: int
    will_retry: bool
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class Mutation:
    """A document was created or changed: its ``key``, ``value`` (inflated, whatever the wire
    carried; empty with ``include_values=False``), ``seqno`` in the vbucket's history,
    ``rev_seqno``, ``flags``, ``expiration``, ``cas`` and ``datatype`` (1: JSON)."""

    vbucket: int
    key: bytes
    value: bytes
    seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    cas: int
    datatype: int
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class Deletion:
    """A document was deleted at ``seqno`` (``delete_time``: when, in seconds since the epoch,
    when the producer sent it)."""

    vbucket: int
    key: bytes
    seqno: int
    rev_seqno: int
    cas: int
    offset: VbucketOffset
    delete_time: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class Expiration:
    """A document expired at ``seqno`` (its TTL passed); apply it as a deletion."""

    vbucket: int
    key: bytes
    seqno: int
    rev_seqno: int
    cas: int
    offset: VbucketOffset
    delete_time: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class Prepare:
    """A durable write's *prepare* (``ClientSettings.include_prepares`` only): the version it
    will make (``deleted``: a durable delete) at durability ``level`` (1 Majority,
    2 MajorityAndPersistToActive, 3 PersistToMajority), not visible to readers; a
    :class:`Commit` or :class:`Abort` of its seqno follows."""

    vbucket: int
    key: bytes
    value: bytes
    seqno: int
    rev_seqno: int
    flags: int
    expiration: int
    cas: int
    datatype: int
    deleted: bool
    level: int
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class Commit:
    """The prepare at ``prepared_seqno`` became the document's committed version at ``seqno``
    (``ClientSettings.include_prepares`` only; otherwise it arrives as a Mutation or Deletion)."""

    vbucket: int
    key: bytes
    prepared_seqno: int
    seqno: int
    cas: int
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class Abort:
    """The prepare at ``prepared_seqno`` was dropped at ``seqno``: it never became visible
    (``ClientSettings.include_prepares`` only)."""

    vbucket: int
    key: bytes
    prepared_seqno: int
    seqno: int
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class SeqnoAdvanced:
    """The stream moved to ``seqno`` without a change for the application (a SeqnoAdvanced
    message, or a system event this library does not interpret)."""

    vbucket: int
    seqno: int
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class SnapshotStart:
    """A snapshot marker: changes ``start..end`` follow. Until ``end`` is reached the
    application does not hold a consistent view (``offset`` does not move for the marker)."""

    vbucket: int
    start: int
    end: int
    flags: int
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class Rollback:
    """Undo every change above ``rollback_seqno`` before the stream is requested again.

    ``producer_seqno`` is what the producer asked for (or what the failover logs showed);
    ``rollback_seqno`` can be lower: the newest point at or below it where the application
    held a consistent view. ``failed_offset`` is the offset the producer refused.
    """

    vbucket: int
    rollback_seqno: int
    producer_seqno: int
    failed_offset: VbucketOffset
    offset: VbucketOffset


@fast_init
@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The producer ended the stream. ``will_resume`` says whether the library asks again
    (on this connection or the next one); otherwise the stream is over (``reason`` OK: the
    end seqno was reached)."""

    vbucket: int
    reason: int
    will_resume: bool
    offset: VbucketOffset


Event = (
    StreamStart
    | StreamRefused
    | SnapshotStart
    | Mutation
    | Deletion
    | Expiration
    | SeqnoAdvanced
    | Rollback
    | StreamEnd
    | Prepare
    | Commit
    | Abort
)
