"""One place that builds the SparkSession of the pipelines' commands.

Theory of operation
-------------------
Every pipeline command (the demo, mirror, views, backups) needs the same session: local
mode with two cores unless a master URL is given, no web UI, a handful of shuffle partitions
(the data sets are small, and 200 empty tasks per aggregation would dominate), the driver on
the loopback address, and the Python workers running the interpreter of the driver (so they
import the same ``dcpkv``). Logs are cut to errors: the commands print their own progress.
The ``dcpkv`` data source is registered on the way out.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DEFAULT_MASTER = "local[2]"


def get_spark(app_name: str, master: str | None = None) -> Any:
    """A SparkSession (an existing one is reused) with the ``dcpkv`` format registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import dcpkv.spark

    session = (
        SparkSession.builder.master(master or DEFAULT_MASTER)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    dcpkv.spark.register(session)
    return session
