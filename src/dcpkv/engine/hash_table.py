"""The hash table: every key's stored value in one vbucket, and what the table costs in memory.

Theory of operation
-------------------
A :class:`HashTable` maps a key to its *stored value* (kv_engine's StoredValue): the newest
version of the key the vbucket holds, an :class:`~dcpkv.engine.item.Item` that is never changed
in place (a write stores a new one), so a reader may hold an entry without a lock. A deleted key
stays as a tombstone until the deletion is persisted (the flusher and DCP send it), then goes
(:meth:`HashTable.discard`). Under memory pressure the bucket's *eviction policy*
(:class:`EvictionPolicy`, Couchbase's ``evictionPolicy``) says what of a persisted entry may
leave memory:

=============== ===============================================================================
valueOnly       its value (``value=None``, :meth:`HashTable.eject`), read back from storage when
                asked for; every key and its metadata stay
fullEviction    the whole entry (:meth:`HashTable.evict`): the key is *non-resident*, storage
                alone holds it, and the vbucket reads it back (:meth:`HashTable.restore`) before
                any write to a key the table does not hold
=============== ===============================================================================

The table keeps, by arithmetic on every change rather than by walking it:

========================= =====================================================================
``memory``                 the sum of :meth:`Item.size` over the entries (an ejected value
                           counts 0): the hash table's part of the vbucket's memory figure
``live``                   entries that are not tombstones
``nonresident``            live items storage holds that are not in the table (full eviction:
                           evicted, or never loaded by warm-up); ``live + nonresident`` is the
                           ``curr_items`` stat, exact as long as every write to a key the table
                           does not hold restores it first while ``nonresident`` is above 0
``len(table)``             entries, tombstones and ejected values included
``max_deleted_rev``        the highest rev seqno of a tombstone stored: a key created after its
                           tombstone left the table still gets a rev seqno above it
``may_expire``             set by every store of an item with an expiry, cleared by a walk of
                           :meth:`HashTable.expiring` that finds none (most buckets never use
                           expiry, and that walk visits every entry holding the GIL)
========================= =====================================================================

:data:`HT_ENTRY_OVERHEAD` is what an entry costs the process beyond ``Item.size()``; the bucket
adds it per entry to make its quota bound the process's memory.

Every change goes through :meth:`HashTable.store` (given the entry it replaces, which the
caller has just read) or a method built on it, so the counts have one place to be right. The
table has no lock of its own: its vbucket's lock guards every change, and a lookup in
``entries`` (the table's own dict, typed read-only; one lookup is atomic under the GIL) may be
made without it.

Committed and pending values: ``entries`` holds committed versions only. A synchronous write's
*prepare* (:class:`~dcpkv.engine.item.PrepareItem`) is a second stored value of its key, pending
until its durability requirement is met or it aborts, kept beside the committed one in
``prepared`` (:meth:`HashTable.store_prepare`, :meth:`HashTable.pop_prepare`, counted in
``memory``), never in its place: reads go on seeing the committed version in ``entries``, and
a vbucket's one admission check of writes (``VBucket._check_write``) refuses a second write to a
key with a prepare (SyncWriteInProgress).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from dcpkv.engine.item import ITEM_OVERHEAD, Item, PrepareItem


class EvictionPolicy(StrEnum):
    """What a bucket drops from memory under pressure (module docstring), by Couchbase's
    names for its ``evictionPolicy`` setting."""

    VALUE_ONLY = "valueOnly"
    FULL = "fullEviction"


# What a hash-table entry costs the process beyond Item.size() (ITEM_OVERHEAD + key + value),
# measured with tracemalloc and RSS deltas on CPython 3.11 (16-byte keys; bench/memory.py):
# the Item object is 120 bytes, not 96 (+24); the dict slot and index, ~48; the CAS and seqno
# ints, ~60; the key's and value's bytes headers with pymalloc's rounding, ~40 each; and the
# allocator's fragmentation once values are ejected and freed. Without it, a 64 MiB quota full
# of ejected small items held ~180 MiB of RSS (319 bytes/item against 112 charged). With it,
# the figure is ~1.2x the RSS growth for resident 16+100-byte items (the checkpoint charges the
# Item it shares with the hash table a second time) and ~0.8x for ejected ones: docs/server.md's
# margin (RSS growth <= 1.25x the quota + 16 MiB) covers the latter.
HT_ENTRY_OVERHEAD = 208

StoredValue = Item
"""What the table holds per key (kv_engine's name): one version of the key, never changed in
place. An entry is the Item itself, not a wrapper around it: a wrapper would cost every key an
object (~56 bytes) and every read a second lookup."""


class HashTable:
    """Key -> stored value, with the counts of the module docstring (not thread-safe: its
    vbucket's lock guards every change)."""

    __slots__ = (
        "_entries", "entries", "live", "max_deleted_rev", "may_expire", "memory", "nonresident",
        "prepared",
    )  # fmt: skip

    def __init__(self) -> None:
        self._entries: dict[bytes, StoredValue] = {}
        # Key -> entry, tombstones included: the same dict, typed read-only for everyone else.
        # Every request looks a key up here, and ``table.entries.get(key)`` costs what a dict's
        # get costs: a method around it would add a Python call, and a bound ``get`` kept in a
        # slot ~110 machine instructions per lookup (counted with callgrind).
        self.entries: Mapping[bytes, StoredValue] = self._entries
        self.memory = 0
        self.live = 0
        self.nonresident = 0
        self.max_deleted_rev = 0
        self.may_expire = False
        # Key -> its pending prepare (empty unless SyncWrites are in flight: writes test it
        # for truth only).
        self.prepared: dict[bytes, PrepareItem] = {}

    def store_prepare(self, prepare: PrepareItem) -> None:
        """Keep ``prepare`` beside its key's committed entry (the key has no prepare yet)."""
        assert prepare.key not in self.prepared, "one pending prepare per key"
        self.prepared[prepare.key] = prepare
        self.memory += prepare.size()

    def pop_prepare(self, key: bytes) -> PrepareItem | None:
        """Forget ``key``'s prepare (committed or aborted); returns it (None: none)."""
        prepare = self.prepared.pop(key, None)
        if prepare is not None:
            self.memory -= prepare.size()
        return prepare

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> list[StoredValue]:
        """A copy of the entries (the table may change while the caller walks it)."""
        return list(self._entries.values())

    def store(self, item: StoredValue, current: StoredValue | None) -> int:
        """Make ``item`` its key's entry in place of ``current``, the entry ``entries`` has
        just given for that key (None: none). Returns ``item.size()``, which a write also
        charges its checkpoint. Every write's hot path: no call made that can be saved."""
        key, value = item.key, item.value
        self._entries[key] = item
        size = ITEM_OVERHEAD + len(key) + (0 if value is None else len(value))
        deleted = item.deleted
        if current is None:
            self.memory += size
            self.live += not deleted
        else:  # minus current.size(): the same key, so only the values differ
            old = current.value
            self.memory += size - ITEM_OVERHEAD - len(key) - (0 if old is None else len(old))
            self.live += current.deleted - deleted
        if deleted and item.rev_seqno > self.max_deleted_rev:
            self.max_deleted_rev = item.rev_seqno
        if item.expiry:
            self.may_expire = True
        return size

    def replace(self, item: StoredValue) -> None:
        """:meth:`store` over whatever the key's entry is."""
        self.store(item, self._entries.get(item.key))

    def discard(self, item: StoredValue) -> None:
        """Remove ``item``'s key if ``item`` is still its entry (a persisted tombstone goes;
        a newer version of the key stays)."""
        if self._entries.get(item.key) is item:
            del self._entries[item.key]
            self.memory -= item.size()
            self.live -= not item.deleted

    def clear(self) -> None:
        """Forget every entry (a rollback reloads the table from storage). The counts restart;
        ``max_deleted_rev`` is kept: rev seqnos never go back."""
        self._entries.clear()
        self.prepared.clear()
        self.memory = self.live = self.nonresident = 0

    def eject(self, persisted_seqno: int, target_bytes: int | None = None) -> int:
        """Drop the values of live entries persisted at or below ``persisted_seqno`` (until
        ``target_bytes`` are freed, if given); returns the bytes freed."""
        freed = 0
        for item in list(self._entries.values()):
            if target_bytes is not None and freed >= target_bytes:
                break
            if item.deleted or item.value is None or item.by_seqno > persisted_seqno:
                continue
            freed += len(item.value)
            self.store(item.with_value(None), item)
        return freed

    def evict(self, persisted_seqno: int, target_bytes: int | None = None) -> int:
        """Full eviction: remove the entries persisted at or below ``persisted_seqno``, whole
        (until ``target_bytes`` are freed, if given), but those of keys with a pending prepare
        (its commit replaces the entry in place). Returns the bytes freed, each entry's
        :data:`HT_ENTRY_OVERHEAD` included. The oldest entries go first (the dict's order:
        a key's first store), and the walk stops at the target rather than copying the table."""
        freed, gone = 0, []
        prepared = self.prepared
        for item in self._entries.values():
            if target_bytes is not None and freed >= target_bytes:
                break
            if item.by_seqno > persisted_seqno or (prepared and item.key in prepared):
                continue
            gone.append(item)
            freed += item.size() + HT_ENTRY_OVERHEAD
        for item in gone:
            del self._entries[item.key]
            self.memory -= item.size()
            if not item.deleted:
                self.live -= 1
                self.nonresident += 1
        return freed

    def restore(self, item: StoredValue) -> None:
        """Put back ``item``, its key's version read from storage, for a key the table does
        not hold: a live one is no longer counted non-resident."""
        assert item.key not in self._entries, "restore only a key the table does not hold"
        self.store(item, None)
        if not item.deleted:
            self.nonresident -= 1

    def expiring(self) -> list[StoredValue]:
        """The live entries with an expiry (clears ``may_expire`` when there are none)."""
        if not self.may_expire:
            return []
        # Attribute tests, not an is_expired() call per item: the walk visits them all.
        found = [i for i in self._entries.values() if i.expiry and not i.deleted]
        self.may_expire = bool(found)
        return found
