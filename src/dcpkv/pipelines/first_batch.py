"""A new mirror's first batch, written by the driver: the initial load without a Spark job.

Theory of operation
-------------------
A new mirror's first batch is the whole bucket (the main job's 30k-document sample). As a
Spark micro-batch it costs, even with Spark warm, the tasks' read (~0.3 s), the JVM's
Arrow-to-Parquet write (~0.3 s) and the job's own overhead (~0.15 s), after the streaming
query's start (seconds: its source runner is a new Python process). The client library
streams 300-500k changes a second on one core and pyarrow writes Parquet at a similar
rate, so the driver writes that batch itself (:func:`load_first_batch`), and the streaming
query starts where it ended:

1. the batch is planned as the streaming source plans one from the query's initial offset
   (``plan.initial_offsets`` and ``plan.batch_end``: each vbucket's branch and high seqno
   now, within ``maxChangesPerTrigger``);
2. it is read by the code a Spark task runs (``read.stream_events``, ``rows.event_batches``:
   the same rows, rollback rows included, and the same clamp of the ends when the server
   cut its history meanwhile), stamped ``ord`` 1 and ``pos`` in stream order, and written as
   it arrives into one Parquet file (``vtable.write_arrow``, the compactor's driver path);
3. the manifest is committed: the directory, the batch's rollback rows as entries (a first
   batch has no floors, so each is an exact rollback, as in a first Spark batch), ``ord`` 1,
   the *planned* end as the applied offset (what Spark would have committed; ``read.py``
   says why that is exact even when a cut history ended the read early), and ``batch_id``
   -1: no Spark batch is in the table yet.

:func:`starting_offsets` then gives the query its ``startingOffsets``: the applied offset,
for as long as the manifest holds no Spark batch. An offset is a vbucket's whole position
(branch uuid, seqno, snapshot, consistent points), so the query's first batch is the one
that would have followed a Spark-made first batch.

Exactness, window by window:

* a crash before the manifest's commit leaves an unnamed directory (no reader sees it, the
  next compaction's swap deletes it) and an empty manifest: the next start loads again;
* a crash after the commit and before the query's first commit. The manifest still holds
  batch_id -1 and the same offset, so the restarted query gets the same ``startingOffsets``;
  Spark runs a batch of its offset log that it did not commit again, from the previous
  batch's end, and for batch 0 from the source's initial offset, i.e. that option: the same
  batch, from the same start. If the table had committed batch 0 before the crash, it skips
  the re-run (a batch id at or below the manifest's), as for any batch
  (``tests/spark/test_first_batch.py`` crashes the query in that window);
* a rollback or failover between the load and the query's first batch: the offset names the
  branch the load read, so the query's first plan finds it moved and rolls back from it (a
  rollback row, an entry) exactly as after any batch;
* the load runs only when the table is empty *and* the query's checkpoint has no offset:
  a batch 0 planned by an earlier query from the earliest offset does not follow on from the
  load's end, so such a checkpoint keeps the Spark path.

Up to :data:`DRIVER_FIRST_ROWS` changes (the seqno distance, an upper bound); a larger first
batch is left to Spark, whose tasks read it in parallel on the executors' memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpkv.pipelines import vtable
from dcpkv.pipelines.mirror_schema import MIRROR_COLUMNS
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.table_job import (
    BatchStats,
    lag_from,
    report_batch,
    resync_rows,
    rollback_entries,
)
from dcpkv.spark.link import DriverLink
from dcpkv.spark.sparkoffsets import SparkOffsets

DRIVER_FIRST_ROWS = 250_000  # a larger first batch is read by Spark's tasks
FIRST_ORD = 1


def starting_offsets(table: Path) -> str | None:
    """The query's ``startingOffsets`` after a driver-written first batch: its end, while no
    Spark batch is in the table (None otherwise: the checkpoint, or the earliest)."""
    manifest = vtable.load_manifest(Path(table))
    if manifest.batch_id >= 0 or not manifest.applied:
        return None
    doc = {"format": 1, "vbuckets": {str(vb): pos for vb, pos in manifest.applied.items()}}
    return SparkOffsets.from_dict(doc).to_json()


def new_mirror(table: Path, checkpoint: Path) -> bool:
    """Whether :func:`load_first_batch` may write the first batch: nothing committed in the
    table, no batch planned in the query's checkpoint (files only, no server)."""
    return vtable.load_manifest(Path(table)).ord == 0 and not has_offsets(checkpoint)


def has_offsets(checkpoint: Path) -> bool:
    """Whether a query's checkpoint has planned a batch (an entry in its offset log)."""
    log = Path(checkpoint) / "offsets"
    return log.is_dir() and any(p.name.isdigit() for p in log.iterdir())


def load_first_batch(
    table: Path,
    source: SourceSettings,
    checkpoint: Path,
    on_batch: Callable[[BatchStats], None] | None = None,
) -> BatchStats | None:
    """Write a new mirror's first batch from the driver (module docstring); None when it is
    not a new mirror (a manifest, or offsets in the checkpoint), there is nothing to read,
    or the batch is larger than :data:`DRIVER_FIRST_ROWS`: Spark's query does it."""
    table = Path(table)
    if not new_mirror(table, checkpoint):
        return None
    started = time.monotonic()
    link = DriverLink(source)
    try:
        plan = _plan(source, link)
        if plan is None:
            return None
        written = _write(table, plan)
        if written is None:
            return None
        committed = time.time()
        lag = _lag(link, plan.end)
    finally:
        link.close()
    return report_batch(
        table, on_batch, -1, written.changes, len(written.rollbacks), started, lag,
        written.oldest_cas, committed,
    )  # fmt: skip


@dataclass(frozen=True)
class _Plan:
    opts: Any  # the source's parsed options (``spark.options.SourceOptions``)
    end: SparkOffsets
    work: list[Any]  # ``spark.plan.VbTarget``s


def _plan(source: SourceSettings, link: DriverLink) -> _Plan | None:
    """The first batch as the streaming source plans it; None: nothing to read, or too much."""
    from dcpkv.client.sync import SyncConsumer
    from dcpkv.spark.options import parse_options
    from dcpkv.spark.plan import batch_end, initial_offsets, targets

    opts = parse_options(source.options())
    seqnos = link.ask(SyncConsumer.vbucket_seqnos)
    begin = initial_offsets(opts.starting, opts.selected(seqnos), seqnos)
    end = batch_end(begin, seqnos, link.ask, opts.max_changes_per_trigger)
    work = targets(begin, end)
    if not work or sum(t.distance for t in work) > DRIVER_FIRST_ROWS:
        return None
    return _Plan(opts, end, work)


@dataclass
class _Written:
    """What the written batch holds (counted as it was written)."""

    rows: int = 0
    rollbacks: list[vtable.RollbackRow] = field(default_factory=list)
    oldest_cas: int | None = None

    @property
    def changes(self) -> int:
        return self.rows - len(self.rollbacks)

    def stamped(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The mirror's stored rows of the source's batches: :data:`MIRROR_COLUMNS`, ``ord``
        and ``pos`` (stream order), noting rollback rows and the oldest CAS on the way."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            n = batch.num_rows
            pos = pa.array(range(self.rows, self.rows + n), pa.int64())
            stored = batch.select(list(MIRROR_COLUMNS))
            stored = stored.append_column("ord", pa.array([FIRST_ORD] * n, pa.int64()))
            stored = stored.append_column("pos", pos)
            rolled = stored.filter(pc.equal(stored["op"], "rollback"))
            for vb, seqno, p in zip(*(rolled[c].to_pylist() for c in ("vbucket", "seqno", "pos")),
                                    strict=True):  # fmt: skip
                self.rollbacks.append(vtable.RollbackRow(vb, seqno, p))
            cas = stored["cas"].filter(pc.greater_equal(stored["cas"], 0))  # 2**63 up: no clock
            low = pc.min(cas).as_py() if len(cas) else None
            if low is not None:
                self.oldest_cas = low if self.oldest_cas is None else min(self.oldest_cas, low)
            self.rows += n
            yield stored


def _write(table: Path, plan: _Plan) -> _Written | None:
    """Read ``plan``, write it, commit the manifest; None (nothing committed, the directory
    deleted) in the case a first batch never meets: a rollback that needs a resync."""
    from dcpkv.spark.read import change_batches

    written = _Written()
    batches = change_batches(plan.opts.client_settings(), plan.work, plan.opts.include_values)
    name = vtable.write_arrow(table, written.stamped(batches), f"b{FIRST_ORD:08d}")
    manifest = vtable.load_manifest(table)
    if resync_rows(written.rollbacks, manifest.floors):
        vtable.delete_dirs(table, [name])
        return None
    manifest.files.append(name)
    manifest.entries.extend(rollback_entries(written.rollbacks, [], {}, FIRST_ORD))
    manifest.ord = FIRST_ORD
    manifest.applied = {int(vb): pos for vb, pos in plan.end.to_dict()["vbuckets"].items()}
    vtable.note_rows(manifest, written.rows)
    vtable.commit_manifest(table, manifest)
    return written


def _lag(link: DriverLink, end: SparkOffsets) -> int | None:
    from dcpkv.client.sync import SyncConsumer

    applied = {vb: (p.offset.vb_uuid, p.offset.seqno) for vb, p in end.items()}
    try:
        return lag_from(link.ask(SyncConsumer.vbucket_seqnos), applied)
    except (OSError, RuntimeError, ValueError):
        return None
