"""Incremental backup and restore of a bucket, as Spark batch jobs over the change stream.

Theory of operation
-------------------
A backup is a chain of runs (the folder layout, manifests, atomic commit and verification are
in ``backup_layout.py``). One run (:func:`run_backup`):

1. On the driver, one KV session reads every vbucket's uuid and high seqno and its failover
   log. The run starts at the previous run's ``end`` offsets (none: from zero) and ends where
   the Spark source's own planner (``plan.plan_end``) says a batch from there ends now: at the
   high seqnos, on the current branches, with the earlier batch ends kept as consistent points
   so a rollback lands on the previous run's end rather than on zero.
2. A Spark batch read (``mode=changes`` from ``start`` to ``end``) is written as Parquet into
   the run's temporary folder, with ``pos`` (stream order inside a vbucket) added.
3. The Parquet is read back and summarised per vbucket (changes by kind, highest seqno,
   rollback rows); the server is asked again, and if a vbucket's branch moved *during* the
   run (the server restarted meanwhile) the run is thrown away rather than committed with end
   offsets that may not describe what was read. Otherwise the manifest is written and the run
   committed by rename.

Rollbacks. When the previous run's end is on a branch the server abandoned (it crashed with
unpersisted writes the previous run had read, and restarted), the stream request is refused
and the source emits a rollback row for the vbucket (seqno R, a consistent point of ours: the
previous run's end or an older one) before the new branch's changes. The row is kept in the
run's Parquet and listed in the manifest; restore applies it to the earlier runs.

Restore (:func:`restore`) refuses a backup that does not verify, then in one Spark job: every
run's rows tagged with the run number; (point in time) each vbucket cut at the first run whose
end reached the requested seqno, and at that seqno; every change dropped that a *later*
rollback row of its vbucket, by (run, pos), undoes (seqno above R); the latest remaining
change per key by (run, pos); written through the dcpkv sink, so deletions delete.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dcpkv.client.cluster import ClusterKV
from dcpkv.client.settings import ClientSettings, ConnectionSettings
from dcpkv.core.failover_table import FailoverEntry
from dcpkv.pipelines import decimal_files
from dcpkv.pipelines.backup_layout import (
    DATA,
    FORMAT,
    BackupError,
    Run,
    commit_run,
    committed_runs,
    file_entries,
    locked,
    new_temp_run,
    run_name,
    verify,
)
from dcpkv.spark.plan import plan_end
from dcpkv.spark.rows import COLUMNS, spark_fields
from dcpkv.spark.sparkoffsets import SparkOffsetError, SparkOffsets

BACKUP_PHASES = ("plan", "read changes into Parquet", "summarise", "checksum and commit")
RESTORE_PHASES = ("verify", "replay runs and load the bucket")
CHANGE_OPS = ("mutation", "deletion", "expiration")

Phase = Callable[[str], None]
SeqnoMap = dict[int, tuple[int, int]]


def _quiet(_phase: str) -> None:
    pass


# -- the server's state, on the driver ------------------------------------------------------


def server_state(ep: ConnectionSettings, logs: bool = True) -> tuple[SeqnoMap, dict[int, Any]]:
    """vbucket -> (uuid, high seqno), and (``logs``) vbucket -> failover log."""
    return asyncio.run(_server_state(ClientSettings(ep, name="dcpkv-backup"), logs))


async def _server_state(config: ClientSettings, want_logs: bool) -> tuple[SeqnoMap, dict[int, Any]]:
    session = await ClusterKV.open(config)
    try:
        seqnos = await session.vbucket_seqnos()
        if not want_logs:
            return seqnos, {}
        vbs = sorted(seqnos)
        logs = await asyncio.gather(*(session.failover_log(vb) for vb in vbs))
        return seqnos, dict(zip(vbs, logs, strict=True))
    finally:
        await session.close()


# -- one backup run -------------------------------------------------------------------------


def run_backup(spark: Any, root: Path, ep: ConnectionSettings, on_phase: Phase = _quiet) -> Run:
    """Back up what changed since the last run of ``root`` as a new committed run."""
    with locked(root):
        runs = committed_runs(root)
        on_phase(BACKUP_PHASES[0])
        began = time.time()
        seqnos, logs = server_state(ep)
        start = _start(runs, ep, seqnos)
        end = plan_end(start, seqnos, logs, None)
        number = runs[-1].number + 1 if runs else 1
        tmp = new_temp_run(root, number)
        try:
            on_phase(BACKUP_PHASES[1])
            _read_into(spark, ep, start, end, tmp / DATA)
            on_phase(BACKUP_PHASES[2])
            summary = _summarise(tmp / DATA)
            _check_unmoved(ep, seqnos)
            on_phase(BACKUP_PHASES[3])
            manifest = _manifest(number, ep, seqnos, logs, start, end, summary, began)
            manifest["files"] = file_entries(tmp / DATA)
            path = commit_run(tmp, manifest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Run(number, path, manifest)


def _start(runs: list[Run], ep: ConnectionSettings, seqnos: SeqnoMap) -> SparkOffsets:
    if not runs:
        return SparkOffsets.earliest(sorted(seqnos))
    last = runs[-1]
    bucket = last.manifest.get("bucket", {})
    if bucket.get("name") != ep.bucket or bucket.get("vbuckets") != len(seqnos):
        raise BackupError(
            f"this backup is of bucket {bucket.get('name')!r} with {bucket.get('vbuckets')} "
            f"vbuckets; the server has {ep.bucket!r} with {len(seqnos)}"
        )
    return last.end


def _read_into(
    spark: Any, ep: ConnectionSettings, start: SparkOffsets, end: SparkOffsets, out: Path
) -> None:
    from pyspark.sql import functions as F

    df = (
        spark.read.format("dcpkv")
        .options(**ep.spark_options())
        .option("mode", "changes")
        .option("startingOffsets", start.to_json())
        .option("endingOffsets", end.to_json())
        .load()
    )
    # A vbucket is read by one task, in stream order: the task's increasing id is that order.
    df.withColumn("pos", F.monotonically_increasing_id()).write.parquet(str(out))


def _summarise(data: Path) -> dict[int, dict[str, Any]]:
    """vbucket -> {mutations, deletions, expirations, max_seqno, rollbacks: [R, ...]}.

    Read from the run's own Parquet with pyarrow on the driver: the folder is local (the commit
    is a local rename), four narrow columns are cheap, and it saves two Spark jobs a run.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: dict[int, dict[str, Any]] = {}
    for part in sorted(data.glob("*.parquet")):
        table = pq.read_table(part, columns=["op", "vbucket", "seqno", "pos"])
        seqnos = table["seqno"].cast(pa.uint64())
        counts = table.append_column("s", seqnos).group_by(["vbucket", "op"])
        for row in counts.aggregate([("s", "max"), ("s", "count")]).to_pylist():
            info = out.setdefault(row["vbucket"], _empty_vb())
            if row["op"] in CHANGE_OPS:
                info[_plural(row["op"])] += row["s_count"]
                info["max_seqno"] = max(info["max_seqno"], row["s_max"])
        rollbacks = table.filter(pc.equal(table["op"], "rollback")).to_pylist()
        for r in sorted(rollbacks, key=lambda r: r["pos"]):
            out.setdefault(r["vbucket"], _empty_vb())["rollbacks"].append(int(r["seqno"]))
    return out


def _empty_vb() -> dict[str, Any]:
    return {"mutations": 0, "deletions": 0, "expirations": 0, "max_seqno": 0, "rollbacks": []}


def _plural(op: str) -> str:
    return op + "s"


def _check_unmoved(ep: ConnectionSettings, planned: SeqnoMap) -> None:
    now, _ = server_state(ep, logs=False)
    moved = [vb for vb, (uuid, _high) in planned.items() if now.get(vb, (uuid, 0))[0] != uuid]
    if moved:
        raise BackupError(
            f"the history of vbucket {moved[0]} branched while the run read it (the server "
            "restarted?): nothing was committed; run the backup again"
        )


def _manifest(
    number: int,
    ep: ConnectionSettings,
    seqnos: SeqnoMap,
    logs: Mapping[int, tuple[FailoverEntry, ...]],
    start: SparkOffsets,
    end: SparkOffsets,
    summary: Mapping[int, dict[str, Any]],
    began: float,
) -> dict[str, Any]:
    vbuckets = {}
    for vb in sorted(seqnos):
        info = dict(summary.get(vb, _empty_vb()))
        info["failover_log"] = [e.to_json_obj() for e in logs[vb]]
        info["high_seqno"] = seqnos[vb][1]
        vbuckets[str(vb)] = info
    rollbacks = [
        {"vbucket": vb, "seqno": r, "message": f"vbucket {vb} rolled back to {r}"}
        for vb in sorted(summary)
        for r in summary[vb]["rollbacks"]
    ]
    totals = {k: sum(s[k] for s in summary.values()) for k in _COUNT_KEYS}
    totals["changes"] = sum(totals[k] for k in _COUNT_KEYS)
    totals["rows"] = totals["changes"] + len(rollbacks)
    return {
        "format": FORMAT,
        "run": number,
        "started_at": _iso(began),
        "finished_at": _iso(time.time()),
        "bucket": {"name": ep.bucket, "vbuckets": len(seqnos)},
        "server": f"{ep.host}:{ep.port}",
        "start": start.to_dict(),
        "end": end.to_dict(),
        "vbuckets": vbuckets,
        "rollbacks": rollbacks,
        "totals": totals,
    }


_COUNT_KEYS = ("mutations", "deletions", "expirations")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


# -- restore --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestoreResult:
    runs: int
    upserts: int
    deletions: int
    rollbacks_applied: int


def parse_to_seqnos(text: str) -> dict[int, int]:
    """``--to-seqnos``: JSON or a file holding it: ``{"vb": seqno}``, a dcpkv offset JSON, or a
    run's manifest (its end offsets)."""
    path = Path(text)
    if not text.lstrip().startswith("{") and path.is_file():
        text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BackupError(f"--to-seqnos: not JSON nor a JSON file: {exc}") from None
    if isinstance(doc, dict) and "end" in doc and "run" in doc:
        doc = doc["end"]
    try:
        if isinstance(doc, dict) and "format" in doc:
            return {vb: pos.offset.seqno for vb, pos in SparkOffsets.from_dict(doc).items()}
        return {int(vb): int(seqno) for vb, seqno in doc.items()}
    except (AttributeError, ValueError, TypeError, SparkOffsetError) as exc:
        raise BackupError(f"--to-seqnos: expected {{vbucket: seqno}}: {exc}") from None


def cut_points(runs: list[Run], to_seqnos: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """vbucket -> (last run to replay, last seqno to keep) for a point-in-time restore: the
    first run whose end reached the seqno (the earliest moment the vbucket was there)."""
    out = {}
    for vb, seqno in to_seqnos.items():
        reached = [r.number for r in runs if vb in r.end and r.end[vb].offset.seqno >= seqno]
        out[vb] = (reached[0] if reached else runs[-1].number, seqno)
    return out


def restore(
    spark: Any,
    root: Path,
    ep: ConnectionSettings,
    to_seqnos: Mapping[int, int] | None = None,
    on_phase: Phase = _quiet,
    *,
    durability: str = "none",
) -> RestoreResult:
    """Load the backup in ``root`` (as of ``to_seqnos``, or its end) into ``ep``'s bucket,
    every write a SyncWrite of ``durability`` (a level name) unless it is ``none``."""
    on_phase(RESTORE_PHASES[0])
    problems = verify(root)
    if problems:
        raise BackupError("the backup does not verify: " + "; ".join(problems))
    runs = committed_runs(root)
    on_phase(RESTORE_PHASES[1])
    rows = _all_rows(spark, runs)
    if to_seqnos:
        rows = _cut(spark, rows, cut_points(runs, to_seqnos))
    latest, rollbacks = _latest(rows)
    latest = latest.persist()
    try:
        counts = {r.op: r["count"] for r in latest.groupBy("op").count().collect()}
        sink = latest.write.format("dcpkv").options(**ep.spark_options())
        sink.option("durability", durability).mode("append").save()
    finally:
        latest.unpersist()
    deletions = sum(n for op, n in counts.items() if op != "mutation")
    return RestoreResult(len(runs), counts.get("mutation", 0), deletions, rollbacks)


def row_schema() -> Any:
    """A run's rows: the source's, and ``pos``."""
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([*spark_fields(*COLUMNS), StructField("pos", LongType())])


def _all_rows(spark: Any, runs: list[Run]) -> Any:
    """Every run's rows, tagged with its number; a run written with the old DECIMAL(20,0)
    columns is read as today's BIGINT ones (``decimal_files``)."""
    from pyspark.sql import functions as F

    schema = row_schema()
    frames = [
        decimal_files.read(spark, [run.data], schema).withColumn("run", F.lit(run.number))
        for run in runs
    ]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _cut(spark: Any, rows: Any, cuts: Mapping[int, tuple[int, int]]) -> Any:
    """Keep each named vbucket's rows up to its cut run and seqno (others: everything)."""
    from pyspark.sql import functions as F

    table = spark.createDataFrame(
        [(vb, run, seqno) for vb, (run, seqno) in sorted(cuts.items())],
        "vbucket INT, cut_run INT, cut_seqno BIGINT",
    )
    joined = rows.join(F.broadcast(table), "vbucket", "left")
    uncut = F.col("cut_run").isNull()
    in_runs = uncut | (F.col("run") <= F.col("cut_run"))
    # A rollback row's seqno is a point to go back to, never above the cut: keep it.
    in_seqnos = uncut | (F.col("op") == "rollback") | (F.col("seqno") <= F.col("cut_seqno"))
    return joined.where(in_runs & in_seqnos).drop("cut_run", "cut_seqno")


def _latest(rows: Any) -> tuple[Any, int]:
    """The last surviving change per key (rollbacks applied), and how many rollbacks there
    were."""
    from pyspark.sql import functions as F

    is_rb = F.col("op") == "rollback"
    rb = rows.where(is_rb).select(
        F.col("vbucket").alias("rb_vb"),
        F.col("run").alias("rb_run"),
        F.col("pos").alias("rb_pos"),
        F.col("seqno").alias("rb_seqno"),
    )
    rollbacks = rb.count()
    changes = rows.where(~is_rb)
    later = (F.col("rb_run") > F.col("run")) | (
        (F.col("rb_run") == F.col("run")) & (F.col("rb_pos") > F.col("pos"))
    )
    undone = (F.col("vbucket") == F.col("rb_vb")) & (F.col("seqno") > F.col("rb_seqno")) & later
    kept = changes.join(F.broadcast(rb), undone, "left_anti")
    doc = F.struct("op", "value", "flags", "expiry")
    latest = (
        kept.groupBy("key")
        .agg(F.max_by(doc, F.struct("run", "pos")).alias("doc"))
        .select("key", "doc.*")
    )
    return latest, rollbacks


def describe_run(run: Run) -> str:
    t = run.manifest["totals"]
    rbs = ", ".join(r["message"] for r in run.manifest["rollbacks"]) or "no rollback"
    return (
        f"run {run_name(run.number)}: {t['changes']} change(s) (mutations {t['mutations']}, "
        f"deletions {t['deletions']}, expirations {t['expirations']}), {rbs}"
    )
