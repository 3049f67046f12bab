"""A bucket: its vbuckets, its storage, the flusher, warm-up, shutdown, memory quota.

Theory of operation
-------------------
Keys map to vbuckets with :func:`vbucket_for_key` (CRC32, as the SDKs compute it). A bucket
holds the vbuckets this node has been given (:meth:`Bucket.set_vbucket_state` creates them;
others answer NotMyVbucket) and one storage: RocksDB (``rocks_storage.py``, behind
:class:`~dcpkv.engine.storage.BucketStorage`). A bucket the SQLite engine of earlier versions
wrote is converted to it when it is opened (:mod:`dcpkv.engine.migrate`).

Life cycle
    ========================= ======================================================
    open (``Bucket(...)``)     warm-up, then mark the shutdown *unclean* on disk
    ``flush_once()``           persist what each vbucket's persistence cursor holds
    ``shutdown()``             flush everything, mark the shutdown *clean*, close
    ========================= ======================================================

Warm-up reads each vbucket's state, failover table (sanitised) and documents: every key, and
values while they fit in :data:`WARMUP_VALUE_FRACTION` of the quota; under full eviction
(``eviction_policy``) no document at all, only the item count its state keeps, and the
pending prepares. After an
unclean shutdown (the flag is still 0: the process died without :meth:`Bucket.shutdown`)
every *active* vbucket cuts a new history branch at the end of its last persisted snapshot:
clients may have seen mutations that never reached the disk, and the new uuid tells their
consumers to roll back past them. A replica needs no new entry: its history is its producer's.
The new failover entries are persisted before warm-up returns.

The flusher (:meth:`Bucket.flush_once`) takes, for every vbucket with something unpersisted,
the snapshots its persistence cursor has not read, and writes them all, with the vbucket states
and failover tables, in one write synced once (each vbucket's part atomic: its disk state moves
from one snapshot to the next or not at all, :mod:`.rocks_storage`). It visits only the
vbuckets in the *flush queue* (as kv_engine's flusher keeps a queue of vbucket ids to flush): a
vbucket is noted there when it queues an item or its state must be written (its ``on_queued`` /
``on_dirty`` hooks), so a flush costs O(dirty vbuckets), not O(vbuckets). The flush removes the
ids it takes *before* taking their batches, so a write that lands meanwhile either is taken now
or notes its vbucket again for the next flush. The server's flusher calls
:meth:`Bucket.flush_if_due` every tick: a sparse, young backlog (few items per vbucket, nobody
asking) is left to gather for up to three ticks, since a flush's cost is in the vbuckets it
touches (:mod:`.flush_cadence`; the bucket keeps the :class:`~.flush_cadence.Backlog` it
decides from in O(1)). Only once the write is synced does it advance the persisted seqnos and
drop persisted tombstones from the hash tables. If the write fails (a full disk, an I/O error),
the batches are kept and written again by the next flush, and until one succeeds the bucket
refuses front-end writes with TempFail (``disk_error`` says why): it never acknowledges more
than it may be unable to persist, and nothing it acknowledged is reported persisted before it
is. Reads go on. (Replica writes are still taken, into memory: the active decides.)

Memory: a write is admitted while the bucket's memory use is under its quota. Over it, the
bucket first drops DCP cursors that pin old checkpoints (their streams fall back to a backfill),
then ejects persisted values (``valueOnly``, the default) or evicts whole persisted items, key
and metadata too (``fullEviction``: the bucket may be larger than memory), down to a low
watermark (:class:`~.hash_table.EvictionPolicy`); if still over quota, the write fails with
TempFail (the flusher must catch up first). The memory use is the vbuckets' own figure
(:meth:`Item.size` per hash-table entry and per checkpoint entry) plus
:data:`~.hash_table.HT_ENTRY_OVERHEAD` per hash-table entry: what a key costs the process beyond
those bytes (measured, see there), so that the quota bounds the process's RSS rather than a lower
figure.

State CAS (spec 002, "ordering of partition state transitions"): a manager that loses a
connection mid-command may send the next state change while the first is still in flight, and
the two could land out of order. So the bucket has one *state CAS*, random at start-up:
:meth:`Bucket.set_vbucket_state` and :meth:`Bucket.delete_vbucket` given a CAS other than the
current one change nothing and raise :class:`StateCasMismatch` (which carries the current
CAS); an accepted change moves the CAS on, and the caller learns the new one. A CAS of 0 is
unconditional (warm-up, a single node's own set-up, the producer's takeover handoff: those
move the CAS on too, so a manager that did not see them must re-read before its next change).

Listeners (for the server's DCP push path; the engine itself never waits on anything):
``seqno_listeners`` are called with a vbucket id after every item that vbucket queues (under
the vbucket's lock, from whichever thread wrote: a listener must only take note and return);
``state_listeners`` after a vbucket changes state or is deleted; ``seqno_ack_listeners`` when a
replica vbucket has a high prepared seqno to acknowledge (SyncWrites; the DCP consumer takes it
with ``VBucket.take_seqno_ack``). A listener must not raise.

Threads: the storage connection for writes belongs to whoever calls :meth:`flush_once`,
:meth:`compact`, :meth:`rollback`, :meth:`delete_vbucket` and :meth:`shutdown`; a lock
serialises them, so the server may run them in an executor thread while the event loop calls
the vbuckets' in-memory operations (which only take the vbucket's own short lock).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import TracebackType

from dcpkv.core.conflict_resolution import ConflictMode
from dcpkv.core.failover_table import FailoverTable
from dcpkv.core.files import atomic_write
from dcpkv.core.status import Status
from dcpkv.core.vbucket import VBucketState, vbucket_for_key
from dcpkv.engine import migrate
from dcpkv.engine.bg_fetcher import BgFetcher, Landing
from dcpkv.engine.checkpoint import DEFAULT_CHECKPOINT_MAX_ITEMS
from dcpkv.engine.document import CompressionMode
from dcpkv.engine.durability_monitor import DEFAULT_TIMEOUT_MS
from dcpkv.engine.flush_cadence import Backlog, due
from dcpkv.engine.hash_table import HT_ENTRY_OVERHEAD, EvictionPolicy
from dcpkv.engine.hlc import Clock, SystemClock
from dcpkv.engine.item import EngineError, Item, NotMyVbucket, TempFail
from dcpkv.engine.retention import DEFAULT_HISTORY_WINDOW
from dcpkv.engine.rocks_storage import RocksStorage
from dcpkv.engine.sqlite_reader import sqlite_path
from dcpkv.engine.storage import (
    BucketStorage,
    CompactResult,
    VBState,
    item_from_row,
    storage_cache_bytes,
)
from dcpkv.engine.vbucket import DEFAULT_MAX_ITEM_SIZE, FlushBatch, SyncOutcome, VBucket
from dcpkv.protocol.constants import DurabilityLevel

DEFAULT_MEMORY_QUOTA = 256 * 1024 * 1024
LOW_WATERMARK = 0.85  # eject down to this fraction of the quota
WARMUP_VALUE_FRACTION = 0.8  # stop loading values at this fraction of the quota
RECLAIM_PAUSE_S = 0.05  # a failed reclaim is not tried again sooner, unless a flush landed
_ADMIT_RECHECK = 4096  # recount memory every N writes (O(vbuckets)), or when the estimate says full


log = logging.getLogger(__name__)


def storage_path(folder: Path, bucket: str) -> Path:
    """Where ``bucket``'s data lives in ``folder`` (a RocksDB directory)."""
    return Path(folder) / f"{bucket}.rocksdb"


def open_storage(
    folder: Path,
    bucket: str,
    *,
    history_window: int = DEFAULT_HISTORY_WINDOW,
    synchronous: str = "FULL",
    cache_bytes: int,
) -> BucketStorage:
    """Open (or create) ``bucket``'s storage; a bucket the SQLite engine wrote is converted
    first (:mod:`dcpkv.engine.migrate`)."""
    migrate_storage(folder, bucket, history_window=history_window, cache_bytes=cache_bytes)
    return RocksStorage(
        storage_path(folder, bucket), history_window=history_window, synchronous=synchronous,
        cache_bytes=cache_bytes,
    )  # fmt: skip


def migrate_storage(
    folder: Path,
    bucket: str,
    *,
    history_window: int = DEFAULT_HISTORY_WINDOW,
    cache_bytes: int = 0,
    progress: migrate.Progress | None = None,
) -> int:
    """Convert ``bucket``'s SQLite files in ``folder`` to RocksDB, or finish a conversion that
    died; nothing when there is none. Returns the versions written. The caller holds the
    bucket's lock."""
    source, target = sqlite_path(folder, bucket), storage_path(folder, bucket)
    step = migrate.pending(source, target)
    if step is None:
        return 0
    log.info("bucket %s: %s the conversion of %s to %s", bucket,
             "finishing" if step == "finish" else "starting", source, target)  # fmt: skip
    written = migrate.convert(
        source, target, history_window=history_window, cache_bytes=cache_bytes,
        progress=progress or _log_progress(bucket),
    )  # fmt: skip
    log.info("bucket %s: converted to %s (%d versions)", bucket, target, written)
    return written


def _log_progress(bucket: str) -> migrate.Progress:
    """Logs a conversion's progress at every tenth (a server's start has no terminal)."""
    said = [-1]

    def progress(done: int, total: int) -> None:
        tenth = done * 10 // total if total else 10
        if tenth > said[0]:
            said[0] = tenth
            log.info("bucket %s: converting, %d of %d versions", bucket, done, total)

    return progress


class StateCasMismatch(EngineError):
    """A state change carried a stale state CAS; ``cas`` is the current one."""

    status = Status.KeyEexists

    def __init__(self, cas: int) -> None:
        super().__init__(f"vbucket state CAS mismatch: the current state CAS is {cas}")
        self.cas = cas


class ConflictModeMismatch(EngineError):
    """A bucket opened with another conflict-resolution mode than it was created with."""

    status = Status.Einval


def fixed_conflict_mode(path: Path, name: str, requested: ConflictMode) -> ConflictMode:
    """The bucket's conflict-resolution mode: ``requested`` when the bucket is new (written
    down beside its storage), else the one it was created with, which ``requested`` must
    match: two clusters converge only if each judges conflicts the same way forever."""
    record = path / f"{name}.conflict_resolution"
    if not record.exists():
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(record, f"{requested.value}\n".encode(), record.with_suffix(".tmp"))
        return requested
    created = ConflictMode(record.read_text().strip())
    if created is not requested:
        raise ConflictModeMismatch(
            f"bucket {name!r} was created with conflict resolution {created.value!r}, "
            f"not {requested.value!r} (the mode is fixed at creation)"
        )
    return created


def _charged(vb: VBucket) -> int:
    """What a vbucket's documents count against the bucket's quota."""
    return vb.memory_used + HT_ENTRY_OVERHEAD * vb.table_entries


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class Bucket:
    """A bucket's vbuckets and storage (see the module docstring)."""

    def __init__(
        self,
        name: str,
        path: str | Path,
        *,
        num_vbuckets: int = 1024,
        memory_quota: int = DEFAULT_MEMORY_QUOTA,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        checkpoint_max_items: int = DEFAULT_CHECKPOINT_MAX_ITEMS,
        history_window: int = DEFAULT_HISTORY_WINDOW,
        max_item_size: int = DEFAULT_MAX_ITEM_SIZE,
        synchronous: str = "FULL",
        compression_mode: CompressionMode = CompressionMode.PASSIVE,
        durability_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        durability_min_level: DurabilityLevel | None = None,
        conflict_mode: ConflictMode = ConflictMode.SEQNO,
        eviction_policy: EvictionPolicy = EvictionPolicy.VALUE_ONLY,
    ) -> None:
        self.name = name
        # What leaves memory over the quota: values only, or whole items (module docstring)
        self.eviction_policy = EvictionPolicy(eviction_policy)
        # Fixed when the bucket is created: a file beside its storage keeps it (XDCR)
        self.conflict_mode = fixed_conflict_mode(Path(path), name, conflict_mode)
        # A SyncWrite's timeout when its request names none (the reference's 30 s).
        self.durability_timeout_ms = durability_timeout_ms
        # Every front-end write at least this level (a write with none becomes a SyncWrite).
        self.durability_min_level = durability_min_level
        # Called (under a vbucket's lock, from the loop or the flusher thread: it must only
        # take note) with the answers SyncWrites get (VBucket.on_sync_outcomes).
        self.sync_outcomes: Callable[[int, list[SyncOutcome]], None] | None = None
        self.compression_mode = compression_mode  # what values are kept and sent as (document)
        self.path = Path(path)
        self.num_vbuckets = num_vbuckets
        self.memory_quota = memory_quota
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.SystemRandom()
        self.checkpoint_max_items = checkpoint_max_items
        self.max_item_size = max_item_size
        self.vbuckets: dict[int, VBucket] = {}
        self.storage: BucketStorage = open_storage(
            self.path, name, history_window=history_window, synchronous=synchronous,
            cache_bytes=storage_cache_bytes(memory_quota),
        )  # fmt: skip
        self._io_lock = threading.RLock()
        self._writes = 0
        self._memory_estimate = 0
        # Set when a reclaim could not make room: (items persisted then, monotonic time).
        self._full_since: tuple[int, float] | None = None
        self.closed = False
        self.seqno_listeners: list[Callable[[int], None]] = []
        self.items_persisted = 0
        self.disk_error: str | None = None  # why the last flush failed; None once one succeeds
        self.flush_failures = 0
        # Monotonic times of the oldest write not yet taken by a flush, and of the oldest write
        # of the flush being written: together, how long an acknowledged write has waited.
        self._dirty_since: float | None = None
        self._inflight_since: float | None = None
        self.state_listeners: list[Callable[[int], None]] = []
        # Called (under a vbucket's lock, any thread: take note only) when a replica vbucket
        # has a high prepared seqno to acknowledge to its active (VBucket.take_seqno_ack).
        self.seqno_ack_listeners: list[Callable[[int], None]] = []
        # The flush queue: ids of the vbuckets with something to persist (module docstring).
        self._flush_queue: set[int] = set()
        # The backlog's shape since the last flush took its batches (flush_cadence.Backlog).
        self._queued_items = 0
        self._state_pending = False
        self._persistence_wanted = False
        self.flushes_deferred = 0  # flusher ticks that let a sparse backlog gather
        self._last_flush_items = 0
        self.flush_visits = 0  # vbuckets the flusher has visited, in all (a flush's cost)
        self.bg_fetcher: BgFetcher | None = None  # (start_background_fetch)
        # Random 63-bit start: a restarted node never reuses the CAS a manager last saw.
        self.state_cas = self.rng.getrandbits(63) | 1
        self.warmed_up_after_clean_shutdown = self.warmup()

    def __enter__(self) -> Bucket:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.closed:
            self.shutdown()

    # -- vbuckets --------------------------------------------------------------------------

    def vbucket_for(self, key: bytes) -> int:
        return vbucket_for_key(key, self.num_vbuckets)

    def get_vbucket(self, vb: int) -> VBucket:
        vbucket = self.vbuckets.get(vb)
        if vbucket is None:
            raise NotMyVbucket(f"vbucket {vb} does not exist here")
        return vbucket

    def _check_state_cas(self, cas: int) -> None:
        if cas and cas != self.state_cas:
            raise StateCasMismatch(self.state_cas)

    def set_vbucket_state(
        self, vb: int, state: VBucketState | str, *, cas: int = 0, transfer: bool = False
    ) -> VBucket:
        """Create the vbucket (fresh failover table at 0) or change its state; ``cas`` (when
        not 0) must be the current state CAS (see the module docstring); ``transfer``: a
        takeover made it active (:meth:`VBucket.set_state`)."""
        if not 0 <= vb < self.num_vbuckets:
            raise NotMyVbucket(f"vbucket {vb} is outside 0..{self.num_vbuckets - 1}")
        state = VBucketState.of(state)
        self._check_state_cas(cas)
        self.state_cas += 1
        vbucket = self.vbuckets.get(vb)
        if vbucket is None:
            vbucket = self._make(vb, state, FailoverTable.fresh(0, rng=self.rng), None)
            self.vbuckets[vb] = vbucket
        else:
            vbucket.set_state(state, transfer=transfer)
        self._state_changed(vb)
        return vbucket

    def delete_vbucket(self, vb: int, *, cas: int = 0) -> None:
        self._check_state_cas(cas)
        self.state_cas += 1
        with self._io_lock:
            vbucket = self.vbuckets.pop(vb, None)
            if vbucket is not None:
                vbucket.set_state(VBucketState.DEAD)
                vbucket.checkpoints.reset(0)
            self.storage.delete_vbucket(vb)
        self._state_changed(vb)

    def _state_changed(self, vb: int) -> None:
        for listener in list(self.state_listeners):
            listener(vb)

    def _queued(self, vb: int) -> None:
        if self._dirty_since is None:
            self._dirty_since = time.monotonic()
        self._queued_items += 1
        self._flush_queue.add(vb)
        for listener in self.seqno_listeners:
            listener(vb)

    def _make(
        self, vb: int, state: VBucketState, failover: FailoverTable, s: VBState | None
    ) -> VBucket:
        vbucket = VBucket(
            vb,
            state,
            clock=self.clock,
            failover=failover,
            high_seqno=s.high_seqno if s else 0,
            max_cas=s.max_cas if s else 0,
            purge_seqno=s.purge_seqno if s else 0,
            persisted_snapshot=(s.snap_start, s.snap_end) if s else (0, 0),
            checkpoint_max_items=self.checkpoint_max_items,
            max_item_size=self.max_item_size,
            fetch=self.storage.get,
            admit=self._admit,
            eviction=self.eviction_policy,
            high_prepared_seqno=s.high_prepared_seqno if s else 0,
            high_completed_seqno=s.high_completed_seqno if s else 0,
            may_exist=self.storage.may_exist,
        )
        vbucket.background_fetch = self.bg_fetcher is not None
        vbucket.on_fetch_wanted = self._fetch_wanted
        vbucket.on_queued = self._queued
        vbucket.on_persistence_wanted = self.want_persistence
        vbucket.conflict_mode = self.conflict_mode
        vbucket.durability_timeout_ms = self.durability_timeout_ms
        vbucket.on_sync_outcomes = self._sync_outcomes
        vbucket.on_seqno_ack = self._seqno_ack_due
        vbucket.on_dirty = self._state_dirty
        self._state_dirty(vb)  # a new VBucket starts with its state to write
        return vbucket

    def _fetch_wanted(self, vbucket: VBucket) -> None:
        if self.bg_fetcher is not None:
            self.bg_fetcher.notify(vbucket)

    # -- background fetches (engine/bg_fetch.py) ------------------------------------------------

    def start_background_fetch(self, landed: Callable[[Landing], None]) -> None:
        """From now on front-end requests never read storage on their own thread: one that
        must raises WouldBlock, its caller waits (:meth:`VBucket.wait_for`), a fetcher thread
        reads, and ``landed`` gets each batch (from that thread: the caller hands it to
        :meth:`land_fetches` on the requests' thread)."""
        if self.bg_fetcher is not None:
            return
        self.bg_fetcher = BgFetcher(self.name, self.storage.get_many, landed)
        for vbucket in list(self.vbuckets.values()):
            vbucket.background_fetch = True

    def stop_background_fetch(self) -> None:
        fetcher, self.bg_fetcher = self.bg_fetcher, None
        for vbucket in list(self.vbuckets.values()):
            vbucket.background_fetch = False
        if fetcher is not None:
            fetcher.stop()

    @staticmethod
    def land_fetches(landing: Landing) -> None:
        """Run again the requests that waited for a batch of reads (on the requests' own
        thread) while the whole batch is ready: a request whose connection goes on to the
        next (pipelined) request finds that one's read ready too."""
        waiting = [
            (vbucket, key, vbucket.land_fetch(key, fetched)) for vbucket, key, fetched in landing
        ]
        try:
            for _, _, waiters in waiting:
                for waiter in waiters:
                    waiter()
        finally:
            for vbucket, key, _ in waiting:
                vbucket.fetch_consumed(key)

    def _sync_outcomes(self, vb: int, outcomes: list[SyncOutcome]) -> None:
        if self.sync_outcomes is not None:
            self.sync_outcomes(vb, outcomes)

    def _seqno_ack_due(self, vb: int) -> None:
        for listener in self.seqno_ack_listeners:
            listener(vb)

    def durability_tick(self) -> None:
        """Time passed: every active vbucket's SyncWrites past their timeout abort."""
        for vbucket in list(self.vbuckets.values()):
            # Only vbuckets with prepares pending are ticked (under their lock): taking every
            # active vbucket's lock 20 times a second was a few % of a core at 1024 of them.
            # Prepares are added on the thread that ticks, so this read misses none.
            monitor = vbucket.durability
            if monitor is not None and monitor.num_pending:
                vbucket.durability_tick()

    def _state_dirty(self, vb: int) -> None:
        self._state_pending = True
        self._flush_queue.add(vb)

    # -- warm-up and shutdown ------------------------------------------------------------------

    def warmup(self) -> bool:
        """Load every vbucket from storage; returns whether the last shutdown was clean."""
        with self._io_lock:
            with self.storage.reading("warm-up"):  # reads only: a damaged file stays as it is
                clean = self.storage.was_clean_shutdown()
                # memory_used of the vbuckets loaded so far, summed as they load (memory_used
                # visits every vbucket: once per vbucket, 1M visits, 10 % of a 2M-item warm-up)
                loaded = 0
                for vb, s in self.storage.vbucket_states().items():
                    failover = FailoverTable.from_json(s.failover_json, s.high_seqno, rng=self.rng)
                    state = VBucketState.of(s.state)
                    if not clean and state == VBucketState.ACTIVE:
                        failover.create_entry(s.snap_end)
                    vbucket = self._make(vb, state, failover, s)
                    self.vbuckets[vb] = vbucket
                    self._load(vbucket, values=loaded < self.memory_quota * WARMUP_VALUE_FRACTION)
                    vbucket.load_prepares(self.storage.load_prepares(vb))
                    loaded += _charged(vbucket)
            self.storage.set_clean_shutdown(False)
            self.flush_once()  # the new failover entries must be durable before anyone sees them
            return clean

    def _load(self, vbucket: VBucket, *, values: bool) -> None:
        """Warm-up's documents of one vbucket: all its keys (``values``: theirs too, while
        they fit), or none under full eviction (they are counted non-resident)."""
        if self.eviction_policy is EvictionPolicy.FULL:
            vbucket.load_nonresident(self.storage.item_count(vbucket.id))
            return
        vbucket.load(self.storage.load_items(vbucket.id, values=values))

    def shutdown(self) -> None:
        """Flush everything, record a clean shutdown, close storage."""
        self.stop_background_fetch()
        with self._io_lock:
            while self.flush_once():
                pass
            self.storage.set_clean_shutdown(True)
            self.storage.close()
            self.closed = True

    # -- flusher ---------------------------------------------------------------------------

    def flush_once(self) -> int:
        """Persist every vbucket's unpersisted snapshots in one synced write; items written."""
        with self._io_lock:
            # Cleared before the batches are taken: a write that lands meanwhile sets it again
            # (its age is then overstated by at most one flush, never understated).
            taken_since, self._dirty_since = self._dirty_since, None
            self._queued_items = 0
            self._state_pending = self._persistence_wanted = False
            batches = self._take_batches()
            if not batches:
                return 0
            self._inflight_since = taken_since
            try:
                self.storage.persist((b.vb, b.items, b.vbstate) for b in batches)
            except BaseException as exc:
                for b in batches:
                    if (failed := self.vbuckets.get(b.vb)) is not None:
                        failed.flush_failed()
                self._dirty_since = _earliest(taken_since, self._dirty_since)
                self.flush_failures += 1
                self.disk_error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self._inflight_since = None
            self.disk_error = None
            for b in batches:
                if (flushed := self.vbuckets.get(b.vb)) is not None:
                    flushed.mark_persisted(b)
            written = sum(len(b.items) for b in batches)
            self._last_flush_items = written
            self.items_persisted += written
            return written

    def _take_batches(self) -> list[FlushBatch]:
        """The batches of the vbuckets in the flush queue, which they leave first (sorted:
        the storage's keys lead with the vbucket, so its writes go in key order)."""
        queue = self._flush_queue
        dirty = sorted(queue)  # (a copy made at C speed: atomic under the GIL)
        queue.difference_update(dirty)
        self.flush_visits += len(dirty)
        vbuckets = self.vbuckets
        return [
            batch
            for vb in dirty
            if (vbucket := vbuckets.get(vb)) is not None and (batch := vbucket.take_flush_batch())
        ]

    @property
    def writes_admitted(self) -> int:
        """Front-end writes admitted so far (a counter: the server compares two readings)."""
        return self._writes

    def backlog(self) -> Backlog:
        """What the next flush would write, in O(1) (:func:`~dcpkv.engine.flush_cadence.due`
        decides from it)."""
        return Backlog(
            items=self._queued_items,
            vbuckets=len(self._flush_queue),
            lag_s=self.persistence_lag(),
            state=self._state_pending,
            # Over its quota the bucket refuses writes until persisted values can be ejected:
            # writers wait on the disk as much as a client that asks.
            wanted=self._persistence_wanted or self._full_since is not None,
            last_flush=self._last_flush_items,
        )

    def want_persistence(self) -> None:
        """A client asked whether a write is on disk and it is not yet, or a SyncWrite's
        prepare waits to be persisted: the next flusher tick writes the backlog, sparse or not
        (``flush_cadence``, case W)."""
        self._persistence_wanted = True

    def flush_if_due(self, interval_s: float, *, waiting: bool = False) -> int:
        """:meth:`flush_once` when :func:`~dcpkv.engine.flush_cadence.due` says so; items
        written (0 also when a sparse backlog was left to gather)."""
        backlog = self.backlog()
        if due(backlog, interval_s, waiting=waiting):
            return self.flush_once()
        if backlog.vbuckets:
            self.flushes_deferred += 1
        return 0

    def persistence_lag(self) -> float:
        """Seconds the oldest acknowledged, not yet persisted write has waited (0.0: none)."""
        oldest = _earliest(self._dirty_since, self._inflight_since)
        return 0.0 if oldest is None else max(0.0, time.monotonic() - oldest)

    # -- replica rollback, compaction, expiry --------------------------------------------------

    def rollback(self, vb: int, seqno: int) -> int:
        """Roll a replica/pending vbucket back to (at most) ``seqno``; returns where it went."""
        vbucket = self.get_vbucket(vb)
        if vbucket.state not in (VBucketState.REPLICA, VBucketState.PENDING):
            raise NotMyVbucket(f"vbucket {vb} is {vbucket.state}: only replicas roll back")
        with self._io_lock:
            self.flush_once()
            revived = vbucket.completions_above(seqno)
            point = self.storage.rollback(vb, seqno)
            s = self.storage.vbucket_state(vb)
            assert s is not None
            failover = FailoverTable.from_json(s.failover_json, s.high_seqno, rng=self.rng)
            if self.eviction_policy is EvictionPolicy.FULL:  # as warm-up: no items, the count
                vbucket.reset(s, failover, (), self.storage.item_count(vb))
            else:
                vbucket.reset(s, failover, self.storage.load_items(vb))
            stored = self.storage.load_prepares(vb)  # (RocksDB: completed ones revived too)
            held = {p.key for p in stored}
            kept = [p for p in revived if p.by_seqno <= point and p.key not in held]
            vbucket.load_prepares(sorted([*stored, *kept], key=lambda p: p.by_seqno))
            self.flush_once()
        # Wake the DCP streams of this vbucket (as a queued item would): each sees the new
        # generation on its next refill and ends with Rollback, even one idle in memory.
        for listener in self.seqno_listeners:
            listener(vb)
        return point

    def divergence(self, vb: int, seqno: int) -> list[tuple[Item, Item | None]]:
        """What :meth:`rollback` to ``seqno`` would undo, key by key: (our latest version,
        our version at the point it lands on, or None). Flushes first, so memory counts."""
        with self._io_lock:
            self.flush_once()
            return [
                (item_from_row(ours), None if old is None else item_from_row(old))
                for ours, old in self.storage.divergence(vb, seqno)
            ]

    def compact(
        self,
        vb: int | None = None,
        *,
        purge_before_seqno: int | None = None,
        purge_older_than_secs: float | None = None,
    ) -> dict[int, CompactResult]:
        """Purge tombstones of one or every vbucket; raises their purge seqnos."""
        results: dict[int, CompactResult] = {}
        with self._io_lock:
            for vbid in [vb] if vb is not None else list(self.vbuckets):
                vbucket = self.get_vbucket(vbid)
                result = self.storage.compact(
                    vbid,
                    purge_before_seqno=purge_before_seqno,
                    purge_older_than_secs=purge_older_than_secs,
                    now=self.clock.time(),
                )
                with vbucket.lock:
                    vbucket.purge_seqno = max(vbucket.purge_seqno, result.purge_seqno)
                results[vbid] = result
        return results

    def expiry_pager(self) -> int:
        return sum(vb.expiry_pager() for vb in list(self.vbuckets.values()))

    def delete_all(self) -> int:
        """memcached's Flush: every live document of every active vbucket deleted, the ones
        only storage holds (full eviction) too (:meth:`VBucket.delete_all`); returns how many."""
        deleted = 0
        for vbucket in list(self.vbuckets.values()):
            if vbucket.state is VBucketState.ACTIVE:
                deleted += vbucket.delete_all(partial(self.storage.load_items, vbucket.id))
        return deleted

    def get_from_storage(self, vb: int, key: bytes) -> Item | None:
        return self.storage.get(vb, key)

    # -- memory ----------------------------------------------------------------------------

    @property
    def memory_used(self) -> int:
        return sum(_charged(vb) for vb in list(self.vbuckets.values()))

    def reclaim(self, target: int) -> int:
        """Free memory down to ``target`` bytes: drop slow cursors, then eject values."""
        for vbucket in list(self.vbuckets.values()):
            # Closing lets a fully-read open checkpoint go; cursors behind are dropped.
            vbucket.checkpoints.close_open_checkpoint()
            vbucket.checkpoints.drop_slow_cursors(0)
        used = self.memory_used
        for vbucket in list(self.vbuckets.values()):
            if used <= target:
                break
            used -= vbucket.eject(used - target)
        self._memory_estimate = self.memory_used
        return self._memory_estimate

    def _admit(self, size: int) -> None:
        if self.disk_error is not None:
            raise TempFail(f"the flusher cannot persist ({self.disk_error}); retry")
        size += HT_ENTRY_OVERHEAD  # the write may add a hash-table entry
        self._writes += 1
        # The estimate only grows between recounts (a write is charged, what it replaces is
        # not credited), so it errs on the safe side: recount (O(vbuckets)) every
        # _ADMIT_RECHECK writes, and whenever the estimate says the quota is reached, never on
        # every write near the quota (that made a full bucket take a few thousand writes/s).
        self._memory_estimate += size
        if self._writes % _ADMIT_RECHECK == 0 or self._memory_estimate > self.memory_quota:
            self._memory_estimate = self.memory_used + size
        if self._memory_estimate <= self.memory_quota:
            self._full_since = None
            return
        if self._still_full():
            raise TempFail("memory quota reached; retry after the flusher has caught up")
        used = self.reclaim(int(self.memory_quota * LOW_WATERMARK))
        if used + size > self.memory_quota:
            self._full_since = (self.items_persisted, time.monotonic())
            raise TempFail("memory quota reached; retry after the flusher has caught up")
        # The write being admitted counts too: an estimate of what the reclaim left alone let
        # the next writes take the bucket over its quota by one write.
        self._memory_estimate = used + size
        self._full_since = None

    def _still_full(self) -> bool:
        """A reclaim walks every vbucket: after one that could not make room, the next waits
        until a flush has persisted something (values become ejectable) or a moment has
        passed, so a full bucket refuses writes in O(1) instead of walking on every one."""
        if self._full_since is None:
            return False
        persisted, since = self._full_since
        return self.items_persisted == persisted and time.monotonic() - since < RECLAIM_PAUSE_S
