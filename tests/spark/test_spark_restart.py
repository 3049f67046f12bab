"""The streaming source while the server is killed (unpersisted writes lost) and restarted.

The crash happens *inside* a running query: a processing-time query's foreachBatch kills the
server after Spark planned (and logged) the batch's end offset and before the batch reads, so
the planned end lies on a branch the restart throws away and above the new branch's high
seqno: the read must not wait for seqnos that never come, and the next batches must roll the
dead tail back. Then a zero-budget rollback: ``maxChangesPerTrigger`` smaller than the number
of rolled-back vbuckets, so most of them end their batch exactly at the rollback point.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sparkhelp import Changelog, Workload, high_seqnos, persisted_round, stream_available_now

CONVERGE_S = 180.0  # a bound on a wait that must end, not a timed assertion


class SharedLog(Changelog):
    """A changelog written by foreachBatch's thread and read by the test's."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def apply(self, rows: Iterable[Any]) -> None:
        with self.lock:
            super().apply(rows)

    def live(self) -> dict[bytes, bytes]:
        with self.lock:
            return super().live()


class CrashInBatch:
    """Armed, the next batch kills the server once the test's writes are done, restarts it on
    the same port and data dir, writes a little, and only then reads its rows."""

    def __init__(self, srv: Any, work: Workload, log: SharedLog) -> None:
        self.srv, self.work, self.log = srv, work, log
        self.armed = threading.Event()
        self.writes_done = threading.Event()
        self.done = threading.Event()
        self.highs_before: dict[int, int] = {}
        self.highs_after: dict[int, int] = {}

    def each(self, df: Any, _batch_id: int) -> None:
        if self.armed.is_set() and not self.done.is_set():
            assert self.writes_done.wait(CONVERGE_S)
            self.highs_before = high_seqnos(self.srv.port)
            self.srv.kill9()
            self.srv.start(same_port=True)
            self.work.run(24, prefix="c")  # far fewer seqnos than were lost
            self.highs_after = high_seqnos(self.srv.port)
            self.done.set()
        self.log.apply(df.collect())


def wait_for(what: str, ready: Callable[[], bool], query: Any) -> None:
    deadline = time.monotonic() + CONVERGE_S
    while not ready():
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.2)


def test_kill_and_restart_during_a_running_query_stays_exact(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv, work = persisted_round(server_factory, tmp_path, same_port=True)
    log = SharedLog()
    crash = CrashInBatch(srv, work, log)
    query = (
        spark.readStream.format("dcpkv")
        .option("port", srv.port)
        .load()
        .writeStream.foreachBatch(crash.each)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        truth = work.truth()
        wait_for("round a read", lambda: log.live() == truth, query)
        work.run(300, prefix="b")  # unpersisted from here on
        truth = work.truth()
        wait_for("round b read", lambda: log.live() == truth, query)
        crash.armed.set()
        work.run(200, prefix="b2")  # the next batch's end is planned on these
        crash.writes_done.set()
        wait_for("the crash batch", crash.done.is_set, query)
        work.run(150, prefix="d")
        truth = work.truth()
        wait_for("the end state", lambda: log.live() == truth, query)
    finally:
        query.stop()
    assert query.exception() is None
    assert log.rollbacks, "the lost writes must be rolled back"
    # The crash batch's end was planned at or above these highs (round b was read in full
    # before it), and the new branch stayed below them: the read had to end early.
    assert any(crash.highs_after[vb] < crash.highs_before[vb] for vb in crash.highs_after)
    assert log.live() == truth


def test_zero_budget_rollback_ends_batches_at_the_rollback_point(
    spark: Any, server_factory: Any, tmp_path: Path
) -> None:
    srv, work = persisted_round(server_factory, tmp_path, 200)
    log = Changelog()
    stream_available_now(spark, srv.port, tmp_path / "ck", log)
    work.run(200, prefix="b")  # unpersisted, read, then lost
    truth = work.truth()  # (a Get expires what is due: before the read, not after)
    stream_available_now(spark, srv.port, tmp_path / "ck", log)
    assert log.live() == truth
    srv.kill9()
    work.port = srv.start()
    work.run(12, prefix="c")
    truth = work.truth()
    before = len(log.batch_sizes)
    # 8 vbuckets roll back and a batch may read 2 seqnos: at least 6 of them end the first
    # batch at their rollback point (a stream request with start == end).
    stream_available_now(spark, srv.port, tmp_path / "ck", log, maxChangesPerTrigger=2)
    assert len({vb for vb, _seqno in log.rollbacks}) == 8
    assert max(log.batch_sizes[before:]) <= 2
    assert log.live() == truth
