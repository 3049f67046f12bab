"""The mirror against a real server and the shared local Spark session."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sparkhelp import Workload, mirror_docs, persisted_round, run_once

from dcpkv.pipelines.mirror import compact_mirror, mirror_manifest, read_mirror, start_mirror
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.vtable import table_bytes


def test_mirror_equals_the_live_documents(spark: Any, server: Any, tmp_path: Path) -> None:
    work = Workload(server.port)
    work.run(400)
    truth = work.truth()
    run_once(spark, server.port, tmp_path / "m")
    assert mirror_docs(spark, tmp_path / "m") == truth


def test_kill9_rollback_restart_compaction_and_resync(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv, work = persisted_round(server_factory, tmp_path)
    path = tmp_path / "m"
    run_once(spark, srv.port, path, compact_every=None)
    before = work.truth()
    work.run(250, prefix="a")  # overwrites round a (other values) in memory only...
    truth = work.truth()  # (a Get expires what is due: truth first, then the mirror)
    run_once(spark, srv.port, path, compact_every=None)  # the job restarts from its checkpoint
    assert mirror_docs(spark, path) == truth != before
    srv.kill9()  # ...and loses it: every vbucket rolls back to round a
    work.port = srv.start()
    assert work.truth() == before
    run_once(spark, srv.port, path, compact_every=None)
    assert mirror_docs(spark, path) == before  # the older versions came back exactly
    entries = mirror_manifest(path).entries
    assert entries and all(e.kind == "rollback" and e.seqno >= 0 for e in entries)
    # Compaction with the server's persisted seqnos keeps the documents, shrinks the files.
    work.run(400, prefix="b")
    truth = work.truth()
    run_once(spark, srv.port, path, compact_every=None)
    size = table_bytes(path, mirror_manifest(path))
    files = len(mirror_manifest(path).files)
    compacted = compact_mirror(spark, path, SourceSettings.at(port=srv.port))
    assert mirror_docs(spark, path) == truth
    assert table_bytes(path, compacted) < size and len(compacted.files) < files
    # A floor above the coming rollback point (as if everything had been persisted) drops the
    # history the rollback needs: the mirror must resync those vbuckets and stay exact.
    work.run(200, prefix="c")  # never persisted
    run_once(spark, srv.port, path, compact_every=None)
    applied = {vb: s for vb, (_u, s) in mirror_manifest(path).applied_seqnos().items()}
    compact_mirror(spark, path, persisted=applied)
    srv.kill9()
    work.port = srv.start()
    work.run(50, prefix="d")
    truth = work.truth()
    run_once(spark, srv.port, path, compact_every=None)
    assert_one_read_for_several_resyncs(mirror_manifest(path))
    assert mirror_docs(spark, path) == truth


def assert_one_read_for_several_resyncs(manifest: Any) -> None:
    """The last batch resynced several vbuckets with one read (one ``r`` directory); each
    resync is a reset and a skip at its own rollback row's place."""
    resets = [e for e in manifest.entries if e.kind == "rollback" and e.seqno == -1]
    assert len({e.vbucket for e in resets}) > 1, "several vbuckets needed a resync"
    ords = {e.ord for e in resets}
    reads = [f for f in manifest.files if f.startswith("data/r")]
    assert len(reads) == len(ords) == 1
    for reset in resets:
        skips = [e for e in manifest.entries if e.kind == "skip" and e.vbucket == reset.vbucket]
        assert [(s.ord, s.pos) for s in skips] == [(reset.ord, reset.pos)]
        assert manifest.floors[reset.vbucket] == skips[0].seqno


def test_without_vbuckets_keeps_the_other_vbuckets_rows(spark: Any, tmp_path: Path) -> None:
    """A resync read in which some vbuckets rolled back keeps only the others' rows."""
    from dcpkv.pipelines import vtable

    rows = spark.createDataFrame([(vb, f"k{vb}-{i}") for vb in (1, 2, 3) for i in range(5)],
                                 "vbucket int, key string")  # fmt: skip
    name = vtable.write_rows(tmp_path, rows, "r00000001")
    kept = vtable.without_vbuckets(spark, tmp_path, name, {2})
    assert kept is not None and kept != name and not (tmp_path / name).exists()
    left = spark.read.parquet(str(tmp_path / kept)).collect()
    assert sorted(r.vbucket for r in left) == [1] * 5 + [3] * 5
    assert vtable.without_vbuckets(spark, tmp_path, kept, set()) == kept
    assert vtable.without_vbuckets(spark, tmp_path, kept, {1, 3}) is None
    assert not (tmp_path / kept).exists()


def test_readers_see_whole_batches_only(spark: Any, server: Any, tmp_path: Path) -> None:
    """Manifests read while the job runs name only complete directories, their documents are
    within the applied offsets and never change afterwards (committed files are immutable),
    and the mirror ends equal to the server."""
    path = tmp_path / "m"
    work = Workload(server.port)
    src = SourceSettings.at(port=server.port, max_changes_per_trigger=40)
    query = start_mirror(spark, src, path, trigger_seconds=0.2, compact_every=None)
    snapshots = []
    try:
        for round_ in range(4):
            work.run(150, prefix=f"s{round_ % 2}")
            manifest = next_manifest(path, mirror_manifest(path).generation)
            assert all((path / name / "_SUCCESS").exists() for name in manifest.files)
            snapshots.append((manifest, read_mirror(spark, path, manifest).collect()))
    finally:
        query.stop()
    for manifest, rows in snapshots:
        applied = manifest.applied_seqnos()
        assert all(r.seqno <= applied[r.vbucket][1] for r in rows)
        again = read_mirror(spark, path, manifest).collect()
        assert sorted(again) == sorted(rows)
    truth = work.truth()
    run_once(spark, server.port, path)  # the same checkpoint: catches up, then stops
    assert mirror_docs(spark, path) == truth


def next_manifest(path: Path, generation: int) -> Any:
    """The first manifest after ``generation`` (polled, bounded: the job commits each 0.2 s)."""
    for _ in range(600):
        manifest = mirror_manifest(path)
        if manifest.generation > generation and manifest.applied:
            return manifest
        time.sleep(0.1)
    raise AssertionError("the mirror job committed nothing")
