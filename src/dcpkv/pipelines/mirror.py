"""The mirror: a Parquet table of a bucket's current documents, kept by a Spark stream.

Theory of operation
-------------------
``start_mirror`` runs ``spark.readStream.format("dcpkv")`` with ``foreachBatch``: a
:class:`~dcpkv.pipelines.table_job.TableJob` applies each batch to a versioned change table
(``vtable.py``; ``table_job.py`` gives how a batch, its rollbacks, the retention floors,
compaction and a stop are handled) of the mirror's rows (``mirror_schema.py``).

A new mirror's first batch (the initial load) is written by the driver before the query
starts, without a Spark job, and the query starts where it ended (``first_batch.py``, which
gives the commit protocol and why it stays exact); ``start_mirror(first_on_driver=False)``
leaves it to the query.

``read_mirror`` reads through the manifest: the current documents, consistent as of one
committed batch. Per batch a JSON line of :class:`~dcpkv.pipelines.table_job.BatchStats`
goes to ``<to>/_metrics.jsonl``. A live mirror is stopped with ``stop_query``, between batches.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcpkv.pipelines import vtable
from dcpkv.pipelines.first_batch import load_first_batch, starting_offsets
from dcpkv.pipelines.mirror_schema import mirror_rows, mirror_schema
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.table_job import (
    BatchStats,
    TableJob,
    compact_table,
    start_stream,
    stop_query,
)
from dcpkv.pipelines.vtable import Manifest

# What a user of the mirror needs, from one module: the settings, start, stop, read.
__all__ = [
    "BatchStats",
    "SourceSettings",
    "compact_mirror",
    "mirror_doc_count",
    "mirror_manifest",
    "read_mirror",
    "start_mirror",
    "stop_query",
]


def start_mirror(
    spark: Any,
    source: SourceSettings,
    to: Path,
    *,
    checkpoint: Path | None = None,
    available_now: bool = False,
    trigger_seconds: float = 1.0,
    on_batch: Callable[[BatchStats], None] | None = None,
    compact_every: int | None = 10,
    after_commit: Callable[[int], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    first_on_driver: bool = True,
) -> Any:
    """Start mirroring ``source`` into the table ``to``; returns the StreamingQuery.

    ``checkpoint`` defaults to ``to/_checkpoint``; ``available_now`` stops once caught up
    with the high seqnos of the start (``query.awaitTermination()``); ``after_commit`` runs
    after each batch's commit (a view following the mirror in the same query), ``on_stop``
    when :func:`stop_query` stops it, between batches. A live query (not ``available_now``)
    must be stopped with :func:`stop_query`: that finishes its background compaction.
    A new mirror's first batch is written by the driver before the query starts
    (``first_batch.py``; ``first_on_driver=False``: by the query, as any batch).
    """
    to = Path(to)
    checkpoint = Path(checkpoint) if checkpoint else to / "_checkpoint"
    if first_on_driver:
        load_first_batch(to, source, checkpoint, on_batch)
    job = TableJob(
        spark=spark,
        table=to,
        schema=mirror_schema(),
        transform=mirror_rows,
        source=source,
        checkpoint=checkpoint,
        compact_every=compact_every,
        on_batch=on_batch,
        after_commit=after_commit,
        on_stop=on_stop,
    )
    return start_stream(
        spark, source, job, available_now=available_now, trigger_seconds=trigger_seconds,
        starting=starting_offsets(to),
    )  # fmt: skip


def read_mirror(spark: Any, path: Path, manifest: Manifest | None = None) -> Any:
    """The mirror's current documents (key, value, flags, expiry, vbucket, seqno, cas), as of
    the last committed batch (or of ``manifest``, one read before)."""
    from pyspark.sql import functions as F

    path = Path(path)
    manifest = manifest or vtable.load_manifest(path)
    live = vtable.live_changes(spark, path, manifest, mirror_schema())
    cols = ["key", "value", "flags", "expiry", "vbucket", "seqno", "cas", "op", "ord", "pos"]
    current = vtable.current_versions(live, cols)
    return current.filter(F.col("op") == "mutation").select(
        "key", "value", "flags", "expiry", "vbucket", "seqno", "cas"
    )


def mirror_doc_count(path: Path) -> int:
    """How many documents the mirror holds as of its last committed batch: what
    ``read_mirror(...).count()`` says, read with pyarrow on the driver (no Spark job)."""
    import pyarrow.compute as pc

    current = vtable.current_arrow(Path(path), vtable.load_manifest(Path(path)))
    return 0 if current is None else int(pc.sum(pc.equal(current["op"], "mutation")).as_py() or 0)


def mirror_manifest(path: Path) -> Manifest:
    """The committed manifest (applied offsets per vbucket, files, floors)."""
    return vtable.load_manifest(Path(path))


def compact_mirror(
    spark: Any,
    path: Path,
    source: SourceSettings | None = None,
    *,
    persisted: dict[int, int] | None = None,
) -> Manifest:
    """Compact a mirror whose job is not running (or from inside its own batch)."""
    return compact_table(spark, Path(path), mirror_schema(), source, persisted=persisted)
