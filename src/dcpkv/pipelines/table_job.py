"""A streaming table job: a Spark query's batches applied, exactly once, to a versioned table.

Theory of operation
-------------------
A table's query (:func:`start_stream`) runs ``spark.readStream.format("dcpkv")`` with
``foreachBatch``; each batch is applied to a versioned change table (``vtable.py``: Parquet
directories named by an atomically replaced ``_manifest.json``; Delta Lake is not usable, its
jars come from Maven, which this machine cannot reach) by :class:`TableJob`, the function
given to ``foreachBatch``. The mirror (``mirror.py``) and the views (``views/``) are such
tables:

1. its rows, rollback rows included, are written once into a new directory with their stream
   position (``ord`` = the table's batch ordinal, ``pos`` = order inside the batch);
2. its rollback rows are read back and become manifest entries. A rollback to R at or above
   the vbucket's retention floor is exact (the history above the floor is all there). One below
   the floor *resyncs* the vbucket: a batch read ``mode=changes`` from 0 up to the vbucket's
   high seqno H now, stored at the rollback's position, and a ``skip`` entry that hides the
   stream's own changes up to H (they are in the resync already). All the vbuckets a batch
   resyncs are read in ONE Spark read (a vbucket list and an end offset for each, every
   vbucket's rows stamped with its own rollback's position): after a failover a batch can
   resync hundreds, and a read, a write and a check per vbucket took minutes;
3. the manifest is committed with the batch id and the applied source offset (Spark wrote it
   to ``<checkpoint>/offsets/<batch id>`` before running the batch): exactly once, since a
   re-run of a batch whose id the manifest already holds does nothing.

Every ``compact_every`` batches at the earliest the table is compacted, once it has grown
enough since the last compaction (``vtable.compaction_due``). Retention rule: the floor of a vbucket
becomes the highest consistent point the stream has (its applied seqno and the offset's earlier
batch ends) that is at or below the server's *persisted* seqno for that branch (ObserveSeqno).
A node rolls back only to its last persisted snapshot (a branch starts at or above what was on
disk) and the source rolls back to one of its consistent points at or below that, so the
rollback point is at or above the floor and the history above it suffices; anything else (a
failover to a lagging replica, a purge) falls back to the resync, which is always correct.

Per batch a JSON line of :class:`BatchStats` goes to ``<to>/_metrics.jsonl``.

Stopping (:func:`stop_query`, for Ctrl-C). ``query.stop()`` interrupts the stream thread
wherever it is: in the middle of a batch's Parquet write that is a page of Java
``InterruptedException`` traces and a directory the manifest never names. So a pipeline's
query stops between batches: :meth:`TableJob.stop` waits for the batch in flight to commit
and makes any later batch refuse to start (:class:`PipelineStopping`, before writing
anything; Spark did not commit that batch, so a restarted query runs it again), and only
then is the query stopped, with Spark's log silenced for the stop itself. The stop also
finishes a background compaction (waited for and swapped in, or cancelled and deleted), so
nothing half-written is left behind.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dcpkv.core.errors import DcpkvError
from dcpkv.pipelines import vtable
from dcpkv.pipelines.compactor import Compactor
from dcpkv.pipelines.source_node import SourceSettings, persisted_seqnos
from dcpkv.pipelines.vtable import Entry, Manifest
from dcpkv.spark.link import DriverLink

RESYNC_ATTEMPTS = 3
STOP_WAIT_S = 300.0  # how long a stop waits for the batch in flight before interrupting it
SPARK_LOG_LEVEL = "ERROR"  # the pipelines' level, restored after a stop


class PipelineStopping(DcpkvError, RuntimeError):
    """A batch refused to start because its pipeline is stopping (it runs after a restart)."""


@dataclass(frozen=True)
class BatchStats:
    """One applied batch. ``seconds``: the whole batch (its write, commit, and what runs after
    the commit: a following view, a compaction's swap). ``lag``: changes not yet applied (sum
    over vbuckets of high seqno minus applied seqno) right after the commit, None when the
    server could not be asked. ``lag_s``: seconds from the write of the batch's oldest change
    (its CAS, a hybrid logical clock) to the batch's commit, i.e. the longest a change of it
    waited to be visible; None for a batch without changes or rows without a CAS (a view).
    ``visible_s``: seconds from the batch's start (Spark handing it to ``foreachBatch``) to its
    commit, when its rows became visible to readers (None: a view's)."""

    batch_id: int
    finished_at: float
    rows: int
    rollbacks: int
    seconds: float
    lag: int | None
    lag_s: float | None = None
    visible_s: float | None = None


# -- batches, rollbacks and floors ------------------------------------------------------------


def lag_from(highs: dict[int, tuple[int, int]], applied: dict[int, tuple[int, int]]) -> int:
    """Changes not yet applied: the sum over applied vbuckets of high seqno minus applied."""
    return sum(max(0, highs[vb][1] - applied[vb][1]) for vb in highs if vb in applied)


def resync_rows(
    rollbacks: Sequence[vtable.RollbackRow], floors: Mapping[int, int]
) -> list[vtable.RollbackRow]:
    """The rollback rows of a batch (stream order) that resync their vbucket: one below its
    vbucket's floor (the history it needs is gone), and every later one of a vbucket already
    resynced in the batch (the batch reads each such vbucket once, as it is now, so a later
    rollback of it is a resync too: always exact, and its H is the same read's)."""
    out: list[vtable.RollbackRow] = []
    resynced: set[int] = set()
    for rb in rollbacks:
        if rb.vbucket in resynced or rb.seqno < floors.get(rb.vbucket, 0):
            resynced.add(rb.vbucket)
            out.append(rb)
    return out


def rollback_entries(
    rollbacks: Sequence[vtable.RollbackRow],
    resyncs: Sequence[vtable.RollbackRow],
    highs: Mapping[int, int],
    ord_: int,
) -> list[Entry]:
    """A batch's manifest entries, in stream order: a rollback row becomes a rollback entry at
    its place; one of ``resyncs`` a reset (rollback to -1) and a skip to its vbucket's resync
    seqno ``highs[vb]``, both at its own place (``vtable``'s docstring)."""
    resync = set(resyncs)
    out: list[Entry] = []
    for rb in rollbacks:
        if rb in resync:
            out.append(Entry("rollback", rb.vbucket, -1, ord_, rb.pos))
            out.append(Entry("skip", rb.vbucket, highs[rb.vbucket], ord_, rb.pos))
        else:
            out.append(Entry("rollback", rb.vbucket, rb.seqno, ord_, rb.pos))
    return out


def caught_up(applied: dict[int, tuple[int, int]], highs: dict[int, tuple[int, int]]) -> bool:
    """Has every vbucket applied its high seqno on the server's current branch?"""
    for vb, (uuid, high) in highs.items():
        if high == 0:
            continue
        got = applied.get(vb)
        if got is None or got[0] != uuid or got[1] < high:
            return False
    return True


def floors_from(manifest: Manifest, persisted: dict[int, int]) -> dict[int, int]:
    """The retention floor per vbucket: the highest consistent point of the applied offset
    (its seqno and earlier batch ends) at or below the persisted seqno."""
    floors = {}
    for vb, safe in persisted.items():
        applied = manifest.applied.get(vb)
        if applied is None:
            continue
        points = [int(p) for p in applied.get("points", [])] + [int(applied["seqno"])]
        below = [p for p in points if p <= safe]
        if below:
            floors[vb] = max(below)
    return floors


# -- the job -----------------------------------------------------------------------------------


def applied_offset(checkpoint: Path, batch_id: int) -> dict[int, dict[str, Any]] | None:
    """The source offset at the end of ``batch_id``, from Spark's offset log (the last line of
    ``offsets/<id>`` is the one source's offset JSON)."""
    path = checkpoint / "offsets" / str(batch_id)
    try:
        doc = json.loads(path.read_text().strip().splitlines()[-1])
        return {int(vb): pos for vb, pos in doc["vbuckets"].items()}
    except (OSError, ValueError, KeyError, IndexError):
        return None


@dataclass
class TableJob:
    """The ``foreachBatch`` function that applies a batch of source rows to a table."""

    spark: Any
    table: Path
    schema: Any
    transform: Callable[[Any], Any]
    source: SourceSettings
    checkpoint: Path
    compact_every: int | None = 10
    on_batch: Callable[[BatchStats], None] | None = None
    # Runs after each commit with the batch id (and for a batch committed before a restart):
    # a view that follows this table applies the batch in the same Spark batch (demo.py).
    after_commit: Callable[[int], None] | None = None
    # Runs when the job stops, between batches (a follower's own compaction to finish).
    on_stop: Callable[[], None] | None = None
    _busy: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stopping: bool = field(default=False, init=False)
    _link: DriverLink = field(init=False, repr=False)
    compactor: Compactor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._link = DriverLink(self.source)  # lag and resync questions, one connection
        floors = server_floors(self.source)
        self.compactor = Compactor(self.spark, self.table, self.schema, self.compact_every, floors)

    def __call__(self, df: Any, batch_id: int) -> None:
        with self._busy:
            if self._stopping:
                raise PipelineStopping(f"batch {batch_id} not started: the pipeline is stopping")
            self._apply(df, batch_id)

    def stop(self, timeout: float = STOP_WAIT_S) -> bool:
        """Wait (up to ``timeout``) for the batch in flight; no batch starts afterwards.
        False when the batch did not finish in time."""
        done = self._busy.acquire(timeout=timeout)
        self._stopping = True
        if done:
            try:
                self.compactor.finish()  # swapped in, or cancelled and deleted
                if self.on_stop is not None:
                    self.on_stop()
            finally:
                self._link.close()
                self._busy.release()
        return done

    def _apply(self, df: Any, batch_id: int) -> None:
        manifest = vtable.load_manifest(self.table)
        if batch_id <= manifest.batch_id:
            self._after_commit(batch_id)  # its follower may not have applied it yet
            return  # committed before a restart: Spark re-runs the last batch, we do not
        started = time.monotonic()
        ord_ = manifest.ord + 1
        rows = vtable.stamp(self.transform(df), ord_)
        name = vtable.write_rows(self.table, rows, f"b{ord_:08d}")
        summary = vtable.batch_summary(self.spark, self.table, name)  # one job, not two
        rollbacks = summary.rollbacks
        manifest.files.append(name)
        if rollbacks:
            self._roll_back(manifest, ord_, rollbacks)
        manifest.ord = ord_
        manifest.batch_id = batch_id
        manifest.applied.update(applied_offset(self.checkpoint, batch_id) or {})
        vtable.note_rows(manifest, summary.rows)
        vtable.commit_manifest(self.table, manifest)
        committed = time.time()  # the batch's rows are visible from here
        self._after_commit(batch_id)
        self.compactor.step(manifest)  # off the batch path (compactor.py)
        changes = summary.rows - len(rollbacks)
        self._report(
            batch_id, changes, len(rollbacks), started, manifest, summary.oldest_cas, committed
        )

    def _roll_back(
        self, manifest: Manifest, ord_: int, rollbacks: list[vtable.RollbackRow]
    ) -> None:
        resyncs = resync_rows(rollbacks, manifest.floors)
        # The last resync row of a vbucket is where its read goes (dict: the last one wins).
        places = {rb.vbucket: rb.pos for rb in resyncs}
        highs, names = self._resync(places, ord_) if places else ({}, [])
        manifest.entries.extend(rollback_entries(rollbacks, resyncs, highs, ord_))
        manifest.files.extend(names)
        manifest.floors.update(highs)

    def _resync(self, places: dict[int, int], ord_: int) -> tuple[dict[int, int], list[str]]:
        """Read the vbuckets of ``places`` from 0 to their high seqnos now, in ONE Spark read;
        each vbucket's rows take its rollback's position (``places[vb]``), so earlier entries
        leave them alone and its skip entry hides what the stream sends again up to that seqno.
        A vbucket that rolled back during the read (a rollback row among its rows) is dropped
        from the written rows and read again. Returns vbucket -> the seqno read to, and the
        directories written."""
        pending, highs, names = dict(places), {}, []
        for _attempt in range(RESYNC_ATTEMPTS):
            seqnos = self._highs()
            lost = sorted(set(pending) - set(seqnos))
            if lost:
                raise RuntimeError(f"vbucket {lost[0]}: no high seqno to resync it to")
            now = {vb: seqnos[vb] for vb in pending}
            name = self._read_changes(now, pending, ord_)
            again = {rb.vbucket for rb in vtable.written_rollbacks(self.spark, self.table, name)}
            kept = vtable.without_vbuckets(self.spark, self.table, name, again)
            names.extend([kept] if kept else [])
            highs.update({vb: now[vb][1] for vb in pending if vb not in again})
            pending = {vb: p for vb, p in pending.items() if vb in again}
            if not pending:
                return highs, names
        raise RuntimeError(f"vbucket {min(pending)}: the server kept rolling back during a resync")

    def _read_changes(
        self, ends: dict[int, tuple[int, int]], places: dict[int, int], ord_: int
    ) -> str:
        """Write the changes of ``ends``' vbuckets from 0 to (uuid, seqno), stamped (ord_,
        ``places[vb]``); the directory's name."""
        from dcpkv.spark.sparkoffsets import SparkOffsets, VbPosition

        ending = SparkOffsets({vb: VbPosition.at(h, u) for vb, (u, h) in ends.items()}).to_json()
        vbs = ",".join(str(vb) for vb in sorted(ends))
        reader = self.spark.read.format("dcpkv").options(**self.source.options())
        df = reader.options(vbuckets=vbs, mode="changes", endingOffsets=ending).load()
        rows = vtable.stamp(self.transform(df), ord_, places)
        return vtable.write_rows(self.table, rows, f"r{ord_:08d}")

    def _after_commit(self, batch_id: int) -> None:
        if self.after_commit is not None:
            self.after_commit(batch_id)

    def _highs(self) -> dict[int, tuple[int, int]]:
        """vbucket -> (uuid, high seqno) now, on the job's kept connection."""
        from dcpkv.client.sync import SyncConsumer

        return self._link.ask(SyncConsumer.vbucket_seqnos)

    def _lag(self, applied: dict[int, tuple[int, int]]) -> int | None:
        try:
            return lag_from(self._highs(), applied)
        except (OSError, RuntimeError, ValueError):
            return None

    def _report(
        self, batch_id: int, rows: int, rollbacks: int, started: float, manifest: Manifest,
        oldest_cas: int | None, committed: float,
    ) -> None:  # fmt: skip
        lag = self._lag(manifest.applied_seqnos())
        report_batch(
            self.table, self.on_batch, batch_id, rows, rollbacks, started, lag, oldest_cas,
            committed,
        )  # fmt: skip


def report_batch(
    table: Path, on_batch: Callable[[BatchStats], None] | None, batch_id: int, rows: int,
    rollbacks: int, started: float, lag: int | None, oldest_cas: int | None, committed: float,
) -> BatchStats:  # fmt: skip
    """The :class:`BatchStats` of a batch that started at ``started`` (monotonic) and was
    committed at ``committed`` (wall clock), appended to the table's metrics and handed to
    ``on_batch``."""
    seconds = time.monotonic() - started
    finished = time.time()
    stats = BatchStats(
        batch_id=batch_id,
        finished_at=finished,
        rows=rows,
        rollbacks=rollbacks,
        seconds=seconds,
        lag=lag,
        lag_s=None if oldest_cas is None else max(0.0, committed - oldest_cas / 1e9),
        visible_s=max(0.0, seconds - (finished - committed)),
    )
    vtable.append_metrics(table, asdict(stats))
    if on_batch is not None:
        on_batch(stats)
    return stats


def server_floors(source: SourceSettings) -> Callable[[Manifest], dict[int, int]]:
    """The floors a compaction of a snapshot may raise the table's to: :func:`floors_from`
    the server's persisted seqnos for the snapshot's branches (none when it cannot be asked:
    the floors then stay put)."""

    def floors(manifest: Manifest) -> dict[int, int]:
        uuids = {vb: u for vb, (u, _s) in manifest.applied_seqnos().items()}
        try:
            persisted = persisted_seqnos(source, uuids)
        except (OSError, RuntimeError, ValueError):
            persisted = {}
        return floors_from(manifest, persisted)

    return floors


def compact_table(
    spark: Any,
    table: Path,
    schema: Any,
    source: SourceSettings | None,
    *,
    persisted: dict[int, int] | None = None,
) -> Manifest:
    """Compact a table now, its job not running (a running job compacts on its own, in the
    background). The floors come from ``persisted`` if given, else from the server's persisted
    seqnos, else stay put."""
    manifest = vtable.load_manifest(table)
    if persisted is not None or source is None:
        floors = floors_from(manifest, persisted or {})
    else:
        floors = server_floors(source)(manifest)
    return vtable.compact(spark, table, manifest, schema, floors)


# -- the query ---------------------------------------------------------------------------


def start_stream(
    spark: Any,
    source: SourceSettings,
    job: TableJob,
    *,
    available_now: bool,
    trigger_seconds: float,
    starting: str | None = None,
) -> Any:
    """``job``'s query on ``source``; ``starting``: its ``startingOffsets`` (a checkpoint
    with a committed batch overrides them, as Spark does)."""
    import dcpkv.spark

    dcpkv.spark.register(spark)
    job.table.mkdir(parents=True, exist_ok=True)
    # A live query compacts beside its batches and finishes the compaction when stopped
    # (stop_query); an AvailableNow run ends without a stop, so it compacts inside its batch.
    job.compactor.background = not available_now
    options = source.options() | ({"startingOffsets": starting} if starting else {})
    stream = spark.readStream.format("dcpkv").options(**options).load()
    writer = stream.writeStream.foreachBatch(job).option("checkpointLocation", str(job.checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    query = writer.start()
    _JOBS[str(query.id)] = job
    return query


_JOBS: dict[str, TableJob] = {}  # query id -> its job, for stop_query


def stop_query(query: Any, timeout: float = STOP_WAIT_S) -> None:
    """Stop a pipeline's query quietly, between batches (module docstring); any query
    works, one not started by :func:`start_stream` is simply stopped."""
    job = _JOBS.pop(str(query.id), None)
    if job is None:
        query.stop()
        return
    context = job.spark.sparkContext
    context.setLogLevel("OFF")  # the refused batch ends the query with an error trace
    try:
        job.stop(timeout)
        with contextlib.suppress(Exception):  # already failed (PipelineStopping) or stopped
            query.stop()
    finally:
        context.setLogLevel(SPARK_LOG_LEVEL)
