"""The streaming source against a real server and a real local Spark session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkhelp import Changelog, Workload, high_seqnos, persisted_round, stream_available_now


def test_available_now_ends_with_the_live_documents(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    work = Workload(server.port)
    work.run(600)
    truth = work.truth()
    log = Changelog()
    stream_available_now(spark, server.port, tmp_path / "ck", log)
    assert log.live() == truth
    assert len(truth) > 10


def test_restart_from_checkpoint_neither_loses_nor_double_applies(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    work = Workload(server.port)
    log = Changelog()
    for round_ in range(3):
        work.run(300, prefix=f"r{round_ % 2}")
        truth = work.truth()
        # Changelog.apply asserts every vbucket's seqnos ascend: a re-applied change fails.
        stream_available_now(spark, server.port, tmp_path / "ck", log)
        assert log.live() == truth
    # Nothing new: a run from the checkpoint reads nothing at all.
    before = len(log.batch_sizes)
    stream_available_now(spark, server.port, tmp_path / "ck", log)
    assert sum(log.batch_sizes[before:]) == 0


def test_max_changes_per_trigger_bounds_every_batch(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    work = Workload(server.port)
    work.run(400)
    truth = work.truth()
    log = Changelog()
    stream_available_now(spark, server.port, tmp_path / "ck", log, maxChangesPerTrigger=60)
    assert log.live() == truth
    assert max(log.batch_sizes) <= 60
    # The budget is in seqnos (deduplication only shrinks a batch): 60 per batch at most.
    total = sum(high_seqnos(server.port).values())
    assert len(log.batch_sizes) >= total // 60 >= 4


def test_kill9_with_unpersisted_writes_rolls_back_and_stays_exact(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv, work = persisted_round(server_factory, tmp_path)
    log = Changelog()
    stream_available_now(spark, srv.port, tmp_path / "ck", log)
    work.run(300, prefix="b")  # never persisted...
    truth = work.truth()
    stream_available_now(spark, srv.port, tmp_path / "ck", log)
    assert log.live() == truth
    srv.kill9()  # ...and lost here: the vbuckets branch at the last persisted seqno
    work.port = srv.start()
    work.run(150, prefix="c")  # the new branch grows past the seqnos the consumer had seen
    truth = work.truth()
    stream_available_now(spark, srv.port, tmp_path / "ck", log)
    assert log.rollbacks, "the lost writes must be rolled back"
    assert log.live() == truth


def test_latest_initial_offset_is_one_answer_per_query(server: Any) -> None:
    """Spark asks a stream reader for its initial offset twice per query; with ``latest`` the
    server's high seqnos move between the two when writes go on, so the second answer must
    be the first, or batch 0 runs from a start above the one it was planned from."""
    from dcpkv.spark.options import parse_options
    from dcpkv.spark.source import DcpkvStreamReader

    reader = DcpkvStreamReader(
        parse_options({"port": str(server.port), "startingOffsets": "latest"})
    )
    first = reader.initialOffset()
    before = high_seqnos(server.port)
    Workload(server.port).run(20)
    assert high_seqnos(server.port) != before  # the server moved on
    assert reader.initialOffset() == first
    assert DcpkvStreamReader(reader.opts).initialOffset() != first  # a new query: a new start
