"""The producer's answer to a stream request, as a pure function.

Theory of operation
-------------------
A stream request is answered by checks in a fixed order (PROTOCOL.md, "Order of checks on the
producer"); the first that fails decides the answer:

1. the vbucket exists and may be streamed from (not dead; active only with ActiveVbOnly)
   -> NotMyVbucket;
2. FromLatest rewrites start and the snapshot to the high seqno, on the current branch;
3. start <= end, and snap start <= start <= snap end -> Erange;
4. no stream for the vbucket on this connection yet -> KeyEexists;
5. the rollback decision (:mod:`dcpkv.core.rollback`) -> Rollback with the seqno;
6. ToLatest fixes the end at the high seqno, DiskOnly at the persisted seqno;
7. start <= high seqno -> Erange;
8. otherwise the stream is accepted and answered with the failover log.

The vbucket is seen through :class:`VBucketView`, a snapshot of the few facts the checks need,
so the function is testable without an engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpkv.core.failover_table import FailoverTable
from dcpkv.core.rollback import needs_rollback
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.protocol.constants import StreamRequestFlag


@dataclass(frozen=True, slots=True)
class VBucketView:
    state: VBucketState
    high_seqno: int
    persisted_seqno: int
    purge_seqno: int
    failover_table: FailoverTable


@dataclass(frozen=True, slots=True)
class StreamRequest:
    vbucket: int
    flags: StreamRequestFlag
    start: int
    end: int
    vb_uuid: int
    snap_start: int
    snap_end: int
    consumer_purge_seqno: int | None = None


@dataclass(frozen=True, slots=True)
class Accept:
    """Create the stream with these (possibly rewritten) bounds."""

    start: int
    end: int
    snap_start: int
    snap_end: int
    vb_uuid: int


@dataclass(frozen=True, slots=True)
class Refuse:
    status: Status
    message: str


@dataclass(frozen=True, slots=True)
class RollbackTo:
    seqno: int
    reason: str


Answer = Accept | Refuse | RollbackTo


def decide_stream_request(
    req: StreamRequest, vb: VBucketView | None, *, stream_exists: bool
) -> Answer:
    flags = req.flags
    refused = _refuse_vbucket(req, vb)
    if refused is not None:
        return refused
    assert vb is not None  # _refuse_vbucket refuses a missing vbucket
    start, end, snap_start, snap_end, uuid = (
        req.start,
        req.end,
        req.snap_start,
        req.snap_end,
        req.vb_uuid,
    )
    if flags & StreamRequestFlag.FromLatest:
        start = snap_start = snap_end = vb.high_seqno
        uuid = vb.failover_table.latest_uuid
        end = max(end, start)
    refused = _refuse_range(start, end, snap_start, snap_end)
    if refused is not None:
        return refused
    if stream_exists:
        return Refuse(Status.KeyEexists, f"a stream for vbucket {req.vbucket} already exists")

    rollback = needs_rollback(
        start=start,
        vb_uuid=uuid,
        snap_start=snap_start,
        snap_end=snap_end,
        purge_seqno=vb.purge_seqno,
        failover_table=vb.failover_table,
        high_seqno=vb.high_seqno,
        strict_vb_uuid=bool(flags & StreamRequestFlag.StrictVbUuid),
        consumer_purge_seqno=req.consumer_purge_seqno,
        ignore_purged_tombstones=bool(flags & StreamRequestFlag.IgnorePurgedTombstones),
    )
    if rollback is not None:
        return RollbackTo(rollback.seqno, rollback.reason)

    if flags & StreamRequestFlag.ToLatest:
        end = vb.high_seqno
    if flags & StreamRequestFlag.DiskOnly:
        end = min(end, vb.persisted_seqno)
    end = max(end, start)
    if start > vb.high_seqno:
        return Refuse(Status.Erange, f"start seqno {start} is above high seqno {vb.high_seqno}")
    return Accept(start, end, snap_start, snap_end, uuid)


def _refuse_vbucket(req: StreamRequest, vb: VBucketView | None) -> Refuse | None:
    """NotMyVbucket when the vbucket is missing or dead, or not active for ActiveVbOnly."""
    if vb is None or vb.state is VBucketState.DEAD:
        return Refuse(Status.NotMyVbucket, f"vbucket {req.vbucket} is not here")
    if req.flags & StreamRequestFlag.ActiveVbOnly and vb.state is not VBucketState.ACTIVE:
        return Refuse(Status.NotMyVbucket, f"vbucket {req.vbucket} is not active here")
    return None


def _refuse_range(start: int, end: int, snap_start: int, snap_end: int) -> Refuse | None:
    """Erange when the requested range or snapshot does not hold together."""
    if start > end:
        return Refuse(Status.Erange, f"start seqno {start} is above end seqno {end}")
    if not snap_start <= start <= snap_end:
        return Refuse(
            Status.Erange,
            f"snapshot {{{snap_start},{snap_end}}} does not contain start seqno {start}",
        )
    return None
