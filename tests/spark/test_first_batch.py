"""A new mirror's first batch written by the driver (``pipelines/first_batch.py``), and the
query that continues from its end: the same rows as a Spark-made first batch, and exact
across a crash in each window and a rollback between the load and the query."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sparkhelp import Workload, mirror_docs, persisted_round, run_once

from dcpkv.pipelines import first_batch, vtable
from dcpkv.pipelines.first_batch import has_offsets, load_first_batch, starting_offsets
from dcpkv.pipelines.mirror import mirror_manifest
from dcpkv.pipelines.mirror_schema import mirror_schema
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.table_job import TableJob, start_stream


def stored_changes(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    """Every stored change row of the table's named directories, without its stream place."""
    manifest = mirror_manifest(path)
    rows = spark.read.schema(mirror_schema()).parquet(*(str(path / f) for f in manifest.files))
    keep = ["op", "vbucket", "key", "value", "flags", "expiry", "cas", "seqno", "vb_uuid"]
    return sorted(tuple(r) for r in rows.select(*keep).collect())


def assert_no_change_twice(spark: Any, path: Path) -> None:
    """No change (vbucket, seqno) is stored twice: nothing was read by both the driver and
    the query."""
    seen = Counter((r[1], r[7]) for r in stored_changes(spark, path) if r[0] != "rollback")
    assert seen and max(seen.values()) == 1


def test_the_driver_writes_what_a_spark_batch_writes(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    work = Workload(server.port)
    work.run(400)
    truth = work.truth()  # (a Get expires what is due: the truth first, then the mirror)
    source = SourceSettings.at(port=server.port)
    stats = load_first_batch(tmp_path / "d", source, tmp_path / "d" / "_checkpoint")
    assert stats is not None and stats.batch_id == -1 and stats.rows > 0
    assert stats.visible_s is not None and stats.lag == 0
    manifest = mirror_manifest(tmp_path / "d")
    assert manifest.batch_id == -1 and manifest.ord == 1 and len(manifest.files) == 1
    assert starting_offsets(tmp_path / "d") is not None
    run_once(spark, server.port, tmp_path / "s", first_on_driver=False)
    assert mirror_manifest(tmp_path / "s").applied == manifest.applied
    assert stored_changes(spark, tmp_path / "d") == stored_changes(spark, tmp_path / "s")
    assert mirror_docs(spark, tmp_path / "d") == truth == mirror_docs(spark, tmp_path / "s")
    # A second load does nothing: the table is no longer new.
    assert load_first_batch(tmp_path / "d", source, tmp_path / "d" / "_checkpoint") is None


def test_the_query_continues_from_the_driver_batch(spark: Any, server: Any, tmp_path: Path) -> None:
    path = tmp_path / "m"
    work = Workload(server.port)
    work.run(300, prefix="a")
    truth = work.truth()
    seen: list[Any] = []
    run_once(spark, server.port, path, on_batch=seen.append)
    # The driver's batch, then the new query's batch 0 (Spark runs one, even empty).
    assert [(b.batch_id, b.rows > 0) for b in seen] == [(-1, True), (0, False)]
    assert mirror_docs(spark, path) == truth
    work.run(300, prefix="b")
    truth = work.truth()
    run_once(spark, server.port, path)
    manifest = mirror_manifest(path)
    assert manifest.batch_id == 1 and manifest.ord == 3
    assert starting_offsets(path) is None  # the checkpoint leads from here on
    assert mirror_docs(spark, path) == truth
    assert_no_change_twice(spark, path)


class CrashBeforeCommit(Exception):
    pass


def crash(_df: Any) -> Any:
    raise CrashBeforeCommit("the job dies before the table's commit")


def test_a_crash_after_the_driver_commit_before_the_querys_first_commit(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    """The query plans its batch 0 (Spark logs the end offset) and dies before the table's
    commit; the restarted query runs that batch again from the same start."""
    path = tmp_path / "m"
    source = SourceSettings.at(port=server.port)
    work = Workload(server.port)
    work.run(300, prefix="a")
    assert load_first_batch(path, source, path / "_checkpoint") is not None
    work.run(200, prefix="b")
    job = TableJob(spark, path, mirror_schema(), crash, source, path / "_checkpoint")
    query = start_stream(
        spark, source, job, available_now=True, trigger_seconds=1.0, starting=starting_offsets(path)
    )
    with pytest.raises(Exception, match="CrashBeforeCommit"):
        query.awaitTermination()
    assert has_offsets(path / "_checkpoint")
    assert not (path / "_checkpoint" / "commits" / "0").exists()
    assert mirror_manifest(path).batch_id == -1
    work.run(100, prefix="c")  # beyond batch 0's planned end: the next batch's
    truth = work.truth()
    run_once(spark, server.port, path)
    assert mirror_manifest(path).batch_id >= 1  # batch 0 re-run, then one more
    assert mirror_docs(spark, path) == truth
    assert_no_change_twice(spark, path)


def test_a_batch_the_table_committed_but_spark_did_not(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    """The table committed the query's batch 0, Spark's commit log lacks it: the re-run is
    skipped, whatever its start, and the next batch follows on."""
    path = tmp_path / "m"
    work = Workload(server.port)
    work.run(300, prefix="a")
    run_once(spark, server.port, path)  # the driver's batch, then the query's (empty) batch 0
    assert mirror_manifest(path).batch_id == 0
    for name in ("0", ".0.crc"):  # the start is now the earliest
        (path / "_checkpoint" / "commits" / name).unlink()
    work.run(100, prefix="c")
    truth = work.truth()
    run_once(spark, server.port, path)
    assert mirror_docs(spark, path) == truth
    assert_no_change_twice(spark, path)


def test_a_crash_before_the_driver_commit_loads_again(
    spark: Any, server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m"
    work = Workload(server.port)
    work.run(300)

    def die(*_a: Any) -> None:
        raise CrashBeforeCommit("killed before the manifest's commit")

    with monkeypatch.context() as patch:
        patch.setattr(vtable, "commit_manifest", die)
        with pytest.raises(CrashBeforeCommit):
            load_first_batch(path, SourceSettings.at(port=server.port), path / "_checkpoint")
    assert mirror_manifest(path).ord == 0 and len(list((path / "data").iterdir())) == 1
    work.run(100, prefix="b")
    truth = work.truth()
    seen: list[Any] = []
    run_once(spark, server.port, path, on_batch=seen.append)
    assert seen[0].batch_id == -1  # loaded again by the driver
    assert mirror_docs(spark, path) == truth
    assert_no_change_twice(spark, path)


def test_a_rollback_between_the_driver_batch_and_the_query(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv, work = persisted_round(server_factory, tmp_path)
    path = tmp_path / "m"
    before = work.truth()
    work.run(250, prefix="a")  # overwrites round a in memory only...
    truth = work.truth()
    assert load_first_batch(path, SourceSettings.at(port=srv.port), path / "_checkpoint")
    assert mirror_docs(spark, path) == truth != before
    srv.kill9()  # ...and loses it: the driver's batch read a branch that is gone
    work.port = srv.start()
    assert work.truth() == before
    run_once(spark, srv.port, path)
    assert mirror_docs(spark, path) == before
    entries = mirror_manifest(path).entries
    assert entries and all(e.kind == "rollback" and e.ord == 2 for e in entries)


def test_a_checkpoint_with_offsets_or_a_large_batch_keeps_the_spark_path(
    spark: Any, server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = Workload(server.port)
    work.run(300)
    truth = work.truth()
    source = SourceSettings.at(port=server.port)
    planned = tmp_path / "ck"
    (planned / "offsets").mkdir(parents=True)
    (planned / "offsets" / "0").write_text("v1\n{}\n")
    assert load_first_batch(tmp_path / "a", source, planned) is None
    monkeypatch.setattr(first_batch, "DRIVER_FIRST_ROWS", 10)
    assert load_first_batch(tmp_path / "b", source, tmp_path / "b" / "_checkpoint") is None
    run_once(spark, server.port, tmp_path / "b")
    assert mirror_manifest(tmp_path / "b").batch_id == 0  # Spark's batch 0
    assert mirror_docs(spark, tmp_path / "b") == truth


def test_starting_offsets_keep_the_whole_position(tmp_path: Path) -> None:
    manifest = vtable.Manifest(ord=1, applied={3: {"vb_uuid": "7", "seqno": "9",
        "snap_start": "9", "snap_end": "9", "points": ["4"]}})  # fmt: skip
    vtable.commit_manifest(tmp_path, manifest)
    text = starting_offsets(tmp_path)
    assert (
        text is not None and '"3":{"vb_uuid":"7","seqno":"9"' in text and '"points":["4"]' in text
    )
    manifest.batch_id = 0
    vtable.commit_manifest(tmp_path, manifest)
    assert starting_offsets(tmp_path) is None
