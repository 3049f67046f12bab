"""Compaction beside the batches (``compactor.py``): a rewrite of a snapshot, swapped in after
later batches committed (rollbacks and resyncs among them), leaves the mirror exact; a stop
in the middle of one leaves no half-written output; a restart after a kill cleans up."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from sparkhelp import NO_FLUSH, Workload, mirror_docs, run_once

from dcpkv.pipelines import vtable
from dcpkv.pipelines.mirror import compact_mirror, mirror_manifest, start_mirror
from dcpkv.pipelines.mirror_schema import mirror_schema
from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.table_job import floors_from, server_floors, stop_query


def _no_stray_dirs(path: Path) -> None:
    """Every directory under data/ is one the manifest names (live or retired)."""
    manifest = mirror_manifest(path)
    named = {*manifest.files, *manifest.retired}
    assert {f"data/{d.name}" for d in (path / "data").iterdir()} == named
    assert all((path / name / "_SUCCESS").exists() for name in manifest.files)


def _crashy_server(server_factory: Any, tmp_path: Path) -> Any:
    srv = server_factory(tmp_path / "data", tmp_path / "server.log", *NO_FLUSH)
    srv.start()
    return srv


def _restart(srv: Any, work: Workload, *, kill: bool = False) -> None:
    """Stop the server (cleanly: what it holds is persisted; ``kill``: kill -9, what was only
    in memory is lost and its vbuckets branch) and start it again; the workload follows."""
    if kill:
        srv.kill9()
    else:
        srv.terminate()
    work.port = srv.start()


def test_a_rewrite_swapped_in_after_rollbacks_and_new_batches_is_exact(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv = _crashy_server(server_factory, tmp_path)
    path = tmp_path / "m"
    work = Workload(srv.port)
    work.run(300, prefix="a")
    _restart(srv, work)  # round a persisted
    work.run(200, prefix="a")  # a second version of many keys, persisted too
    _restart(srv, work)
    run_once(spark, srv.port, path, compact_every=None)
    snapshot = mirror_manifest(path)
    floors = server_floors(SourceSettings.at(port=srv.port))(snapshot)
    assert floors and all(f > 0 for f in floors.values())
    done = vtable.rewrite(spark, path, snapshot, mirror_schema(), floors)
    # While the rewrite "runs": new batches, then a crash whose rollbacks the batches apply as
    # exact (at the persisted point, i.e. at the floors the rewrite used), then more writes.
    work.run(250, prefix="a")
    run_once(spark, srv.port, path, compact_every=None)
    _restart(srv, work, kill=True)
    work.run(60, prefix="b")
    truth = work.truth()
    run_once(spark, srv.port, path, compact_every=None)
    before = mirror_manifest(path)
    assert [e for e in before.entries if e.ord > snapshot.ord and e.seqno >= 0], "no rollback"
    swapped = vtable.swap(path, done)
    assert swapped is not None
    assert swapped.files[0] == done.name and swapped.files[1:] == [
        f for f in before.files if f not in snapshot.files
    ]
    assert swapped.entries == before.entries and swapped.applied == before.applied
    assert swapped.compacted_ord == snapshot.ord and swapped.ord == before.ord
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)
    # The floors it used hold from now on: the next batches and compaction stay exact.
    work.run(120, prefix="c")
    truth = work.truth()
    run_once(spark, srv.port, path, compact_every=1)
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)


def test_a_rewrite_is_dropped_when_a_later_rollback_fell_below_its_floors(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv = _crashy_server(server_factory, tmp_path)
    path = tmp_path / "m"
    work = Workload(srv.port)
    work.run(300, prefix="a")
    _restart(srv, work)
    work.run(250, prefix="a")  # in memory only
    run_once(spark, srv.port, path, compact_every=None)
    snapshot = mirror_manifest(path)
    # Floors as if everything applied were persisted: above the coming rollback points.
    applied = {vb: s for vb, (_u, s) in snapshot.applied_seqnos().items()}
    done = vtable.rewrite(spark, path, snapshot, mirror_schema(), floors_from(snapshot, applied))
    # The batches apply the rollbacks as exact: the manifest's floors are lower.
    _restart(srv, work, kill=True)
    truth = work.truth()
    run_once(spark, srv.port, path, compact_every=None)
    assert vtable.swap(path, done) is None  # it dropped versions those rollbacks need
    assert not (path / done.name).exists()
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)


def test_a_resync_during_a_rewrite_keeps_its_own_floor(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv = _crashy_server(server_factory, tmp_path)
    path = tmp_path / "m"
    work = Workload(srv.port)
    work.run(300, prefix="a")
    _restart(srv, work)
    work.run(200, prefix="c")  # never persisted
    run_once(spark, srv.port, path, compact_every=None)
    applied = {vb: s for vb, (_u, s) in mirror_manifest(path).applied_seqnos().items()}
    compact_mirror(spark, path, persisted=applied)  # floors above the coming rollback points
    work.run(50, prefix="d")
    run_once(spark, srv.port, path, compact_every=None)
    snapshot = mirror_manifest(path)
    done = vtable.rewrite(spark, path, snapshot, mirror_schema(), {})
    _restart(srv, work, kill=True)
    work.run(40, prefix="e")
    truth = work.truth()
    run_once(spark, srv.port, path, compact_every=None)  # resyncs, after the snapshot
    before = mirror_manifest(path)
    resynced = {e.vbucket for e in before.entries if e.ord > snapshot.ord and e.seqno == -1}
    assert resynced
    swapped = vtable.swap(path, done)
    assert swapped is not None
    assert {vb: swapped.floors[vb] for vb in resynced} == {vb: before.floors[vb] for vb in resynced}
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)


class _Gate:
    """A compactor's floors function that holds the rewrite until ``batches`` more batches
    have committed (so they commit while it runs), or until the job is stopping."""

    def __init__(self, path: Path, floors: Any, batches: int) -> None:
        self.path, self.floors, self.batches = path, floors, batches
        self.started = threading.Event()
        self.release = threading.Event()
        self.snapshots: list[int] = []
        self.overtaken: list[bool] = []  # per rewrite: did the batches commit while it waited

    def __call__(self, manifest: vtable.Manifest) -> dict[int, int]:
        self.snapshots.append(manifest.ord)
        self.started.set()
        deadline = time.monotonic() + 60
        overtaken = False
        while time.monotonic() < deadline and not self.release.is_set() and not overtaken:
            overtaken = mirror_manifest(self.path).ord >= manifest.ord + self.batches
            time.sleep(0.05)
        self.overtaken.append(overtaken)
        return self.floors(manifest)


def _live_mirror(spark: Any, port: int, path: Path, gate_batches: int) -> tuple[Any, _Gate]:
    src = SourceSettings.at(port=port, max_changes_per_trigger=60)
    query = start_mirror(spark, src, path, trigger_seconds=0.2, compact_every=2)
    from dcpkv.pipelines.table_job import _JOBS

    job = _JOBS[str(query.id)]
    gate = _Gate(path, server_floors(src), gate_batches)
    job.compactor.floors = gate
    return query, gate


def _wait(condition: Any, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_batches_commit_while_a_background_compaction_runs(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    path = tmp_path / "m"
    work = Workload(server.port)
    query, gate = _live_mirror(spark, server.port, path, gate_batches=3)
    from dcpkv.pipelines.table_job import _JOBS

    compactor = _JOBS[str(query.id)].compactor
    # Writes go on until the first rewrite is swapped in: batches keep coming (they are what
    # the gate waits for) however slowly a loaded machine runs them; the deadline only stops
    # a job that will never compact.
    deadline = time.monotonic() + 300
    try:
        round_ = 0
        while compactor.swaps < 1 and time.monotonic() < deadline and query.exception() is None:
            work.run(120, prefix=f"r{round_ % 3}")
            round_ += 1
            time.sleep(0.3)
    finally:
        gate.release.set()  # a later compaction need not wait for batches that never come
        failed = query.exception()
        stop_query(query)
    assert failed is None, failed
    assert compactor.swaps >= 1 and compactor.dropped == 0
    assert gate.overtaken[0], "batches committed while the first compaction ran"
    manifest = mirror_manifest(path)
    assert manifest.compacted_ord > 0 and manifest.files[0].startswith("data/c")
    truth = work.truth()
    run_once(spark, server.port, path, compact_every=None)  # the rest, after the last round
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)


def test_a_stop_mid_compaction_finishes_it_and_a_restart_goes_on(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    path = tmp_path / "m"
    work = Workload(server.port)
    query, gate = _live_mirror(spark, server.port, path, gate_batches=10**6)  # never by itself
    try:
        for round_ in range(20):
            work.run(80, prefix=f"s{round_ % 3}")
            if gate.started.is_set():
                break
            time.sleep(0.3)
        assert gate.started.wait(60)  # a compaction is running (held at its floors)
    finally:
        releaser = threading.Timer(1.0, gate.release.set)  # once the stop is waiting for it
        releaser.start()
        stop_query(query)
        releaser.join()
    _no_stray_dirs(path)  # swapped in by the stop: nothing half-written, nothing left over
    manifest = mirror_manifest(path)
    assert manifest.compacted_ord == gate.snapshots[-1]
    work.run(150, prefix="t")
    truth = work.truth()
    run_once(spark, server.port, path, compact_every=1)  # the restart, compacting again
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)


def test_a_restart_after_a_kill_mid_compaction_cleans_up(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    """A job killed while its rewrite ran left that rewrite (finished or half-written) in a
    directory no manifest names: readers never see it, and the next compaction deletes it."""
    path = tmp_path / "m"
    work = Workload(server.port)
    work.run(300)
    truth = work.truth()
    run_once(spark, server.port, path, compact_every=None)
    done = vtable.rewrite(spark, path, mirror_manifest(path), mirror_schema(), {})
    half = path / vtable.new_data_dir(path, "c00000001") / "_temporary"
    half.mkdir(parents=True)
    (half / "part-00000.parquet").write_bytes(b"PAR1 half")
    assert mirror_docs(spark, path) == truth  # unnamed: invisible
    work.run(100, prefix="u")
    truth = work.truth()
    run_once(spark, server.port, path, compact_every=1)
    assert not (path / done.name).exists() and not half.parent.exists()
    assert mirror_docs(spark, path) == truth
    _no_stray_dirs(path)
