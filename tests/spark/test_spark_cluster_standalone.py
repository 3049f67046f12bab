"""The pipelines on a Spark standalone cluster against a dcpkv cluster.

A Spark master and two workers run as processes from PySpark's own launcher
(:mod:`standalone`), next to three managed dcpkv nodes and the manager. The mirror (one
AvailableNow run) and a backup run as a subprocess on ``spark://...`` (a standalone driver
cannot share this pytest process with the suite's local SparkSession), given only the dcpkv
cluster's connection string: the executors, on the workers, reach the nodes through it and
follow the map. The output goes to a tmp dir, which every worker of a
one-machine cluster shares. Then the mirror must equal the bucket, the backup must verify and
hold the bucket, and both workers must have run executors.

The two jobs run in one driver (``standalone_job.py``, which calls what ``dcpkv pipeline mirror
--once`` and ``dcpkv backup`` call): a standalone application's executors take seconds to
start, so they are started once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from standalone import StandaloneSpark

from dcpkv.client.settings import ConnectionSettings
from dcpkv.client.writer import KVWriter, WriteOp
from dcpkv.pipelines.backup_layout import committed_runs, verify
from dcpkv.pipelines.mirror import read_mirror
from support.managerproc import VBUCKETS, start_cluster, tracked_managers
from support.serverproc import ServerProcess

DOCS = 400


def write(conn: ConnectionSettings) -> dict[bytes, bytes]:
    """Writes, overwrites and deletes; the documents that remain."""
    truth: dict[bytes, bytes] = {}
    with KVWriter(conn, VBUCKETS) as writer:
        for round_ in range(2):
            ops = [WriteOp(f"doc-{i}".encode(), value=b"v%d-%d" % (round_, i)) for i in range(DOCS)]
            writer.write(ops)
            truth.update((op.key, op.value) for op in ops)
        gone = [f"doc-{i}".encode() for i in range(0, DOCS, 7)]
        writer.write(WriteOp(key, delete=True) for key in gone)
    return {k: v for k, v in truth.items() if k not in gone}


def backup_documents(root: Path) -> dict[bytes, bytes]:
    """The last version of each key in the backup's one run (no rollback: nothing failed)."""
    (run,) = committed_runs(root)
    rows = []
    for path in sorted((run.path / "data").rglob("*.parquet")):
        rows += pq.read_table(path, columns=["op", "vbucket", "key", "seqno", "value"]).to_pylist()
    latest: dict[bytes, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["vbucket"], r["seqno"])):
        latest[row["key"]] = row
    return {k: r["value"] for k, r in latest.items() if r["op"] == "mutation"}


def test_mirror_and_backup_on_a_spark_standalone_cluster(
    spark: Any, server_factory: type[ServerProcess], tmp_path: Path
) -> None:
    with tracked_managers() as managers:
        cluster = start_cluster(server_factory, managers, tmp_path, nodes=3, replicas=1)
        nodes = ",".join(cluster.name(n) for n in cluster.nodes)
        connection_string = f"couchbase://{nodes}"
        truth = write(ConnectionSettings.parse(connection_string))
        standalone = StandaloneSpark(tmp_path / "spark", workers=2)
        try:
            master = standalone.start()
            mirror, backup = tmp_path / "shared" / "mirror", tmp_path / "shared" / "backup"
            job = [sys.executable, str(Path(__file__).with_name("standalone_job.py")), master,
                   connection_string, str(mirror), str(backup)]  # fmt: skip
            done = subprocess.run(job, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr[-5000:]
        finally:
            standalone.stop()
    assert all(p.poll() is not None for p in standalone.procs)
    assert all(standalone.executor_dirs(i) for i in range(2)), "a worker ran no executor"
    mirrored = {bytes(r.key): bytes(r.value) for r in read_mirror(spark, mirror).collect()}
    assert mirrored == truth
    assert verify(backup) == []
    assert backup_documents(backup) == truth
