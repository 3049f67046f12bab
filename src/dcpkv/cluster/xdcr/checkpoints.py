"""XDCR checkpoints: where a replication stands in each vbucket, and where it resumes.

Theory of operation
-------------------
Every checkpoint interval a replicator records, for each vbucket whose progress moved, a
:class:`Checkpoint`: the source's position (vbucket uuid, seqno, snapshot start and end: a
DCP resume point) and the target's at that moment (its vbucket uuid and high seqno, read after
every change up to ``seqno`` was written there). A vbucket keeps several, newest first
(:data:`KEEP`), so one that became useless (the source failed over past it, the target lost
writes) still leaves an older one to fall back on. They live in the source cluster's
configuration store (the manager's folder), as JSON (:meth:`CheckpointLog.to_json`).

Picking one at resume (:func:`pick_resume`), newest first, the first that passes both:

=== ============================================ =========================================
#   check                                        why
=== ============================================ =========================================
1   its source uuid is in the source vbucket's   a branch the source no longer has: the
    failover log                                 stream would be rolled back anyway
2   its target uuid is in the target vbucket's   the target failed over or was rebuilt
    failover log, and the target's history on    since, and may have lost writes the
    that branch reaches its target seqno (the    checkpoint counts as done: they must be
    next newer entry starts at or above it, or   sent again
    it is the newest branch and the high seqno
    is at or above it)
=== ============================================ =========================================

None passing: the vbucket starts from 0 (everything is sent again; conflict resolution
refuses what the target already has, so a restart from 0 costs time, never correctness).

While it runs, a replicator also watches the target's branch of every vbucket: a vbucket
whose uuid changed since it last looked, or whose high seqno went down
(:func:`target_branch_changed`), failed over or restarted uncleanly, and may have lost
writes it had acknowledged, past the checkpoints too. The replicator then stops with an
error instead of recording anything (then or later); the next one resumes by the rules
above, which send those writes again.

After a rollback answer from the source (the consumer's Rollback event to seqno R),
:func:`pick_after_rollback` keeps the newest checkpoint at or below R and drops the newer ones
(:meth:`CheckpointLog.rolled_back`): they name changes the source no longer has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dcpkv.core.failover_table import FailoverEntry

KEEP = 5  # checkpoints kept per vbucket, newest first


@dataclass(frozen=True, slots=True)
class Checkpoint:
    source_uuid: int
    seqno: int
    snap_start: int
    snap_end: int
    target_uuid: int
    target_seqno: int

    def to_json(self) -> list[int]:
        return [
            self.source_uuid, self.seqno, self.snap_start, self.snap_end, self.target_uuid,
            self.target_seqno,
        ]  # fmt: skip

    @classmethod
    def from_json(cls, doc: Sequence[int]) -> Checkpoint:
        if len(doc) != 6 or not all(isinstance(v, int) and v >= 0 for v in doc):
            raise ValueError(f"a checkpoint is six non-negative integers, not {doc!r}")
        return cls(*doc)


def source_knows(cp: Checkpoint, source_log: Sequence[FailoverEntry]) -> bool:
    """Check 1: the checkpoint's source branch is in the source's failover log."""
    return any(entry.uuid == cp.source_uuid for entry in source_log)


def target_holds(cp: Checkpoint, target_log: Sequence[FailoverEntry], target_high: int) -> bool:
    """Check 2: the target still has everything the checkpoint counts as written. ``target_log``
    is newest first (as a failover log is sent)."""
    for i, entry in enumerate(target_log):
        if entry.uuid != cp.target_uuid:
            continue
        reached = target_log[i - 1].seqno if i > 0 else target_high
        return reached >= cp.target_seqno
    return False


def pick_resume(
    checkpoints: Sequence[Checkpoint],
    source_log: Sequence[FailoverEntry],
    target_log: Sequence[FailoverEntry],
    target_high: int,
) -> Checkpoint | None:
    """The newest checkpoint that passes both checks of the module docstring (None: from 0)."""
    for cp in checkpoints:
        if source_knows(cp, source_log) and target_holds(cp, target_log, target_high):
            return cp
    return None


def target_branch_changed(
    seen: Mapping[int, tuple[int, int]], now: Mapping[int, tuple[int, int]]
) -> list[int]:
    """The vbuckets whose target state ``now`` (vbucket -> (uuid, high seqno)) is on another
    branch than the one ``seen`` last, or below its high seqno then (history was lost either
    way); a vbucket not in ``seen`` has not changed."""
    changed = []
    for vb, (uuid, high) in now.items():
        was = seen.get(vb)
        if was is not None and (was[0] != uuid or high < was[1]):
            changed.append(vb)
    return sorted(changed)


def pick_after_rollback(
    checkpoints: Sequence[Checkpoint], rollback_seqno: int
) -> Checkpoint | None:
    """The newest checkpoint at or below the source's rollback point (None: from 0)."""
    return next((cp for cp in checkpoints if cp.seqno <= rollback_seqno), None)


class CheckpointLog:
    """Every vbucket's checkpoints of one replication, newest first."""

    def __init__(self, by_vbucket: dict[int, list[Checkpoint]] | None = None) -> None:
        self.by_vbucket: dict[int, list[Checkpoint]] = by_vbucket or {}

    def of(self, vbucket: int) -> list[Checkpoint]:
        return self.by_vbucket.get(vbucket, [])

    def record(self, vbucket: int, cp: Checkpoint) -> bool:
        """Add ``cp`` as the newest (False: it is the newest already, nothing changed)."""
        kept = self.by_vbucket.setdefault(vbucket, [])
        if kept and kept[0] == cp:
            return False
        kept.insert(0, cp)
        del kept[KEEP:]
        return True

    def rolled_back(self, vbucket: int, rollback_seqno: int) -> Checkpoint | None:
        """Drop the checkpoints above ``rollback_seqno``; the one to resume from, if any."""
        kept = [cp for cp in self.of(vbucket) if cp.seqno <= rollback_seqno]
        self.by_vbucket[vbucket] = kept
        return pick_after_rollback(kept, rollback_seqno)

    def to_json(self) -> dict[str, Any]:
        return {str(vb): [cp.to_json() for cp in cps] for vb, cps in self.by_vbucket.items()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CheckpointLog:
        if not isinstance(doc, dict):
            raise ValueError("checkpoints must be a JSON object of vbucket -> list")
        return cls({int(vb): [Checkpoint.from_json(c) for c in cps] for vb, cps in doc.items()})

    def vbuckets(self) -> Iterable[int]:
        return self.by_vbucket.keys()
