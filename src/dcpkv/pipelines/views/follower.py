"""The mirror follower: a view fed by a mirror's batches instead of the server.

Theory of operation
-------------------
See the package docstring (:mod:`dcpkv.pipelines.views`) for how a view works as a whole.
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from dcpkv.pipelines import decimal_files, vtable
from dcpkv.pipelines.compactor import Compactor
from dcpkv.pipelines.mirror_schema import mirror_schema
from dcpkv.pipelines.table_job import BatchStats
from dcpkv.pipelines.views.definition import emission_table, view_rows, view_schema

DRIVER_MAP_ROWS = 200_000  # more new rows than this: the map runs in Spark tasks


class MirrorTicks(DataSource):
    """A streaming source whose offset is a mirror's batch ordinal; its batches hold no rows,
    they only tell the follower when the mirror has moved."""

    @classmethod
    def name(cls) -> str:
        return "dcpkvmirrorticks"

    def schema(self) -> str:
        return "tick int"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _TickReader(Path(self.options["path"]))


class _TickReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, mirror: Path) -> None:
        self.mirror = mirror
        self._target: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"ord": -1}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = vtable.load_manifest(self.mirror).ord

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        ord_ = vtable.load_manifest(self.mirror).ord
        return {"ord": ord_ if self._target is None else min(ord_, self._target)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        return iter(())


@dataclass
class MirrorFollower:
    """Applies a mirror's new batches to a view (the ``foreachBatch`` of the tick stream)."""

    spark: Any
    table: Path
    mirror: Path
    map_spec: str
    on_batch: Callable[[BatchStats], None] | None = None
    compact_every: int = 10
    # Compact beside the batches (compactor.py); then :meth:`stop` must run when they stop.
    background: bool = False
    compactor: Compactor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.compactor = Compactor(
            self.spark, self.table, view_schema(), self.compact_every, background=self.background
        )

    def stop(self) -> None:
        """No more batches: finish the background compaction (swapped in, or deleted)."""
        self.compactor.finish()

    def start(self, *, available_now: bool, trigger_seconds: float) -> Any:
        self.spark.dataSource.register(MirrorTicks)
        ticks = self.spark.readStream.format("dcpkvmirrorticks").option("path", str(self.mirror))
        writer = ticks.load().writeStream.foreachBatch(self)
        writer = writer.option("checkpointLocation", str(self.table / "_checkpoint"))
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
        return writer.start()

    def __call__(self, _df: Any, batch_id: int) -> None:
        self.follow(batch_id)

    def follow(self, batch_id: int) -> None:
        """Apply what the mirror committed since the last call (``batch_id``: the caller's
        batch, the tick stream's or the mirror's own when it runs inside the mirror's batch)."""
        view = vtable.load_manifest(self.table)
        # Fed by the server until now (rows and batch ids of its own): rebuild from the mirror.
        elsewhere = "mirror_ord" not in view.extra and view.batch_id >= 0
        if batch_id <= view.batch_id and not elsewhere:
            return
        started = time.monotonic()
        mirror = vtable.load_manifest(self.mirror)
        done = int(view.extra.get("mirror_ord", 0))
        # Too far behind: the mirror compacted away deletions the view has not seen.
        if elsewhere or done < int(mirror.extra.get("dropped_through", 0)):
            view.retired.extend(view.files)
            view.files, view.entries, done = [], [], 0
        rows = 0
        if mirror.files and mirror.ord > done:
            rows = self._copy_rows(view, mirror, done)
        new_entries = [e for e in mirror.entries if done < e.ord <= mirror.ord]
        view.entries.extend(new_entries)
        view.floors = dict(mirror.floors)
        view.applied = dict(mirror.applied)
        view.extra["mirror_ord"] = mirror.ord
        view.ord = max(view.ord, mirror.ord)
        view.batch_id = batch_id
        vtable.note_rows(view, rows)
        vtable.commit_manifest(self.table, view)
        self.compactor.step(view)
        self._report(batch_id, rows, len(new_entries), started, view)

    def _copy_rows(self, view: vtable.Manifest, mirror: vtable.Manifest, done: int) -> int:
        """The mirror's rows of ords (done, M] through the map into a new directory of the
        view: on the driver with pyarrow up to :data:`DRIVER_MAP_ROWS` rows (a live batch:
        a Spark job's fixed cost is seconds, the map milliseconds), else in a Spark job."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        directories = [self.mirror / f for f in mirror.files]
        datasets = decimal_files.arrow_datasets(directories)  # one per schema (old ones too)
        if not datasets:
            return 0  # only empty batches so far
        tag = f"m{mirror.ord:08d}"
        new_rows = (ds.field("ord") > done) & (ds.field("ord") <= mirror.ord)
        if sum(d.count_rows(filter=new_rows) for d in datasets) <= DRIVER_MAP_ROWS:
            cols = ["op", "vbucket", "key", "value", "seqno", "vb_uuid", "ord", "pos"]
            table = pa.concat_tables(
                decimal_files.as_bigint(d.to_table(columns=cols, filter=new_rows)) for d in datasets
            )
            name = vtable.write_arrow(self.table, emission_table(self.map_spec, table), tag)
            view.files.append(name)
            return table.num_rows
        from pyspark.sql import functions as F

        source = decimal_files.read(self.spark, directories, mirror_schema())
        new = source.filter((F.col("ord") > done) & (F.col("ord") <= mirror.ord))
        name = vtable.write_rows(self.table, view_rows(self.map_spec, True)(new), tag)
        view.files.append(name)
        return vtable.parquet_rows(self.table / name)

    def _report(
        self, batch_id: int, rows: int, rollbacks: int, started: float, view: vtable.Manifest
    ) -> None:
        stats = BatchStats(batch_id, time.time(), rows, rollbacks, time.monotonic() - started, None)
        vtable.append_metrics(self.table, stats.__dict__)
        if self.on_batch is not None:
            self.on_batch(stats)
