"""The mirror against a real server and the shared local Spark session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkhelp import Workload

from dcpkv.pipelines.mirror import SourceSettings, read_mirror, start_mirror


def mirror_docs(spark: Any, path: Path) -> dict[bytes, bytes]:
    return {bytes(r.key): bytes(r.value) for r in read_mirror(spark, path).collect()}


def run_once(spark: Any, port: int, path: Path, **kw: Any) -> None:
    query = start_mirror(spark, SourceSettings(port=port), path, available_now=True, **kw)
    query.awaitTermination()
    assert query.exception() is None, query.exception()


def test_mirror_equals_the_live_documents(spark: Any, server: Any, tmp_path: Path) -> None:
    work = Workload(server.port)
    work.run(400)
    run_once(spark, server.port, tmp_path / "m")
    assert mirror_docs(spark, tmp_path / "m") == work.truth()
