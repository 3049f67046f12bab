"""The Spark source's throughput: an AvailableNow query over a loaded bucket into Parquet.

Theory of operation
-------------------
1. Load ``--count`` items (16-byte keys, 100-byte values) through the engine into a fresh data
   dir and start a real ``dcpkv server`` on it, exactly as ``bench/dcp.py`` does.
2. Ceilings: the client library alone, streaming every vbucket from 0 to its high seqno and
   counting the mutations (no Spark, no rows): once through the blocking
   :class:`SyncConsumer` facade, once the way a Spark task drives the library
   (``dcpkv.spark.read.stream_events``: the same facade with explicit, clamped ends).
3. The query: ``spark.readStream.format("dcpkv")`` with ``Trigger.AvailableNow`` into a Parquet
   folder, on ``local[N]``; timed from ``start()`` to the end of ``awaitTermination()``
   (planning, tasks, Arrow conversion, Parquet writes, checkpoint commits included; Spark's
   own start-up is not). The Parquet rows are counted afterwards to check the figure. The
   same query runs again (:data:`WARM_ROUNDS` times, the figure their median) into new
   folders and checkpoints: the first run also pays the JVM's warm-up and the Python
   workers' start (seconds), the others show the steady rate. The session's driver JVM
   starts as the dcpkv commands start theirs, from the
   class-data archive of ``dcpkv.pipelines.class_archive`` (the first run on a machine
   writes it; ``DCPKV_SPARK_CDS=0`` measures without it): it loads Spark's classes faster,
   while the JIT's warm-up and the Python workers' start stay in the first query's figure.
   Spark's Python processes run as the commands run them too: importing the installed
   PySpark, not Spark's zip (``dcpkv.pipelines.worker_python``; ``DCPKV_SPARK_WORKER_PATH=0``
   measures without it).

Rates are rows/s. With N cores the query runs N tasks at once, each with its own consumer
connection, so it can beat the single-consumer ceiling on a machine with spare cores.
``--json PATH`` writes the rates for ``make bench``'s summary.

4. Three nodes (``--cluster-count``, 0 skips it): the same ``--cluster-count`` items written
   through the protocol into a fresh node and into a local 3-node cluster (1 replica,
   ``bench/_cluster.py``), then the same AvailableNow query on each (the cluster through its
   connection string: partitions planned by node, each vbucket read from its active).
   Figures ``cluster3_query_rows_per_s``, ``single_same_data_query_rows_per_s`` and their
   ratio.

Spark's own share of the query's time is measured by ``bench/spark_floor.py`` (the same query
over a source of pre-built Arrow batches, in a fresh JVM): ``make bench`` runs it first and the
summary shows the two queries' rates against it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

import dcpkv.spark
from _cluster import same_data
from _report import bench_main, rounds, window, write_json
from dcp import loaded_server  # bench/dcp.py (the script's folder is on sys.path)
from dcpkv.client import events
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.client.sync import SyncConsumer
from dcpkv.pipelines.class_archive import java_options
from dcpkv.pipelines.worker_python import worker_python
from dcpkv.spark.plan import VbTarget
from dcpkv.spark.read import stream_events
from dcpkv.spark.sparkoffsets import VbPosition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CLIENT_ROUNDS = 5  # of each client-library rate (about a second each), between yardstick samples
WARM_ROUNDS = 5  # warm queries, each between yardstick samples (the figure: their median)


def raw_rate(port: int) -> tuple[int, float]:
    """Mutations streamed by one SyncConsumer from 0 to the high seqnos; (count, seconds)."""
    start = time.perf_counter()
    count = 0
    with SyncConsumer(
        ClientSettings(ConnectionSettings.at(port=port), name="bench:raw")
    ) as consumer:
        for event in consumer.stream(start="beginning", end="now"):
            if isinstance(event, events.Mutation):
                count += 1
    return count, time.perf_counter() - start


def task_path_rate(port: int) -> tuple[int, float]:
    """The same stream as :func:`raw_rate`, driven the way a Spark task drives it
    (``dcpkv.spark.read.stream_events``), in one process."""
    config = ClientSettings(ConnectionSettings.at(port=port), name="bench:chunked")
    with SyncConsumer(config) as consumer:
        seqnos = consumer.vbucket_seqnos()
    work = [VbTarget(vb, VbPosition.at(0, 0), high, high) for vb, (_u, high) in seqnos.items()]
    start = time.perf_counter()
    count = sum(isinstance(e, events.Mutation) for e in stream_events(config, work))
    return count, time.perf_counter() - start


def spark_session(cores: int) -> SparkSession:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Spark's Python processes as the dcpkv commands run them (pipelines/worker_python.py)
    os.environ["PYSPARK_PYTHON"] = worker_python(f"local[{cores}]")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("dcpkv-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        # the driver JVM as the dcpkv commands start it: from the class-data archive
        .config("spark.driver.extraJavaOptions", java_options())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    dcpkv.spark.register(spark)
    return spark


def query_rate(spark: SparkSession, port: int, out: Path, partitions: int | None) -> float:
    return query_rate_on(spark, {"port": str(port)}, out, partitions)


def query_rate_on(
    spark: SparkSession,
    options: dict[str, str],
    out: Path,
    partitions: int | None,
    fmt: str = "dcpkv",
) -> float:
    reader = spark.readStream.format(fmt).options(**options)
    if partitions:
        reader = reader.option("numPartitions", partitions)
    start = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out / "parquet"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - start
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    return seconds


def _client_round(what: str, metric: str, measured: tuple[int, float]) -> dict[str, float]:
    rows, seconds = measured
    print(_line(what, rows, seconds))
    return {metric: rows / seconds}


def _line(what: str, rows: int, seconds: float) -> str:
    return f"  {what:<34} {rows:>10,} rows in {seconds:7.2f} s  {rows / seconds:>10,.0f} rows/s"


def main(
    count: int = typer.Option(1_000_000, "--count", help="items loaded before streaming"),
    vbuckets: int = typer.Option(64, "--vbuckets", help="vbuckets of the bucket"),
    cores: int = typer.Option(2, "--cores", help="Spark local[N]"),
    partitions: int = typer.Option(0, "--partitions", help="numPartitions (0: default)"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
    cluster_count: int = typer.Option(
        200_000, "--cluster-count", help="items of the 3-node run (0: skip it)"
    ),
) -> None:
    figures: dict[str, float] = {}
    print(f"Spark bench: {count:,} items of 100 bytes, {vbuckets} vbuckets, local[{cores}]")
    with (
        loaded_server(count, vbuckets, "spark", width=34) as port,
        tempfile.TemporaryDirectory(prefix="dcpkv-spark-out-") as out,
    ):
        # about a second each: rounds, as the warm queries (a burst moves one, not the median)
        figures |= rounds(
            CLIENT_ROUNDS,
            lambda: _client_round(
                "client library (SyncConsumer)", "sync_consumer_rows_per_s", raw_rate(port)
            ),
        )
        figures |= rounds(
            CLIENT_ROUNDS,
            lambda: _client_round(
                "client library, task path", "task_path_rows_per_s", task_path_rate(port)
            ),
        )
        started = time.perf_counter()
        spark = spark_session(cores)
        print(f"  Spark session start                {time.perf_counter() - started:7.2f} s")
        with window("query_rows_per_s"):
            seconds = query_rate(spark, port, Path(out) / "cold", partitions or None)
        rows = spark.read.parquet(str(Path(out) / "cold" / "parquet")).count()
        print(_line("AvailableNow query -> Parquet", rows, seconds))
        figures |= {"query_rows_per_s": rows / seconds, "query_rows_missing": count - rows}
        runs = iter(range(WARM_ROUNDS))
        figures |= rounds(WARM_ROUNDS, lambda: {"query_warm_rows_per_s": _warm(
            spark, port, Path(out) / f"warm{next(runs)}", partitions or None)})  # fmt: skip
        if cluster_count:
            figures |= three_nodes(spark, cluster_count, vbuckets, partitions or None, Path(out))
        spark.stop()
    write_json(json_out, "spark", figures)


def _warm(spark: SparkSession, port: int, target: Path, partitions: int | None) -> float:
    """The same query again on the warm session: rows/s."""
    seconds = query_rate(spark, port, target, partitions)
    rows = spark.read.parquet(str(target / "parquet")).count()
    print(_line("  the same again (warm JVM, workers)", rows, seconds))
    return rows / seconds


def three_nodes(
    spark: SparkSession, count: int, vbuckets: int, partitions: int | None, out: Path
) -> dict[str, float]:
    """The same items on one node and on three: the same AvailableNow query on each."""
    print(f"3 nodes against 1 on the same data: {count:,} items, {vbuckets} vbuckets")
    figures: dict[str, float] = {}
    with same_data(count, vbuckets, "spark", width=34) as (single, three):
        for label, conn in (("single_same_data", single), ("cluster3", three)):
            target = out / label
            with window(f"{label}_query_rows_per_s"):
                seconds = query_rate_on(spark, conn.spark_options(), target, partitions)
            rows = spark.read.parquet(str(target / "parquet")).count()
            print(_line(f"AvailableNow query, {label}", rows, seconds))
            figures[f"{label}_query_rows_per_s"] = rows / seconds
            figures[f"{label}_query_rows_missing"] = count - rows
    ratio = figures["cluster3_query_rows_per_s"] / figures["single_same_data_query_rows_per_s"]
    figures["cluster3_query_vs_single"] = ratio
    print(f"  query: 3 nodes / 1 node = {ratio:.2f}")
    return figures


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    bench_main(main)
