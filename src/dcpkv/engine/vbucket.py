"""A vbucket: the memcached operations, seqnos, the write queue, the vbucket state.

Theory of operation
-------------------
A vbucket owns the in-memory state of one partition and composes it into operations:

* ``state`` - which operations it accepts (table below);
* the *hash table* (:class:`~dcpkv.engine.hash_table.HashTable`): every key's newest version,
  tombstones until persisted, ejected values, and what the table costs in memory;
* ``high_seqno`` - every accepted mutation gets the next seqno, a new CAS from the vbucket's
  hybrid logical clock, and rev seqno + 1, and is queued in the :class:`CheckpointManager`;
* the failover table, the persisted seqno and snapshot, the purge seqno.

One way for a write: every front-end write passes the one admission check
(:meth:`VBucket._check_write`: the state, the sizes, the bucket's memory quota and disk), reads
the key's entry in one place (:meth:`VBucket._live`, which expires it if due) and ends in the
one core (:meth:`VBucket._put`, or :meth:`VBucket._queue` for a version built elsewhere: a
tombstone, an edit, a replica's mutation), which stores it in the table and queues it. The
server's request fast path calls the same :meth:`VBucket.set`; a Get answered from memory is
:meth:`VBucket.get_resident`, the first step of :meth:`VBucket.get`.

A replica's mutations arrive with their seqno, CAS and rev seqno already set by the active
vbucket (:meth:`VBucket.set_with_meta`, :meth:`VBucket.delete_with_meta`) inside snapshot
markers (:meth:`VBucket.replica_snapshot_marker`); they are stored as they are, up to
``SEQNO_MAX`` (``core/seqno.py``): a seqno, rev seqno or snapshot end beyond it is refused
(Einval), and so is a front-end write that would get one.

========== ================= ============================ =====================================
state      front-end ops     replica ops (with_meta)      on becoming active
========== ================= ============================ =====================================
active     yes               NotMyVbucket                 -
replica    NotMyVbucket      yes                          new failover entry at the high seqno
pending    NotMyVbucket      yes                          new failover entry at the high seqno
dead       NotMyVbucket      NotMyVbucket                 new failover entry at the high seqno
========== ================= ============================ =====================================

Every state may move to every other; refusals raise :class:`NotMyVbucket`. A pending vbucket
made active by a rebalance takeover (``transfer``) keeps the failover log it was handed.

Expiry follows memcached: an expiry of 0 never expires, up to 30 days (2,592,000 s) is relative
to now, anything larger is absolute unix time. An expired item is gone when next touched (and
an expiration is queued as a deletion, so DCP sends it) or when :meth:`VBucket.expiry_pager`
walks the table. Only an active vbucket expires items: a replica waits for the active's
expiration to arrive.

SyncWrites (PROTOCOL.md, "SyncWrites"). A front-end write run through :meth:`VBucket.sync_write`
takes the one write path as any other, but its new version becomes a *prepare*
(:class:`~dcpkv.engine.item.PrepareItem`) with its own seqno, kept beside the key's committed
entry (``hash_table.prepared``) and queued for the flusher, never seen by a reader. The
vbucket's :class:`~dcpkv.engine.durability_monitor.ActiveDurabilityMonitor` decides when it
commits or aborts, and the vbucket acts on each decision in order (:meth:`VBucket._resolve`):

=============================== ===============================================================
decision                        what the vbucket does
=============================== ===============================================================
Commit                          queues a :class:`~dcpkv.engine.item.CommitItem` (next seqno, a
                                new CAS, the prepare's value or deletion): the key's committed
                                entry; the client gets Success with it
Abort (timeout, impossible)     queues an :class:`~dcpkv.engine.item.AbortItem` (next seqno);
                                the committed entry is untouched; the client gets
                                SyncWriteAmbiguous
Ambiguous                       the client gets SyncWriteAmbiguous (its prepare waits its turn)
=============================== ===============================================================

Answers go to ``on_sync_outcomes`` (:class:`SyncOutcome`, a cookie the caller chose). The
monitor exists once :meth:`VBucket.set_topology` gave the active vbucket a topology; without
one (or with one that cannot reach a majority) a durable write is refused with
DurabilityImpossible before anything is queued. Any write to a key with a pending prepare is
refused with SyncWriteInProgress (in :meth:`VBucket._check_write`). The flusher's progress
(:meth:`VBucket.mark_persisted`) and :meth:`VBucket.durability_tick` (the server calls it
periodically: timeouts) feed the monitor. Leaving the active state answers every waiting client
SyncWriteAmbiguous and keeps the prepares, with no timeout, in a passive monitor (as do
prepares read back at warm-up): a later topology on an active vbucket re-commits them once
satisfied. Until then such a prepare is *maybe visible* (the old active may have committed it):
a read of its key (Get, a sub-document lookup) answers SyncWriteReCommitInProgress, a write
SyncWriteInProgress. A client's own pending prepare hides nothing: readers see the committed
value. :attr:`VBucket.high_prepared_seqno` is what a failover compares. A *pending* vbucket
(a rebalance's new copy) may be given the topology it takes when a takeover makes it active
(:meth:`VBucket.set_takeover_topology`). :meth:`VBucket.seqno_acknowledged` feeds a replica's
acknowledgement (its DCP consumer_name and high prepared seqno) to the monitor.

On a replica, a SyncWrite DCP stream's prepares, commits and aborts arrive through
:meth:`VBucket.replica_prepare`, :meth:`VBucket.replica_commit` and
:meth:`VBucket.replica_abort` (the active's seqnos and CAS kept), tracked by the passive
monitor; :meth:`VBucket.replica_snapshot_end` and the flusher's progress move the replica's
high prepared seqno, and :meth:`VBucket.take_seqno_ack` hands the acknowledgement due to the
consumer (``on_seqno_ack`` says one is). In a disk snapshot, a committed version of a key whose
prepare the replica holds completes that prepare (its commit was deduplicated into it).

Full eviction (the bucket's ``eviction`` policy, ``hash_table.EvictionPolicy``): a persisted
entry may leave the table whole, and warm-up loads none. While the table counts such
*non-resident* items (``hash_table.nonresident``), a key the table does not hold may still be
on disk: every write reads it back into the table first (:meth:`VBucket._live`,
:meth:`VBucket._entry`), so a CAS, an Add, a Replace, a rev seqno and the item count see it; a
Get answers from storage without putting it back (reads do not grow memory), and GetMeta reads
storage for any key the table lacks. ``len(vbucket)`` (``curr_items``) is the table's live
entries plus the non-resident ones, and every flush writes it with the vbucket state
(``VBState.item_count``): what warm-up starts from. Flush (:meth:`VBucket.delete_all`) deletes
the non-resident keys too, from a scan of storage.

Background fetches (:mod:`dcpkv.engine.bg_fetch`): every front-end read of storage (a
non-resident key, an ejected value) goes through :meth:`VBucket._stored`. With a fetcher
running (``background_fetch``, the server's case) it reads nothing: a result a background
fetch made ready is used, a key storage's filters rule out is None, anything else raises
WouldBlock before the request changed anything, and the caller runs the request again once
the fetch landed (:meth:`VBucket.wait_for`). Without one (the engine alone, tests, tools) it
reads at once. A replica's with-meta writes and commits wait the same way (the replication
link's shell parks the DCP message and those behind it); a durability monitor's commit on the
active reads at once (its decision may come from the flusher's thread, which cannot wait).

Threads: all state is guarded by one re-entrant lock, shared with the checkpoint manager, so
the flusher thread can take and acknowledge batches while the event loop serves requests. No
storage call is made under the lock but a filter probe (``may_exist``, in memory), and, with
no fetcher, a write's read of a non-resident key (full eviction). A value fetch for an ejected
item, and a Get's read of a non-resident key, happen between two short critical sections.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from dcpkv.core import conflict_resolution as cr
from dcpkv.core.failover_table import FailoverEntry, FailoverTable
from dcpkv.core.replication_topology import ReplicationTopology
from dcpkv.core.seqno import SEQNO_MAX
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState
from dcpkv.engine import document
from dcpkv.engine import durability_monitor as dm
from dcpkv.engine.bg_fetch import PendingFetches, WouldBlock
from dcpkv.engine.checkpoint import DEFAULT_CHECKPOINT_MAX_ITEMS, CheckpointManager
from dcpkv.engine.hash_table import EvictionPolicy, HashTable
from dcpkv.engine.hlc import Clock, HybridLogicalClock
from dcpkv.engine.item import (
    ITEM_OVERHEAD,
    AbortItem,
    CommitItem,
    DeltaBadval,
    DurabilityImpossible,
    Einval,
    Item,
    KeyExists,
    KeyNotFound,
    MissingPrepare,
    NotMyVbucket,
    NotStored,
    PrepareItem,
    SyncWriteInProgress,
    SyncWriteReCommitInProgress,
    TempFail,
    TooBig,
)
from dcpkv.engine.storage import VBState
from dcpkv.protocol.constants import DurabilityLevel

RELATIVE_EXPIRY_LIMIT = 30 * 24 * 3600
NO_CREATE = 0xFFFFFFFF  # incr/decr expiry meaning "do not create a missing counter"
MAX_KEY_LENGTH = 250
DEFAULT_MAX_ITEM_SIZE = 20 * 1024 * 1024
U64 = 1 << 64
_FLUSH_ALL = 1 << 62
_DROPPED_KEPT = 100_000  # dropped tombstones remembered per vbucket (then: always read)


_REPLICA_PATH = (VBucketState.REPLICA, VBucketState.PENDING)
_XATTR = document.XATTR
_ACTIVE = VBucketState.ACTIVE
_NOT_READY = object()  # (get_nonresident: a key with no ready background fetch)

Fetcher = Callable[[int, bytes], Item | None]
KeyFilter = Callable[[int, bytes], bool]  # False: storage surely lacks the key (no I/O)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    """The answer a client waiting on a SyncWrite gets: ``status`` Success with ``item`` (the
    commit: its CAS and seqno), or SyncWriteAmbiguous (``item`` None)."""

    cookie: object
    status: Status
    item: Item | None = None


@dataclass(frozen=True, slots=True)
class _SyncRequest:
    level: DurabilityLevel
    timeout_ms: int | None
    cookie: object


class Edit(Protocol):
    """What :meth:`VBucket.edit` stores."""

    value: bytes
    datatype: int
    flags: int
    deleted: bool


Editor = Callable[[Item | None, int, int], Edit]
Admitter = Callable[[int], None]


def absolute_expiry(exptime: int, now: float) -> int:
    """memcached's rule: 0 never, <= 30 days relative to now, otherwise absolute."""
    if exptime == 0:
        return 0
    if exptime <= RELATIVE_EXPIRY_LIMIT:
        return int(now) + exptime
    return exptime


def parse_counter(value: bytes) -> int:
    if not value or len(value) > 20 or not value.isdigit():
        raise DeltaBadval("value is not an unsigned 64-bit decimal number")
    number = int(value)
    if number >= U64:
        raise DeltaBadval("value is not an unsigned 64-bit decimal number")
    return number


@dataclass(slots=True)
class FlushBatch:
    """What the flusher writes for one vbucket: items and the state to write with them."""

    vb: int
    items: list[Item]
    vbstate: VBState


class VBucket:
    """One partition's in-memory state and operations (see the module docstring)."""

    def __init__(
        self,
        vbid: int,
        state: VBucketState,
        *,
        clock: Clock,
        failover: FailoverTable,
        high_seqno: int = 0,
        max_cas: int = 0,
        purge_seqno: int = 0,
        persisted_snapshot: tuple[int, int] = (0, 0),
        checkpoint_max_items: int = DEFAULT_CHECKPOINT_MAX_ITEMS,
        max_item_size: int = DEFAULT_MAX_ITEM_SIZE,
        fetch: Fetcher | None = None,
        admit: Admitter | None = None,
        eviction: EvictionPolicy = EvictionPolicy.VALUE_ONLY,
        high_prepared_seqno: int = 0,
        high_completed_seqno: int = 0,
        may_exist: KeyFilter | None = None,
    ) -> None:
        self.id = vbid
        self.state = VBucketState(state)
        self.lock = threading.RLock()
        self.clock = clock
        self.hlc = HybridLogicalClock(clock, max_cas)
        self.failover = failover
        self.checkpoints = CheckpointManager(
            high_seqno, max_items=checkpoint_max_items, lock=self.lock
        )
        self.persisted_seqno = high_seqno
        self.persisted_snapshot = persisted_snapshot
        self.replica_snapshot = persisted_snapshot
        self.purge_seqno = purge_seqno
        self.max_item_size = max_item_size
        self._fetch = fetch
        self._may_exist = may_exist
        self._admit = admit
        # Background fetches (engine/bg_fetch.py): when set (a fetcher thread runs), a
        # front-end request that must read storage raises WouldBlock instead of reading here;
        # the pending reads, and the results its requests' re-runs use; who hears of a key
        # newly wanted (under the lock: take note only).
        self.background_fetch = False
        self.fetches = PendingFetches()
        self.on_fetch_wanted: Callable[[VBucket], None] | None = None
        self.eviction = eviction
        self.hash_table = HashTable()  # changed only under ``lock``
        self._state_dirty = True
        self._unacked: FlushBatch | None = None
        # How many times this vbucket's history was rolled back (reset): a DCP stream opened
        # before a rollback carries the old history and must end (kv_engine's Rollback end).
        self.rollbacks = 0
        # Called (under the lock, so it must only take note) with the vbucket id after every
        # item queued for DCP; the bucket fans it out to its listeners and notes the vbucket
        # for its flusher.
        self.on_queued: Callable[[int], None] | None = None
        # Someone waits on this vbucket's disk: a prepare that must be persisted before it can
        # be acknowledged (levels 2 and 3 on the active, level 3 on a replica). The bucket
        # flushes at its flusher's next tick rather than letting a sparse backlog gather.
        self.on_persistence_wanted: Callable[[], None] | None = None
        # Called (under the lock) with the vbucket id when the state or failover table must
        # be written without any item queued: the flusher visits only vbuckets noted by one
        # of the two hooks (a new vbucket starts dirty: its creator notes it).
        self.on_dirty: Callable[[int], None] | None = None
        # SyncWrites (module docstring): the active's monitor once a topology is set; the
        # prepares kept while there is none (after a step-down, or read back at warm-up);
        # the durable request being written (the one write path reads it); where answers go.
        self.durability: dm.ActiveDurabilityMonitor | None = None
        self.passive_durability: dm.PassiveDurabilityMonitor | None = None
        self.durability_timeout_ms = dm.DEFAULT_TIMEOUT_MS
        self._sync: _SyncRequest | None = None
        self._takeover_topology: ReplicationTopology | None = None
        # Replicas' acks that came before the topology (a restarted active's replicas ack the
        # prepares it read back as soon as their streams reopen; the manager's topology comes
        # later, and they will not ack the same prepares again): the monitor gets them.
        self._early_acks: dict[str, int] = {}
        self.on_sync_outcomes: Callable[[int, list[SyncOutcome]], None] | None = None
        # A replica's side (replica_prepare ...): whether the snapshot being received is a
        # disk one, the last snapshot end told to the passive monitor, the high prepared seqno
        # to acknowledge to the active (taken by the DCP consumer), and the hook that tells it
        # one is due (under the lock, from the loop or the flusher thread: take note only).
        self._replica_disk = False
        self._replica_snapshot_ended = 0
        self._seqno_ack_due: int | None = None
        # The high prepared seqno persisted with the state (storage's VBState): what a
        # restarted copy reports, and acknowledges once its stream reopens, before any prepare
        # arrives (a failover compares it: a copy reporting 0 might lose to one holding less).
        self._stored_hps = min(high_prepared_seqno, high_seqno)
        # The completions queued and not yet persisted, (their seqno, their prepare's seqno) in
        # seqno order, and the high completed seqno persisted (a disk snapshot's, in its V2
        # marker; a restarted copy's)
        self._completions: deque[tuple[int, int]] = deque()
        self._stored_hcs = high_completed_seqno
        self.on_seqno_ack: Callable[[int], None] | None = None
        # How a with-meta write is judged against the local copy (the bucket's setting)
        self.conflict_mode = cr.ConflictMode.SEQNO
        # Hashes of the keys whose persisted tombstones left the table (None: unknown, after
        # a warm-up or a rollback, or too many to keep): a with-meta write of a key absent
        # from the table reads storage only when it may find a tombstone there.
        self._dropped: set[int] | None = set() if high_seqno == 0 else None

    # -- reading the state ----------------------------------------------------------------

    @property
    def high_seqno(self) -> int:
        return self.checkpoints.high_seqno

    @property
    def uuid(self) -> int:
        return self.failover.latest_uuid

    @property
    def memory_used(self) -> int:
        return self.hash_table.memory + self.checkpoints.memory_used

    @property
    def holds_prepares(self) -> bool:
        """Whether a prepare is pending here (on an active: a SyncWrite's client may wait on
        its replicas' acks). O(1), read without the lock (a hint)."""
        return bool(self.hash_table.prepared)

    @property
    def table_entries(self) -> int:
        """Entries in the hash table, tombstones and ejected items included (O(1))."""
        return len(self.hash_table)

    def __len__(self) -> int:
        """Live (not deleted) keys, resident or not (O(1)): the ``curr_items`` stat."""
        return self.hash_table.live + self.hash_table.nonresident

    def peek(self, key: bytes) -> Item | None:
        """The hash table's entry for a key, whatever the state, tombstones included."""
        with self.lock:
            return self.hash_table.entries.get(key)

    def get_meta(self, key: bytes) -> Item | None:
        """The key's current version, tombstones included (GetMeta): the hash table's entry,
        else what disk holds (a persisted tombstone leaves the table). The value may be None
        (ejected): GetMeta answers metadata only."""
        with self.lock:
            self._require_active()
            item = self.hash_table.entries.get(key)
        if item is None and self._fetch is not None:
            item = self._stored(key)
        return item

    def items(self) -> list[Item]:
        with self.lock:
            return self.hash_table.values()

    # -- front-end operations (active only) ---------------------------------------------------

    def get(self, key: bytes) -> Item:
        """The key's live version with its value (read back from storage if it was ejected)."""
        item = self.get_resident(key)
        if item is not None:
            return item
        self._ensure_resident(key)
        read, stored = self._read_nonresident(key)
        with self.lock:
            self._require_active()
            self._check_re_commit(key)
            if read and key not in self.hash_table.entries:
                # Storage's version, read as the table did not hold the key (nor does now):
                # answered, not put back. An expired one is expired by the path below.
                if stored is None or stored.deleted:
                    raise KeyNotFound("no such key")
                if not stored.is_expired(int(self.clock.time())):
                    return stored
            return self._resident_or_fail(self._live_or_fail(key))

    def _read_nonresident(self, key: bytes) -> tuple[bool, Item | None]:
        """Full eviction: (True, storage's version of ``key``, or None) when the table does
        not hold the key and may have evicted it; (False, None) without a read otherwise."""
        table = self.hash_table
        if self._fetch is None or not table.nonresident or key in table.entries:
            return False, None
        if self.state is not _ACTIVE:
            return False, None  # refused under the lock: no read for it
        return True, self._stored(key)

    def get_resident(self, key: bytes) -> Item | None:
        """The first step of :meth:`get`, for a key whose value is in memory and due to
        stay: its live item, or None when the other steps are needed (a fetch from storage, an
        expiry to apply, a refusal to make), which this one has not taken. A definite miss (no
        key, a tombstone) raises KeyNotFound as :meth:`get` does. Lock-free: one read of the
        table (atomic under the GIL) of an item that is never changed in place."""
        if self.state is not _ACTIVE:
            return None
        if self.hash_table.prepared and key in self.hash_table.prepared:
            return None  # maybe being re-committed: :meth:`get` asks under the lock
        item = self.hash_table.entries.get(key)
        if item is None or item.deleted:
            if item is None and self.hash_table.nonresident:
                return None  # maybe evicted: :meth:`get` reads storage
            raise KeyNotFound("no such key")
        if item.value is None or (item.expiry and item.expiry <= int(self.clock.time())):
            return None
        return item

    def get_nonresident(self, key: bytes) -> Item | None:
        """The steps of :meth:`get` that answer a key the table does not hold under full
        eviction without a read, for a key :meth:`get_resident` declined: storage's version
        when a background fetch made it ready (its requests are running again), or a miss
        when storage's filters rule the key out; None when the other steps are needed (a read
        to wait for, a failed one, an expiry to apply, a prepare, a refusal to make). A miss
        (none, a tombstone) raises KeyNotFound as :meth:`get` does. Lock-free, as
        :meth:`get_resident`: ready results are made and consumed on this thread (another
        one only drops some, one atomic dict operation each)."""
        if self.state is not _ACTIVE or not self.background_fetch:
            return None
        table = self.hash_table
        if key in table.entries or not table.nonresident or key in table.prepared:
            return None
        ready = self.fetches.ready
        found = ready.get(key, _NOT_READY) if ready else _NOT_READY
        if found is _NOT_READY:
            if self._may_exist is None or self._may_exist(self.id, key):
                return None
            raise KeyNotFound("no such key")
        if found is None or (isinstance(found, Item) and found.deleted):
            raise KeyNotFound("no such key")
        if not isinstance(found, Item) or found.is_expired(int(self.clock.time())):
            return None
        return found

    def set(
        self, key: bytes, value: bytes, flags: int = 0, expiry: int = 0, datatype: int = 0, *,
        cas: int = 0,
    ) -> Item:  # fmt: skip
        """memcached's Set: store ``value`` over whatever version the key has (with a ``cas``,
        only over that version). Every Set takes this path, the server's fast path's too, so
        its common case makes no call it can spare (:meth:`_resident_if_xattrs` and
        :meth:`_expiry` are inlined; the fast path passes flags, expiry and datatype by
        position, ~40 ns less than by keyword)."""
        # A racy peek: the write reads the entry again under the lock.
        peek = self.hash_table.entries.get(key)
        if peek is not None and peek.value is None and peek.datatype & _XATTR:
            self._ensure_resident(key)
        with self.lock:
            self._check_write(key, value)
            current = self._live(key)
            if cas:
                _check_cas(current, cas)
            if current is not None and current.datatype & _XATTR:
                value, datatype = self._keep_system_xattrs(current, value, datatype)
            if expiry:
                expiry = absolute_expiry(expiry, self.clock.time())
            return self._put(key, value, flags, expiry, datatype, current)

    def add(
        self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0
    ) -> Item:
        with self.lock:
            self._check_write(key, value)
            if self._live(key) is not None:
                raise KeyExists("key exists")
            return self._put(key, value, flags, self._expiry(expiry), datatype, None)

    def replace(
        self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, cas: int = 0,
        datatype: int = 0,
    ) -> Item:  # fmt: skip
        self._resident_if_xattrs(key)
        with self.lock:
            self._check_write(key, value)
            current = self._live_or_fail(key)
            _check_cas(current, cas)
            if current.datatype & _XATTR:
                value, datatype = self._keep_system_xattrs(current, value, datatype)
            return self._put(key, value, flags, self._expiry(expiry), datatype, current)

    def delete(self, key: bytes, *, cas: int = 0) -> Item:
        self._resident_if_xattrs(key)
        with self.lock:
            self._check_write(key, b"")
            current = self._live_or_fail(key)
            _check_cas(current, cas)
            return self._tombstone(current, expired=False)

    def delete_all(self, stored: Callable[[], Iterable[Item]] | None = None) -> int:
        """memcached's Flush of this active vbucket: every live key gets a tombstone through
        the one write path (admission, a seqno, the checkpoint: DCP and the flusher see each
        deletion; an expired key gets its expiration instead); returns the deletions made.

        Two passes. The table's keys first; then, while the table counts non-resident items
        (full eviction), the live items storage holds: ``stored`` opens a scan of them (values
        included), called only once the first pass is done. A scanned key is deleted only if
        the table neither holds it nor held it in the first pass: the table's entry (a
        tombstone) is newer, and a tombstone the flusher persisted and dropped meanwhile may
        be newer than the scan's view. Any other key the table lacks was persisted and
        evicted before the scan opened, so the scan has its newest version. Reads happen
        here, on the caller's thread, never through a background fetch (an admin operation,
        O(items) anyway); each key is one short critical section."""
        held = set()
        deleted = 0
        for item in self.items():
            held.add(item.key)
            if not item.deleted:
                with self.lock:
                    deleted += self._delete_for_flush(item.key, None)
        if stored is None or self._fetch is None or not self.hash_table.nonresident:
            return deleted
        entries = self.hash_table.entries
        for item in stored():
            if item.key not in held and item.key not in entries:
                with self.lock:
                    deleted += self._delete_for_flush(item.key, item)
        return deleted

    def _delete_for_flush(self, key: bytes, scanned: Item | None) -> bool:
        """Delete ``key`` for :meth:`delete_all` (under the lock): its entry, else ``scanned``
        (or, for a key evicted since the first pass listed it, storage's version read now)
        put back first so the count moves from non-resident to deleted."""
        self._check_write(key, b"")  # (admitting may evict: the entry is read after it)
        table = self.hash_table
        item = table.entries.get(key)
        if item is None:
            if not table.nonresident or self._fetch is None:
                return False
            item = scanned if scanned is not None else self._fetch(self.id, key)
            if item is None or item.deleted:
                return False
            table.restore(item)
        if item.deleted:
            return False
        if item.value is None and item.datatype & _XATTR and self._fetch is not None:
            # An ejected value with xattrs: the tombstone keeps its system ones
            read = self._fetch(self.id, key)
            if read is not None and read.by_seqno == item.by_seqno:
                table.store(item.with_value(read.value), item)
        live = self._live(key)  # (expires it now if due)
        if live is None:
            return False
        self._tombstone(live, expired=False)
        return True

    def read_any(self, key: bytes) -> Item | None:
        """The document with its value, live or deleted (a tombstone still in memory, else the
        persisted one), or None: what sub-document lookups read."""
        stored = self._stored_for_edit(key)
        with self.lock:
            self._require_active()
            self._check_re_commit(key)
            return self._current_for_edit(key, stored)

    def edit(self, key: bytes, change: Editor, *, expiry: int = 0) -> Item:
        """One atomic read-modify-write: ``change(current, cas, seqno)`` sees the document
        (live, a tombstone, or None) and the CAS and seqno the write will get, and returns
        what to store (a sub-document mutation: :mod:`dcpkv.engine.subdoc`). It raises to
        store nothing."""
        stored = self._stored_for_edit(key)
        with self.lock:
            self._require_active()
            current = self._current_for_edit(key, stored)
            cas, seqno = self.hlc.next_cas(), self.checkpoints.high_seqno + 1
            rev = self._next_rev(key)
            if seqno > SEQNO_MAX or rev > SEQNO_MAX:
                raise self._beyond_seqno_max(seqno, rev)
            out = change(current, cas, seqno)
            self._check_write(key, out.value)
            deleted = out.deleted
            item = Item(
                key, out.value, out.flags, 0 if deleted else self._expiry(expiry), cas,
                rev, seqno, out.datatype, deleted,
                int(self.clock.time()) if deleted else 0,
            )  # fmt: skip
            # (_entry: admitting the write may have evicted the entry read above)
            return self._queue(item, self._entry(key))

    def _stored_for_edit(self, key: bytes) -> Item | None:
        """The persisted version, read outside the lock, when memory may not have the value:
        the key is absent (a purged-from-memory tombstone) or its value was ejected."""
        current = self.hash_table.entries.get(key)
        if self._fetch is None or (current is not None and current.value is not None):
            return None
        return self._stored(key)

    def _current_for_edit(self, key: bytes, stored: Item | None) -> Item | None:
        live = self._live(key)  # expires it now if due
        current = live if live is not None else self.hash_table.entries.get(key)
        if current is None:
            return stored if stored is not None and stored.deleted else None
        if current.value is None:
            if stored is None or stored.by_seqno != current.by_seqno:
                raise TempFail("value not resident, retry")
            return current.with_value(stored.value)
        return current

    def append(self, key: bytes, value: bytes, *, cas: int = 0) -> Item:
        return self._concat(key, value, cas, append=True)

    def prepend(self, key: bytes, value: bytes, *, cas: int = 0) -> Item:
        return self._concat(key, value, cas, append=False)

    def _concat(self, key: bytes, value: bytes, cas: int, *, append: bool) -> Item:
        self._ensure_resident(key)
        with self.lock:
            self._check_write(key, value)
            current = self._live(key)
            if current is None:
                raise NotStored("append/prepend to a missing key")
            _check_cas(current, cas)
            old = self._resident_or_fail(current).value or b""
            datatype = current.datatype
            if datatype & document.SHAPED:  # the body grows; the xattrs stay in front
                doc = document.unpack(old, datatype)
                doc.body = doc.body + value if append else value + doc.body
                joined, datatype = doc.pack()
            else:
                joined = old + value if append else value + old
            if len(joined) > self.max_item_size:
                raise TooBig(f"value of {len(joined)} bytes is over {self.max_item_size}")
            return self._put(key, joined, current.flags, current.expiry, datatype, current)

    def incr(
        self, key: bytes, delta: int, *, initial: int = 0, expiry: int = 0, cas: int = 0
    ) -> tuple[int, Item]:
        return self._arith(key, delta, initial, expiry, cas, incr=True)

    def decr(
        self, key: bytes, delta: int, *, initial: int = 0, expiry: int = 0, cas: int = 0
    ) -> tuple[int, Item]:
        return self._arith(key, delta, initial, expiry, cas, incr=False)

    def _arith(
        self, key: bytes, delta: int, initial: int, expiry: int, cas: int, *, incr: bool
    ) -> tuple[int, Item]:
        self._ensure_resident(key)
        with self.lock:
            self._check_write(key, b"")
            current = self._live(key)
            if current is None:
                if expiry == NO_CREATE:
                    raise KeyNotFound("counter does not exist")
                if cas:
                    raise KeyNotFound("counter does not exist")
                value = initial % U64
                item = self._put(key, b"%d" % value, 0, self._expiry(expiry), 0, None)
                return value, item
            _check_cas(current, cas)
            stored = self._resident_or_fail(current)
            number = parse_counter(document.body(stored.value or b"", stored.datatype)[0])
            number = (number + delta) % U64 if incr else max(number - delta, 0)
            text, datatype = b"%d" % number, 0
            if stored.datatype & _XATTR:  # the counter is the body: its xattrs stay
                doc = document.unpack(stored.value or b"", stored.datatype)
                text, datatype = document.Document(doc.xattrs, text, False).pack()
            item = self._put(key, text, current.flags, current.expiry, datatype, current)
            return number, item

    def touch(self, key: bytes, expiry: int) -> Item:
        """Set a new expiry; returns the item (with its value: get-and-touch)."""
        self._ensure_resident(key)
        with self.lock:
            self._check_write(key, b"")
            current = self._resident_or_fail(self._live_or_fail(key))
            value, flags, datatype = current.value or b"", current.flags, current.datatype
            return self._put(key, value, flags, self._expiry(expiry), datatype, current)

    get_and_touch = touch

    def expiry_pager(self) -> int:
        """Queue an expiration for every expired item; returns how many."""
        with self.lock:
            if self.state != VBucketState.ACTIVE:
                return 0
            now = int(self.clock.time())
            expired = [i for i in self.hash_table.expiring() if i.expiry <= now]
            for item in expired:
                self._tombstone(item, expired=True)
            return len(expired)

    # -- replica operations -----------------------------------------------------------------

    def replica_snapshot_marker(self, start: int, end: int, *, disk: bool = False) -> None:
        with self.lock:
            self._require_replica_path()
            if not start <= end or end < self.high_seqno:
                raise Einval(f"bad snapshot marker {start}..{end} at high seqno {self.high_seqno}")
            if end > SEQNO_MAX:
                raise self._beyond_seqno_max(end, 0)
            self.checkpoints.snapshot_marker(start, end)
            self.replica_snapshot = (start, end)
            self._replica_disk = disk

    def adopt_failover_log(self, entries: Iterable[FailoverEntry]) -> None:
        """A replica's history is its active's: take the producer's log (spec 002); the next
        flush persists it with the vbucket's state."""
        with self.lock:
            self._require_replica_path()
            self.failover.replace(list(entries))
            self._dirty_state()

    def set_with_meta(self, item: Item) -> Item:
        """Store a mutation as the active vbucket made it (seqno, CAS, rev seqno kept)."""
        if item.deleted or item.delete_time or item.expired:  # a copy only when it must change
            item = dataclasses.replace(item, deleted=False, delete_time=0, expired=False)
        return self._with_meta(item)

    def delete_with_meta(self, item: Item) -> Item:
        """A replicated deletion; its value is the system xattrs the tombstone kept, if any."""
        if not item.deleted or (item.value and not item.datatype & _XATTR):
            item = dataclasses.replace(item, deleted=True, value=b"", datatype=0)
        return self._with_meta(item)

    def _with_meta(self, item: Item) -> Item:
        with self.lock:
            self._require_replica_path()
            if item.by_seqno <= self.high_seqno:
                raise Einval(f"seqno {item.by_seqno} is not above {self.high_seqno}")
            if item.by_seqno > SEQNO_MAX or item.rev_seqno > SEQNO_MAX:
                raise self._beyond_seqno_max(item.by_seqno, item.rev_seqno)
            self._check_size(item.key, item.value or b"")
            current = self._entry(item.key)  # (may raise WouldBlock: before any change)
            prepared = self.hash_table.prepared
            if prepared and self._replica_disk and item.key in prepared:
                item = self._committed_on_disk(item)
            self._queue(item, current)
            self.hlc.observe(item.cas)
            return item

    # -- with-meta writes (XDCR: an active vbucket takes a version made elsewhere) ----------

    def write_with_meta(
        self, incoming: Item, *, check_conflict: bool = True, regenerate_cas: bool = False,
        add: bool = False, cas: int = 0,
    ) -> Item:  # fmt: skip
        """SetWithMeta/AddWithMeta/DelWithMeta (``incoming.deleted``) on an active vbucket:
        ``incoming`` keeps its source's CAS (unless ``regenerate_cas``), rev seqno, flags and
        expiry, and takes the next local seqno. Refused with KeyExists when it loses conflict
        resolution (``core/conflict_resolution.py``, the bucket's ``conflict_mode``) or is
        identical, and for ``add`` when a live document exists; ``cas`` (not 0) must be the
        local CAS. A tombstone the table dropped is read back first: it still takes part."""
        key = incoming.key
        disk = None
        if self.hash_table.entries.get(key) is None and self._may_be_on_disk(key):
            disk = self._stored(key)  # a persisted tombstone (outside the lock)
        with self.lock:
            self._check_write(key, incoming.value or b"")
            live = self._live(key)
            stored = self.hash_table.entries.get(key)
            if add and live is not None:
                raise KeyExists("key exists")
            if cas:
                _check_cas(live, cas)
            local = stored if stored is not None else disk
            # (the items are the versions compared: nothing is built for the rule)
            if check_conflict and not cr.incoming_wins(self.conflict_mode, incoming, local):
                raise KeyExists("the incoming version loses conflict resolution")
            seqno = self.high_seqno + 1
            if seqno > SEQNO_MAX or incoming.rev_seqno > SEQNO_MAX:
                raise self._beyond_seqno_max(seqno, incoming.rev_seqno)
            item = incoming.placed(seqno, self.hlc.next_cas() if regenerate_cas else incoming.cas)
            self.hlc.observe(item.cas)
            return self._queue(item, stored)

    def _note_dropped(self, key: bytes) -> None:
        if self._dropped is not None:
            self._dropped.add(hash(key))
            if len(self._dropped) > _DROPPED_KEPT:
                self._dropped = None

    def _may_be_on_disk(self, key: bytes) -> bool:
        """Whether storage may hold a tombstone of ``key``, which the table does not hold."""
        if self._fetch is None:
            return False
        return self._dropped is None or hash(key) in self._dropped

    # -- SyncWrites (module docstring) ----------------------------------------------------------

    def set_topology(self, topology: ReplicationTopology) -> None:
        """The chains a SyncWrite of this active vbucket must reach; the first chain's active
        names this node. Every pending prepare is judged again (it may commit or be doomed)."""
        with self.lock:
            self._require_active()
            monitor = self.durability
            if monitor is None:
                monitor = self._new_monitor(topology.first.active)
            decisions = monitor.set_topology(topology)  # raises before anything changed
            self.durability = monitor
            early, self._early_acks = self._early_acks, {}
            for node, seqno in early.items():
                if node != monitor.node:  # (named so by a consumer before a rename: dropped)
                    decisions += monitor.seqno_ack(node, seqno)
            self._resolve(decisions)

    def set_takeover_topology(self, topology: ReplicationTopology) -> None:
        """The chains this *pending* copy takes when a takeover makes it active (so durable
        writes are served from its first moment as the active, not refused until the manager
        hears of the handover); forgotten if it goes any other way."""
        with self.lock:
            if self.state != VBucketState.PENDING:
                raise Einval(f"vbucket {self.id} is {self.state}: a takeover topology is for a "
                             "pending vbucket")  # fmt: skip
            self._takeover_topology = topology

    @property
    def topology(self) -> ReplicationTopology | None:
        return None if self.durability is None else self.durability.topology

    @property
    def high_prepared_seqno(self) -> int:
        """The highest prepare this copy has locally satisfied (its monitor's HPS; 0 with no
        monitor): what a failover compares, with the high seqno, to pick the replica to
        promote (PROTOCOL.md, "SyncWrites": Failover)."""
        monitor = self.durability or self.passive_durability
        return 0 if monitor is None else monitor.high_prepared_seqno

    def _check_re_commit(self, key: bytes) -> None:
        """A read of a key whose maybe visible prepare a promoted active has not re-committed
        yet: the old active may have committed it, so neither version may be served."""
        if key not in self.hash_table.prepared:
            return
        monitor = self.durability or self.passive_durability
        if monitor is not None and monitor.re_committing(key):
            raise SyncWriteReCommitInProgress(
                f"vbucket {self.id}: key {key!r} has a prepare being re-committed (seqno "
                f"{self.hash_table.prepared[key].by_seqno}); retry"
            )

    def sync_write(
        self,
        write: Callable[[], T],
        level: DurabilityLevel,
        *,
        timeout_ms: int | None = None,
        cookie: object = None,
    ) -> T:
        """Run ``write`` (one of this vbucket's front-end writes, e.g. ``lambda: vb.set(...)``)
        as a SyncWrite: the version it makes becomes a prepare, and ``cookie`` is answered
        through ``on_sync_outcomes`` when it commits (at once if the topology is satisfied
        already) or its outcome becomes ambiguous. Returns what ``write`` returns (its item
        is the prepare). DurabilityImpossible without a usable topology."""
        with self.lock:
            self._require_active()
            monitor = self.durability
            if monitor is None or not monitor.durability_possible:
                topology = None if monitor is None else monitor.topology
                raise DurabilityImpossible(
                    f"vbucket {self.id}: no replication topology can satisfy a SyncWrite "
                    f"(topology: {topology})"
                )
            self._sync = _SyncRequest(DurabilityLevel(level), timeout_ms, cookie)
            try:
                return write()
            finally:
                self._sync = None

    def durability_tick(self) -> None:
        """Time passed: prepares past their deadline abort or become ambiguous."""
        with self.lock:
            if self.durability is not None and self.durability.num_pending:
                self._resolve(self.durability.tick(self.clock.time()))

    def _new_monitor(self, node: str) -> dm.ActiveDurabilityMonitor:
        passive, self.passive_durability = self.passive_durability, None
        if passive is not None:
            passive.persisted(self.persisted_seqno)
            return passive.promote(node, default_timeout_ms=self.durability_timeout_ms)
        return dm.ActiveDurabilityMonitor(
            node,
            default_timeout_ms=self.durability_timeout_ms,
            persisted_seqno=self.persisted_seqno,
        )

    def _prepare(self, item: Item) -> PrepareItem:
        """Make ``item``, the version a SyncWrite's write path built, a prepare."""
        sync, monitor = self._sync, self.durability
        assert sync is not None and monitor is not None
        self._sync = None  # one prepare per request (a commit made at once is committed)
        prepare = PrepareItem(
            item.key, item.value, item.flags, item.expiry, item.cas, item.rev_seqno,
            item.by_seqno, item.datatype, item.deleted, item.delete_time, False, sync.level,
        )  # fmt: skip
        self.hash_table.store_prepare(prepare)
        self.checkpoints.queue_sync(prepare)
        if self.on_queued is not None:
            self.on_queued(self.id)
        if sync.level != DurabilityLevel.Majority:
            self._persistence_wanted()
        self._resolve(
            monitor.add_prepare(
                prepare.by_seqno,
                prepare.key,
                sync.level,
                now=self.clock.time(),
                timeout_ms=sync.timeout_ms,
                cookie=sync.cookie,
            )
        )
        return prepare

    def _persistence_wanted(self) -> None:
        if self.on_persistence_wanted is not None:
            self.on_persistence_wanted()

    def _resolve(self, decisions: list[dm.Decision]) -> None:
        """Act on the monitor's decisions in order (the module docstring's table)."""
        outcomes: list[SyncOutcome] = []
        for decision in decisions:
            if isinstance(decision, dm.Commit):
                commit = self._commit(decision.seqno, decision.key)
                if decision.cookie is not None:
                    outcomes.append(SyncOutcome(decision.cookie, Status.Success, commit))
            elif isinstance(decision, dm.Abort):
                self._abort(decision.seqno, decision.key)
                if decision.cookie is not None:
                    outcomes.append(SyncOutcome(decision.cookie, Status.SyncWriteAmbiguous))
            elif isinstance(decision, dm.Ambiguous):
                outcomes.append(SyncOutcome(decision.cookie, Status.SyncWriteAmbiguous))
        if outcomes and self.on_sync_outcomes is not None:
            self.on_sync_outcomes(self.id, outcomes)

    def _take_prepare(self, seqno: int, key: bytes) -> PrepareItem:
        prepare = self.hash_table.pop_prepare(key)
        if prepare is None or prepare.by_seqno != seqno:
            raise AssertionError(f"vbucket {self.id}: no prepare of {key!r} at {seqno}")
        return prepare

    def _commit(self, prepared_seqno: int, key: bytes) -> CommitItem:
        p = self._take_prepare(prepared_seqno, key)
        commit = CommitItem(
            key, p.value, p.flags, p.expiry, self.hlc.next_cas(), p.rev_seqno,
            self.checkpoints.high_seqno + 1, p.datatype, p.deleted,
            int(self.clock.time()) if p.deleted else 0, False, prepared_seqno,
        )  # fmt: skip
        # (read in place: a monitor's decision lands from any thread, and cannot wait)
        current = self._entry(key, wait=False)
        self.checkpoints.queue_next(commit, self.hash_table.store(commit, current))
        self.checkpoints.sync_items += 1  # (a warmed-up prepare's commit: its first)
        self._completions.append((commit.by_seqno, prepared_seqno))
        if self.on_queued is not None:
            self.on_queued(self.id)
        return commit

    def _abort(self, prepared_seqno: int, key: bytes) -> None:
        p = self._take_prepare(prepared_seqno, key)
        abort = AbortItem(
            key, b"", 0, 0, self.hlc.next_cas(), p.rev_seqno, self.checkpoints.high_seqno + 1,
            prepared_seqno=prepared_seqno,
        )  # fmt: skip
        self.checkpoints.queue_sync(abort)
        self._completions.append((abort.by_seqno, prepared_seqno))
        if self.on_queued is not None:
            self.on_queued(self.id)

    def _step_down(self) -> None:
        """Leaving the active state: answer the waiting clients, keep the prepares."""
        self._early_acks.clear()
        if self.durability is None:
            return
        decisions, self.passive_durability = self.durability.step_down()
        self.durability = None
        self._resolve(decisions)

    # -- SyncWrites on a replica: what a SyncWrite-enabled DCP stream brings -------------------

    def replica_prepare(self, prepare: PrepareItem) -> None:
        """Keep a prepare the active sent (its seqno, CAS and level): beside the key's committed
        entry, persisted, tracked by the passive monitor. In a disk snapshot it replaces the
        key's older prepare (whose completion was deduplicated away)."""
        with self.lock:
            self._check_replica_seqno(prepare.by_seqno, prepare.rev_seqno)
            self._check_size(prepare.key, prepare.value or b"")
            monitor = self.passive_durability
            if monitor is None:
                monitor = self.passive_durability = dm.PassiveDurabilityMonitor(
                    persisted_seqno=self.persisted_seqno
                )
            try:
                level = DurabilityLevel(prepare.level)
                monitor.prepare(prepare.by_seqno, prepare.key, level, disk=self._replica_disk)
            except ValueError as exc:  # (DurabilityMonitorError is one, as is a bad level)
                raise Einval(f"vbucket {self.id}: {exc}") from None
            self.hash_table.pop_prepare(prepare.key)
            self.hash_table.store_prepare(prepare)
            self.checkpoints.queue_sync(prepare)
            self.hlc.observe(prepare.cas)
            if self.on_queued is not None:
                self.on_queued(self.id)
            if level == DurabilityLevel.PersistToMajority:  # acknowledged once persisted
                self._persistence_wanted()

    def replica_commit(self, key: bytes, prepared_seqno: int, seqno: int, cas: int) -> CommitItem:
        """The active committed the prepare at ``prepared_seqno`` as ``seqno`` (``cas`` its
        CAS, 0: the prepare's): the prepare becomes the key's committed entry."""
        with self.lock:
            self._require_replica_path()
            current = self._entry(key)  # (may raise WouldBlock: before any change)
            p = self._replica_completion(key, prepared_seqno, seqno, "commit")
            commit = CommitItem(
                key, p.value, p.flags, p.expiry, cas or p.cas, p.rev_seqno, seqno, p.datatype,
                p.deleted, int(self.clock.time()) if p.deleted else 0, False, prepared_seqno,
            )  # fmt: skip
            self.checkpoints.queue_next(commit, self.hash_table.store(commit, current))
            self.checkpoints.sync_items += 1
            self._completions.append((seqno, prepared_seqno))
            self.hlc.observe(commit.cas)
            if self.on_queued is not None:
                self.on_queued(self.id)
            return commit

    def replica_abort(self, key: bytes, prepared_seqno: int, seqno: int, cas: int) -> None:
        """The active aborted the prepare at ``prepared_seqno`` as ``seqno``. In a disk
        snapshot its prepare may be one we never got (P7), and an older prepare of the key we
        hold completed too (a later prepare of a key comes only after the earlier completed)."""
        with self.lock:
            held = self.hash_table.prepared.get(key)
            if self._replica_disk and (held is None or held.by_seqno != prepared_seqno):
                self._check_replica_seqno(seqno, 0)
                if held is not None:
                    self._drop_held(held, "abort")
            else:
                self._replica_completion(key, prepared_seqno, seqno, "abort")
            abort = AbortItem(key, b"", 0, 0, cas, 0, seqno, prepared_seqno=prepared_seqno)
            self.checkpoints.queue_sync(abort)
            self._completions.append((seqno, prepared_seqno))
            if self.on_queued is not None:
                self.on_queued(self.id)

    def replica_snapshot_end(self, seqno: int) -> None:
        """The snapshot ending at ``seqno`` arrived whole: the passive monitor may move the
        high prepared seqno (an acknowledgement becomes due, :meth:`take_seqno_ack`)."""
        with self.lock:
            monitor = self.passive_durability
            if monitor is None or seqno <= self._replica_snapshot_ended:
                return
            self._replica_snapshot_ended = seqno
            self._note_acks(monitor.snapshot_end(seqno, disk=self._replica_disk))

    def take_seqno_ack(self) -> int | None:
        """The high prepared seqno to acknowledge to the active now, if one is due."""
        with self.lock:
            seqno, self._seqno_ack_due = self._seqno_ack_due, None
            return seqno

    def _check_replica_seqno(self, seqno: int, rev: int) -> None:
        self._require_replica_path()
        if seqno <= self.high_seqno:
            raise Einval(f"seqno {seqno} is not above {self.high_seqno}")
        if seqno > SEQNO_MAX or rev > SEQNO_MAX:
            raise self._beyond_seqno_max(seqno, rev)

    def _replica_completion(self, key: bytes, prepared: int, seqno: int, what: str) -> PrepareItem:
        """The prepare a replicated commit or abort completes, taken (refused: Einval)."""
        self._check_replica_seqno(seqno, 0)
        p = self.hash_table.prepared.get(key)
        monitor = self.passive_durability
        if p is None or p.by_seqno != prepared or monitor is None:
            held = "none" if p is None else str(p.by_seqno)
            message = f"vbucket {self.id}: {what} of {key!r} at {prepared}, held: {held}"
            raise MissingPrepare(message, min(prepared, prepared if p is None else p.by_seqno))
        try:
            if what == "commit":
                monitor.commit(prepared, key, disk=self._replica_disk)
            else:
                monitor.abort(prepared, key, disk=self._replica_disk)
        except dm.DurabilityMonitorError as exc:
            raise Einval(f"vbucket {self.id}: {exc}") from None
        return self._take_prepare(prepared, key)

    def _committed_on_disk(self, item: Item) -> CommitItem:
        """A disk snapshot brings a committed version of a key whose prepare we hold: that
        prepare completed (its commit was deduplicated into what the disk has). The version is
        kept as its commit, so the flusher deletes the prepare's stored row too."""
        p = self.hash_table.prepared[item.key]
        self._drop_held(p, "commit")
        self.checkpoints.sync_items += 1
        self._completions.append((item.by_seqno, p.by_seqno))
        return CommitItem(
            item.key, item.value, item.flags, item.expiry, item.cas, item.rev_seqno,
            item.by_seqno, item.datatype, item.deleted, item.delete_time, item.expired,
            p.by_seqno,
        )  # fmt: skip

    def _drop_held(self, p: PrepareItem, what: str) -> None:
        """Forget a held prepare a disk snapshot shows completed (P7)."""
        self.hash_table.pop_prepare(p.key)
        monitor = self.passive_durability
        if monitor is not None:
            complete = monitor.commit if what == "commit" else monitor.abort
            complete(p.by_seqno, p.key, disk=True)

    def _note_acks(self, decisions: list[dm.Decision]) -> None:
        for decision in decisions:
            if isinstance(decision, dm.SeqnoAck):
                self._seqno_ack_due = decision.seqno
        if self._seqno_ack_due is not None and self.on_seqno_ack is not None:
            self.on_seqno_ack(self.id)

    def seqno_acknowledged(self, node: str, seqno: int) -> None:
        """A replica (``node``, its DCP consumer_name) acknowledged its high prepared seqno:
        prepares it satisfies may commit (NotMyVbucket unless active; Einval when ``node``
        names this node)."""
        with self.lock:
            self._require_active()
            if self.durability is None:  # no topology yet: kept for the monitor it brings
                self._early_acks[node] = max(seqno, self._early_acks.get(node, 0))
                return
            try:
                decisions = self.durability.seqno_ack(node, seqno)
            except dm.DurabilityMonitorError as exc:
                raise Einval(f"vbucket {self.id}: {exc}") from None
            self._resolve(decisions)

    # -- state ------------------------------------------------------------------------------

    def set_state(self, state: VBucketState, *, transfer: bool = False) -> None:
        """Move to ``state``; becoming active cuts a new history branch (:meth:`branch_point`),
        unless ``transfer``: a takeover handed this copy the whole history of the old active
        (which is dead now), so the failover log moves with the vbucket unchanged and a
        consumer following it needs no rollback (kv_engine's ``transfer``)."""
        state = VBucketState(state)
        with self.lock:
            if state == self.state:
                return
            if self.state is _ACTIVE:
                self._step_down()
            if state == VBucketState.ACTIVE:
                if not transfer:
                    self.failover.create_entry(self.branch_point())
                # New active items form their own checkpoints, apart from a replica snapshot.
                self.checkpoints.close_open_checkpoint()
                self.replica_snapshot = (self.high_seqno, self.high_seqno)
            self.state = state
            self._dirty_state()
            waiting, self._takeover_topology = self._takeover_topology, None
            if waiting is not None and state == VBucketState.ACTIVE:
                self.set_topology(waiting)

    def branch_point(self) -> int:
        """Where a new failover entry starts when this vbucket becomes active.

        A promoted replica (failover) branches at the last complete snapshot it persisted,
        as kv_engine does and spec 002 asks: its end if the flusher persisted all of it, else
        its start (a partial snapshot is no consistent point of the old history). What the
        replica holds above that point is served as the new branch, so a consumer that has it
        from the old active rolls back to the branch point and gets it again: never wrong,
        sometimes more than needed. Any other vbucket (a pending or dead one made active by
        hand) holds a complete history up to its high seqno and branches there. (A takeover's
        handoff cuts no entry at all: ``set_state(transfer=True)``.)
        """
        if self.state != VBucketState.REPLICA:
            return self.high_seqno
        start, end = self.persisted_snapshot
        return end if self.persisted_seqno >= end else start

    def vbstate(self, snapshot: tuple[int, int], high_seqno: int) -> VBState:
        return VBState(
            state=self.state.label,
            failover_json=self.failover.to_json(),
            high_seqno=high_seqno,
            snap_start=snapshot[0],
            snap_end=snapshot[1],
            purge_seqno=self.purge_seqno,
            max_cas=self.hlc.max_cas,
            # Exact at the batch's high seqno: the flusher takes every queued item at once.
            item_count=len(self),
            high_prepared_seqno=self._persistable_hps(snapshot[1], high_seqno),
            high_completed_seqno=self._persistable_hcs(high_seqno),
        )

    def _persistable_hcs(self, high_seqno: int) -> int:
        """The high completed seqno a state persisted at ``high_seqno`` holds: the highest
        prepare whose commit or abort is at or below it."""
        done = self._completions
        while done and done[0][0] <= high_seqno:
            self._stored_hcs = max(self._stored_hcs, done.popleft()[1])
        return self._stored_hcs

    def _persistable_hps(self, snapshot_end: int, high_seqno: int) -> int:
        """The high prepared seqno a state persisted at ``high_seqno`` may claim: a lower bound
        of what the copy holds once the batch is on disk. The monitor's HPS if the batch holds
        it; on a replica whose batch ends a snapshot that arrived whole, ``high_seqno`` itself
        (every prepare up to it is then received whole and persisted, as a disk snapshot's end
        moves the HPS, P4); else the last claim."""
        claim = self.high_prepared_seqno
        if claim > high_seqno:
            claim = 0
        if (
            self.state in _REPLICA_PATH
            and high_seqno == snapshot_end
            and self._replica_snapshot_ended >= high_seqno
            and self.passive_durability is not None
        ):
            claim = high_seqno
        self._stored_hps = max(self._stored_hps, claim)
        return self._stored_hps

    # -- flusher ----------------------------------------------------------------------------

    def take_flush_batch(self) -> FlushBatch | None:
        """Everything the flusher has not persisted yet (a failed batch is taken again)."""
        with self.lock:
            batch = self._unacked
            cursor = self.checkpoints.persistence_cursor
            if batch is None and not self._state_dirty and cursor.caught_up():
                return None
            items = batch.items if batch else []
            snap_range, high = self.persisted_snapshot, self.persisted_seqno
            if batch:
                snap_range = (batch.vbstate.snap_start, batch.vbstate.snap_end)
                high = batch.vbstate.high_seqno
            taken = False
            # One read usually takes all (it crosses closed checkpoints); the test spares the
            # second read, which would only find nothing.
            while not cursor.caught_up() and (snap := cursor.next_snapshot(_FLUSH_ALL)):
                items = items + snap.items if items else snap.items
                snap_range, high = (snap.start, snap.end), snap.high_seqno
                taken = True
            if batch is None and not taken and not self._state_dirty:
                return None
            self._state_dirty = False
            self._unacked = FlushBatch(self.id, items, self.vbstate(snap_range, high))
            return self._unacked

    def flush_failed(self) -> None:
        with self.lock:
            self._dirty_state()

    def mark_persisted(self, batch: FlushBatch) -> None:
        """The batch is durable: advance the persisted seqno, forget persisted tombstones."""
        with self.lock:
            if self._unacked is batch:
                self._unacked = None
            self.persisted_seqno = max(self.persisted_seqno, batch.vbstate.high_seqno)
            self.persisted_snapshot = (batch.vbstate.snap_start, batch.vbstate.snap_end)
            fetches = self.fetches
            for item in batch.items:
                if item.deleted:
                    self.hash_table.discard(item)
                    self._note_dropped(item.key)
                    if fetches:
                        fetches.dropped(item.key)
            if self.durability is not None:
                self._resolve(self.durability.persisted(self.persisted_seqno))
            elif self.passive_durability is not None and self.state in _REPLICA_PATH:
                self._note_acks(self.passive_durability.persisted(self.persisted_seqno))

    # -- memory -----------------------------------------------------------------------------

    def eject(self, target_bytes: int | None = None) -> int:
        """Drop persisted values, or whole persisted items under full eviction, from the hash
        table (until ``target_bytes`` are freed); returns the bytes freed."""
        with self.lock:
            if self.eviction is not EvictionPolicy.FULL:
                return self.hash_table.eject(self.persisted_seqno, target_bytes)
            entries = self.hash_table.entries
            watched = [k for k in self.fetches.watched() if k in entries] if self.fetches else ()
            freed = self.hash_table.evict(self.persisted_seqno, target_bytes)
            for key in watched:
                if key not in entries:  # left while a fetch of it is pending (bg_fetch.py)
                    self.fetches.dropped(key)
            return freed

    # -- loading (warm-up, rollback) -------------------------------------------------------

    def load(self, items: Iterable[Item]) -> None:
        """Fill the hash table from storage (items are persisted: nothing is queued)."""
        with self.lock:
            # (per item: one store and a compare, the clock told the highest CAS once; a
            # warm-up loads every document through here)
            store, entries, top = self.hash_table.store, self.hash_table.entries, 0
            for item in items:
                store(item, entries.get(item.key))
                if item.cas > top:
                    top = item.cas
            self.hlc.observe(top)

    def load_nonresident(self, count: int) -> None:
        """Warm-up under full eviction: ``count`` live items are on disk, none in the table."""
        with self.lock:
            self.hash_table.nonresident += count

    def load_prepares(self, prepares: Iterable[PrepareItem]) -> None:
        """Take back the prepares storage holds (warm-up, in seqno order): pending, with no
        client and no timeout ("maybe visible"), until a topology lets them commit."""
        with self.lock:
            writes = []
            for prepare in prepares:
                self.hash_table.store_prepare(prepare)
                self.hlc.observe(prepare.cas)
                level = DurabilityLevel(prepare.level)
                writes.append(dm.SyncWrite(prepare.by_seqno, prepare.key, level))
            if writes or self._stored_hps:
                self.passive_durability = dm.PassiveDurabilityMonitor(
                    persisted_seqno=self.persisted_seqno,
                    high_prepared_seqno=self._stored_hps,
                    high_completed_seqno=self._stored_hcs,
                    prepares=writes,
                )

    def completions_above(self, seqno: int) -> list[PrepareItem]:
        """The prepares a rollback to ``seqno`` must give back: those at or below it whose
        commit lies above it (storage replaced the prepare's row by its commit, so rolling the
        commit back would drop both). Each comes back from its committed version, pending
        again (the active re-commits it once this replica acknowledges it); an ejected value
        is not revived (rare: a commit still above a rollback point is recent)."""
        with self.lock:
            revived = [
                _pending_again(item)
                for item in self.hash_table.values()
                if isinstance(item, CommitItem)
                and item.prepared_seqno <= seqno < item.by_seqno
                and item.value is not None
            ]
            return sorted(revived, key=lambda p: p.by_seqno)

    def acknowledge_held(self) -> None:
        """A replica's stream was (re)opened: acknowledge the prepares it holds now (a rollback
        or a restart may have brought back ones the active still waits for, and no snapshot
        need come to end before it commits them)."""
        with self.lock:
            monitor = self.passive_durability
            if monitor is None:
                return
            # Held and persisted (warm-up, a rollback's point): this replica has them
            held = [p.by_seqno for p in self.hash_table.prepared.values()]
            seqno = max(
                [monitor.high_prepared_seqno, *(s for s in held if s <= self.persisted_seqno)]
            )
            if seqno > 0:
                self._seqno_ack_due = seqno

    def reset(
        self, vbstate: VBState, failover: FailoverTable, items: Iterable[Item], nonresident: int = 0
    ) -> None:
        """Replace the whole in-memory state by what storage holds (after a rollback): its
        ``items``, and ``nonresident`` live items left on disk (full eviction)."""
        with self.lock:
            self.hash_table.clear()
            self.fetches.dropped_all()
            self._unacked = None
            self.checkpoints.reset(vbstate.high_seqno)
            self.persisted_seqno = vbstate.high_seqno
            self.persisted_snapshot = (vbstate.snap_start, vbstate.snap_end)
            self.replica_snapshot = self.persisted_snapshot
            self.purge_seqno = vbstate.purge_seqno
            self.failover = failover
            self.passive_durability = None  # the caller loads the prepares storage kept
            self._replica_snapshot_ended = 0
            self._seqno_ack_due = None
            # No claim: a prepare at or below the point whose commit lay above it is gone
            # with its commit unless completions_above revived it from memory.
            self._stored_hps = 0
            self._completions.clear()
            self._stored_hcs = vbstate.high_completed_seqno
            self._dirty_state()
            self.rollbacks += 1
            self._dropped = None
            self.load(items)
            self.hash_table.nonresident = nonresident

    # -- internals --------------------------------------------------------------------------

    def _dirty_state(self) -> None:
        """The state must be written by the next flush: note it, and tell the flusher."""
        self._state_dirty = True
        if self.on_dirty is not None:
            self.on_dirty(self.id)

    def _require_active(self) -> None:
        if self.state != VBucketState.ACTIVE:
            raise NotMyVbucket(f"vbucket {self.id} is {self.state}")

    def _beyond_seqno_max(self, seqno: int, rev: int) -> Einval:
        """The refusal of a seqno or rev seqno beyond SEQNO_MAX (``core/seqno.py``)."""
        what, value = ("seqno", seqno) if seqno > SEQNO_MAX else ("rev seqno", rev)
        return Einval(
            f"vbucket {self.id}: {what} {value} is beyond 2^63-1, the largest a vbucket keeps "
            "(seqnos are signed 64-bit here, as in kv_engine)"
        )

    def _require_replica_path(self) -> None:
        if self.state not in _REPLICA_PATH:
            raise NotMyVbucket(f"vbucket {self.id} is {self.state}, not replica/pending")

    def _check_write(self, key: bytes, value: bytes) -> None:
        """The one admission check of every front-end write, in this order: the vbucket is
        active, the key and the value fit, the bucket admits the bytes (its memory quota, its
        disk). Before the key's entry is read: admitting may eject values from the table."""
        if self.state is not _ACTIVE:
            raise NotMyVbucket(f"vbucket {self.id} is {self.state}")
        if not 0 < len(key) <= MAX_KEY_LENGTH or len(value) > self.max_item_size:
            self._check_size(key, value)  # raises the refusal
        prepared = self.hash_table.prepared
        if prepared and key in prepared:
            raise SyncWriteInProgress(
                f"key {key!r} has a pending SyncWrite (prepare at {prepared[key].by_seqno})"
            )
        if self._admit is not None:
            # Charge what the write will add to memory_used: the item is accounted in the hash
            # table and again in the checkpoint until persisted. Charging only key + value let
            # a bucket run ~2x over its quota between two recounts.
            self._admit(2 * (ITEM_OVERHEAD + len(key) + len(value)))

    def _check_size(self, key: bytes, value: bytes) -> None:
        if not key or len(key) > MAX_KEY_LENGTH:
            raise Einval(f"key length {len(key)} is not 1..{MAX_KEY_LENGTH}")
        if len(value) > self.max_item_size:
            raise TooBig(f"value of {len(value)} bytes is over {self.max_item_size}")

    def _expiry(self, exptime: int) -> int:
        return absolute_expiry(exptime, self.clock.time()) if exptime else 0

    def _live(self, key: bytes) -> Item | None:
        """The key's live entry, or None (missing, deleted, or expired now: then expire it).
        Where every write reads the key's entry (after :meth:`_check_write`); a non-resident
        one is read back into the table first (:meth:`_entry`)."""
        item = self.hash_table.entries.get(key)
        if item is None and self.hash_table.nonresident:
            item = self._entry(key)
        if item is None or item.deleted:
            return None
        if item.expiry and item.expiry <= int(self.clock.time()):  # Item.is_expired, inlined
            if self.state is _ACTIVE:
                self._tombstone(item, expired=True)
            return None
        return item

    def _entry(self, key: bytes, *, wait: bool = True) -> Item | None:
        """The key's entry, tombstones included, under the lock: when the table does not hold
        it but counts non-resident items (full eviction), storage's version is read back into
        the table first, so the write that follows replaces it (its CAS, rev seqno, xattrs,
        and whether it adds a live key: the item count stays exact). A front-end write may
        wait for a background fetch (:meth:`_stored`), and so may a replica's (its DCP
        consumer's shell waits as a connection does); a monitor's commit (``wait`` False),
        whose decision may land on any thread, reads now."""
        table = self.hash_table
        item = table.entries.get(key)
        if item is None and table.nonresident and self._fetch is not None:
            item = self._stored(key) if wait else self._fetch(self.id, key)
            if item is not None:
                table.restore(item)
        return item

    def _live_or_fail(self, key: bytes) -> Item:
        item = self._live(key)
        if item is None:
            raise KeyNotFound("no such key")
        return item

    def _resident_or_fail(self, item: Item) -> Item:
        if item.value is None:
            # Ejected again between the fetch and now: the client retries.
            raise TempFail("value not resident, retry")
        return item

    def _stored(self, key: bytes) -> Item | None:
        """Storage's version of ``key`` (None: none) for a front-end request: a background
        fetch's result when one is ready; else, without a fetcher, a read now; else None
        when storage's filters rule the key out, or :class:`WouldBlock` (nothing changed yet:
        the caller waits for the fetch, then runs the request again)."""
        ready = self.fetches.ready
        if ready and key in ready:
            found = ready[key]
            if isinstance(found, TempFail):
                raise TempFail(str(found))
            return found
        assert self._fetch is not None
        if not self.background_fetch:
            return self._fetch(self.id, key)
        if self._may_exist is not None and not self._may_exist(self.id, key):
            return None
        raise WouldBlock(self, key)

    def wait_for(self, key: bytes, waiter: Callable[[], None]) -> None:
        """``waiter`` runs (on the caller's thread, once the bucket lands the read) when a
        background fetch of ``key`` has landed: the request that raised WouldBlock again."""
        with self.lock:
            if self.fetches.want(key, waiter) and self.on_fetch_wanted is not None:
                self.on_fetch_wanted(self)

    def prefetch(self, key: bytes) -> None:
        """A request queued behind one that waits will read ``key``: fetch it in the same
        batch (no waiter: the request itself asks when its turn comes, and joins the read).
        On a replica (a DCP mutation queued behind one that waits) only a non-resident key
        is read: its writes need no ejected value."""
        if not self.background_fetch or self._fetch is None:
            return
        active = self.state is _ACTIVE
        if not active and self.state not in _REPLICA_PATH:
            return
        table = self.hash_table
        item = table.entries.get(key)
        if item is None:
            # No filter probe here: the read answers a missing key as cheaply (the fetcher
            # thread's multi-get consults the same bloom filters), off the loop, and most
            # keys a pipelining client asks for exist (the probe only said "maybe").
            if not table.nonresident or key in self.fetches.ready:
                return
        elif item.deleted or item.value is not None or not active:
            return
        self.wait_for(key, _nothing)

    def land_fetch(self, key: bytes, fetched: Item | TempFail | None) -> list[Callable[[], None]]:
        """A background fetch of ``key`` landed: ready for the waiters it returns (run
        them, then :meth:`fetch_consumed`)."""
        with self.lock:
            return self.fetches.landed(key, fetched)

    def fetch_consumed(self, key: bytes) -> None:
        with self.lock:
            self.fetches.consumed(key)

    def _ensure_resident(self, key: bytes) -> None:
        table = self.hash_table
        with self.lock:
            item = table.entries.get(key)
            if item is None or item.deleted or item.value is not None or self._fetch is None:
                return
            seqno = item.by_seqno
        stored = self._stored(key)
        with self.lock:
            current = table.entries.get(key)
            if (
                stored is not None
                and current is not None
                and current.value is None
                and current.by_seqno == seqno == stored.by_seqno
            ):
                table.store(current.with_value(stored.value), current)

    def _next_rev(self, key: bytes) -> int:
        previous = self.hash_table.entries.get(key)
        return (previous.rev_seqno if previous else self.hash_table.max_deleted_rev) + 1

    def _put(
        self, key: bytes, value: bytes, flags: int, expiry: int, datatype: int,
        live: Item | None,
    ) -> Item:  # fmt: skip
        """Store the next live version of ``key``, given ``live``, what :meth:`_live` has just
        returned: the one core of every front-end write but deletion and edits. The hot path
        of a Set (about a dozen bytecodes per step counts here)."""
        table, checkpoints = self.hash_table, self.checkpoints
        current = live if live is not None else table.entries.get(key)  # a tombstone, or None
        rev = (current.rev_seqno if current is not None else table.max_deleted_rev) + 1
        seqno = checkpoints.high_seqno + 1
        if seqno > SEQNO_MAX or rev > SEQNO_MAX:
            raise self._beyond_seqno_max(seqno, rev)
        # Positional: keyword parsing costs ~0.3 us here. Order: key, value, flags, expiry,
        # cas, rev_seqno, by_seqno, datatype.
        item = Item(key, value, flags, expiry, self.hlc.next_cas(), rev, seqno, datatype)
        if self._sync is not None:
            return self._prepare(item)
        checkpoints.queue_next(item, table.store(item, current))
        if self.on_queued is not None:
            self.on_queued(self.id)
        return item

    def _queue(self, item: Item, current: Item | None) -> Item:
        """Store ``item``, a version with its seqno (above the high seqno) already given, over
        ``current``, the key's entry, and queue it for the flusher and DCP (a SyncWrite's
        version becomes a prepare; an expiry never does)."""
        if self._sync is not None and not item.expired:
            return self._prepare(item)
        self.checkpoints.queue_next(item, self.hash_table.store(item, current))
        if self.on_queued is not None:
            self.on_queued(self.id)
        return item

    def _keep_system_xattrs(self, current: Item, value: bytes, datatype: int) -> tuple[bytes, int]:
        kept = self._resident_or_fail(current).value or b""
        value, datatype = document.carry_system_xattrs(kept, current.datatype, value, datatype)
        self._check_size(current.key, value)
        return value, datatype

    def _resident_if_xattrs(self, key: bytes) -> None:
        """Read back an ejected value that has xattrs: a write over it keeps some of them."""
        current = self.hash_table.entries.get(key)  # a racy peek is fine: the write re-checks it
        if current is not None and current.value is None and current.datatype & _XATTR:
            self._ensure_resident(key)

    def _tombstone(self, current: Item, *, expired: bool) -> Item:
        """Delete ``current``, the key's live entry: a tombstone takes its place."""
        now = int(self.clock.time())
        if self.high_seqno + 1 > SEQNO_MAX or current.rev_seqno + 1 > SEQNO_MAX:
            raise self._beyond_seqno_max(self.high_seqno + 1, current.rev_seqno + 1)
        # A deletion keeps the system xattrs (an ejected value's are lost: expiry only).
        value, datatype = (
            document.for_tombstone(current.value, current.datatype)
            if current.datatype & _XATTR
            else (b"", 0)
        )
        item = Item(
            key=current.key,
            value=value,
            datatype=datatype,
            flags=current.flags,
            cas=self.hlc.next_cas(),
            rev_seqno=current.rev_seqno + 1,
            by_seqno=self.high_seqno + 1,
            deleted=True,
            delete_time=now,
            expired=expired,
        )
        return self._queue(item, current)


def _nothing() -> None:
    return None


def _check_cas(current: Item | None, cas: int) -> None:
    if cas == 0:
        return
    if current is None:
        raise KeyNotFound("no such key")
    if current.cas != cas:
        raise KeyExists("CAS mismatch")


def _pending_again(commit: CommitItem) -> PrepareItem:
    """The prepare ``commit`` completed, rebuilt from it (its level unknown: the strictest)."""
    return PrepareItem(
        commit.key, commit.value, commit.flags, commit.expiry, commit.cas, commit.rev_seqno,
        commit.prepared_seqno, commit.datatype, commit.deleted, commit.delete_time,
        level=DurabilityLevel.PersistToMajority,
    )  # fmt: skip
