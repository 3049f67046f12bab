"""The job the standalone-cluster test runs as a subprocess (a standalone driver cannot share
the suite's pytest process with its local SparkSession): one SparkSession on the given master,
then the mirror (one AvailableNow run) and a backup, both from a connection string only.

Usage: ``python standalone_job.py MASTER CONNECTION_STRING MIRROR_DIR BACKUP_DIR``. One driver
for both jobs: a standalone application's executors take seconds to start, so the two jobs
share them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcpkv.client.settings import ConnectionSettings
from dcpkv.pipelines.backup import describe_run, run_backup
from dcpkv.pipelines.mirror import start_mirror
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.spark_session import get_spark


def main(master: str, connection_string: str, mirror: Path, backup: Path) -> None:
    spark = get_spark("dcpkv-standalone-test", master)
    try:
        conn = ConnectionSettings.parse(connection_string)
        query = start_mirror(spark, SourceSettings(conn), mirror, available_now=True)
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"the mirror failed: {query.exception()}")
        print(describe_run(run_backup(spark, backup, conn)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
