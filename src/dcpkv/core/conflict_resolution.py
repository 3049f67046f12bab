"""Conflict resolution: whether a replicated (with-meta) write beats the local copy of its key.

Theory of operation
-------------------
XDCR writes a document into another cluster with the metadata it had at its source (CAS, rev
seqno, flags, expiry). Two clusters that both changed a key converge without a coordinator
because each side applies the same pure rule to the same pair of versions: the version with
the larger *tuple* wins, the other is refused (KeyExists). A bucket picks its mode once, at
creation (:class:`ConflictMode`):

* ``seqno`` (revision-based, the default): the rev seqno counts the key's changes, so the
  version changed more often wins; the CAS breaks ties;
* ``lww`` (timestamp, last write wins): the CAS is a hybrid logical clock (ns since the epoch,
  the low 16 bits a logical counter), so the later write wins; the rev seqno breaks ties.

The tuple compared depends on what the *incoming* write is:

============ ===================== ======================================================
mode         incoming              tuple compared (incoming against local, larger wins)
============ ===================== ======================================================
seqno        set / add             (rev seqno, cas, expiry, flags)
seqno        delete                (rev seqno, cas)
lww          set / add             (cas, rev seqno, expiry, flags)
lww          delete                (cas, rev seqno)
============ ===================== ======================================================

and the cases, in the order :func:`incoming_wins` checks them:

=== ======================================= ============================================
#   situation                               the incoming write...
=== ======================================= ============================================
1   no local copy (never written, purged)   wins
2   incoming tuple larger                   wins
3   incoming tuple smaller                  loses (KeyExists: "failed CR at target")
4   tie, incoming is a set/add with xattrs  wins (a copy that gained xattrs replaces one
    and the local copy has none             without: the only tie that moves a document)
5   any other tie (identical, a delete)     loses: an echo of a write the key already
                                            holds is refused, so bidirectional
                                            replication needs no loop marker
=== ======================================= ============================================

The rule reads a version through :class:`Version`: a :class:`Meta` (a replicator's view of a
GetMeta answer) or the engine's item itself, so a with-meta write compares the two versions
it holds without building anything. A local tombstone is a local copy like any other (its
rev seqno and CAS count), which is why the server reads a tombstone back from disk when the
hash table has dropped it. The rule is antisymmetric: of two versions with different tuples
exactly one beats the other (the table test and the property test in
``tests/core/test_conflict_resolution.py`` hold it to that).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class ConflictMode(StrEnum):
    SEQNO = "seqno"  # revision-based (the reference's default)
    LWW = "lww"  # timestamp: last write wins, the CAS as a hybrid logical clock


@dataclass(frozen=True, slots=True)
class Meta:
    """The metadata of one version of a key that conflict resolution looks at."""

    cas: int
    rev_seqno: int
    expiry: int = 0
    flags: int = 0
    deleted: bool = False
    xattrs: bool = False


class Version(Protocol):
    """What conflict resolution reads of one version of a key (:class:`Meta` has it all)."""

    @property
    def cas(self) -> int: ...
    @property
    def rev_seqno(self) -> int: ...
    @property
    def expiry(self) -> int: ...
    @property
    def flags(self) -> int: ...
    @property
    def deleted(self) -> bool: ...
    @property
    def xattrs(self) -> bool: ...


def resolution_key(mode: ConflictMode, meta: Version, *, delete: bool) -> tuple[int, ...]:
    """The tuple compared when the incoming write is a delete (``delete``) or a set/add."""
    first, second = (meta.rev_seqno, meta.cas) if mode is ConflictMode.SEQNO else (
        meta.cas, meta.rev_seqno,
    )  # fmt: skip
    if delete:
        return (first, second)
    return (first, second, meta.expiry, meta.flags)


def incoming_wins(mode: ConflictMode, incoming: Version, local: Version | None) -> bool:
    """Whether ``incoming`` replaces ``local`` (None: the key has no copy here); the cases
    of the module docstring, in order."""
    if local is None:
        return True
    theirs = resolution_key(mode, incoming, delete=incoming.deleted)
    ours = resolution_key(mode, local, delete=incoming.deleted)
    if theirs != ours:
        return theirs > ours
    return not incoming.deleted and incoming.xattrs and not local.xattrs
