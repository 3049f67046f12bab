"""Stopping a pipeline's job between batches: the batch in flight finishes, none starts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dcpkv.pipelines.source_node import SourceSettings
from dcpkv.pipelines.table_job import PipelineStopping, TableJob


class _Job(TableJob):
    """A TableJob whose batch is a step the test controls (no Spark)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(None, tmp, None, lambda df: df, SourceSettings(), tmp)
        self.entered, self.release = threading.Event(), threading.Event()
        self.applied: list[int] = []

    def _apply(self, df: Any, batch_id: int) -> None:
        self.entered.set()
        assert self.release.wait(10)
        self.applied.append(batch_id)


def test_stop_waits_for_the_batch_in_flight_and_refuses_later_ones(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    batch = threading.Thread(target=job, args=(None, 1))
    batch.start()
    assert job.entered.wait(10)
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(job.stop(10)))
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # still waiting: the batch has not finished
    job.release.set()
    batch.join(10)
    stopper.join(10)
    assert stopped == [True] and job.applied == [1]
    with pytest.raises(PipelineStopping):
        job(None, 2)  # refused before anything is written: Spark runs it again later
    assert job.applied == [1]


def test_stop_gives_up_after_its_timeout(tmp_path: Path) -> None:
    job = _Job(tmp_path)
    batch = threading.Thread(target=job, args=(None, 1))
    batch.start()
    assert job.entered.wait(10)
    assert job.stop(0.05) is False  # the caller then interrupts the query
    job.release.set()
    batch.join(10)
    with pytest.raises(PipelineStopping):
        job(None, 2)


def _write(directory: Path, ops: list[str], cas: list[int | None], files: int = 1) -> None:
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        table = pa.table(
            {
                "op": ops,
                "cas": pa.array(
                    [None if c is None else decimal.Decimal(c) for c in cas],
                    pa.decimal128(20, 0),
                ),
            }
        )
        pq.write_table(table, directory / f"part-{f}.parquet")


def test_footer_summary_reads_counts_and_the_oldest_cas_without_spark(tmp_path: Path) -> None:
    from dcpkv.pipelines.vtable import footer_summary

    _write(tmp_path / "a", ["mutation", "deletion", "expiration"], [2**64 - 1, 2**63, 7], files=2)
    summary = footer_summary(tmp_path / "a")
    assert summary is not None
    assert (summary.rows, summary.rollbacks, summary.oldest_cas) == (6, [], 7)
    # a rollback row must be read (its vbucket, seqno and position): the Spark job does that
    _write(tmp_path / "b", ["mutation", "rollback"], [5, None])
    assert footer_summary(tmp_path / "b") is None
    # no rows at all (an empty batch): nothing to read, no CAS
    empty = footer_summary(tmp_path / "c")
    assert empty is not None and (empty.rows, empty.oldest_cas) == (0, None)


def test_footer_summary_of_bigint_cas_leaves_the_negative_ones_to_the_job(tmp_path: Path) -> None:
    """A BIGINT cas holds the u64's bits: a negative one (from 2**63 up) is no clock time, so
    the footer's minimum cannot give the oldest change; the Spark job leaves those out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dcpkv.pipelines.vtable import footer_summary

    for name, cas in (("a", [9, 7, None]), ("b", [9, -1, 7])):
        (tmp_path / name).mkdir()
        table = pa.table({"op": ["mutation"] * 3, "cas": pa.array(cas, pa.int64())})
        pq.write_table(table, tmp_path / name / "part-0.parquet")
    summary = footer_summary(tmp_path / "a")
    assert summary is not None and (summary.rows, summary.oldest_cas) == (3, 7)
    assert footer_summary(tmp_path / "b") is None
