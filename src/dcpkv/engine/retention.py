"""What a bucket's storage keeps for rollback, and what it may purge: pure decisions.

Theory of operation
-------------------
The storage engine (``rocks_storage.py``, RocksDB) keeps, besides the latest version of every
key, the versions a flush replaced, for a *history window* of the last ``history_window``
seqnos of each vbucket, and the *flush points* (the high seqnos of committed flushes: the
states the disk actually went through, the only exact rollback targets). This module decides,
from plain values, what it keeps and where a rollback lands; the engine does the reading and
writing.

============================= ============================================================
decision                      rule
============================= ============================================================
trim due (:func:`trim_due`)   every quarter window of seqnos per vbucket: keeping up to
                              1.25 windows only makes more rollbacks exact, and a trim
                              costs a scan
history start                 the newest flush point at least a window below the high
(:func:`history_start`)       seqno (never lower than before): rollback to any flush point
                              at or above it is exact; versions replaced at or below it,
                              and flush points below it, go
thin due (:func:`thin_due`)   every stride (``history_window // FLUSH_POINT_STRIDES``
                              seqnos) per vbucket
thinned points                below ``high - stride``, keep the newest point of each stride
(:func:`points_to_thin`)      of seqnos and the history start; the others go (a flush per
                              vbucket per flush would otherwise grow without bound)
rollback point                the newest flush point at or below the target, if the history
(:func:`rollback_point`)      still covers it (at or above the history start, not 0, a
                              window kept at all); else None: the vbucket is emptied (0)
version at a point            of a key's replaced versions written at or before the point
(:func:`version_at`)          and replaced after it, the one replaced first (None: the key
                              did not exist at the point)
purgeable tombstone           deleted, and below the seqno or older than the age asked
(:func:`purgeable`)           for; the purge seqno rises to the highest one purged
============================= ============================================================

A rollback also forgets the failover entries that began above its point
(:func:`prune_failover`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from dcpkv.core.failover_table import FailoverTable, FailoverTableError, entries_from_json_obj

DEFAULT_HISTORY_WINDOW = 100_000
FLUSH_POINT_STRIDES = 64  # strides per history window (thinned points)


def due(last: int | None, high_seqno: int, every: int) -> bool:
    """Whether a per-vbucket chore last done at ``last`` (None: never) is due again at
    ``high_seqno``, being done once every ``every`` seqnos."""
    return last is None or high_seqno - last >= every


def stride(history_window: int) -> int:
    """Seqnos per stride of thinned flush points."""
    return max(1, history_window // FLUSH_POINT_STRIDES)


def trim_due(last: int | None, high_seqno: int, history_window: int) -> bool:
    return due(last, high_seqno, max(1, history_window // 4))


def thin_due(last: int | None, high_seqno: int, history_window: int) -> bool:
    return due(last, high_seqno, stride(history_window))


def history_start(points: Iterable[int], high_seqno: int, window: int, current: int) -> int:
    """The new history start of a vbucket at ``high_seqno`` with these flush points."""
    cutoff = high_seqno - window
    return max(current, max((p for p in points if p <= cutoff), default=0))


def points_to_thin(points: Iterable[int], cutoff: int, stride_seqnos: int, keep: int) -> list[int]:
    """The flush points below ``cutoff`` that thinning removes: all but the newest of each
    stride of seqnos, and but ``keep`` (the history start)."""
    newest: dict[int, int] = {}
    old = [p for p in points if p < cutoff and p != keep]
    for p in old:
        group = p // stride_seqnos
        newest[group] = max(newest.get(group, p), p)
    return [p for p in old if newest[p // stride_seqnos] != p]


def rollback_point(
    points: Iterable[int], seqno: int, history_start_seqno: int, window: int
) -> int | None:
    """Where a rollback to ``seqno`` lands: the newest flush point at or below it whose
    versions the history still holds; None when only a wipe (to 0) gets there."""
    point = max((p for p in points if p <= seqno), default=None)
    if window <= 0 or point is None or point < history_start_seqno or point == 0:
        return None
    return point


def version_at(point: int, replaced: Iterable[tuple[int, int]]) -> int | None:
    """Of one key's replaced versions, (their seqno, the seqno that replaced them), the seqno
    of the one live at ``point``: written at or before it, replaced after it, the first such
    replacement (a version written after the point is not it: the key may not have existed
    then). None: no version of the key was live at the point."""
    live = [(by, seqno) for seqno, by in replaced if seqno <= point < by]
    return min(live)[1] if live else None


def purgeable(
    deleted: bool,
    seqno: int,
    delete_time: int,
    before_seqno: int | None,
    deleted_before: int | None,
) -> bool:
    """Whether compaction removes this document: a tombstone below ``before_seqno`` or
    deleted before the unix time ``deleted_before`` (None: that criterion not asked for)."""
    if not deleted:
        return False
    by_seqno = before_seqno is not None and seqno < before_seqno
    by_age = deleted_before is not None and delete_time < deleted_before
    return by_seqno or by_age


def prune_failover(text: str, seqno: int) -> str:
    """The failover table (JSON) without the branches that began above ``seqno``; a table
    that cannot be read is left as it is (warm-up sanitises it)."""
    try:
        entries = entries_from_json_obj(json.loads(text))
    except (FailoverTableError, ValueError):
        return text
    table = FailoverTable(entries, capacity=max(len(entries), 1))
    table.prune(seqno)
    return table.to_json()
