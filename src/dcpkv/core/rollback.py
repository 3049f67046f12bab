"""The producer's rollback decision for a stream request (spec ``000_cbcc6d3ad3ab7e61.txt``).

Theory of operation
-------------------
A consumer asks to resume a vbucket at ``start`` and tells the producer which snapshot
``{snap_start, snap_end}`` it was inside and which history branch (``vb_uuid``) it was on. The
producer must answer either "go on" or "roll back to at least R" so that the consumer never
keeps a change the producer no longer has, and never misses one it does have.

First the snapshot is *adjusted*: a consumer whose start equals its snapshot end holds the
whole snapshot (it is consistent at ``start``: treat it as ``{start, start}``); one whose start
equals its snapshot start holds none of it (also ``{start, start}``). Then, in order:

==== ================================================ =====================================
case condition                                        answer
==== ================================================ =====================================
1a   start == 0 and (uuid == 0 or not strict)         no rollback: nothing to undo
1b   start == 0, uuid != 0, strict                    go on to cases 3 and 4
2    start != 0 and snap_start < purge seqno          roll back to 0 (missed purged deletes)
3    uuid not in the failover table                   roll back to 0 (no common history)
4a   snap_end <= upper                                no rollback (lagging consumer)
4b   snap_start > upper                               roll back to upper (leading consumer)
4c   snap_start <= upper < snap_end                   roll back to snap_start
==== ================================================ =====================================

``upper`` is where the consumer's branch ends in the producer's history: the seqno of the next
newer failover entry, or the producer's high seqno when the consumer's branch is the latest.
4b and 4c are together ``min(upper, snap_start)``.

Case 1 follows the reference producer: the spec's 1b ("a consumer might need to update its
state even at seqno 0") applies when the consumer asked for it with the StrictVbUuid flag;
without it a request from zero is always served, since a consumer at zero has nothing to undo.

Case 2 is skipped when the consumer proves it already knows of the purge: its own purge seqno
(sent in the stream request's JSON value, learnt from a V2.2 snapshot marker) is at least the
producer's; and when the consumer asked to ignore purged tombstones.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpkv.core.failover_table import FailoverTable


@dataclass(frozen=True, slots=True)
class RollbackDecision:
    """The consumer must roll back to (at most) ``seqno`` and ask again."""

    seqno: int
    reason: str


def reason_purged(purge_seqno: int) -> str:
    return f"purge seqno ({purge_seqno}) is greater than start seqno - could miss purged deletions"


REASON_NO_COMMON_HISTORY = (
    "vBucket UUID not found in failover table, consumer and producer have no common history"
)


def reason_ahead(upper: int) -> str:
    return f"consumer ahead of producer - producer upper at {upper}"


def adjust_snapshot(start: int, snap_start: int, snap_end: int) -> tuple[int, int]:
    """The snapshot the decision reasons about (see the module docstring)."""
    if start == snap_end:
        return start, snap_end
    if start == snap_start:
        return snap_start, start
    return snap_start, snap_end


def needs_rollback(
    *,
    start: int,
    vb_uuid: int,
    snap_start: int,
    snap_end: int,
    purge_seqno: int,
    failover_table: FailoverTable,
    high_seqno: int,
    strict_vb_uuid: bool = False,
    consumer_purge_seqno: int | None = None,
    ignore_purged_tombstones: bool = False,
) -> RollbackDecision | None:
    """Decide a stream request: ``None`` to serve it, or the :class:`RollbackDecision` to answer.

    The request is assumed to have passed the range checks already
    (``snap_start <= start <= snap_end``; the producer answers Erange before asking this).
    """
    if start == 0 and (vb_uuid == 0 or not strict_vb_uuid):
        return None  # 1a

    snap_start, snap_end = adjust_snapshot(start, snap_start, snap_end)

    purge_known = consumer_purge_seqno is not None and consumer_purge_seqno >= purge_seqno
    if start != 0 and snap_start < purge_seqno and not purge_known and not ignore_purged_tombstones:
        return RollbackDecision(0, reason_purged(purge_seqno))  # 2

    index = failover_table.index_of(vb_uuid)
    if index is None:
        return RollbackDecision(0, REASON_NO_COMMON_HISTORY)  # 3

    upper = high_seqno if index == 0 else failover_table.entries[index - 1].seqno
    if snap_end <= upper:
        return None  # 4a
    return RollbackDecision(min(upper, snap_start), reason_ahead(upper))  # 4b, 4c
