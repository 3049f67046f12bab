"""A short seeded run of the fault-injection suite (``make chaos`` runs it for 30 minutes)."""

from __future__ import annotations

from pathlib import Path

from chaos import run


def test_a_short_seeded_chaos_run_loses_nothing_and_ends_equal(tmp_path: Path) -> None:
    report = run(seed=20261123, duration_s=20, workdir=tmp_path)
    assert report.faults and report.acknowledged and report.confirmed, report.summary()
    assert report.durable is not None and report.durable.acknowledged, report.summary()
    assert report.ok, "\n".join([report.summary(), *report.problems, *report.history])
