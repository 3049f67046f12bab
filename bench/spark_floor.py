"""Spark's own floor for `bench/spark.py`'s query: the same query over a source costing nothing.

Theory of operation
-------------------
``bench/spark.py`` times an AvailableNow query from the dcpkv source into Parquet, cold (the
session's first query) and warm. How much of that time is ours? This script runs the same
query, on a session started the same way (``spark.spark_session``: class-data archive, the
installed PySpark for the Python processes, ``local[N]``), over a Python data source that
needs no server: its tasks build Arrow record batches of the source's schema and shape
(16-byte keys ``key-%012d``, 100-byte values, 64 vbuckets, seqnos and CAS rising, 8,192 rows
per batch, 16 partitions) with pyarrow's vectorised kernels, a few milliseconds per batch. What
is left is Spark's: planner processes, task workers, Arrow into the JVM, the Parquet writer,
the JIT's warm-up on a cold JVM.

So the floor's figures bound any source on this machine: the dcpkv source's cold and warm
rates divided by these are how close it comes to Spark's own limit. A cold query needs a JVM
that has run nothing, so ``bench/spark.py`` runs this script in a process of its own.

``--json PATH`` writes ``floor_query_rows_per_s`` (the median of :data:`COLD_ROUNDS` cold
queries: this session's first, and the first of as many more runs of this script with
``--cold-only``, each a JVM of its own; one cold query's rate moved 1.5x between two quiet
runs) and ``floor_query_warm_rows_per_s`` (the median of :data:`WARM_ROUNDS` warm queries).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from _report import a_round, bench_main, rounds, write_json
from dcpkv.spark.columns import SCHEMA_DDL
from spark import query_rate_on, spark_session  # bench/spark.py

PARTITIONS = 16  # what the dcpkv source plans for 64 vbuckets on local[2]
BATCH_ROWS = 8192  # dcpkv.spark.rows.BATCH_ROWS
VBUCKETS = 64
WARM_ROUNDS = 3  # warm queries, each between yardstick samples (the figure: their median)
COLD_ROUNDS = 5  # cold queries, each in a JVM of its own (module docstring)


def floor_batch(first: int, rows: int) -> Any:
    """Rows ``first``..``first + rows - 1`` as one record batch of the source's schema."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from dcpkv.spark.rows import ARROW_SCHEMA

    ids = pa.array(np.arange(first, first + rows, dtype=np.int64))
    digits = pc.utf8_lpad(pc.cast(ids, pa.string()), 12, "0")
    keys = pc.binary_join_element_wise("key-", digits, "").cast(pa.binary())
    offsets = np.arange(0, (rows + 1) * 100, 100, dtype=np.int32)
    values = pa.Array.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(b"v" * (100 * rows))]
    )
    seqnos = pa.array(np.arange(first, first + rows, dtype=np.int64) // VBUCKETS + 1)
    zeros32 = pa.array(np.zeros(rows, dtype=np.int32))
    zeros64 = pa.array(np.zeros(rows, dtype=np.int64))
    columns = {
        "op": pa.repeat("mutation", rows),
        "vbucket": pa.array(np.arange(first, first + rows, dtype=np.int32) % VBUCKETS),
        "key": keys,
        "value": values,
        "datatype": zeros32,
        "flags": zeros64,
        "expiry": zeros64,
        "cas": pa.array(np.arange(first, first + rows, dtype=np.int64) * 997 + (1 << 60)),
        "rev_seqno": pa.array(np.ones(rows, dtype=np.int64)),
        "seqno": seqnos,
        "vb_uuid": pa.array(np.full(rows, 0x1234_5678_9ABC, dtype=np.int64)),
        "snap_start": seqnos,
        "snap_end": seqnos,
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


class FloorStreamReader(DataSourceStreamReader):
    """One batch of ``count`` rows over :data:`PARTITIONS` tasks, then nothing."""

    def __init__(self, count: int) -> None:
        self.count = count

    def initialOffset(self) -> dict[str, int]:
        return {"batch": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"batch": 1}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if start["batch"] >= end["batch"]:
            return []
        share = -(-self.count // PARTITIONS)
        return [
            InputPartition((first, min(share, self.count - first)))
            for first in range(0, self.count, share)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        first, rows = partition.value
        for at in range(first, first + rows, BATCH_ROWS):
            yield floor_batch(at, min(BATCH_ROWS, first + rows - at))

    def commit(self, end: dict[str, int]) -> None:
        pass


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dcpkv-floor"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FloorStreamReader(int(self.options.get("count", "0")))


def _query(spark: Any, count: int, target: Path, label: str) -> float:
    """One floor query into ``target``: rows/s (checked: every row written)."""
    seconds = query_rate_on(spark, {"count": str(count)}, target, None, fmt="dcpkv-floor")
    rows = spark.read.parquet(str(target / "parquet")).count()
    if rows != count:
        raise SystemExit(f"the floor query wrote {rows:,} rows, not {count:,}")
    rate = rows / seconds
    print(f"  {label} query {rows:>10,} rows in {seconds:7.2f} s {rate:>10,.0f} rows/s")
    return rate


def main(
    count: int = typer.Option(1_000_000, "--count", help="rows of each query"),
    cores: int = typer.Option(2, "--cores", help="Spark local[N]"),
    cold_only: bool = typer.Option(
        False, "--cold-only", help="run the cold query only (one of the cold rounds)"
    ),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    print(f"Spark's floor: {count:,} rows from a source of pre-built Arrow batches, local[{cores}]")
    spark = spark_session(cores)
    spark.dataSource.register(FloorDataSource)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dcpkv-spark-floor-") as out:
        # the first query in the fresh JVM (cold), then WARM_ROUNDS more, each between
        # yardstick samples (bench/_report.py)
        colds = [_cold_round(lambda: _query(spark, count, Path(out) / "cold", "cold"))]
        if not cold_only:
            runs = iter(range(WARM_ROUNDS))
            figures |= rounds(WARM_ROUNDS, lambda: {"floor_query_warm_rows_per_s": _query(
                spark, count, Path(out) / f"warm{next(runs)}", "warm")})  # fmt: skip
    spark.stop()
    if not cold_only:
        colds += [_cold_round(lambda: _cold_elsewhere(count, cores))
                  for _ in range(COLD_ROUNDS - 1)]  # fmt: skip
    figures["floor_query_rows_per_s"] = statistics.median(colds)
    write_json(json_out, "spark_floor", figures)


def _cold_round(query: Callable[[], float]) -> float:
    """One cold query's rows/s, as a round between yardstick samples (bench/_report.py)."""
    with a_round() as cold:
        cold["floor_query_rows_per_s"] = query()
    return cold["floor_query_rows_per_s"]


def _cold_elsewhere(count: int, cores: int) -> float:
    """One cold query's rows/s, in a new run of this script (a JVM that has run nothing)."""
    with tempfile.TemporaryDirectory(prefix="dcpkv-spark-floor-cold-") as out:
        body = Path(out) / "cold.json"
        done = subprocess.run([sys.executable, __file__, "--cold-only", "--count", str(count),
                               "--cores", str(cores), "--json", str(body)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            sys.stdout.write(done.stdout[-3000:] + done.stderr[-3000:])
            raise SystemExit(f"the cold query's run failed (exit {done.returncode})")
        print(next(line for line in done.stdout.splitlines() if "cold query" in line))
        return float(json.loads(body.read_text())["figures"]["floor_query_rows_per_s"])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)
