"""The streaming source against a real server and a real local Spark session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkhelp import Changelog, Workload, stream_available_now


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
