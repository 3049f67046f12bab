"""Where a consumer must roll back to, found from its own and the producer's failover logs.

Theory of operation
-------------------
This is the client-side algorithm of ``002_47fc10532b67397d.txt`` ("How UPR Replicas/Clients
find out where to rollback to and stream from"). A consumer that fetched the producer's
failover log (GetFailoverLog) can work out its rollback point itself and send a stream request
that will be accepted, instead of asking, being told to roll back, and asking again.

1. The consumer's log gets a *client sentinel* in front at its last persisted complete snapshot
   (``snapshot_seqno``, 0 if none); entries that began above that seqno are dropped, since the
   consumer never completed a snapshot on those branches.
2. The producer's log gets a *server sentinel* in front at the highest seqno the consumer has
   seen (not necessarily a complete snapshot).
3. The common ancestor is the newest consumer entry whose uuid the producer also knows. With
   none, the answer is 0.
4. Take the next newer row of both logs. Two sentinels: the larger seqno (the branch never
   diverged). Otherwise the smaller (the first point where the histories may differ).

One combination cannot arise: the consumer knows a branch newer than the common ancestor while
the producer has none. A producer only changes its latest uuid by cutting a branch, so the
consumer cannot have seen a branch the producer never made. :class:`ImpossibleHistoryError`
says so rather than guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcpkv.core.errors import DcpkvError
from dcpkv.core.failover_table import FailoverEntry


class ImpossibleHistoryError(DcpkvError, ValueError):
    """The consumer's log names a branch after the common ancestor the producer never made."""


@dataclass(frozen=True, slots=True)
class _Row:
    uuid: int | None  # None marks a sentinel
    seqno: int


def consumer_rollback_point(
    producer_log: Sequence[FailoverEntry],
    consumer_log: Sequence[FailoverEntry],
    *,
    snapshot_seqno: int,
    seen_seqno: int,
) -> int:
    """The seqno to roll back to and stream from (both logs newest first)."""
    consumer = [_Row(None, snapshot_seqno)] + [
        _Row(e.uuid, e.seqno) for e in consumer_log if e.seqno <= snapshot_seqno
    ]
    producer = [_Row(None, seen_seqno)] + [_Row(e.uuid, e.seqno) for e in producer_log]

    # Keyed by uuid: a sentinel's None is never a key, so it never matches a consumer row.
    producer_index: dict[int | None, int] = {
        row.uuid: i for i, row in enumerate(producer) if row.uuid is not None
    }
    for ci in range(1, len(consumer)):
        pi = producer_index.get(consumer[ci].uuid)
        if pi is not None:
            break
    else:
        return 0

    mine, theirs = consumer[ci - 1], producer[pi - 1]
    if mine.uuid is None and theirs.uuid is None:
        return max(mine.seqno, theirs.seqno)
    if theirs.uuid is None:
        raise ImpossibleHistoryError(
            f"consumer saw branch {mine.uuid:#x} at seqno {mine.seqno} after the common "
            f"ancestor {consumer[ci].uuid:#x}, but the producer has no branch after it"
        )
    return min(mine.seqno, theirs.seqno)
