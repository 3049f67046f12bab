"""One place that decides how the command-line jobs start their local SparkSession.

Theory of operation
-------------------
Every ``dcpkv`` command that runs a Spark job (backup, restore, the pipelines) starts its own
SparkSession in the same way, so the settings live here: the master (``local[*]`` unless the
caller or ``DCPKV_SPARK_MASTER`` says otherwise), no web UI (a second job on the machine would
fight for port 4040 and nothing looks at it), the driver bound to ``SPARK_LOCAL_IP`` (default
127.0.0.1: a laptop's hostname often resolves to an address nothing listens on), Python
workers running this very interpreter (the one with dcpkv installed; on a local master through
``worker_python.py``'s script, so they import the installed PySpark, not Spark's zip), and the
``dcpkv`` format registered. ``getOrCreate`` returns an existing session unchanged, so a
test's session is reused when a job runs inside one. The driver JVM starts from a class-data archive
(``class_archive.py``): half the start-up time, and less of a first job's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dcpkv.pipelines.class_archive import java_options
from dcpkv.pipelines.worker_python import worker_python

DEFAULT_MASTER = "local[*]"
# Small jobs: Spark's default of 200 shuffle partitions is 200 tiny tasks here.
SHUFFLE_PARTITIONS = "8"


def get_spark(app_name: str, master: str | None = None) -> Any:
    """A local SparkSession with the project's settings and ``format("dcpkv")`` registered."""
    master = master or os.environ.get("DCPKV_SPARK_MASTER", DEFAULT_MASTER)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Its Python processes import the installed PySpark, not Spark's zip (worker_python.py)
    os.environ.setdefault("PYSPARK_PYTHON", worker_python(master))
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import dcpkv.spark

    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        # The commands draw their own progress bar; Spark's would scribble over it.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS)
        # A pipeline's compaction runs beside its batches in a pool of its own (compactor.py):
        # fair scheduling hands a batch's tasks the next free core instead of queueing them
        # behind every task of the compaction's job.
        .config("spark.scheduler.mode", "FAIR")
        # Stopping a streaming query mid-batch makes Spark match the interruption's message,
        # which embeds the offset JSON (1024 vbuckets of it), against a recursive regular
        # expression: the default 1 MiB thread stack overflows. A bigger default stack for
        # the driver's threads keeps that check (and the clean stop) working.
        .config("spark.driver.extraJavaOptions", f"-Xss16m {java_options()}".strip())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    dcpkv.spark.register(session)
    return session
