"""Items (documents and tombstones) and the errors an engine operation can end in.

Theory of operation
-------------------
An :class:`Item` is one *version* of a document: the key, the value and the metadata that
travel with it on the wire (flags, expiry, CAS, rev seqno, by seqno, datatype) and on disk.
A deletion is an item too, a *tombstone*: ``deleted`` is set, the value is empty and
``delete_time`` says when it happened (compaction purges tombstones by age or seqno).
``expired`` marks a tombstone created by expiry, so a DCP producer can send an Expiration
rather than a Deletion.

Items are treated as immutable once they have been given a seqno: the hash table, the write
queue (checkpoints) and a DCP snapshot may all hold the same object, so a change makes a new
item (:meth:`Item.evolve`) rather than editing one in place. The only exception is the value
of an item that is already persisted: ejecting it builds a copy with ``value=None`` for the
hash table and leaves the write queue's copy alone.

Every failure of an engine operation is an :class:`EngineError` whose ``status`` is the
memcached status the server answers with (see ``PROTOCOL.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpkv.core.errors import DcpkvError
from dcpkv.core.status import Status
from dcpkv.protocol.constants import Datatype

_XATTR = int(Datatype.Xattr)
# Fixed per-item overhead in the memory accounting: object header, slots and dict entry.
ITEM_OVERHEAD = 96


@dataclass(slots=True)
class Item:
    """One version of a document (or a tombstone when ``deleted``); changed by copying
    (``dataclasses.replace``), never in place."""

    key: bytes
    value: bytes | None = b""  # None: ejected, not resident in memory (read it from storage)
    flags: int = 0
    expiry: int = 0  # absolute unix seconds, 0 = never
    cas: int = 0
    rev_seqno: int = 0
    by_seqno: int = 0
    datatype: int = 0
    deleted: bool = False
    delete_time: int = 0
    expired: bool = False  # a tombstone made by expiry (DCP Expiration rather than Deletion)

    @property
    def resident(self) -> bool:
        return self.value is not None

    @property
    def xattrs(self) -> bool:
        """Whether the value carries xattrs (what conflict resolution reads of the datatype:
        an item is a :class:`~dcpkv.core.conflict_resolution.Version`)."""
        return bool(self.datatype & _XATTR)

    def size(self) -> int:
        """Bytes this item is charged for in the memory accounting."""
        return ITEM_OVERHEAD + len(self.key) + (len(self.value) if self.value is not None else 0)

    def with_value(self, value: bytes | None) -> Item:
        """This version with another value (None: ejected), built positionally: a memory
        reclaim ejects many values at once, and ``dataclasses.replace`` costs ~5x more."""
        return Item(
            self.key, value, self.flags, self.expiry, self.cas, self.rev_seqno, self.by_seqno,
            self.datatype, self.deleted, self.delete_time, self.expired,
        )  # fmt: skip

    def placed(self, by_seqno: int, cas: int) -> Item:
        """This version at ``by_seqno`` with ``cas`` (a with-meta write taking its local
        seqno), built positionally like :meth:`with_value`."""
        return Item(
            self.key, self.value, self.flags, self.expiry, cas, self.rev_seqno, by_seqno,
            self.datatype, self.deleted, self.delete_time, self.expired,
        )  # fmt: skip

    def is_expired(self, now: int) -> bool:
        return not self.deleted and self.expiry != 0 and self.expiry <= now


@dataclass(slots=True)
class SyncWriteItem(Item):
    """An item of a synchronous write's own namespace (kv_engine's "prepared" namespace): it
    is never a key's committed version, never deduplicates a committed item nor is deduplicated
    by one, and a reader, a front-end request or a DCP consumer without SyncWrites never sees
    it."""


@dataclass(slots=True)
class PrepareItem(SyncWriteItem):
    """A durable write waiting for its durability requirement: the value (or, ``deleted``, the
    deletion) it will commit, with its own seqno; ``level`` is its DurabilityLevel (1..3)."""

    level: int = 1


@dataclass(slots=True)
class AbortItem(SyncWriteItem):
    """The end of the prepare at ``prepared_seqno``, which never became visible."""

    prepared_seqno: int = 0


@dataclass(slots=True)
class CommitItem(Item):
    """The committed version a prepare became: a plain mutation or deletion of its key (what a
    reader and a consumer without SyncWrites see), with its own seqno and CAS, and the
    ``prepared_seqno`` it commits (what a DcpCommit carries)."""

    prepared_seqno: int = 0


class EngineError(DcpkvError):
    """An operation the engine refused; ``status`` is the memcached status to answer."""

    status: Status = Status.Einternal


class KeyNotFound(EngineError):
    status = Status.KeyEnoent


class KeyExists(EngineError):
    """CAS mismatch, or Add on a key that exists."""

    status = Status.KeyEexists


class NotStored(EngineError):
    status = Status.NotStored


class DeltaBadval(EngineError):
    status = Status.DeltaBadval


class NotMyVbucket(EngineError):
    status = Status.NotMyVbucket


class TempFail(EngineError):
    """Memory is full and nothing could be freed; the client should retry later."""

    status = Status.Etmpfail


class TooBig(EngineError):
    status = Status.E2big


class Einval(EngineError):
    status = Status.Einval


class DurabilityImpossible(EngineError):
    """A durable write the vbucket cannot satisfy: no topology set, or too few nodes in it."""

    status = Status.DurabilityImpossible


class MissingPrepare(Einval):
    """A replicated commit or abort of a prepare this replica does not hold (lost to a local
    rollback that landed between the prepare and its completion, say): the replica must roll
    back below ``prepared_seqno`` and stream it again."""

    def __init__(self, message: str, prepared_seqno: int) -> None:
        super().__init__(message)
        self.prepared_seqno = prepared_seqno


class SyncWriteInProgress(EngineError):
    """A write to a key whose prepare is pending (the client retries later)."""

    status = Status.SyncWriteInProgress


class SyncWriteReCommitInProgress(EngineError):
    """A read of a key whose prepare a newly promoted active is re-committing: the prepare may
    have been committed by the old active, so neither version may be served yet."""

    status = Status.SyncWriteReCommitInProgress


ERRORS: tuple[type[EngineError], ...] = (
    KeyNotFound,
    KeyExists,
    NotStored,
    DeltaBadval,
    NotMyVbucket,
    TempFail,
    TooBig,
    Einval,
    DurabilityImpossible,
    SyncWriteInProgress,
    SyncWriteReCommitInProgress,
)
