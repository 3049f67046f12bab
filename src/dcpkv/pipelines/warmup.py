"""Warming a fresh SparkSession up on the mirror's write path, before the user waits on it.

Theory of operation
-------------------
The first Spark job of a session pays once for what every later job reuses: the Python
daemons the JVM forks its Python processes from (one per kind: the data source's creation,
the read's planning, the tasks), the task workers themselves (Spark reuses them, with the
modules they imported: pyarrow, the client library), and the JVM's first run of the Arrow
reader, the generated projection and the Parquet writer (class loading, code generation,
the JIT's first compilations). In the main job that was seconds of the mirror's first
Spark batch (the sample, before the driver wrote that one: ``first_batch.py``), and is
seconds of the live query's first batches still.

:func:`warm_up` runs one small batch through the same path: a batch read of a few vbuckets
from the node with the ``dcpkv`` source (one task per core, so every worker is forked and
has imported the source), the mirror's columns and stream position (``mirror_rows``,
``vtable.stamp``), and a Parquet write into a throwaway table, deleted afterwards. It only
reads, and its output is never seen: whatever the bucket holds at that moment will do, even
nothing. The main job runs it while the node starts and the sample loads (``app/demo.py``),
so the cost moves off the user's path instead of merely moving around on it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dcpkv.pipelines import vtable
from dcpkv.pipelines.mirror_schema import mirror_rows
from dcpkv.pipelines.source_node import SourceSettings

WARM_VBUCKETS = 16  # read from the first this many vbuckets: a few hundred rows of a sample


def warm_up(spark: Any, source: SourceSettings, scratch: Path, num_vbuckets: int) -> None:
    """One small mirror-like batch from ``source`` into ``scratch`` (deleted afterwards)."""
    tasks = max(1, int(spark.sparkContext.defaultParallelism))
    last = max(0, min(num_vbuckets, WARM_VBUCKETS) - 1)
    reader = spark.read.format("dcpkv").options(**source.options())
    df = reader.options(vbuckets=f"0-{last}", numPartitions=str(tasks)).load()
    try:
        name = vtable.write_rows(scratch, vtable.stamp(mirror_rows(df), 0), "warmup")
        vtable.footer_summary(scratch / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
