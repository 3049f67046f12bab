"""Stopping a pipeline's job between batches: the batch in flight finishes, none starts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dcpkv.pipelines.mirror import PipelineStopping, SourceSettings, TableJob


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
