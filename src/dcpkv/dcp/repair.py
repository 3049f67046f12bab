"""A replica repairing the new active before it rolls back (spec 002, step 5 of "How clients
roll back changes when seeing a new failover ID", and figure 8 of "UPR in action").

Theory of operation
-------------------
After a failover, a replica that was ahead of the promoted one holds changes the new active
never saw; the rollback rules make it drop them. Optionally (the cluster's
``repairOnRollback`` setting) it first offers them to the new active: every document it
changed above the rollback point that the new active has *not* modified since that point is
written there, gets a new seqno on the new branch, and streams back to the replica after its
rollback like any other change. A document the new active did modify is left alone: the new
branch wins.

"Not modified since the point" is decided by CAS, which both histories share up to the
point: the new active's current version (GetMeta, tombstones included) must be the very
version the replica held at the point (same CAS), or absent on both. The write itself is
conditional on the same fact (a CAS-checked Set or Delete, or an Add where the key did not
exist), so a front-end write racing the repair wins and the repair is skipped.

=========== ======================== ============================ ===================== ======
ours        our version at the point the new active now            repair                 case
=========== ======================== ============================ ===================== ======
live        live, CAS c              live, CAS c                  Set with CAS c         R1
live        none, or deleted (CAS c) none, or deleted with CAS c  Add                    R2
deleted     live, CAS c              live, CAS c                  Delete with CAS c      R3
deleted     none, or deleted         (anything)                   nothing: same outcome  R4
(any)       (any)                    anything else                nothing: changed since R5
=========== ======================== ============================ ===================== ======

Left to chance: in case R2 with a tombstone on the new active, a create and a delete landing
on it between its GetMeta and the Add would let the Add bring back a deleted document. The
window is one round trip, and the front end did write nothing it could not see.

This module decides; the replication link (``server/replication.py``) asks and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dcpkv.engine.item import Item


class RepairKind(Enum):
    SET = "set"  # CAS-checked replace of the version both histories share
    ADD = "add"  # the key existed on neither side at the point
    DELETE = "delete"  # CAS-checked delete of the version both histories share


@dataclass(frozen=True, slots=True)
class Meta:
    """What GetMeta tells of the new active's current version of a key."""

    cas: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class RepairWrite:
    kind: RepairKind
    key: bytes
    cas: int = 0  # the CAS the new active's copy must still have (SET, DELETE)
    value: bytes = b""
    flags: int = 0
    expiry: int = 0
    datatype: int = 0


def worth_asking(ours: Item, base: Item | None) -> bool:
    """Whether the new active's version can matter: not when both sides end deleted (R4)."""
    return not ours.deleted or (base is not None and not base.deleted)


def decide(ours: Item, base: Item | None, theirs: Meta | None) -> RepairWrite | None:
    """The write that repairs the new active with ``ours``, or None (see the table)."""
    if not worth_asking(ours, base):
        return None  # R4
    if not _unchanged_since_point(base, theirs):
        return None  # R5
    if ours.deleted:
        assert base is not None  # worth_asking: base is live
        return RepairWrite(RepairKind.DELETE, ours.key, cas=base.cas)  # R3
    value = ours.value or b""
    if base is not None and not base.deleted:
        return RepairWrite(
            RepairKind.SET, ours.key, base.cas, value, ours.flags, ours.expiry, ours.datatype
        )  # R1
    return RepairWrite(
        RepairKind.ADD, ours.key, 0, value, ours.flags, ours.expiry, ours.datatype
    )  # R2


def _unchanged_since_point(base: Item | None, theirs: Meta | None) -> bool:
    """Whether the new active still holds what we held at the rollback point."""
    if base is None:
        return theirs is None
    if theirs is None:
        # Our version at the point is on the shared history, so the new active had it too; a
        # tombstone may have been purged since, a live document not.
        return base.deleted
    return theirs.cas == base.cas and theirs.deleted == base.deleted
